// The filters, tests and methods a template may name, each in its table: the parser
// looks a name up here when it reads the template (data/jinja.h), the renderer calls what
// it found.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "data/jinja_render.h"

namespace cleave::jinja {
namespace {

// ---- Methods of strings ----

// `call` (of a method: its callee is the attribute that names it) made on `self`, which
// has no such method.
StatusOr<Json> NoMethod(const Json& self, const Expr& call) {
  return Error(absl::StrCat("no method ", call.a->name, " of ", Repr(self)));
}

// A method of strings only: `body` of the string, else no such method.
template <typename Body>
StatusOr<Json> OfString(const Json& self, const Expr& call, Body body) {
  if (!self.is_string()) return NoMethod(self, call);
  return body(self.get_ref<const std::string&>());
}

StatusOr<Json> Affix(Renderer& r, const Json& self, const Expr& call, bool prefix) {
  return OfString(self, call, [&](const std::string& s) -> StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json arg, r.Arg(call, 0, "prefix"));
    std::vector<std::string> options;
    if (arg.is_array()) {
      for (const auto& a : arg) options.push_back(Str(a));
    } else {
      options.push_back(Str(arg));
    }
    for (const std::string& o : options) {
      const bool hit = prefix ? s.compare(0, o.size(), o) == 0
                              : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
      if (hit) return true;
    }
    return false;
  });
}

StatusOr<Json> StripMethod(Renderer& r, const Json& self, const Expr& call, bool left, bool right) {
  return OfString(self, call, [&](const std::string& s) -> StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json chars, r.Arg(call, 0, "chars"));
    return Strip(s, chars, left, right);
  });
}

StatusOr<Json> SplitMethod(Renderer& r, const Json& self, const Expr& call) {
  return OfString(self, call, [&](const std::string& s) -> StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json sep, r.Arg(call, 0, "sep"));
    ASSIGN_OR_RETURN(Json parts, SplitString(s, sep));
    RETURN_IF_ERROR(Renderer::Items(parts.size()));
    RETURN_IF_ERROR(r.Step(static_cast<int64_t>(parts.size())));
    return parts;
  });
}

StatusOr<Json> ReplaceMethod(Renderer& r, const Json& self, const Expr& call) {
  return OfString(self, call, [&](const std::string& s) -> StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json from, r.Arg(call, 0, "old"));
    ASSIGN_OR_RETURN(const Json to, r.Arg(call, 1, "new"));
    return r.Replaced(s, Str(from), Str(to));
  });
}

StatusOr<Json> JoinMethod(Renderer& r, const Json& self, const Expr& call) {
  return OfString(self, call, [&](const std::string& s) -> StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json items, r.Arg(call, 0, "iterable"));
    std::vector<std::string> parts;
    for (size_t i = 0; items.is_array() && i < items.size(); ++i) parts.push_back(Str(items[i]));
    return r.Joined(parts, s);
  });
}

StatusOr<Json> CountMethod(Renderer& r, const Json& self, const Expr& call) {
  return OfString(self, call, [&](const std::string& s) -> StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json arg, r.Arg(call, 0, "sub"));
    const std::string sub = Str(arg);
    int64_t n = 0;
    for (size_t i = 0; !sub.empty() && (i = s.find(sub, i)) != std::string::npos; i += sub.size()) ++n;
    return n;
  });
}

StatusOr<Json> FindMethod(Renderer& r, const Json& self, const Expr& call) {
  return OfString(self, call, [&](const std::string& s) -> StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json sub, r.Arg(call, 0, "sub"));
    const size_t i = s.find(Str(sub));
    return i == std::string::npos ? int64_t{-1} : static_cast<int64_t>(i);
  });
}

// ---- Methods of dicts ----

// Each (key, value) of a dict as [key, value], its key or its value; the method `name`
// of nothing else.
enum class Part { kItem, kKey, kValue };
StatusOr<Json> DictParts(Renderer& r, const Json& self, const char* name, Part part) {
  if (!self.is_object()) return Error(absl::StrCat("no method ", name, " of ", Repr(self)));
  Json out = Json::array();
  for (auto it = self.begin(); it != self.end(); ++it) {
    if (part == Part::kKey) {
      out.push_back(it.key());
      continue;
    }
    ASSIGN_OR_RETURN(Json value, r.Copy(it.value()));
    out.push_back(part == Part::kItem ? Json::array({it.key(), std::move(value)}) : std::move(value));
  }
  return out;
}

