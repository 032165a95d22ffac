#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "data/jinja.h"

namespace cleave::jinja {

// ---- Values, as Python prints and compares them ----

std::string Quote(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == '\\' || c == q) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + q;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string Repr(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case Json::value_t::number_float: return FloatRepr(v.get<double>());
    case Json::value_t::string: return Quote(v.get<std::string>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + Repr(v[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        out += (first ? "" : ", ") + Quote(it.key()) + ": " + Repr(it.value());
        first = false;
      }
      return out + "}";
    }
    default: return "";
  }
}

// What {{ v }} prints: Python's str().
std::string Str(const Json& v) {
  if (IsUndefined(v)) return "";
  return v.is_string() ? v.get<std::string>() : Repr(v);
}

bool Truthy(const Json& v) {
  switch (v.type()) {
    case Json::value_t::boolean: return v.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return v.get<int64_t>() != 0;
    case Json::value_t::number_float: return v.get<double>() != 0;
    case Json::value_t::string:
    case Json::value_t::array:
    case Json::value_t::object: return !v.empty();
    default: return false;  // none, undefined
  }
}

// json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson writes it:
// ", " and ": " between items without an indent.
// Fails rather than grow `out` past `limit` bytes.
Status Dump(const Json& v, int64_t indent, int depth, size_t limit, std::string& out) {
  const Status too_long = Error(absl::StrCat("tojson: the text would be longer than ", limit, " bytes"));
  auto newline = [&](int d) {
    if (indent < 0) return true;
    if (static_cast<double>(out.size()) + 1 + static_cast<double>(indent) * d > static_cast<double>(limit)) {
      return false;
    }
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
    return true;
  };
  if (!v.is_array() && !v.is_object()) {
    if (v.is_number_float()) {
      out += FloatRepr(v.get<double>());
    } else if (IsUndefined(v)) {
      out += "null";
    } else {
      out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    return absl::OkStatus();
  }
  const bool array = v.is_array();
  if (v.empty()) {
    out += array ? "[]" : "{}";
    return absl::OkStatus();
  }
  out += array ? '[' : '{';
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += indent < 0 ? ", " : ",";
    first = false;
    if (!newline(depth + 1)) return too_long;
    if (!array) {
      out += Json(it.key()).dump(-1, ' ', false, Json::error_handler_t::replace);
      out += ": ";
    }
    RETURN_IF_ERROR(Dump(it.value(), indent, depth + 1, limit, out));
    if (out.size() > limit) return too_long;
  }
  if (!newline(depth)) return too_long;
  out += array ? ']' : '}';
  return absl::OkStatus();
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string Strip(const std::string& s, const Json& chars, bool left, bool right) {
  auto strip = [&chars](char c) {
    return chars.is_string() ? chars.get<std::string>().find(c) != std::string::npos : IsSpace(c);
  };
  size_t b = 0, e = s.size();
  while (left && b < e && strip(s[b])) ++b;
  while (right && e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

StatusOr<Json> SplitString(const std::string& s, const Json& sep) {
  Json out = Json::array();
  if (!sep.is_string()) {  // runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsSpace(s[i])) ++i;
      size_t j = i;
      while (j < s.size() && !IsSpace(s[j])) ++j;
      if (j > i) out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string d = sep.get<std::string>();
  if (d.empty()) return Error("split: empty separator");
  size_t i = 0;
  for (size_t j; (j = s.find(d, i)) != std::string::npos; i = j + d.size()) out.push_back(s.substr(i, j - i));
  out.push_back(s.substr(i));
  return out;
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t i = 0; (i = s.find(from, i)) != std::string::npos; i += to.size()) s.replace(i, from.size(), to);
  return s;
}

std::string Title(const std::string& s, bool every_word) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      c = start ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      start = false;
    } else {
      start = every_word;
    }
  }
  return out;
}

std::string Case(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

StatusOr<double> Number(const Json& v, const char* what) {
  if (!v.is_number()) return Error(absl::StrCat(what, " needs a number, not ", Repr(v)));
  return v.get<double>();
}

bool BothInts(const Json& a, const Json& b) { return a.is_number_integer() && b.is_number_integer(); }

int64_t Index(int64_t i, int64_t n) { return i < 0 ? (i < -n ? -1 : i + n) : i; }

// A number as a 64-bit integer (a float truncated, as Python's int() does); an error for
// anything else, an unsigned integer past the signed range, or a float past it.
StatusOr<int64_t> Integer(const Json& v, const char* what) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Error(absl::StrCat(what, ": ", v.get<uint64_t>(), " is past the 64-bit range"));
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  ASSIGN_OR_RETURN(const double d, Number(v, what));
  if (!(std::fabs(d) < 9.2e18)) return Error(absl::StrCat(what, ": ", FloatRepr(d), " is past the 64-bit range"));
  return static_cast<int64_t>(d);
}

// Python's slice of a list or a string.
StatusOr<Json> Slice(const Json& v, const Json& start, const Json& stop, const Json& step) {
  const bool text = v.is_string();
  if (!text && !v.is_array()) return Error("only lists and strings can be sliced");
  const int64_t n = text ? static_cast<int64_t>(v.get_ref<const std::string&>().size()) : static_cast<int64_t>(v.size());
  int64_t k = 1;
  if (step.is_number()) {
    ASSIGN_OR_RETURN(k, Integer(step, "a slice's step"));
  }
  if (k == 0) return Error("slice step cannot be zero");
  auto bound = [&](const Json& j, int64_t def) -> StatusOr<int64_t> {
    if (!j.is_number()) return def;
    ASSIGN_OR_RETURN(int64_t i, Integer(j, "a slice's bound"));
    if (i < 0) i = i < -n ? -1 : i + n;
    return k > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  ASSIGN_OR_RETURN(const int64_t b, bound(start, k > 0 ? 0 : n - 1));
  ASSIGN_OR_RETURN(const int64_t e, bound(stop, k > 0 ? n : -1));
  std::string s;
  Json out = Json::array();
  for (int64_t i = b; k > 0 ? i < e : i > e;) {
    if (text) {
      s += v.get_ref<const std::string&>()[i];
    } else {
      out.push_back(v[i]);
    }
    if (__builtin_add_overflow(i, k, &i)) break;  // a step past the 64-bit range ends it
  }
  return text ? Json(s) : out;
}

}  // namespace cleave::jinja
