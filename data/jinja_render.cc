#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>

#include "absl/strings/str_cat.h"
#include "data/jinja.h"

namespace cleave::jinja {
namespace {

// The jinja2 result of an undefined value: what {{ }} prints as "" and `is defined` tests.
const Json& UndefinedValue() {
  static const Json* v = new Json(Undefined());
  return *v;
}

// "messages[0].content" for a name, attribute or subscript chain; "a value" otherwise.
std::string Describe(const Expr& e) {
  switch (e.kind) {
    case Expr::kName: return e.name;
    case Expr::kAttr: return Describe(*e.a) + "." + e.name;
    case Expr::kIndex: return Describe(*e.a) + "[" + (e.b->kind == Expr::kLiteral ? Repr(e.b->value) : "...") + "]";
    default: return "a value";
  }
}

// Jinja's tests (`x is NAME`), by name: each a predicate of the value.
using TestFn = bool (*)(const Json& v);
const std::map<std::string, TestFn>& Tests() {
  static const std::map<std::string, TestFn> tests = {
      {"defined", [](const Json& v) { return !IsUndefined(v); }},
      {"undefined", [](const Json& v) { return IsUndefined(v); }},
      {"none", [](const Json& v) { return v.is_null(); }},
      {"string", [](const Json& v) { return v.is_string(); }},
      {"number", [](const Json& v) { return v.is_number(); }},
      {"integer", [](const Json& v) { return v.is_number_integer(); }},
      {"float", [](const Json& v) { return v.is_number_float(); }},
      {"mapping", [](const Json& v) { return v.is_object(); }},
      {"iterable", [](const Json& v) { return v.is_array() || v.is_object() || v.is_string(); }},
      {"sequence", [](const Json& v) { return v.is_array() || v.is_string() || v.is_object(); }},
      {"boolean", [](const Json& v) { return v.is_boolean(); }},
      {"true", [](const Json& v) { return v.is_boolean() && v.get<bool>(); }},
      {"false", [](const Json& v) { return v.is_boolean() && !v.get<bool>(); }},
      {"odd", [](const Json& v) { return v.is_number_integer() && v.get<int64_t>() % 2 != 0; }},
      {"even", [](const Json& v) { return v.is_number_integer() && v.get<int64_t>() % 2 == 0; }},
  };
  return tests;
}

class Renderer {
 public:
  Renderer(Json globals, TemplateBudget* budget) : b_(budget) { scopes_.push_back(std::move(globals)); }

  void Run(const Body& body, std::string& out) {
    for (const auto& n : body) Exec(*n, out);
  }

 private:
  // One level deeper (a statement, an expression, a value built) while it lives.
  struct Nest {
    explicit Nest(Renderer* r) : r(r) {
      if (++r->depth_ > r->b_->depth) Fail(absl::StrCat("nested more than ", r->b_->depth, " deep while rendering"));
    }
    ~Nest() { --r->depth_; }
    Renderer* r;
  };

  void Step(int64_t n = 1) {
    if ((b_->steps -= n) < 0) {
      Fail("the render ran out of steps (a loop too long for its data, or a template that recurses without end)");
    }
  }
  // `s`, a string this render made: at most the budget's bytes, and a step for every 8.
  std::string Made(std::string s) {
    Checked(s.size(), "a string");
    Step(static_cast<int64_t>(s.size() / 8));
    return s;
  }
  void Checked(double bytes, const char* what) const {
    if (bytes > static_cast<double>(b_->bytes)) {
      Fail(absl::StrCat(what, " of more than ", b_->bytes, " bytes (the render's limit)"));
    }
  }
  // How much copying `v` costs: its elements, and a step for every 8 bytes of text. Fails
  // for a value nested deeper than the budget allows.
  int64_t Weight(const Json& v, int depth = 0) {
    if (depth > b_->depth) Fail(absl::StrCat("a value nested more than ", b_->depth, " deep"));
    if (v.is_string()) return 1 + static_cast<int64_t>(v.get_ref<const std::string&>().size() / 8);
    int64_t w = 1;
    if (v.is_array() || v.is_object()) {
      for (const Json& x : v) w += Weight(x, depth + 1);
    }
    return w;
  }
  Json Copy(const Json& v) {
    Step(Weight(v));
    return v;
  }
  void Items(size_t n) {
    if (n > kMaxItems) Fail(absl::StrCat("a list of more than ", kMaxItems, " items"));
  }
  static constexpr size_t kMaxItems = 1'000'000;
  static constexpr int64_t kLoopSteps = 16;

