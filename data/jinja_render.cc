#include "data/jinja_render.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace cleave::jinja {
namespace {

// The jinja2 result of an undefined value: what {{ }} prints as "" and `is defined` tests.
const Json& UndefinedValue() {
  static const Json* v = new Json(Undefined());
  return *v;
}

constexpr int64_t kLoopSteps = 16;

// Integer arithmetic that fails past the 64-bit range (Python's would grow).
StatusOr<Json> NoOverflow(const std::string& op, int64_t i, int64_t j) {
  int64_t out = 0;
  const bool overflow = op == "+"   ? __builtin_add_overflow(i, j, &out)
                        : op == "-" ? __builtin_sub_overflow(i, j, &out)
                                    : __builtin_mul_overflow(i, j, &out);
  if (overflow) return Error(absl::StrCat(op, ": past the 64-bit range"));
  return out;
}

// Python's // and % of integers: rounded toward minus infinity.
StatusOr<Json> Divide(const std::string& op, int64_t i, int64_t j) {
  if (j == 0) return Error("division by zero");
  if (j == -1) return op == "%" ? Json(int64_t{0}) : NoOverflow("-", 0, i);  // INT64_MIN / -1 traps
  const int64_t q = i / j, m = i % j;
  const bool adjust = m != 0 && ((m < 0) != (j < 0));
  return op == "//" ? q - (adjust ? 1 : 0) : m + (adjust ? j : 0);
}

}  // namespace

std::string Describe(const Expr& e) {
  switch (e.kind) {
    case Expr::kName: return e.name;
    case Expr::kAttr: return Describe(*e.a) + "." + e.name;
    case Expr::kIndex: return Describe(*e.a) + "[" + (e.b->kind == Expr::kLiteral ? Repr(e.b->value) : "...") + "]";
    default: return "a value";
  }
}

Renderer::Nest::Nest(Renderer* r) : r(r) {
  if (++r->depth_ > r->b_->depth) {
    status = Error(absl::StrCat("nested more than ", r->b_->depth, " deep while rendering"));
  }
}

Status Renderer::Step(int64_t n) {
  if ((b_->steps -= n) < 0) {
    return Error("the render ran out of steps (a loop too long for its data, or a template that recurses without end)");
  }
  return absl::OkStatus();
}

StatusOr<Json> Renderer::Made(std::string s) {
  RETURN_IF_ERROR(Checked(static_cast<double>(s.size()), "a string"));
  RETURN_IF_ERROR(Step(static_cast<int64_t>(s.size() / 8)));
  return Json(std::move(s));
}

Status Renderer::Checked(double bytes, const char* what) const {
  if (bytes > static_cast<double>(b_->bytes)) {
    return Error(absl::StrCat(what, " of more than ", b_->bytes, " bytes (the render's limit)"));
  }
  return absl::OkStatus();
}

StatusOr<int64_t> Renderer::Weight(const Json& v, int depth) const {
  if (depth > b_->depth) return Error(absl::StrCat("a value nested more than ", b_->depth, " deep"));
  if (v.is_string()) return 1 + static_cast<int64_t>(v.get_ref<const std::string&>().size() / 8);
  int64_t w = 1;
  if (v.is_array() || v.is_object()) {
    for (const Json& x : v) {
      ASSIGN_OR_RETURN(const int64_t wx, Weight(x, depth + 1));
      w += wx;
    }
  }
  return w;
}

StatusOr<Json> Renderer::Copy(const Json& v) {
  ASSIGN_OR_RETURN(const int64_t weight, Weight(v));
  RETURN_IF_ERROR(Step(weight));
  return v;
}

Status Renderer::Items(size_t n) {
  if (n > kMaxItems) return Error(absl::StrCat("a list of more than ", kMaxItems, " items"));
  return absl::OkStatus();
}

Status Renderer::Append(std::string& out, const std::string& s) const {
  RETURN_IF_ERROR(Checked(static_cast<double>(out.size()) + static_cast<double>(s.size()), "an output"));
  out += s;
  return absl::OkStatus();
}

Status Renderer::Run(const Body& body, std::string& out) {
  for (const auto& n : body) RETURN_IF_ERROR(Exec(*n, out));
  return absl::OkStatus();
}

