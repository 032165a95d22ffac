// Internal to data/: the Jinja engine behind data/chat_template.h, in three parts that
// share these types: jinja_parse.cc (the template cut into text and tags, expressions
// lexed and parsed, statements nested into a Body), jinja_values.cc (values as Python
// prints, compares and converts them) and jinja_render.cc (a Body rendered within a
// TemplateBudget). Errors are TemplateError, thrown inside the engine and turned into a
// Status at its edge (data/chat_template.cc).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "data/chat_template.h"

namespace cleave::jinja {

using Json = nlohmann::json;

// Every error while parsing or rendering; caught at the engine's edge.
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void Fail(const std::string& what) { throw TemplateError(what); }

// jinja2's Undefined, as a JSON value no document holds.
inline Json Undefined() { return Json(Json::value_t::discarded); }
inline bool IsUndefined(const Json& v) { return v.is_discarded(); }

// ---- The parsed template ----

struct Expr;
using ExprP = std::shared_ptr<Expr>;
struct Expr {
  enum Kind { kLiteral, kName, kList, kDict, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kTernary } kind;
  Json value;        // kLiteral
  std::string name;  // kName, kAttr, kFilter, kTest, kBinary's operator
  ExprP a, b, c;     // operands; kSlice: start, stop, step (any null)
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negated = false;  // kTest: "is not"
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
// below): an unknown name fails here, when the template is read, not when a branch that
// uses it first runs.
Body ParseTemplate(const std::string& tmpl);

// What the renderer implements (jinja_render.cc, beside the code of each): filters
// (`x | name`), tests (`x is name`) and methods (`x.name(...)`, of strings and dicts).
const std::set<std::string>& FilterNames();
const std::set<std::string>& TestNames();
const std::set<std::string>& MethodNames();

// `body` rendered with the variables `globals` into *out, drawing on *budget
// (jinja_render.cc).
void RenderTemplate(const Body& body, Json globals, TemplateBudget* budget, std::string* out);

// ---- Values, as Python prints, compares and converts them (jinja_values.cc) ----

std::string Quote(const std::string& s);
std::string FloatRepr(double d);
std::string Repr(const Json& v);
std::string Str(const Json& v);  // what {{ v }} prints: Python's str()
bool Truthy(const Json& v);
bool IsSpace(char c);
// json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson writes it,
// failing rather than grow `out` past `limit` bytes.
void Dump(const Json& v, int64_t indent, int depth, size_t limit, std::string& out);
std::string Strip(const std::string& s, const Json& chars, bool left, bool right);
Json SplitString(const std::string& s, const Json& sep);
std::string Replace(std::string s, const std::string& from, const std::string& to);
std::string Title(const std::string& s, bool every_word);
std::string Case(std::string s, bool upper);
double Number(const Json& v, const char* what);
bool BothInts(const Json& a, const Json& b);
int64_t Index(int64_t i, int64_t n);
int64_t Integer(const Json& v, const char* what);
Json Slice(const Json& v, const Json& start, const Json& stop, const Json& step);

}  // namespace cleave::jinja