  void Append(std::string& out, const std::string& s) {
    Checked(static_cast<double>(out.size()) + static_cast<double>(s.size()), "an output");
    out += s;
  }

  void Exec(const Node& n, std::string& out) {
    Step();
    Nest nest(this);
    switch (n.kind) {
      case Node::kText: return Append(out, n.text);
      case Node::kOutput: return Append(out, Str(Eval(*n.expr)));
      case Node::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (Truthy(cond)) return Run(body, out);
        }
        return Run(n.else_body, out);
      case Node::kFor: return For(n, out);
      case Node::kSet: return Set(n, Eval(*n.expr));
      case Node::kSetBlock: {
        std::string text;
        Run(n.body, text);
        return Set(n, Json(text));
      }
      case Node::kMacro: macros_[n.targets[0]] = &n; return;
      case Node::kBlock: return Run(n.body, out);
    }
  }

  void Set(const Node& n, Json value) {
    Weight(value);  // its depth (a namespace that holds itself, again and again)
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(value);
      return;
    }
    Json* ns = Find(n.targets[0]);
    if (ns == nullptr || !ns->is_object()) Fail(absl::StrCat("cannot set an attribute of ", n.targets[0]));
    (*ns)[n.targets[1]] = std::move(value);
  }

  void For(const Node& n, std::string& out) {
    std::vector<Json> items;
    {  // the sequence read in place, its items copied before the body can change it
      Json own;
      const Json& seq = View(*n.expr, &own);
      if (seq.is_array()) {
        for (const Json& x : seq) items.push_back(Copy(x));
      } else if (seq.is_object()) {
        for (auto it = seq.begin(); it != seq.end(); ++it) items.push_back(Made(it.key()));
      } else if (seq.is_string()) {
        Items(seq.get_ref<const std::string&>().size());
        Step(static_cast<int64_t>(seq.get_ref<const std::string&>().size()));
        for (char c : seq.get<std::string>()) items.push_back(std::string(1, c));
      } else if (!seq.is_null() && !IsUndefined(seq)) {
        Fail(absl::StrCat("cannot loop over ", Repr(seq)));
      }
    }
    auto bind = [&](Json& scope, const Json& item) {
      if (n.targets.size() == 1) {
        scope[n.targets[0]] = item;
        return;
      }
      if (!item.is_array() || item.size() != n.targets.size()) Fail("cannot unpack the loop's item");
      for (size_t i = 0; i < n.targets.size(); ++i) scope[n.targets[i]] = item[i];
    };
    if (n.filter) {
      std::vector<Json> kept;
      for (Json& item : items) {
        scopes_.push_back(Json::object());
        bind(scopes_.back(), item);
        const bool keep = Truthy(n.filter);
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return Run(n.else_body, out);
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      Step(kLoopSteps);  // the scope and loop object each iteration builds
      Json scope = Json::object();
      Json loop = {{"index0", i}, {"index", i + 1}, {"revindex0", len - 1 - i}, {"revindex", len - i},
                   {"first", i == 0}, {"last", i == len - 1}, {"length", len}};
      if (i > 0) loop["previtem"] = Copy(items[i - 1]);
      if (i + 1 < len) loop["nextitem"] = Copy(items[i + 1]);
      scope["loop"] = std::move(loop);
      bind(scope, items[i]);
      scopes_.push_back(std::move(scope));
      Run(n.body, out);
      scopes_.pop_back();
    }
  }

  Json* Find(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &*f;
    }
    return nullptr;
  }

