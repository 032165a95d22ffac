// Internal to data/: the Jinja engine behind data/chat_template.h, in three parts that
// share these types: jinja_parse.cc (the template cut into text and tags, expressions
// lexed and parsed, statements nested into a Body), jinja_values.cc (values as Python
// prints, compares and converts them) and jinja_render.cc (a Body rendered within a
// TemplateBudget), with its filters, tests and methods in tables (jinja_filters.cc).
// Every error is a Status, INVALID_ARGUMENT, that ends the parse or the render.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"

namespace cleave::jinja {

using Json = nlohmann::json;

// An error of the template's or of its data, while parsing or rendering.
inline Status Error(const std::string& what) { return absl::InvalidArgumentError(what); }

// jinja2's Undefined, as a JSON value no document holds.
inline Json Undefined() { return Json(Json::value_t::discarded); }
inline bool IsUndefined(const Json& v) { return v.is_discarded(); }

// ---- The parsed template ----

struct Expr;
using ExprP = std::shared_ptr<Expr>;
class Renderer;  // data/jinja_render.h

// A filter (`x | name(...)`) of the value x, and a method (`self.name(...)`) of a string
// or dict; each reads its arguments from the call's Expr through the renderer.
using FilterFn = StatusOr<Json> (*)(Renderer& r, const Json& x, const Expr& call);
using MethodFn = StatusOr<Json> (*)(Renderer& r, const Json& self, const Expr& call);
using TestFn = bool (*)(const Json& v);  // `x is name`

// What the renderer implements, by name (jinja_filters.cc). The parser looks each name a
// template uses up here, so an unknown one fails when the template is read, and keeps
// what it found in the Expr.
const std::map<std::string, FilterFn>& Filters();
const std::map<std::string, TestFn>& Tests();
const std::map<std::string, MethodFn>& Methods();

struct Expr {
  enum Kind { kLiteral, kName, kList, kDict, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kTernary } kind;
  Json value;        // kLiteral
  std::string name;  // kName, kAttr, kFilter, kTest, kBinary's operator
  ExprP a, b, c;     // operands; kSlice: start, stop, step (any null)
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negated = false;  // kTest: "is not"
  // What the parser found for a kFilter, a kTest, and a kCall of a method.
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  MethodFn method = nullptr;
};

struct Node;
using Body = std::vector<std::shared_ptr<Node>>;
struct Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBlock } kind;
  std::string text;                                 // kText
  ExprP expr;                                       // kOutput, kSet's value, kFor's iterable
  std::vector<std::pair<ExprP, Body>> branches;     // kIf: conditions and bodies
  Body body, else_body;                             // kFor, kSetBlock, kMacro, kBlock; else
  std::vector<std::string> targets;                 // kFor's loop variables; kSet: name[, attr]
  ExprP filter;                                     // kFor's "if"
  std::vector<std::pair<std::string, ExprP>> params;  // kMacro: names and defaults
};

// The template parsed (jinja_parse.cc): linear in its size, nested at most 100 deep.
// A filter, test or method it names must be one the renderer implements (the tables
// above): an unknown name fails here, when the template is read, not when a branch that
// uses it first runs.
StatusOr<Body> ParseTemplate(const std::string& tmpl);

// `body` rendered with the variables `globals` into *out, drawing on *budget
// (jinja_render.cc).
Status RenderTemplate(const Body& body, Json globals, TemplateBudget* budget, std::string* out);

// ---- Values, as Python prints, compares and converts them (jinja_values.cc) ----

std::string Quote(const std::string& s);
std::string FloatRepr(double d);
std::string Repr(const Json& v);
std::string Str(const Json& v);  // what {{ v }} prints: Python's str()
bool Truthy(const Json& v);
bool IsSpace(char c);
// json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson writes it,
// failing rather than grow `out` past `limit` bytes.
Status Dump(const Json& v, int64_t indent, int depth, size_t limit, std::string& out);
std::string Strip(const std::string& s, const Json& chars, bool left, bool right);
StatusOr<Json> SplitString(const std::string& s, const Json& sep);
std::string Replace(std::string s, const std::string& from, const std::string& to);
std::string Title(const std::string& s, bool every_word);
std::string Case(std::string s, bool upper);
StatusOr<double> Number(const Json& v, const char* what);
bool BothInts(const Json& a, const Json& b);
int64_t Index(int64_t i, int64_t n);
StatusOr<int64_t> Integer(const Json& v, const char* what);
StatusOr<Json> Slice(const Json& v, const Json& start, const Json& stop, const Json& step);

}  // namespace cleave::jinja
