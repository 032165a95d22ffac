// Internal to data/: the renderer of a parsed template (data/jinja.h), as its statements
// and expressions (jinja_render.cc) and its filters and methods (jinja_filters.cc) share
// it. Everything it makes is charged to the TemplateBudget: a step for each node it
// evaluates and for every 8 bytes it copies, its bytes and depth bounded; the first error
// (a Status, INVALID_ARGUMENT) ends the render.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/jinja.h"

namespace cleave::jinja {

class Renderer {
 public:
  Renderer(Json globals, TemplateBudget* budget) : b_(budget) { scopes_.push_back(std::move(globals)); }

  Status Run(const Body& body, std::string& out);

  // ---- For filters and methods ----

  StatusOr<Json> Eval(const Expr& e);
  // `e`'s value: in place where it is a name, literal, attribute or subscript by one
  // (nothing evaluated, nothing copied), else evaluated into *own. Nothing may be
  // evaluated while the result is held.
  StatusOr<const Json*> View(const Expr& e, Json* own);
  // A call's positional argument i, else its keyword `key`, else `def`.
  StatusOr<Json> Arg(const Expr& call, size_t i, const std::string& key, Json def = Undefined());

  // n steps of the budget's; an error once they are spent.
  Status Step(int64_t n = 1);
  // `v` copied, a step for its every element and 8 bytes of text.
  StatusOr<Json> Copy(const Json& v);
  // `s`, a string this render made: at most the budget's bytes, and a step for every 8.
  StatusOr<Json> Made(std::string s);
  // An error where a string of `bytes` would pass the budget's bytes.
  Status Checked(double bytes, const char* what) const;
  // An error for a list of more than kMaxItems.
  static Status Items(size_t n);
  // What copying `v` costs: its elements, and a step for every 8 bytes of text; an error
  // for a value nested deeper than the budget allows.
  StatusOr<int64_t> Weight(const Json& v, int depth = 0) const;
  int64_t Bytes() const { return b_->bytes; }

  // `s` with every `from` replaced by `to`; `parts` joined by `sep`: both within the
  // budget's bytes.
  StatusOr<Json> Replaced(const std::string& s, const std::string& from, const std::string& to);
  StatusOr<Json> Joined(const std::vector<std::string>& parts, const std::string& sep);

  static constexpr size_t kMaxItems = 1'000'000;

 private:
  // One level deeper (a statement, an expression) while it lives; `status` an error past
  // the budget's depth.
  struct Nest {
    explicit Nest(Renderer* r);
    ~Nest() { --r->depth_; }
    Renderer* r;
    Status status;
  };

  Status Append(std::string& out, const std::string& s) const;
  Status Exec(const Node& n, std::string& out);
  Status Set(const Node& n, Json value);
  Status For(const Node& n, std::string& out);
  StatusOr<std::vector<Json>> LoopItems(const Node& n);
  Status Bind(const Node& n, Json& scope, const Json& item) const;
  Json* Find(const std::string& name);
  StatusOr<const Json*> Element(const Json& base, const Json& key, const Expr& e);
  StatusOr<const Json*> Ref(const Expr& e);
  StatusOr<bool> Truthy(const ExprP& e);
  StatusOr<Json> Index(const Expr& e);
  StatusOr<Json> SliceOf(const Expr& e);
  StatusOr<Json> Binary(const Expr& e);
  StatusOr<Json> Arithmetic(const std::string& op, const Json& a, const Json& b);
  StatusOr<Json> Range(const Expr& e);
  StatusOr<Json> Call(const Expr& e);
  StatusOr<Json> CallMacro(const Node& macro, const Expr& e);
  StatusOr<Json> Filter(const Expr& e);
  StatusOr<bool> Test(const Expr& e);

  TemplateBudget* b_;
  int depth_ = 0;
  std::vector<Json> scopes_;  // the globals, then one per loop or macro call
  std::map<std::string, const Node*> macros_;
};

// "messages[0].content" for a name, attribute or subscript chain; "a value" otherwise.
std::string Describe(const Expr& e);

}  // namespace cleave::jinja