  // The item `key` of `base` (an attribute, or a subscript) in place: UndefinedValue()
  // where it has none, nullptr for a character of a string (a new value). Taking anything
  // of an undefined value is an error, as in jinja2.
  const Json* Element(const Json& base, const Json& key, const Expr& e) {
    if (IsUndefined(base)) Fail(absl::StrCat(Describe(*e.a), " is undefined"));
    if (base.is_array() && key.is_number_integer()) {
      const int64_t i = Index(Integer(key, "an index"), static_cast<int64_t>(base.size()));
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
  const Json* Ref(const Expr& e) {
    Step();
    switch (e.kind) {
      case Expr::kLiteral: return &e.value;
      case Expr::kName: {
        const Json* v = Find(e.name);
        return v == nullptr ? &UndefinedValue() : v;
      }
      case Expr::kAttr:
      case Expr::kIndex: {
        if (e.kind == Expr::kIndex && e.b->kind != Expr::kLiteral && e.b->kind != Expr::kName) return nullptr;
        const Json* base = Ref(*e.a);
        if (base == nullptr) return nullptr;
        if (e.kind == Expr::kAttr) return Element(*base, Json(e.name), e);
        return Element(*base, *Ref(*e.b), e);
      }
      default: return nullptr;
    }
  }
  // `e`'s value: in place where Ref finds it, else evaluated into *own. Nothing may be
  // evaluated while the result is held.
  const Json& View(const Expr& e, Json* own) {
    if (const Json* v = Ref(e)) return *v;
    *own = Eval(e);
    return *own;
  }
  bool Truthy(const ExprP& e) {
    Json own;
    return jinja::Truthy(View(*e, &own));
  }

  Json Eval(const Expr& e) {
    Step();
    Nest nest(this);
    switch (e.kind) {
      case Expr::kLiteral: return Copy(e.value);
      case Expr::kName: {
        const Json* v = Find(e.name);
        return v == nullptr ? Undefined() : Copy(*v);
      }
      case Expr::kList: {
        Json out = Json::array();
        Items(e.args.size());
        for (const auto& a : e.args) out.push_back(Eval(*a));
        Weight(out);
        return out;
      }
      case Expr::kDict: {
        Json out = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) out[Str(Eval(*e.args[i]))] = Eval(*e.args[i + 1]);
        Weight(out);
        return out;
      }
      case Expr::kAttr:
      case Expr::kIndex: {
        // The key first: evaluating it may change the base (a macro that sets ns.x).
        const Json key = e.kind == Expr::kAttr ? Json(e.name) : Eval(*e.b);
        Json own;
        const Json& base = View(*e.a, &own);
        if (const Json* v = Element(base, key, e)) return Copy(*v);
        const std::string& s = base.get_ref<const std::string&>();
        const int64_t i = Index(Integer(key, "an index"), static_cast<int64_t>(s.size()));
        return i >= 0 && i < static_cast<int64_t>(s.size()) ? Json(std::string(1, s[static_cast<size_t>(i)])) : Undefined();
      }
      case Expr::kSlice: {
        auto opt = [this](const ExprP& x) { return x ? Eval(*x) : Json(nullptr); };
        const Json start = opt(e.args[0]), stop = opt(e.args[1]), step = opt(e.args[2]);
        Json own;
        const Json& base = View(*e.a, &own);
        if (IsUndefined(base)) Fail(absl::StrCat(Describe(*e.a), " is undefined"));
        Json out = Slice(base, start, stop, step);
        Step(Weight(out));
        return out;
      }
      case Expr::kCall: return Call(e);
      case Expr::kFilter: return Filter(e);
      case Expr::kTest: return Test(e) != e.negated;
      case Expr::kNot: return !Truthy(e.a);
      case Expr::kNeg: {
        const Json v = Eval(*e.a);
        if (v.is_number_integer()) return NoOverflow("-", 0, Integer(v, "-"));
        return -Number(v, "-");
      }
      case Expr::kTernary:
        if (Truthy(e.b)) return Eval(*e.a);
        return e.c ? Eval(*e.c) : Undefined();
      case Expr::kBinary: return Binary(e);
    }
    return Undefined();
  }

  // Integer arithmetic that fails past the 64-bit range (Python's would grow).
  static int64_t NoOverflow(const std::string& op, int64_t i, int64_t j) {
    int64_t out = 0;
    const bool overflow = op == "+"   ? __builtin_add_overflow(i, j, &out)
                          : op == "-" ? __builtin_sub_overflow(i, j, &out)
                                      : __builtin_mul_overflow(i, j, &out);
    if (overflow) Fail(absl::StrCat(op, ": past the 64-bit range"));
    return out;
  }

  Json Binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and" || op == "or") {
      Json a = Eval(*e.a);
      if (jinja::Truthy(a) == (op == "or")) return a;
      return Eval(*e.b);
    }
    // The left operand evaluated (a copy), then the right read in place: nothing is
    // evaluated after it.
    const Json a = Eval(*e.a);
    Json own;
    const Json& b = View(*e.b, &own);
    if (op == "~") {
      const std::string x = Str(a), y = Str(b);
      Checked(static_cast<double>(x.size()) + static_cast<double>(y.size()), "a string");
      return Made(x + y);
    }
    if (op == "==") return a == b;
    if (op == "!=") return !(a == b);
    if (op == "in") {
      if (b.is_string()) return a.is_string() && b.get_ref<const std::string&>().find(a.get<std::string>()) != std::string::npos;
      if (b.is_array()) {
        Step(static_cast<int64_t>(b.size()));
        return std::find(b.begin(), b.end(), a) != b.end();
      }
      if (b.is_object()) return a.is_string() && b.contains(a.get<std::string>());
      if (IsUndefined(b) || b.is_null()) Fail(absl::StrCat("'in' an undefined value"));
      return false;
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (!((a.is_number() && b.is_number()) || (a.is_string() && b.is_string()))) {
        Fail(absl::StrCat("cannot compare ", Repr(a), " and ", Repr(b)));
      }
      const bool lt = a < b, gt = b < a;
      return op == "<" ? lt : op == ">" ? gt : op == "<=" ? !gt : !lt;
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        Checked(static_cast<double>(a.get_ref<const std::string&>().size()) + static_cast<double>(b.get_ref<const std::string&>().size()), "a string");
        return Made(a.get<std::string>() + b.get<std::string>());
      }
      if (a.is_array() && b.is_array()) {
        Items(a.size() + b.size());
        Json out = a;
        for (const Json& x : b) out.push_back(Copy(x));
        return out;
      }
      if (a.is_number() && b.is_number()) {
        if (BothInts(a, b)) return NoOverflow("+", Integer(a, "+"), Integer(b, "+"));
        return a.get<double>() + b.get<double>();
      }
      Fail(absl::StrCat("cannot add ", Repr(a), " and ", Repr(b)));
    }
    if (op == "*" && a.is_string() && b.is_number_integer()) {
      const std::string& unit = a.get_ref<const std::string&>();
      const int64_t times = std::max<int64_t>(0, Integer(b, "*"));
      Checked(static_cast<double>(unit.size()) * static_cast<double>(times), "a string");
      std::string out;
      out.reserve(unit.size() * static_cast<size_t>(times));
      for (int64_t i = 0; i < times; ++i) out += unit;
      return Made(std::move(out));
    }
    const double x = Number(a, op.c_str()), y = Number(b, op.c_str());
    if (BothInts(a, b) && (op == "-" || op == "*" || op == "//" || op == "%")) {
      const int64_t i = Integer(a, op.c_str()), j = Integer(b, op.c_str());
      if (op == "-" || op == "*") return NoOverflow(op, i, j);
      if (j == 0) Fail("division by zero");
      if (j == -1) return op == "%" ? int64_t{0} : NoOverflow("-", 0, i);  // INT64_MIN / -1 traps
      const int64_t q = i / j, m = i % j;
      const bool adjust = m != 0 && ((m < 0) != (j < 0));  // Python rounds toward minus infinity
      return op == "//" ? q - (adjust ? 1 : 0) : m + (adjust ? j : 0);
    }
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (y == 0) Fail("division by zero");
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    if (op == "%") return x - y * std::floor(x / y);
    Fail(absl::StrCat("unknown operator ", op));
  }

  // Positional argument i, else keyword `key`, else `def`.
  Json Arg(const Expr& e, size_t i, const std::string& key, Json def = Undefined()) {
    if (i < e.args.size()) return Eval(*e.args[i]);
    for (const auto& [k, v] : e.kwargs) {
      if (k == key) return Eval(*v);
    }
    return def;
  }

  Json Range(const Expr& e) {
    int64_t start = 0, stop = 0, step = 1;
    if (e.args.size() == 1) {
      stop = Integer(Eval(*e.args[0]), "range");
    } else if (e.args.size() >= 2) {
      start = Integer(Eval(*e.args[0]), "range");
      stop = Integer(Eval(*e.args[1]), "range");
      if (e.args.size() > 2) step = Integer(Eval(*e.args[2]), "range");
    }
    if (step == 0) Fail("range step cannot be zero");
    // The count in 128 bits: stop - start can pass the 64-bit range.
    const __int128 span = static_cast<__int128>(stop) - start;
    const __int128 count = step > 0 ? (span > 0 ? (span + step - 1) / step : 0)
                                    : (span < 0 ? (-span + (-static_cast<__int128>(step)) - 1) / -static_cast<__int128>(step) : 0);
    if (count > static_cast<__int128>(kMaxItems)) Fail(absl::StrCat("range of more than ", kMaxItems, " numbers"));
    Step(static_cast<int64_t>(count));
    Json out = Json::array();
    for (int64_t k = 0, i = start; k < static_cast<int64_t>(count); ++k, i += step) out.push_back(i);
    return out;
  }

  Json Call(const Expr& e) {
    if (e.a->kind == Expr::kAttr) return Method(Eval(*e.a->a), e.a->name, e);
    if (e.a->kind != Expr::kName) Fail("only functions and methods can be called");
    const std::string& f = e.a->name;
    if (f == "raise_exception") Fail("raise_exception: " + Str(Arg(e, 0, "message")));
    if (f == "namespace") {
      Json ns = Json::object();
      for (const auto& a : e.args) {
        const Json d = Eval(*a);
        if (d.is_object()) ns.update(d);
      }
      for (const auto& [k, v] : e.kwargs) ns[k] = Eval(*v);
      return ns;
    }
    if (f == "range") return Range(e);
    if (f == "strftime_now") {
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), Str(Arg(e, 0, "format")).c_str(), &tm);
      return std::string(buf, n);
    }
    auto m = macros_.find(f);
    if (m == macros_.end()) Fail(absl::StrCat("unknown function ", f));
    const Node& macro = *m->second;
    Json scope = Json::object();
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [name, def] = macro.params[i];
      scope[name] = Arg(e, i, name, def ? Eval(*def) : Undefined());
    }
    scopes_.push_back(std::move(scope));
    std::string out;
    Run(macro.body, out);
    scopes_.pop_back();
    return out;
  }

  Json Method(const Json& self, const std::string& name, const Expr& e) {
    if (IsUndefined(self)) Fail(absl::StrCat(Describe(*e.a->a), " is undefined"));
    if (self.is_string()) {
      const std::string& s = self.get_ref<const std::string&>();
      if (name == "startswith" || name == "endswith") {
        const Json arg = Arg(e, 0, "prefix");
        std::vector<std::string> options;
        if (arg.is_array()) {
          for (const auto& a : arg) options.push_back(Str(a));
        } else {
          options.push_back(Str(arg));
        }
        for (const std::string& o : options) {
          const bool hit = name == "startswith" ? s.compare(0, o.size(), o) == 0
                                                : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
          if (hit) return true;
        }
        return false;
      }
      if (name == "split") {
        Json parts = SplitString(s, Arg(e, 0, "sep"));
        Items(parts.size());
        Step(static_cast<int64_t>(parts.size()));
        return parts;
      }
      if (name == "strip") return Strip(s, Arg(e, 0, "chars"), true, true);
      if (name == "lstrip") return Strip(s, Arg(e, 0, "chars"), true, false);
      if (name == "rstrip") return Strip(s, Arg(e, 0, "chars"), false, true);
      if (name == "upper" || name == "lower") return Case(s, name == "upper");
      if (name == "title") return Title(s, true);
      if (name == "capitalize") return Case(s.substr(0, 1), true) + Case(s.size() > 1 ? s.substr(1) : "", false);
      if (name == "replace") return Replaced(s, Str(Arg(e, 0, "old")), Str(Arg(e, 1, "new")));
      if (name == "join") {
        const Json items = Arg(e, 0, "iterable");
        std::vector<std::string> parts;
        for (size_t i = 0; items.is_array() && i < items.size(); ++i) parts.push_back(Str(items[i]));
        return Joined(parts, s);
      }
      if (name == "count") {
        const std::string sub = Str(Arg(e, 0, "sub"));
        int64_t n = 0;
        for (size_t i = 0; !sub.empty() && (i = s.find(sub, i)) != std::string::npos; i += sub.size()) ++n;
        return n;
      }
      if (name == "find") {
        const size_t i = s.find(Str(Arg(e, 0, "sub")));
        return i == std::string::npos ? int64_t{-1} : static_cast<int64_t>(i);
      }
    } else if (self.is_object()) {
      if (name == "items") {
        Json out = Json::array();
        for (auto it = self.begin(); it != self.end(); ++it) out.push_back(Json::array({it.key(), Copy(it.value())}));
        return out;
      }
      if (name == "keys" || name == "values") {
        Json out = Json::array();
        for (auto it = self.begin(); it != self.end(); ++it) out.push_back(name == "keys" ? Json(it.key()) : Copy(it.value()));
        return out;
      }
      if (name == "get") {
        const Json key = Arg(e, 0, "key");
        auto it = key.is_string() ? self.find(key.get<std::string>()) : self.end();
        return it == self.end() ? Arg(e, 1, "default", nullptr) : Copy(*it);
      }
    }
    Fail(absl::StrCat("no method ", name, " of ", Repr(self)));
  }

  // `s` with every `from` replaced by `to`, within the budget's bytes.
  std::string Replaced(const std::string& s, const std::string& from, const std::string& to) {
    if (from.empty()) return s;
    int64_t hits = 0;
    for (size_t i = 0; (i = s.find(from, i)) != std::string::npos; i += from.size()) ++hits;
    Checked(static_cast<double>(s.size()) + static_cast<double>(hits) * (static_cast<double>(to.size()) - static_cast<double>(from.size())), "a string");
    return Made(Replace(s, from, to));
  }
  std::string Joined(const std::vector<std::string>& parts, const std::string& sep) {
    double size = 0;
    for (const std::string& p : parts) size += static_cast<double>(p.size() + sep.size());
    Checked(size, "a string");
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
    return Made(std::move(out));
  }

  Json Filter(const Expr& e) {
    // The value read in place for a filter without arguments (nothing else is evaluated
    // while it is held); evaluated otherwise.
    Json own;
    const Json& v = e.args.empty() && e.kwargs.empty() ? View(*e.a, &own) : (own = Eval(*e.a));
    const std::string& f = e.name;
    if (f == "trim") return Strip(Str(v), Json(), true, true);
    if (f == "tojson") {
      const Json indent = Arg(e, 0, "indent");
      std::string out;
      Dump(v, indent.is_number() ? std::max<int64_t>(0, Integer(indent, "tojson's indent")) : -1, 0,
           static_cast<size_t>(b_->bytes), out);
      return Made(std::move(out));
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return static_cast<int64_t>(v.get_ref<const std::string&>().size());
      if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
      Fail(absl::StrCat("no length of ", Repr(v)));
    }
    if (f == "upper" || f == "lower") return Case(Str(v), f == "upper");
    if (f == "string" || f == "safe") return f == "safe" ? Copy(v) : Json(Made(Str(v)));
    if (f == "default" || f == "d") {
      const bool boolean = jinja::Truthy(Arg(e, 1, "boolean", false));
      return IsUndefined(v) || (boolean && !jinja::Truthy(v)) ? Arg(e, 0, "default_value", "") : Copy(v);
    }
    if (f == "first" || f == "last") {
      if (v.is_array()) return v.empty() ? Undefined() : Copy(f == "first" ? v.front() : v.back());
      if (v.is_string() && !v.get<std::string>().empty()) {
        const std::string& s = v.get_ref<const std::string&>();
        return std::string(1, f == "first" ? s.front() : s.back());
      }
      return Undefined();
    }
    if (f == "join") {
      const std::string sep = Str(Arg(e, 0, "d", ""));
      const Json attribute = Arg(e, 1, "attribute");
      std::vector<std::string> parts;
      for (size_t i = 0; v.is_array() && i < v.size(); ++i) {
        const Json item = attribute.is_string() && v[i].is_object() ? v[i].value(attribute.get<std::string>(), Json()) : v[i];
        parts.push_back(Str(item));
      }
      return Joined(parts, sep);
    }
    if (f == "reverse") {
      if (v.is_string()) return std::string(v.get<std::string>().rbegin(), v.get<std::string>().rend());
      Json out = Json::array();
      for (auto it = v.rbegin(); v.is_array() && it != v.rend(); ++it) out.push_back(Copy(*it));
      return out;
    }
    if (f == "list") {
      if (v.is_array()) return Copy(v);
      Json out = Json::array();
      if (v.is_string()) {
        Items(v.get_ref<const std::string&>().size());
        Step(static_cast<int64_t>(v.get_ref<const std::string&>().size()));
        for (char c : v.get<std::string>()) out.push_back(std::string(1, c));
      } else if (v.is_object()) {
        for (auto it = v.begin(); it != v.end(); ++it) out.push_back(it.key());
      }
      return out;
    }
    if (f == "items") return Method(v, "items", e);
    if (f == "replace") return Replaced(Str(v), Str(Arg(e, 0, "old")), Str(Arg(e, 1, "new")));
    if (f == "int" || f == "float") return NumberFilter(f, v, e);
    if (f == "abs") {
      if (!v.is_number_integer()) return std::fabs(Number(v, "abs"));
      const int64_t i = Integer(v, "abs");
      if (i == INT64_MIN) Fail("abs: past the 64-bit range");
      return std::llabs(i);
    }
    if (f == "capitalize") return Method(Json(Str(v)), "capitalize", e);
    if (f == "title") return Title(Str(v), true);
    if (f == "indent") return Indent(Str(v), e);
    if (f == "map") return MapAttribute(v, e);
    Fail(absl::StrCat("unknown filter ", f));
  }

  // |map(attribute=name): each item's attribute.
  Json MapAttribute(const Json& v, const Expr& e) {
    const Json attribute = Arg(e, 99, "attribute");
    if (!attribute.is_string()) Fail("map takes attribute=");
    if (!v.is_array()) Fail(absl::StrCat("map over ", Repr(v)));
    Json out = Json::array();
    for (const Json& item : v) {
      out.push_back(item.is_object() ? Copy(item.value(attribute.get<std::string>(), Json())) : Undefined());
    }
    return out;
  }

  // |int and |float: Python's int() and float() of the value, else the default.
  Json NumberFilter(const std::string& f, const Json& v, const Expr& e) {
    if (f == "int") {
      if (v.is_number()) return Integer(v, "int");
      int64_t out = 0;
      const std::string s = Strip(Str(v), Json(), true, true);
      auto r = std::from_chars(s.data(), s.data() + s.size(), out);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty()) return out;
      return Arg(e, 0, "default", 0);
    }
    if (v.is_number()) return v.get<double>();
    try {
      return std::stod(Str(v));
    } catch (const std::exception&) {
      return Arg(e, 0, "default", 0.0);
    }
  }

  // |indent(width, first): each line after the first (and it too with `first`) indented,
  // Python's ' ' * width: none for a width below 1.
  std::string Indent(const std::string& s, const Expr& e) {
    const int64_t width = std::max<int64_t>(0, Integer(Arg(e, 0, "width", 4), "indent's width"));
    const bool first = jinja::Truthy(Arg(e, 1, "first", false));
    const double lines = 1 + static_cast<double>(std::count(s.begin(), s.end(), '\n'));
    Checked(static_cast<double>(s.size()) + lines * static_cast<double>(width), "a string");
    const std::string pad(static_cast<size_t>(width), ' ');
    std::string out = first ? pad : "";
    for (size_t i = 0; i < s.size(); ++i) {
      out += s[i];
      if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') out += pad;
    }
    return Made(std::move(out));
  }

  bool Test(const Expr& e) {
    Json own;
    const Json& v = View(*e.a, &own);
    const auto test = Tests().find(e.name);
    if (test == Tests().end()) Fail(absl::StrCat("unknown test ", e.name));
    return test->second(v);
  }

  TemplateBudget* b_;
  int depth_ = 0;
  std::vector<Json> scopes_;  // the globals, then one per loop or macro call
  std::map<std::string, const Node*> macros_;
};

}  // namespace

