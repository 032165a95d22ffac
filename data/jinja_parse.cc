#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "data/jinja.h"

namespace cleave::jinja {
namespace {

// ---- The template's pieces: text, {{ expressions }} and {% statements %} ----

struct Piece {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string text;
  int line;
};

bool Space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Splits the template as jinja2 with trim_blocks and lstrip_blocks does: the newline
// after a block or comment tag is dropped, the spaces and tabs before one on its line
// too, and a '-' inside a tag's delimiter strips all whitespace on that side. One
// trailing newline of the template is dropped (keep_trailing_newline off).
StatusOr<std::vector<Piece>> SplitPieces(std::string t) {
  if (!t.empty() && t.back() == '\n') t.pop_back();
  std::vector<Piece> out;
  size_t pos = 0;
  bool strip_next = false;  // the last tag ended with '-'
  // The line of position p, counted on from the last position asked (they only grow):
  // linear in the template, however many tags it has.
  size_t counted = 0;
  int line = 1;
  auto line_of = [&](size_t p) {
    line += static_cast<int>(std::count(t.begin() + counted, t.begin() + p, '\n'));
    counted = p;
    return line;
  };
  while (pos <= t.size()) {
    size_t open = t.find('{', pos);
    while (open != std::string::npos && open + 1 < t.size() && t[open + 1] != '{' && t[open + 1] != '%' &&
           t[open + 1] != '#') {
      open = t.find('{', open + 1);
    }
    if (open + 1 >= t.size()) open = std::string::npos;
    std::string text = t.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (strip_next) {
      size_t i = 0;
      while (i < text.size() && Space(text[i])) ++i;
      text.erase(0, i);
    }
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::kText, text, line_of(pos)});
      break;
    }
    const char kind = t[open + 1];
    const bool minus_left = open + 2 < t.size() && t[open + 2] == '-';
    if (minus_left) {
      while (!text.empty() && Space(text.back())) text.pop_back();
    } else if (kind != '{') {  // lstrip_blocks: the tag begins its line in the source
      size_t b = open;
      while (b > pos && (t[b - 1] == ' ' || t[b - 1] == '\t')) --b;
      const size_t cut = text.size() - std::min(text.size(), open - b);
      if (b == 0 || t[b - 1] == '\n') text.erase(cut);
    }
    if (!text.empty()) out.push_back({Piece::kText, text, line_of(pos)});
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t i = open + 2 + (minus_left ? 1 : 0);
    size_t end = std::string::npos;
    char quote = 0;
    for (; i + 1 < t.size(); ++i) {  // the closing delimiter outside string literals
      if (kind != '#' && quote == 0 && (t[i] == '\'' || t[i] == '"')) {
        quote = t[i];
      } else if (quote != 0 && t[i] == '\\') {
        ++i;
      } else if (quote != 0 && t[i] == quote) {
        quote = 0;
      } else if (quote == 0 && t.compare(i, 2, close) == 0) {
        end = i;
        break;
      }
    }
    if (end == std::string::npos) return Error(absl::StrCat("line ", line_of(open), ": an unclosed tag"));
    const bool minus_right = end > open + 2 && t[end - 1] == '-';
    std::string inner = t.substr(open + 2 + (minus_left ? 1 : 0),
                                 end - (minus_right ? 1 : 0) - (open + 2 + (minus_left ? 1 : 0)));
    if (kind != '#') out.push_back({kind == '{' ? Piece::kExpr : Piece::kStmt, inner, line_of(open)});
    pos = end + 2;
    strip_next = minus_right;
    if (!minus_right && kind != '{' && pos < t.size() && t[pos] == '\n') ++pos;  // trim_blocks
    if (pos >= t.size()) break;
  }
  return out;
}

// ---- Expressions ----

struct Token {
  enum Kind { kName, kNumber, kString, kOp, kEnd } kind;
  std::string text;
  Json value;  // numbers and strings
};