Status Renderer::Exec(const Node& n, std::string& out) {
  RETURN_IF_ERROR(Step());
  Nest nest(this);
  RETURN_IF_ERROR(nest.status);
  switch (n.kind) {
    case Node::kText: return Append(out, n.text);
    case Node::kOutput: {
      ASSIGN_OR_RETURN(const Json v, Eval(*n.expr));
      return Append(out, Str(v));
    }
    case Node::kIf:
      for (const auto& [cond, body] : n.branches) {
        ASSIGN_OR_RETURN(const bool taken, Truthy(cond));
        if (taken) return Run(body, out);
      }
      return Run(n.else_body, out);
    case Node::kFor: return For(n, out);
    case Node::kSet: {
      ASSIGN_OR_RETURN(Json v, Eval(*n.expr));
      return Set(n, std::move(v));
    }
    case Node::kSetBlock: {
      std::string text;
      RETURN_IF_ERROR(Run(n.body, text));
      return Set(n, Json(text));
    }
    case Node::kMacro: macros_[n.targets[0]] = &n; return absl::OkStatus();
    case Node::kBlock: return Run(n.body, out);
  }
  return absl::OkStatus();
}

Status Renderer::Set(const Node& n, Json value) {
  RETURN_IF_ERROR(Weight(value).status());  // its depth (a namespace that holds itself, again and again)
  if (n.targets.size() == 1) {
    scopes_.back()[n.targets[0]] = std::move(value);
    return absl::OkStatus();
  }
  Json* ns = Find(n.targets[0]);
  if (ns == nullptr || !ns->is_object()) return Error(absl::StrCat("cannot set an attribute of ", n.targets[0]));
  (*ns)[n.targets[1]] = std::move(value);
  return absl::OkStatus();
}

// The items a for loop runs over: the sequence read in place, its items copied before
// the body can change it; those its `if` keeps.
StatusOr<std::vector<Json>> Renderer::LoopItems(const Node& n) {
  std::vector<Json> items;
  Json own;
  ASSIGN_OR_RETURN(const Json* seq, View(*n.expr, &own));
  if (seq->is_array()) {
    for (const Json& x : *seq) {
      ASSIGN_OR_RETURN(Json item, Copy(x));
      items.push_back(std::move(item));
    }
  } else if (seq->is_object()) {
    for (auto it = seq->begin(); it != seq->end(); ++it) {
      ASSIGN_OR_RETURN(Json key, Made(it.key()));
      items.push_back(std::move(key));
    }
  } else if (seq->is_string()) {
    const std::string& s = seq->get_ref<const std::string&>();
    RETURN_IF_ERROR(Items(s.size()));
    RETURN_IF_ERROR(Step(static_cast<int64_t>(s.size())));
    for (char c : s) items.push_back(std::string(1, c));
  } else if (!seq->is_null() && !IsUndefined(*seq)) {
    return Error(absl::StrCat("cannot loop over ", Repr(*seq)));
  }
  if (!n.filter) return items;
  std::vector<Json> kept;
  for (Json& item : items) {
    scopes_.push_back(Json::object());
    const Status bound = Bind(n, scopes_.back(), item);
    const StatusOr<bool> keep = bound.ok() ? Truthy(n.filter) : StatusOr<bool>(bound);
    scopes_.pop_back();
    if (!keep.ok()) return keep.status();
    if (*keep) kept.push_back(std::move(item));
  }
  return kept;
}

Status Renderer::Bind(const Node& n, Json& scope, const Json& item) const {
  if (n.targets.size() == 1) {
    scope[n.targets[0]] = item;
    return absl::OkStatus();
  }
  if (!item.is_array() || item.size() != n.targets.size()) return Error("cannot unpack the loop's item");
  for (size_t i = 0; i < n.targets.size(); ++i) scope[n.targets[i]] = item[i];
  return absl::OkStatus();
}