StatusOr<Json> GetMethod(Renderer& r, const Json& self, const Expr& call) {
  if (!self.is_object()) return NoMethod(self, call);
  ASSIGN_OR_RETURN(const Json key, r.Arg(call, 0, "key"));
  auto it = key.is_string() ? self.find(key.get<std::string>()) : self.end();
  return it == self.end() ? r.Arg(call, 1, "default", nullptr) : r.Copy(*it);
}

// A method of strings that takes no arguments: `f` of the string.
template <std::string (*f)(const std::string&)>
StatusOr<Json> Plain(Renderer&, const Json& self, const Expr& call) {
  return OfString(self, call, [](const std::string& s) -> StatusOr<Json> { return f(s); });
}
std::string Upper(const std::string& s) { return Case(s, true); }
std::string Lower(const std::string& s) { return Case(s, false); }
std::string TitleOf(const std::string& s) { return Title(s, true); }
std::string CapitalizeOf(const std::string& s) {
  return Case(s.substr(0, 1), true) + Case(s.size() > 1 ? s.substr(1) : "", false);
}

// ---- Filters ----

StatusOr<Json> ToJson(Renderer& r, const Json& v, const Expr& call) {
  ASSIGN_OR_RETURN(const Json indent, r.Arg(call, 0, "indent"));
  int64_t width = -1;
  if (indent.is_number()) {
    ASSIGN_OR_RETURN(const int64_t given, Integer(indent, "tojson's indent"));
    width = std::max<int64_t>(0, given);
  }
  std::string out;
  RETURN_IF_ERROR(Dump(v, width, 0, static_cast<size_t>(r.Bytes()), out));
  return r.Made(std::move(out));
}

StatusOr<Json> Length(Renderer&, const Json& v, const Expr&) {
  if (v.is_string()) return static_cast<int64_t>(v.get_ref<const std::string&>().size());
  if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
  return Error(absl::StrCat("no length of ", Repr(v)));
}

StatusOr<Json> Default(Renderer& r, const Json& v, const Expr& call) {
  ASSIGN_OR_RETURN(const Json boolean, r.Arg(call, 1, "boolean", false));
  if (IsUndefined(v) || (jinja::Truthy(boolean) && !jinja::Truthy(v))) return r.Arg(call, 0, "default_value", "");
  return r.Copy(v);
}

StatusOr<Json> End(Renderer& r, const Json& v, bool first) {
  if (v.is_array()) {
    if (v.empty()) return Undefined();
    return r.Copy(first ? v.front() : v.back());
  }
  if (v.is_string() && !v.get_ref<const std::string&>().empty()) {
    const std::string& s = v.get_ref<const std::string&>();
    return std::string(1, first ? s.front() : s.back());
  }
  return Undefined();
}

StatusOr<Json> Join(Renderer& r, const Json& v, const Expr& call) {
  ASSIGN_OR_RETURN(const Json sep, r.Arg(call, 0, "d", ""));
  ASSIGN_OR_RETURN(const Json attribute, r.Arg(call, 1, "attribute"));
  std::vector<std::string> parts;
  for (size_t i = 0; v.is_array() && i < v.size(); ++i) {
    const bool pick = attribute.is_string() && v[i].is_object();
    parts.push_back(Str(pick ? v[i].value(attribute.get<std::string>(), Json()) : v[i]));
  }
  return r.Joined(parts, Str(sep));
}

StatusOr<Json> Reverse(Renderer& r, const Json& v, const Expr&) {
  if (v.is_string()) return std::string(v.get_ref<const std::string&>().rbegin(), v.get_ref<const std::string&>().rend());
  Json out = Json::array();
  for (auto it = v.rbegin(); v.is_array() && it != v.rend(); ++it) {
    ASSIGN_OR_RETURN(Json item, r.Copy(*it));
    out.push_back(std::move(item));
  }
  return out;
}