StatusOr<std::vector<Token>> Lex(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  auto err = [line](const std::string& what) { return Error(absl::StrCat("line ", line, ": ", what)); };
  while (i < s.size()) {
    const char c = s[i];
    if (Space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::kName, s.substr(i, j - i), {}});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool real = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && !real && j + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        real |= s[j] == '.';
        ++j;
      }
      // An exponent: 5e18, 1.5E-3.
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
          real = true;
          j = k;
        }
      }
      const std::string n = s.substr(i, j - i);
      Json value;
      if (real) {
        double d = 0;
        auto r = std::from_chars(n.data(), n.data() + n.size(), d);
        if (r.ec != std::errc()) return err(absl::StrCat("the number ", n, " is out of range"));
        value = d;
      } else {
        int64_t v = 0;
        auto r = std::from_chars(n.data(), n.data() + n.size(), v);
        if (r.ec != std::errc()) return err(absl::StrCat("the integer ", n, " is past the 64-bit range"));
        value = v;
      }
      out.push_back({Token::kNumber, n, std::move(value)});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        v += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == '0' ? '\0' : e;
      }
      if (j >= s.size()) return err("an unterminated string");
      out.push_back({Token::kString, v, Json(v)});
      i = j + 1;
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                   "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "="};
      bool found = false;
      for (const char* op : kOps) {
        if (s.compare(i, std::strlen(op), op) == 0) {
          out.push_back({Token::kOp, op, {}});
          i += std::strlen(op);
          found = true;
          break;
        }
      }
      if (!found) return err(absl::StrCat("unexpected '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::kEnd, "", {}});
  return out;
}


ExprP Make(Expr::Kind kind) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  return e;
}

ExprP Binary(const std::string& op, ExprP a, ExprP b) {
  auto e = Make(Expr::kBinary);
  e->name = op;
  e->a = std::move(a);
  e->b = std::move(b);
  return e;
}

// How deeply a template may nest: parentheses, lists, unary operators, blocks.
constexpr int kMaxParseDepth = 100;