Status Renderer::For(const Node& n, std::string& out) {
  ASSIGN_OR_RETURN(std::vector<Json> items, LoopItems(n));
  if (items.empty()) return Run(n.else_body, out);
  const int64_t len = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < len; ++i) {
    RETURN_IF_ERROR(Step(kLoopSteps));  // the scope and loop object each iteration builds
    Json scope = Json::object();
    Json loop = {{"index0", i}, {"index", i + 1}, {"revindex0", len - 1 - i}, {"revindex", len - i},
                 {"first", i == 0}, {"last", i == len - 1}, {"length", len}};
    if (i > 0) {
      ASSIGN_OR_RETURN(loop["previtem"], Copy(items[i - 1]));
    }
    if (i + 1 < len) {
      ASSIGN_OR_RETURN(loop["nextitem"], Copy(items[i + 1]));
    }
    scope["loop"] = std::move(loop);
    RETURN_IF_ERROR(Bind(n, scope, items[i]));
    scopes_.push_back(std::move(scope));
    const Status ran = Run(n.body, out);
    scopes_.pop_back();
    RETURN_IF_ERROR(ran);
  }
  return absl::OkStatus();
}

Json* Renderer::Find(const std::string& name) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return &*f;
  }
  return nullptr;
}

// The item `key` of `base` (an attribute, or a subscript) in place: UndefinedValue()
// where it has none, nullptr for a character of a string (a new value). Taking anything
// of an undefined value is an error, as in jinja2.
StatusOr<const Json*> Renderer::Element(const Json& base, const Json& key, const Expr& e) {
  if (IsUndefined(base)) return Error(absl::StrCat(Describe(*e.a), " is undefined"));
  if (base.is_array() && key.is_number_integer()) {
    ASSIGN_OR_RETURN(const int64_t k, Integer(key, "an index"));
    const int64_t i = jinja::Index(k, static_cast<int64_t>(base.size()));
    return i >= 0 && i < static_cast<int64_t>(base.size()) ? &base[static_cast<size_t>(i)] : &UndefinedValue();
  }
  if (base.is_object() && key.is_string()) {
    auto it = base.find(key.get_ref<const std::string&>());
    return it == base.end() ? &UndefinedValue() : &*it;
  }
  if (base.is_string() && key.is_number_integer()) return nullptr;
  return &UndefinedValue();
}

// `e`'s value in place, without copying it, where that needs no evaluation that could
// change anything (names, literals, attributes, subscripts by a literal or a name);
// nullptr where `e` must be evaluated.
StatusOr<const Json*> Renderer::Ref(const Expr& e) {
  RETURN_IF_ERROR(Step());
  switch (e.kind) {
    case Expr::kLiteral: return &e.value;
    case Expr::kName: {
      const Json* v = Find(e.name);
      return v == nullptr ? &UndefinedValue() : v;
    }
    case Expr::kAttr:
    case Expr::kIndex: {
      if (e.kind == Expr::kIndex && e.b->kind != Expr::kLiteral && e.b->kind != Expr::kName) return nullptr;
      ASSIGN_OR_RETURN(const Json* base, Ref(*e.a));
      if (base == nullptr) return nullptr;
      if (e.kind == Expr::kAttr) return Element(*base, Json(e.name), e);
      ASSIGN_OR_RETURN(const Json* key, Ref(*e.b));
      return Element(*base, *key, e);
    }
    default: return nullptr;
  }
}

StatusOr<const Json*> Renderer::View(const Expr& e, Json* own) {
  ASSIGN_OR_RETURN(const Json* v, Ref(e));
  if (v != nullptr) return v;
  ASSIGN_OR_RETURN(*own, Eval(e));
  return own;
}

StatusOr<bool> Renderer::Truthy(const ExprP& e) {
  Json own;
  ASSIGN_OR_RETURN(const Json* v, View(*e, &own));
  return jinja::Truthy(*v);
}