StatusOr<Json> List(Renderer& r, const Json& v, const Expr&) {
  if (v.is_array()) return r.Copy(v);
  Json out = Json::array();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    RETURN_IF_ERROR(Renderer::Items(s.size()));
    RETURN_IF_ERROR(r.Step(static_cast<int64_t>(s.size())));
    for (char c : s) out.push_back(std::string(1, c));
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) out.push_back(it.key());
  }
  return out;
}

// |int: Python's int() of the value, else the default.
StatusOr<Json> Int(Renderer& r, const Json& v, const Expr& call) {
  if (v.is_number()) {
    ASSIGN_OR_RETURN(const int64_t i, Integer(v, "int"));
    return i;
  }
  int64_t out = 0;
  const std::string s = Strip(Str(v), Json(), true, true);
  auto parsed = std::from_chars(s.data(), s.data() + s.size(), out);
  if (parsed.ec == std::errc() && parsed.ptr == s.data() + s.size() && !s.empty()) return out;
  return r.Arg(call, 0, "default", 0);
}

// |float: the number the value's text begins with (as std::stod reads it), else the
// default.
StatusOr<Json> Float(Renderer& r, const Json& v, const Expr& call) {
  if (v.is_number()) return v.get<double>();
  const std::string s = Str(v);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() && errno != ERANGE) return d;
  return r.Arg(call, 0, "default", 0.0);
}

StatusOr<Json> Abs(Renderer&, const Json& v, const Expr&) {
  if (!v.is_number_integer()) {
    ASSIGN_OR_RETURN(const double d, Number(v, "abs"));
    return std::fabs(d);
  }
  ASSIGN_OR_RETURN(const int64_t i, Integer(v, "abs"));
  if (i == INT64_MIN) return Error("abs: past the 64-bit range");
  return std::llabs(i);
}

// |indent(width, first): each line after the first (and it too with `first`) indented,
// Python's ' ' * width: none for a width below 1.
StatusOr<Json> Indent(Renderer& r, const Json& v, const Expr& call) {
  const std::string s = Str(v);
  ASSIGN_OR_RETURN(const Json width_arg, r.Arg(call, 0, "width", 4));
  ASSIGN_OR_RETURN(const int64_t given, Integer(width_arg, "indent's width"));
  const int64_t width = std::max<int64_t>(0, given);
  ASSIGN_OR_RETURN(const Json first, r.Arg(call, 1, "first", false));
  const double lines = 1 + static_cast<double>(std::count(s.begin(), s.end(), '\n'));
  RETURN_IF_ERROR(r.Checked(static_cast<double>(s.size()) + lines * static_cast<double>(width), "a string"));
  const std::string pad(static_cast<size_t>(width), ' ');
  std::string out = jinja::Truthy(first) ? pad : "";
  for (size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') out += pad;
  }
  return r.Made(std::move(out));
}

// |map(attribute=name): each item's attribute.
StatusOr<Json> Map(Renderer& r, const Json& v, const Expr& call) {
  ASSIGN_OR_RETURN(const Json attribute, r.Arg(call, 99, "attribute"));
  if (!attribute.is_string()) return Error("map takes attribute=");
  if (!v.is_array()) return Error(absl::StrCat("map over ", Repr(v)));
  Json out = Json::array();
  for (const Json& item : v) {
    if (!item.is_object()) {
      out.push_back(Undefined());
      continue;
    }
    ASSIGN_OR_RETURN(Json value, r.Copy(item.value(attribute.get<std::string>(), Json())));
    out.push_back(std::move(value));
  }
  return out;
}

// A filter of the value as a string: `f` of it.
template <std::string (*f)(const std::string&)>
StatusOr<Json> OfStr(Renderer&, const Json& v, const Expr&) {
  return f(Str(v));
}
std::string Trim(const std::string& s) { return Strip(s, Json(), true, true); }

}  // namespace