// One tag's expression, parsed by recursive descent: each rule returns its expression,
// or the first error, which ends the parse.
class Parser {
 public:
  Parser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  StatusOr<ExprP> Expression() {
    Nest n(this);
    RETURN_IF_ERROR(n.status);
    return Ternary();
  }
  const Token& Peek(int ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool AtEnd() const { return Peek().kind == Token::kEnd; }
  bool Accept(const std::string& op) {
    if ((Peek().kind == Token::kOp || Peek().kind == Token::kName) && Peek().text == op) {
      ++p_;
      return true;
    }
    return false;
  }
  Status Expect(const std::string& op) {
    if (!Accept(op)) return Unexpected(absl::StrCat("expected '", op, "'"));
    return absl::OkStatus();
  }
  StatusOr<std::string> Name() {
    if (Peek().kind != Token::kName) return Unexpected("expected a name");
    return t_[p_++].text;
  }
  Status End() const { return AtEnd() ? absl::OkStatus() : Unexpected("unexpected tokens"); }
  // `what`, at the token where the parse stands.
  Status Unexpected(const std::string& what) const {
    return Error(absl::StrCat("line ", line_, ": ", what,
                              AtEnd() ? " at the end" : " at '" + Peek().text + "'"));
  }

 private:
  // One level deeper in the expression's recursive descent while it lives; an error
  // past kMaxParseDepth.
  struct Nest {
    explicit Nest(Parser* p) : p(p) {
      if (++p->depth_ > kMaxParseDepth) {
        status = p->Unexpected(absl::StrCat("an expression nested more than ", kMaxParseDepth, " deep"));
      }
    }
    ~Nest() { --p->depth_; }
    Parser* p;
    Status status;
  };

  // What `table` (the renderer's filters, tests or methods) holds for `name`, else the
  // template is refused now.
  template <typename Fn>
  StatusOr<Fn> Known(const std::map<std::string, Fn>& table, const char* what, const std::string& name) const {
    auto it = table.find(name);
    if (it != table.end()) return it->second;
    std::string known;
    for (const auto& entry : table) absl::StrAppend(&known, known.empty() ? "" : ", ", entry.first);
    return Error(absl::StrCat("line ", line_, ": unknown ", what, " ", name, " (known: ", known, ")"));
  }

  StatusOr<ExprP> Ternary() {
    ASSIGN_OR_RETURN(ExprP e, Or());
    if (Peek().kind != Token::kName || Peek().text != "if") return e;
    ++p_;
    auto t = Make(Expr::kTernary);
    t->a = e;
    ASSIGN_OR_RETURN(t->b, Or());
    if (Accept("else")) {
      ASSIGN_OR_RETURN(t->c, Ternary());
    }
    return t;
  }
  // The operands `operand` parses, joined left to right by any of `ops`.
  StatusOr<ExprP> Chain(StatusOr<ExprP> (Parser::*operand)(), std::initializer_list<const char*> ops) {
    ASSIGN_OR_RETURN(ExprP e, (this->*operand)());
    for (;;) {
      const char* op = nullptr;
      for (const char* o : ops) {
        if (op == nullptr && Accept(o)) op = o;
      }
      if (op == nullptr) return e;
      ASSIGN_OR_RETURN(ExprP b, (this->*operand)());
      e = Binary(op, e, b);
    }
  }
  StatusOr<ExprP> Or() { return Chain(&Parser::And, {"or"}); }
  StatusOr<ExprP> And() { return Chain(&Parser::Not, {"and"}); }
  StatusOr<ExprP> Not() {
    if (!Accept("not")) return Compare();
    Nest n(this);
    RETURN_IF_ERROR(n.status);
    auto e = Make(Expr::kNot);
    ASSIGN_OR_RETURN(e->a, Not());
    return e;
  }
  StatusOr<ExprP> Compare() {
    ASSIGN_OR_RETURN(ExprP e, Concat());
    for (;;) {
      const Token& k = Peek();
      if (k.kind == Token::kOp && (k.text == "==" || k.text == "!=" || k.text == "<" || k.text == ">" ||
                                   k.text == "<=" || k.text == ">=")) {
        const std::string op = t_[p_++].text;
        ASSIGN_OR_RETURN(ExprP b, Concat());
        e = Binary(op, e, b);
      } else if (k.kind == Token::kName && k.text == "in") {
        ++p_;
        ASSIGN_OR_RETURN(ExprP b, Concat());
        e = Binary("in", e, b);
      } else if (k.kind == Token::kName && k.text == "not" && Peek(1).text == "in") {
        p_ += 2;
        auto n = Make(Expr::kNot);
        ASSIGN_OR_RETURN(ExprP b, Concat());
        n->a = Binary("in", e, b);
        e = n;
      } else if (k.kind == Token::kName && k.text == "is") {
        ++p_;
        auto test = Make(Expr::kTest);
        test->negated = Accept("not");
        test->a = e;
        ASSIGN_OR_RETURN(test->name, Name());
        ASSIGN_OR_RETURN(test->test, Known(Tests(), "test", test->name));
        if (Peek().text == "(" && Peek().kind == Token::kOp) RETURN_IF_ERROR(Args(*test));
        e = test;
      } else {
        return e;
      }
    }
  }
  StatusOr<ExprP> Concat() { return Chain(&Parser::Sum, {"~"}); }
  StatusOr<ExprP> Sum() { return Chain(&Parser::Product, {"+", "-"}); }
  StatusOr<ExprP> Product() { return Chain(&Parser::Unary, {"//", "*", "/", "%"}); }
  StatusOr<ExprP> Unary() {
    Nest n(this);
    RETURN_IF_ERROR(n.status);
    if (Accept("-")) {
      auto e = Make(Expr::kNeg);
      ASSIGN_OR_RETURN(e->a, Unary());
      return e;
    }
    if (Accept("+")) return Unary();
    return Filtered();
  }
  StatusOr<ExprP> Filtered() {
    ASSIGN_OR_RETURN(ExprP primary, Primary());
    ASSIGN_OR_RETURN(ExprP e, Postfix(primary));
    while (Accept("|")) {
      auto f = Make(Expr::kFilter);
      f->a = e;
      ASSIGN_OR_RETURN(f->name, Name());
      ASSIGN_OR_RETURN(f->filter, Known(Filters(), "filter", f->name));
      if (Peek().kind == Token::kOp && Peek().text == "(") RETURN_IF_ERROR(Args(*f));
      ASSIGN_OR_RETURN(e, Postfix(f));
    }
    return e;
  }
  Status Args(Expr& call) {
    RETURN_IF_ERROR(Expect("("));
    while (!Accept(")")) {
      if (Peek().kind == Token::kName && Peek(1).kind == Token::kOp && Peek(1).text == "=") {
        ASSIGN_OR_RETURN(std::string key, Name());
        RETURN_IF_ERROR(Expect("="));
        ASSIGN_OR_RETURN(ExprP value, Expression());
        call.kwargs.emplace_back(key, value);
      } else {
        ASSIGN_OR_RETURN(ExprP value, Expression());
        call.args.push_back(value);
      }
      if (!Accept(",")) return Expect(")");
    }
    return absl::OkStatus();
  }
  StatusOr<ExprP> Postfix(ExprP e) {
    for (;;) {
      if (Accept(".")) {
        auto a = Make(Expr::kAttr);
        a->a = e;
        ASSIGN_OR_RETURN(a->name, Name());
        e = a;
      } else if (Peek().kind == Token::kOp && Peek().text == "(") {
        auto c = Make(Expr::kCall);
        if (e->kind == Expr::kAttr) {
          ASSIGN_OR_RETURN(c->method, Known(Methods(), "method", e->name));
        }
        c->a = e;
        RETURN_IF_ERROR(Args(*c));
        e = c;
      } else if (Accept("[")) {
        ASSIGN_OR_RETURN(e, Subscript(e));
      } else {
        return e;
      }
    }
  }
  // `e[...]` after its '[': an index or a slice.
  StatusOr<ExprP> Subscript(ExprP e) {
    auto is_op = [this](const char* op) { return Peek().kind == Token::kOp && Peek().text == op; };
    ExprP start, stop, step;
    bool slice = false;
    if (!is_op(":")) {
      ASSIGN_OR_RETURN(start, Expression());
    }
    if (Accept(":")) {
      slice = true;
      if (!is_op(":") && !is_op("]")) {
        ASSIGN_OR_RETURN(stop, Expression());
      }
      if (Accept(":") && !is_op("]")) {
        ASSIGN_OR_RETURN(step, Expression());
      }
    }
    RETURN_IF_ERROR(Expect("]"));
    auto s = Make(slice ? Expr::kSlice : Expr::kIndex);
    s->a = e;
    s->b = start;
    if (slice) s->args = {start, stop, step};
    return s;
  }
  // The expressions of a list, tuple or dict up to `close`, `per_item` to an item (a
  // dict's key and value, split by ':').
  Status Items(Expr& list, const char* close, int per_item) {
    while (!Accept(close)) {
      for (int i = 0; i < per_item; ++i) {
        if (i > 0) RETURN_IF_ERROR(Expect(":"));
        ASSIGN_OR_RETURN(ExprP item, Expression());
        list.args.push_back(item);
      }
      if (!Accept(",")) return Expect(close);
    }
    return absl::OkStatus();
  }
  StatusOr<ExprP> Primary() {
    const Token& k = Peek();
    if (k.kind == Token::kNumber || k.kind == Token::kString) {
      ++p_;
      auto e = Make(Expr::kLiteral);
      e->value = k.value;
      // Adjacent string literals concatenate, as in Python.
      while (e->value.is_string() && Peek().kind == Token::kString) e->value = e->value.get<std::string>() + t_[p_++].text;
      return e;
    }
    if (k.kind == Token::kName) {
      ++p_;
      auto e = Make(Expr::kLiteral);
      if (k.text == "true" || k.text == "True") {
        e->value = true;
      } else if (k.text == "false" || k.text == "False") {
        e->value = false;
      } else if (k.text == "none" || k.text == "None") {
        e->value = nullptr;
      } else {
        e->kind = Expr::kName;
        e->name = k.text;
      }
      return e;
    }
    if (Accept("(")) {
      ASSIGN_OR_RETURN(ExprP e, Expression());
      if (!Accept(",")) {
        RETURN_IF_ERROR(Expect(")"));
        return e;
      }
      auto tuple = Make(Expr::kList);  // a tuple: a list here
      tuple->args.push_back(e);
      RETURN_IF_ERROR(Items(*tuple, ")", 1));
      return tuple;
    }
    for (const auto& [open, close, kind] : {std::tuple("[", "]", Expr::kList), std::tuple("{", "}", Expr::kDict)}) {
      if (!Accept(open)) continue;
      auto list = Make(kind);
      RETURN_IF_ERROR(Items(*list, close, kind == Expr::kDict ? 2 : 1));
      return list;
    }
    return Unexpected("expected a value");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

// The pieces nested into a Body: each statement with the blocks it opens.
class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  StatusOr<Body> Parse() {
    std::string end;
    return ParseBody({}, &end);
  }

 private:
  // Parses until a statement whose first word is in `ends`, which it returns in `*end`
  // with that statement's parser left in `last_`.
  StatusOr<Body> ParseBody(const std::vector<std::string>& ends, std::string* end) {
    if (depth_ + 1 > kMaxParseDepth) return Error(absl::StrCat("blocks nested more than ", kMaxParseDepth, " deep"));
    ++depth_;
    StatusOr<Body> out = ParseBodyIn(ends, end);
    --depth_;
    return out;
  }
  StatusOr<Body> ParseBodyIn(const std::vector<std::string>& ends, std::string* end) {
    Body out;
    while (i_ < pieces_.size()) {
      const Piece& p = pieces_[i_++];
      auto n = std::make_shared<Node>();
      if (p.kind == Piece::kText) {
        n->kind = Node::kText;
        n->text = p.text;
        out.push_back(n);
        continue;
      }
      ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(p.text, p.line));
      Parser parser(std::move(tokens), p.line);
      if (p.kind == Piece::kExpr) {
        n->kind = Node::kOutput;
        ASSIGN_OR_RETURN(n->expr, parser.Expression());
        RETURN_IF_ERROR(parser.End());
        out.push_back(n);
        continue;
      }
      ASSIGN_OR_RETURN(const std::string word, parser.Name());
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
        *end = word;
        last_ = std::make_unique<Parser>(std::move(parser));
        return out;
      }
      ASSIGN_OR_RETURN(n, Statement(word, parser, p.line));
      out.push_back(n);
    }
    if (!ends.empty()) return Error(absl::StrCat("the template ends inside a block (expected ", ends.back(), ")"));
    return out;
  }