StatusOr<Json> Renderer::Eval(const Expr& e) {
  RETURN_IF_ERROR(Step());
  Nest nest(this);
  RETURN_IF_ERROR(nest.status);
  switch (e.kind) {
    case Expr::kLiteral: return Copy(e.value);
    case Expr::kName: {
      const Json* v = Find(e.name);
      return v == nullptr ? Undefined() : Copy(*v);
    }
    case Expr::kList:
    case Expr::kDict: {
      RETURN_IF_ERROR(Items(e.args.size()));
      Json out = e.kind == Expr::kList ? Json::array() : Json::object();
      for (size_t i = 0; i < e.args.size(); ++i) {
        ASSIGN_OR_RETURN(Json v, Eval(*e.args[i]));
        if (e.kind == Expr::kList) {
          out.push_back(std::move(v));
          continue;
        }
        ASSIGN_OR_RETURN(out[Str(v)], Eval(*e.args[++i]));
      }
      RETURN_IF_ERROR(Weight(out).status());
      return out;
    }
    case Expr::kAttr:
    case Expr::kIndex: return Index(e);
    case Expr::kSlice: return SliceOf(e);
    case Expr::kCall: return Call(e);
    case Expr::kFilter: return Filter(e);
    case Expr::kTest: {
      ASSIGN_OR_RETURN(const bool passed, Test(e));
      return passed != e.negated;
    }
    case Expr::kNot: {
      ASSIGN_OR_RETURN(const bool v, Truthy(e.a));
      return !v;
    }
    case Expr::kNeg: {
      ASSIGN_OR_RETURN(const Json v, Eval(*e.a));
      if (v.is_number_integer()) {
        ASSIGN_OR_RETURN(const int64_t i, Integer(v, "-"));
        return NoOverflow("-", 0, i);
      }
      ASSIGN_OR_RETURN(const double d, Number(v, "-"));
      return -d;
    }
    case Expr::kTernary: {
      ASSIGN_OR_RETURN(const bool cond, Truthy(e.b));
      if (cond) return Eval(*e.a);
      return e.c ? Eval(*e.c) : Undefined();
    }
    case Expr::kBinary: return Binary(e);
  }
  return Undefined();
}

StatusOr<Json> Renderer::Index(const Expr& e) {
  // The key first: evaluating it may change the base (a macro that sets ns.x).
  Json key = e.name;
  if (e.kind == Expr::kIndex) {
    ASSIGN_OR_RETURN(key, Eval(*e.b));
  }
  Json own;
  ASSIGN_OR_RETURN(const Json* base, View(*e.a, &own));
  ASSIGN_OR_RETURN(const Json* v, Element(*base, key, e));
  if (v != nullptr) return Copy(*v);
  const std::string& s = base->get_ref<const std::string&>();
  ASSIGN_OR_RETURN(const int64_t k, Integer(key, "an index"));
  const int64_t i = jinja::Index(k, static_cast<int64_t>(s.size()));
  return i >= 0 && i < static_cast<int64_t>(s.size()) ? Json(std::string(1, s[static_cast<size_t>(i)])) : Undefined();
}

StatusOr<Json> Renderer::SliceOf(const Expr& e) {
  Json bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (e.args[i]) {
      ASSIGN_OR_RETURN(bounds[i], Eval(*e.args[i]));
    }
  }
  Json own;
  ASSIGN_OR_RETURN(const Json* base, View(*e.a, &own));
  if (IsUndefined(*base)) return Error(absl::StrCat(Describe(*e.a), " is undefined"));
  ASSIGN_OR_RETURN(Json out, Slice(*base, bounds[0], bounds[1], bounds[2]));
  ASSIGN_OR_RETURN(const int64_t weight, Weight(out));
  RETURN_IF_ERROR(Step(weight));
  return out;
}

StatusOr<Json> Renderer::Binary(const Expr& e) {
  const std::string& op = e.name;
  ASSIGN_OR_RETURN(const Json a, Eval(*e.a));
  if (op == "and" || op == "or") {
    if (jinja::Truthy(a) == (op == "or")) return a;
    return Eval(*e.b);
  }
  // The left operand evaluated (a copy), then the right read in place: nothing is
  // evaluated after it.
  Json own;
  ASSIGN_OR_RETURN(const Json* right, View(*e.b, &own));
  const Json& b = *right;
  if (op == "~") {
    const std::string x = Str(a), y = Str(b);
    RETURN_IF_ERROR(Checked(static_cast<double>(x.size()) + static_cast<double>(y.size()), "a string"));
    return Made(x + y);
  }
  if (op == "==") return a == b;
  if (op == "!=") return !(a == b);
  if (op == "in") {
    if (b.is_string()) return a.is_string() && b.get_ref<const std::string&>().find(a.get<std::string>()) != std::string::npos;
    if (b.is_array()) {
      RETURN_IF_ERROR(Step(static_cast<int64_t>(b.size())));
      return std::find(b.begin(), b.end(), a) != b.end();
    }
    if (b.is_object()) return a.is_string() && b.contains(a.get<std::string>());
    if (IsUndefined(b) || b.is_null()) return Error("'in' an undefined value");
    return false;
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    if (!((a.is_number() && b.is_number()) || (a.is_string() && b.is_string()))) {
      return Error(absl::StrCat("cannot compare ", Repr(a), " and ", Repr(b)));
    }
    const bool lt = a < b, gt = b < a;
    return op == "<" ? lt : op == ">" ? gt : op == "<=" ? !gt : !lt;
  }
  return Arithmetic(op, a, b);
}