// The names the parser accepts. Tests are the keys of their table; each filter and
// method name here is one Filter and Method implement, and
// ChatTemplateTest.EveryNameTheParserKnowsIsImplemented holds the two together.
const std::set<std::string>& FilterNames() {
  static const std::set<std::string> names = {
      "abs",    "capitalize", "count", "d",    "default", "first",   "float",  "indent", "int",
      "items",  "join",       "last",  "length", "list",  "lower",   "map",    "replace", "reverse",
      "safe",   "string",     "title", "tojson", "trim",  "upper"};
  return names;
}

const std::set<std::string>& TestNames() {
  static const std::set<std::string> names = [] {
    std::set<std::string> n;
    for (const auto& [name, test] : Tests()) n.insert(name);
    return n;
  }();
  return names;
}

const std::set<std::string>& MethodNames() {
  static const std::set<std::string> names = {
      "capitalize", "count", "endswith", "find",  "get",   "items",   "join",   "keys",  "lower", "lstrip",
      "replace",    "rstrip", "split",   "startswith", "strip", "title", "upper", "values"};
  return names;
}

void RenderTemplate(const Body& body, Json globals, TemplateBudget* budget, std::string* out) {
  Renderer(std::move(globals), budget).Run(body, *out);
}

}  // namespace cleave::jinja