  StatusOr<std::shared_ptr<Node>> Statement(const std::string& word, Parser& parser, int line) {
    auto n = std::make_shared<Node>();
    std::string end;
    if (word == "if") {
      RETURN_IF_ERROR(If(parser, *n));
    } else if (word == "for") {
      RETURN_IF_ERROR(For(parser, *n));
    } else if (word == "set") {
      ASSIGN_OR_RETURN(std::string target, parser.Name());
      n->targets.push_back(target);
      if (parser.Accept(".")) {
        ASSIGN_OR_RETURN(std::string attribute, parser.Name());
        n->targets.push_back(attribute);
      }
      if (parser.Accept("=")) {
        n->kind = Node::kSet;
        ASSIGN_OR_RETURN(n->expr, parser.Expression());
      } else {
        n->kind = Node::kSetBlock;
        ASSIGN_OR_RETURN(n->body, ParseBody({"endset"}, &end));
      }
    } else if (word == "macro") {
      RETURN_IF_ERROR(Macro(parser, *n));
    } else if (word == "generation") {  // transformers' marker of assistant text: rendered as is
      n->kind = Node::kBlock;
      ASSIGN_OR_RETURN(n->body, ParseBody({"endgeneration"}, &end));
    } else {
      return Error(absl::StrCat("line ", line, ": unsupported statement '", word, "'"));
    }
    RETURN_IF_ERROR(parser.End());
    return n;
  }
  Status If(Parser& parser, Node& n) {
    n.kind = Node::kIf;
    ASSIGN_OR_RETURN(ExprP cond, parser.Expression());
    for (std::string end;;) {
      ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end));
      n.branches.emplace_back(cond, std::move(body));
      if (end == "elif") {
        ASSIGN_OR_RETURN(cond, last_->Expression());
      } else if (end == "else") {
        ASSIGN_OR_RETURN(n.else_body, ParseBody({"endif"}, &end));
        return absl::OkStatus();
      } else {
        return absl::OkStatus();
      }
    }
  }
  Status For(Parser& parser, Node& n) {
    n.kind = Node::kFor;
    do {
      ASSIGN_OR_RETURN(std::string target, parser.Name());
      n.targets.push_back(target);
    } while (parser.Accept(","));
    RETURN_IF_ERROR(parser.Expect("in"));
    // "for x in xs if cond" parses as a ternary without else: its condition filters.
    ASSIGN_OR_RETURN(n.expr, parser.Expression());
    if (n.expr->kind == Expr::kTernary && n.expr->c == nullptr) {
      n.filter = n.expr->b;
      n.expr = n.expr->a;
    }
    std::string end;
    ASSIGN_OR_RETURN(n.body, ParseBody({"else", "endfor"}, &end));
    if (end == "else") {
      ASSIGN_OR_RETURN(n.else_body, ParseBody({"endfor"}, &end));
    }
    return absl::OkStatus();
  }
  Status Macro(Parser& parser, Node& n) {
    n.kind = Node::kMacro;
    ASSIGN_OR_RETURN(std::string name, parser.Name());
    n.targets.push_back(name);
    RETURN_IF_ERROR(parser.Expect("("));
    while (!parser.Accept(")")) {
      ASSIGN_OR_RETURN(std::string param, parser.Name());
      ExprP def;
      if (parser.Accept("=")) {
        ASSIGN_OR_RETURN(def, parser.Expression());
      }
      n.params.emplace_back(param, def);
      if (!parser.Accept(",")) {
        RETURN_IF_ERROR(parser.Expect(")"));
        break;
      }
    }
    std::string end;
    ASSIGN_OR_RETURN(n.body, ParseBody({"endmacro"}, &end));
    return absl::OkStatus();
  }

  std::vector<Piece> pieces_;
  size_t i_ = 0;
  std::unique_ptr<Parser> last_;
  int depth_ = 0;
};

}  // namespace

StatusOr<Body> ParseTemplate(const std::string& tmpl) {
  ASSIGN_OR_RETURN(std::vector<Piece> pieces, SplitPieces(tmpl));
  return TemplateParser(std::move(pieces)).Parse();
}

}  // namespace cleave::jinja