StatusOr<Json> Renderer::Arithmetic(const std::string& op, const Json& a, const Json& b) {
  if (op == "+" && a.is_string() && b.is_string()) {
    const std::string& x = a.get_ref<const std::string&>();
    const std::string& y = b.get_ref<const std::string&>();
    RETURN_IF_ERROR(Checked(static_cast<double>(x.size()) + static_cast<double>(y.size()), "a string"));
    return Made(x + y);
  }
  if (op == "+" && a.is_array() && b.is_array()) {
    RETURN_IF_ERROR(Items(a.size() + b.size()));
    Json out = a;
    for (const Json& x : b) {
      ASSIGN_OR_RETURN(Json item, Copy(x));
      out.push_back(std::move(item));
    }
    return out;
  }
  if (op == "+" && !(a.is_number() && b.is_number())) {
    return Error(absl::StrCat("cannot add ", Repr(a), " and ", Repr(b)));
  }
  if (op == "*" && a.is_string() && b.is_number_integer()) {
    const std::string& unit = a.get_ref<const std::string&>();
    ASSIGN_OR_RETURN(const int64_t n, Integer(b, "*"));
    const int64_t times = std::max<int64_t>(0, n);
    RETURN_IF_ERROR(Checked(static_cast<double>(unit.size()) * static_cast<double>(times), "a string"));
    std::string out;
    out.reserve(unit.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += unit;
    return Made(std::move(out));
  }
  ASSIGN_OR_RETURN(const double x, Number(a, op.c_str()));
  ASSIGN_OR_RETURN(const double y, Number(b, op.c_str()));
  if (BothInts(a, b) && (op == "+" || op == "-" || op == "*" || op == "//" || op == "%")) {
    ASSIGN_OR_RETURN(const int64_t i, Integer(a, op.c_str()));
    ASSIGN_OR_RETURN(const int64_t j, Integer(b, op.c_str()));
    if (op == "+" || op == "-" || op == "*") return NoOverflow(op, i, j);
    return Divide(op, i, j);
  }
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (y == 0) return Error("division by zero");
  if (op == "/") return x / y;
  if (op == "//") return std::floor(x / y);
  if (op == "%") return x - y * std::floor(x / y);
  return Error(absl::StrCat("unknown operator ", op));
}

StatusOr<Json> Renderer::Arg(const Expr& call, size_t i, const std::string& key, Json def) {
  if (i < call.args.size()) return Eval(*call.args[i]);
  for (const auto& [k, v] : call.kwargs) {
    if (k == key) return Eval(*v);
  }
  return def;
}

StatusOr<Json> Renderer::Range(const Expr& e) {
  int64_t bounds[3] = {0, 0, 1};  // start, stop, step
  const size_t given = std::min<size_t>(e.args.size(), 3);
  for (size_t i = 0; i < given; ++i) {
    ASSIGN_OR_RETURN(const Json v, Eval(*e.args[i]));
    ASSIGN_OR_RETURN(bounds[given == 1 ? 1 : i], Integer(v, "range"));
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) return Error("range step cannot be zero");
  // The count in 128 bits: stop - start can pass the 64-bit range.
  const __int128 span = static_cast<__int128>(stop) - start;
  const __int128 count = step > 0 ? (span > 0 ? (span + step - 1) / step : 0)
                                  : (span < 0 ? (-span + (-static_cast<__int128>(step)) - 1) / -static_cast<__int128>(step) : 0);
  if (count > static_cast<__int128>(kMaxItems)) return Error(absl::StrCat("range of more than ", kMaxItems, " numbers"));
  RETURN_IF_ERROR(Step(static_cast<int64_t>(count)));
  Json out = Json::array();
  for (int64_t k = 0, i = start; k < static_cast<int64_t>(count); ++k, i += step) out.push_back(i);
  return out;
}

StatusOr<Json> Renderer::Call(const Expr& e) {
  if (e.method != nullptr) {
    ASSIGN_OR_RETURN(const Json self, Eval(*e.a->a));
    if (IsUndefined(self)) return Error(absl::StrCat(Describe(*e.a->a), " is undefined"));
    return e.method(*this, self, e);
  }
  if (e.a->kind != Expr::kName) return Error("only functions and methods can be called");
  const std::string& f = e.a->name;
  if (f == "raise_exception") {
    ASSIGN_OR_RETURN(const Json message, Arg(e, 0, "message"));
    return Error("raise_exception: " + Str(message));
  }
  if (f == "namespace") {
    Json ns = Json::object();
    for (const auto& a : e.args) {
      ASSIGN_OR_RETURN(const Json d, Eval(*a));
      if (d.is_object()) ns.update(d);
    }
    for (const auto& [k, v] : e.kwargs) {
      ASSIGN_OR_RETURN(ns[k], Eval(*v));
    }
    return ns;
  }
  if (f == "range") return Range(e);
  if (f == "strftime_now") {
    ASSIGN_OR_RETURN(const Json format, Arg(e, 0, "format"));
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), Str(format).c_str(), &tm);
    return std::string(buf, n);
  }
  auto m = macros_.find(f);
  if (m == macros_.end()) return Error(absl::StrCat("unknown function ", f));
  return CallMacro(*m->second, e);
}