const std::map<std::string, FilterFn>& Filters() {
  static const auto* filters = new std::map<std::string, FilterFn>{
      {"abs", Abs},
      {"capitalize", OfStr<CapitalizeOf>},
      {"count", Length},
      {"d", Default},
      {"default", Default},
      {"first", [](Renderer& r, const Json& v, const Expr&) { return End(r, v, true); }},
      {"float", Float},
      {"indent", Indent},
      {"int", Int},
      {"items", [](Renderer& r, const Json& v, const Expr&) { return DictParts(r, v, "items", Part::kItem); }},
      {"join", Join},
      {"last", [](Renderer& r, const Json& v, const Expr&) { return End(r, v, false); }},
      {"length", Length},
      {"list", List},
      {"lower", OfStr<Lower>},
      {"map", Map},
      {"replace",
       [](Renderer& r, const Json& v, const Expr& call) { return ReplaceMethod(r, Json(Str(v)), call); }},
      {"reverse", Reverse},
      {"safe", [](Renderer& r, const Json& v, const Expr&) { return r.Copy(v); }},
      {"string", [](Renderer& r, const Json& v, const Expr&) { return r.Made(Str(v)); }},
      {"title", OfStr<TitleOf>},
      {"tojson", ToJson},
      {"trim", OfStr<Trim>},
      {"upper", OfStr<Upper>},
  };
  return *filters;
}

const std::map<std::string, TestFn>& Tests() {
  static const auto* tests = new std::map<std::string, TestFn>{
      {"boolean", [](const Json& v) { return v.is_boolean(); }},
      {"defined", [](const Json& v) { return !IsUndefined(v); }},
      {"even", [](const Json& v) { return v.is_number_integer() && v.get<int64_t>() % 2 == 0; }},
      {"false", [](const Json& v) { return v.is_boolean() && !v.get<bool>(); }},
      {"float", [](const Json& v) { return v.is_number_float(); }},
      {"integer", [](const Json& v) { return v.is_number_integer(); }},
      {"iterable", [](const Json& v) { return v.is_array() || v.is_object() || v.is_string(); }},
      {"mapping", [](const Json& v) { return v.is_object(); }},
      {"none", [](const Json& v) { return v.is_null(); }},
      {"number", [](const Json& v) { return v.is_number(); }},
      {"odd", [](const Json& v) { return v.is_number_integer() && v.get<int64_t>() % 2 != 0; }},
      {"sequence", [](const Json& v) { return v.is_array() || v.is_string() || v.is_object(); }},
      {"string", [](const Json& v) { return v.is_string(); }},
      {"true", [](const Json& v) { return v.is_boolean() && v.get<bool>(); }},
      {"undefined", [](const Json& v) { return IsUndefined(v); }},
  };
  return *tests;
}

const std::map<std::string, MethodFn>& Methods() {
  static const auto* methods = new std::map<std::string, MethodFn>{
      {"capitalize", Plain<CapitalizeOf>},
      {"count", CountMethod},
      {"endswith", [](Renderer& r, const Json& s, const Expr& call) { return Affix(r, s, call, false); }},
      {"find", FindMethod},
      {"get", GetMethod},
      {"items", [](Renderer& r, const Json& d, const Expr&) { return DictParts(r, d, "items", Part::kItem); }},
      {"join", JoinMethod},
      {"keys", [](Renderer& r, const Json& d, const Expr&) { return DictParts(r, d, "keys", Part::kKey); }},
      {"lower", Plain<Lower>},
      {"lstrip", [](Renderer& r, const Json& s, const Expr& call) { return StripMethod(r, s, call, true, false); }},
      {"replace", ReplaceMethod},
      {"rstrip", [](Renderer& r, const Json& s, const Expr& call) { return StripMethod(r, s, call, false, true); }},
      {"split", SplitMethod},
      {"startswith", [](Renderer& r, const Json& s, const Expr& call) { return Affix(r, s, call, true); }},
      {"strip", [](Renderer& r, const Json& s, const Expr& call) { return StripMethod(r, s, call, true, true); }},
      {"title", Plain<TitleOf>},
      {"upper", Plain<Upper>},
      {"values", [](Renderer& r, const Json& d, const Expr&) { return DictParts(r, d, "values", Part::kValue); }},
  };
  return *methods;
}

}  // namespace cleave::jinja