StatusOr<Json> Renderer::CallMacro(const Node& macro, const Expr& e) {
  Json scope = Json::object();
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const auto& [name, def] = macro.params[i];
    Json value = Undefined();
    if (def) {
      ASSIGN_OR_RETURN(value, Eval(*def));
    }
    ASSIGN_OR_RETURN(scope[name], Arg(e, i, name, std::move(value)));
  }
  scopes_.push_back(std::move(scope));
  std::string out;
  const Status ran = Run(macro.body, out);
  scopes_.pop_back();
  RETURN_IF_ERROR(ran);
  return out;
}

StatusOr<Json> Renderer::Filter(const Expr& e) {
  // The value read in place for a filter without arguments (nothing else is evaluated
  // while it is held); evaluated otherwise.
  Json own;
  const Json* v = &own;
  if (e.args.empty() && e.kwargs.empty()) {
    ASSIGN_OR_RETURN(v, View(*e.a, &own));
  } else {
    ASSIGN_OR_RETURN(own, Eval(*e.a));
  }
  return e.filter(*this, *v, e);
}

StatusOr<bool> Renderer::Test(const Expr& e) {
  Json own;
  ASSIGN_OR_RETURN(const Json* v, View(*e.a, &own));
  return e.test(*v);
}

StatusOr<Json> Renderer::Replaced(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  int64_t hits = 0;
  for (size_t i = 0; (i = s.find(from, i)) != std::string::npos; i += from.size()) ++hits;
  const double grows = static_cast<double>(hits) * (static_cast<double>(to.size()) - static_cast<double>(from.size()));
  RETURN_IF_ERROR(Checked(static_cast<double>(s.size()) + grows, "a string"));
  return Made(Replace(s, from, to));
}

StatusOr<Json> Renderer::Joined(const std::vector<std::string>& parts, const std::string& sep) {
  double size = 0;
  for (const std::string& p : parts) size += static_cast<double>(p.size() + sep.size());
  RETURN_IF_ERROR(Checked(size, "a string"));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return Made(std::move(out));
}

Status RenderTemplate(const Body& body, Json globals, TemplateBudget* budget, std::string* out) {
  return Renderer(std::move(globals), budget).Run(body, *out);
}

}  // namespace cleave::jinja
