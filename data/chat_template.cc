#include "data/chat_template.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/json.h"

namespace cleave {
namespace {

using Json = nlohmann::json;

// Every error while parsing or rendering; caught at the top (RenderChatTemplate).
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void Fail(const std::string& what) { throw TemplateError(what); }

Json Undefined() { return Json(Json::value_t::discarded); }
bool IsUndefined(const Json& v) { return v.is_discarded(); }

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
std::vector<Piece> Split(std::string t) {
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
    if (end == std::string::npos) Fail(absl::StrCat("line ", line_of(open), ": an unclosed tag"));
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

std::vector<Token> Lex(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  auto err = [line](const std::string& what) { Fail(absl::StrCat("line ", line, ": ", what)); };
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
        if (r.ec != std::errc()) err(absl::StrCat("the number ", n, " is out of range"));
        value = d;
      } else {
        int64_t v = 0;
        auto r = std::from_chars(n.data(), n.data() + n.size(), v);
        if (r.ec != std::errc()) err(absl::StrCat("the integer ", n, " is past the 64-bit range"));
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
      if (j >= s.size()) err("an unterminated string");
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
      if (!found) err(absl::StrCat("unexpected '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::kEnd, "", {}});
  return out;
}

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

ExprP Make(Expr::Kind kind) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  return e;
}

// How deeply a template may nest: parentheses, lists, unary operators, blocks.
constexpr int kMaxParseDepth = 100;

class Parser {
 public:
  Parser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  ExprP Expression() {
    Nest n(this);
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
  void Expect(const std::string& op) {
    if (!Accept(op)) Error(absl::StrCat("expected '", op, "'"));
  }
  std::string Name() {
    if (Peek().kind != Token::kName) Error("expected a name");
    return t_[p_++].text;
  }
  [[noreturn]] void Error(const std::string& what) const {
    Fail(absl::StrCat("line ", line_, ": ", what, Peek().kind == Token::kEnd ? " at the end" : " at '" + Peek().text + "'"));
  }

 private:
  // One level deeper in the expression's recursive descent while it lives.
  struct Nest {
    explicit Nest(Parser* p) : p(p) {
      if (++p->depth_ > kMaxParseDepth) p->Error(absl::StrCat("an expression nested more than ", kMaxParseDepth, " deep"));
    }
    ~Nest() { --p->depth_; }
    Parser* p;
  };

  ExprP Ternary() {
    ExprP e = Or();
    if (Peek().kind == Token::kName && Peek().text == "if") {
      ++p_;
      auto t = Make(Expr::kTernary);
      t->a = e;
      t->b = Or();
      if (Accept("else")) t->c = Ternary();
      return t;
    }
    return e;
  }
  ExprP Binary(const std::string& op, ExprP a, ExprP b) {
    auto e = Make(Expr::kBinary);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }
  ExprP Or() {
    ExprP e = And();
    while (Accept("or")) e = Binary("or", e, And());
    return e;
  }
  ExprP And() {
    ExprP e = Not();
    while (Accept("and")) e = Binary("and", e, Not());
    return e;
  }
  ExprP Not() {
    if (Accept("not")) {
      Nest n(this);
      auto e = Make(Expr::kNot);
      e->a = Not();
      return e;
    }
    return Compare();
  }
  ExprP Compare() {
    ExprP e = Concat();
    for (;;) {
      const Token& k = Peek();
      if (k.kind == Token::kOp && (k.text == "==" || k.text == "!=" || k.text == "<" || k.text == ">" ||
                                   k.text == "<=" || k.text == ">=")) {
        ++p_;
        e = Binary(k.text, e, Concat());
      } else if (k.kind == Token::kName && k.text == "in") {
        ++p_;
        e = Binary("in", e, Concat());
      } else if (k.kind == Token::kName && k.text == "not" && Peek(1).text == "in") {
        p_ += 2;
        auto n = Make(Expr::kNot);
        n->a = Binary("in", e, Concat());
        e = n;
      } else if (k.kind == Token::kName && k.text == "is") {
        ++p_;
        auto test = Make(Expr::kTest);
        test->negated = Accept("not");
        test->a = e;
        test->name = Name();
        if (Peek().text == "(" && Peek().kind == Token::kOp) Args(*test);
        e = test;
      } else {
        return e;
      }
    }
  }
  ExprP Concat() {
    ExprP e = Sum();
    while (Accept("~")) e = Binary("~", e, Sum());
    return e;
  }
  ExprP Sum() {
    ExprP e = Product();
    for (;;) {
      if (Accept("+")) {
        e = Binary("+", e, Product());
      } else if (Accept("-")) {
        e = Binary("-", e, Product());
      } else {
        return e;
      }
    }
  }
  ExprP Product() {
    ExprP e = Unary();
    for (;;) {
      std::string op;
      for (const char* o : {"//", "*", "/", "%"}) {
        if (op.empty() && Accept(o)) op = o;
      }
      if (op.empty()) return e;
      e = Binary(op, e, Unary());
    }
  }
  ExprP Unary() {
    Nest n(this);
    if (Accept("-")) {
      auto e = Make(Expr::kNeg);
      e->a = Unary();
      return e;
    }
    if (Accept("+")) return Unary();
    return Filtered();
  }
  ExprP Filtered() {
    ExprP e = Postfix(Primary());
    while (Accept("|")) {
      auto f = Make(Expr::kFilter);
      f->a = e;
      f->name = Name();
      if (Peek().kind == Token::kOp && Peek().text == "(") Args(*f);
      e = Postfix(f);
    }
    return e;
  }
  void Args(Expr& call) {
    Expect("(");
    while (!Accept(")")) {
      if (Peek().kind == Token::kName && Peek(1).kind == Token::kOp && Peek(1).text == "=") {
        std::string key = Name();
        Expect("=");
        call.kwargs.emplace_back(key, Expression());
      } else {
        call.args.push_back(Expression());
      }
      if (!Accept(",")) {
        Expect(")");
        break;
      }
    }
  }
  ExprP Postfix(ExprP e) {
    for (;;) {
      if (Accept(".")) {
        auto a = Make(Expr::kAttr);
        a->a = e;
        a->name = Name();
        e = a;
      } else if (Peek().kind == Token::kOp && Peek().text == "(") {
        auto c = Make(Expr::kCall);
        c->a = e;
        Args(*c);
        e = c;
      } else if (Accept("[")) {
        ExprP start, stop, step;
        bool slice = false;
        if (!(Peek().kind == Token::kOp && Peek().text == ":")) start = Expression();
        if (Accept(":")) {
          slice = true;
          if (!(Peek().kind == Token::kOp && (Peek().text == ":" || Peek().text == "]"))) stop = Expression();
          if (Accept(":") && !(Peek().kind == Token::kOp && Peek().text == "]")) step = Expression();
        }
        Expect("]");
        auto s = Make(slice ? Expr::kSlice : Expr::kIndex);
        s->a = e;
        s->b = start;
        if (slice) {
          s->args = {start, stop, step};
        }
        e = s;
      } else {
        return e;
      }
    }
  }
  ExprP Primary() {
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
      ExprP e = Expression();
      if (Accept(",")) {  // a tuple: a list here
        auto l = Make(Expr::kList);
        l->args.push_back(e);
        while (!Accept(")")) {
          l->args.push_back(Expression());
          if (!Accept(",")) {
            Expect(")");
            break;
          }
        }
        return l;
      }
      Expect(")");
      return e;
    }
    if (Accept("[")) {
      auto l = Make(Expr::kList);
      while (!Accept("]")) {
        l->args.push_back(Expression());
        if (!Accept(",")) {
          Expect("]");
          break;
        }
      }
      return l;
    }
    if (Accept("{")) {
      auto d = Make(Expr::kDict);
      while (!Accept("}")) {
        ExprP key = Expression();
        Expect(":");
        d->args.push_back(key);
        d->args.push_back(Expression());
        if (!Accept(",")) {
          Expect("}");
          break;
        }
      }
      return d;
    }
    Error("expected a value");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

// ---- Statements ----

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

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body Parse() {
    std::string end;
    Body body = ParseBody({}, &end);
    return body;
  }

 private:
  // Parses until a statement whose first word is in `ends`, which it returns in `*end`
  // with that statement's parser left in `last_`.
  Body ParseBody(const std::vector<std::string>& ends, std::string* end) {
    if (++depth_ > kMaxParseDepth) Fail(absl::StrCat("blocks nested more than ", kMaxParseDepth, " deep"));
    Body out = ParseBodyIn(ends, end);
    --depth_;
    return out;
  }
  Body ParseBodyIn(const std::vector<std::string>& ends, std::string* end) {
    Body out;
    while (i_ < pieces_.size()) {
      const Piece& p = pieces_[i_++];
      if (p.kind == Piece::kText) {
        auto n = std::make_shared<Node>();
        n->kind = Node::kText;
        n->text = p.text;
        out.push_back(n);
        continue;
      }
      Parser parser(Lex(p.text, p.line), p.line);
      if (p.kind == Piece::kExpr) {
        auto n = std::make_shared<Node>();
        n->kind = Node::kOutput;
        n->expr = parser.Expression();
        if (!parser.AtEnd()) parser.Error("unexpected tokens");
        out.push_back(n);
        continue;
      }
      const std::string word = parser.Name();
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
        *end = word;
        last_ = std::make_unique<Parser>(std::move(parser));
        return out;
      }
      out.push_back(Statement(word, parser, p.line));
    }
    if (!ends.empty()) Fail(absl::StrCat("the template ends inside a block (expected ", ends.back(), ")"));
    return out;
  }

  std::shared_ptr<Node> Statement(const std::string& word, Parser& parser, int line) {
    auto n = std::make_shared<Node>();
    std::string end;
    if (word == "if") {
      n->kind = Node::kIf;
      ExprP cond = parser.Expression();
      for (;;) {
        Body body = ParseBody({"elif", "else", "endif"}, &end);
        n->branches.emplace_back(cond, std::move(body));
        if (end == "elif") {
          cond = last_->Expression();
        } else if (end == "else") {
          n->else_body = ParseBody({"endif"}, &end);
          break;
        } else {
          break;
        }
      }
    } else if (word == "for") {
      n->kind = Node::kFor;
      n->targets.push_back(parser.Name());
      while (parser.Accept(",")) n->targets.push_back(parser.Name());
      parser.Expect("in");
      // "for x in xs if cond" parses as a ternary without else: its condition filters.
      n->expr = parser.Expression();
      if (n->expr->kind == Expr::kTernary && n->expr->c == nullptr) {
        n->filter = n->expr->b;
        n->expr = n->expr->a;
      }
      n->body = ParseBody({"else", "endfor"}, &end);
      if (end == "else") n->else_body = ParseBody({"endfor"}, &end);
    } else if (word == "set") {
      n->targets.push_back(parser.Name());
      if (parser.Accept(".")) n->targets.push_back(parser.Name());
      if (parser.Accept("=")) {
        n->kind = Node::kSet;
        n->expr = parser.Expression();
      } else {
        n->kind = Node::kSetBlock;
        n->body = ParseBody({"endset"}, &end);
      }
    } else if (word == "macro") {
      n->kind = Node::kMacro;
      n->targets.push_back(parser.Name());
      parser.Expect("(");
      while (!parser.Accept(")")) {
        std::string name = parser.Name();
        ExprP def;
        if (parser.Accept("=")) def = parser.Expression();
        n->params.emplace_back(name, def);
        if (!parser.Accept(",")) {
          parser.Expect(")");
          break;
        }
      }
      n->body = ParseBody({"endmacro"}, &end);
    } else if (word == "generation") {  // transformers' marker of assistant text: rendered as is
      n->kind = Node::kBlock;
      n->body = ParseBody({"endgeneration"}, &end);
    } else {
      Fail(absl::StrCat("line ", line, ": unsupported statement '", word, "'"));
    }
    if (!parser.AtEnd()) parser.Error("unexpected tokens");
    return n;
  }

  std::vector<Piece> pieces_;
  size_t i_ = 0;
  std::unique_ptr<Parser> last_;
  int depth_ = 0;
};


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
void Dump(const Json& v, int64_t indent, int depth, size_t limit, std::string& out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    if (static_cast<double>(out.size()) + 1 + static_cast<double>(indent) * d > static_cast<double>(limit)) {
      Fail(absl::StrCat("tojson: the text would be longer than ", limit, " bytes"));
    }
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  if (v.is_array() || v.is_object()) {
    const bool array = v.is_array();
    if (v.empty()) {
      out += array ? "[]" : "{}";
      return;
    }
    out += array ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += indent < 0 ? ", " : ",";
      first = false;
      newline(depth + 1);
      if (!array) {
        out += Json(it.key()).dump(-1, ' ', false, Json::error_handler_t::replace);
        out += ": ";
      }
      Dump(it.value(), indent, depth + 1, limit, out);
      if (out.size() > limit) Fail(absl::StrCat("tojson: the text would be longer than ", limit, " bytes"));
    }
    newline(depth);
    out += array ? ']' : '}';
  } else if (v.is_number_float()) {
    out += FloatRepr(v.get<double>());
  } else if (IsUndefined(v)) {
    out += "null";
  } else {
    out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

bool IsSpace(char c) { return Space(c) || c == '\v' || c == '\f'; }

std::string Strip(const std::string& s, const Json& chars, bool left, bool right) {
  auto strip = [&chars](char c) {
    return chars.is_string() ? chars.get<std::string>().find(c) != std::string::npos : IsSpace(c);
  };
  size_t b = 0, e = s.size();
  while (left && b < e && strip(s[b])) ++b;
  while (right && e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

Json Split(const std::string& s, const Json& sep) {
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
  if (d.empty()) Fail("split: empty separator");
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

double Number(const Json& v, const char* what) {
  if (!v.is_number()) Fail(absl::StrCat(what, " needs a number, not ", Repr(v)));
  return v.get<double>();
}

bool BothInts(const Json& a, const Json& b) { return a.is_number_integer() && b.is_number_integer(); }

int64_t Index(int64_t i, int64_t n) { return i < 0 ? (i < -n ? -1 : i + n) : i; }

// A number as a 64-bit integer (a float truncated, as Python's int() does); an error for
// anything else, an unsigned integer past the signed range, or a float past it.
int64_t Integer(const Json& v, const char* what) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    Fail(absl::StrCat(what, ": ", v.get<uint64_t>(), " is past the 64-bit range"));
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  const double d = Number(v, what);
  if (!(std::fabs(d) < 9.2e18)) Fail(absl::StrCat(what, ": ", FloatRepr(d), " is past the 64-bit range"));
  return static_cast<int64_t>(d);
}

// Python's slice of a list or a string.
Json Slice(const Json& v, const Json& start, const Json& stop, const Json& step) {
  const bool text = v.is_string();
  if (!text && !v.is_array()) Fail("only lists and strings can be sliced");
  const int64_t n = text ? static_cast<int64_t>(v.get_ref<const std::string&>().size()) : static_cast<int64_t>(v.size());
  const int64_t k = step.is_number() ? Integer(step, "a slice's step") : 1;
  if (k == 0) Fail("slice step cannot be zero");
  auto bound = [&](const Json& j, int64_t def) {
    if (!j.is_number()) return def;
    int64_t i = Integer(j, "a slice's bound");
    if (i < 0) i = i < -n ? -1 : i + n;
    return k > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = bound(start, k > 0 ? 0 : n - 1), e = bound(stop, k > 0 ? n : -1);
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
    return cleave::Truthy(View(*e, &own));
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
      if (cleave::Truthy(a) == (op == "or")) return a;
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
        Json parts = cleave::Split(s, Arg(e, 0, "sep"));
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
      const bool boolean = cleave::Truthy(Arg(e, 1, "boolean", false));
      return IsUndefined(v) || (boolean && !cleave::Truthy(v)) ? Arg(e, 0, "default_value", "") : Copy(v);
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
    if (f == "int") {
      if (v.is_number()) return Integer(v, "int");
      int64_t out = 0;
      const std::string s = Strip(Str(v), Json(), true, true);
      auto r = std::from_chars(s.data(), s.data() + s.size(), out);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty()) return out;
      return Arg(e, 0, "default", 0);
    }
    if (f == "float") {
      if (v.is_number()) return v.get<double>();
      try {
        return std::stod(Str(v));
      } catch (const std::exception&) {
        return Arg(e, 0, "default", 0.0);
      }
    }
    if (f == "abs") {
      if (!v.is_number_integer()) return std::fabs(Number(v, "abs"));
      const int64_t i = Integer(v, "abs");
      if (i == INT64_MIN) Fail("abs: past the 64-bit range");
      return std::llabs(i);
    }
    if (f == "capitalize") return Method(Json(Str(v)), "capitalize", e);
    if (f == "title") return Title(Str(v), true);
    if (f == "indent") {
      // Python's ' ' * width: no indent for a width below 1.
      const int64_t width = std::max<int64_t>(0, Integer(Arg(e, 0, "width", 4), "indent's width"));
      const bool first = cleave::Truthy(Arg(e, 1, "first", false));
      const std::string s = Str(v);
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
    if (f == "map") {
      const Json attribute = Arg(e, 99, "attribute");
      if (!attribute.is_string()) Fail("map takes attribute=");
      if (!v.is_array()) Fail(absl::StrCat("map over ", Repr(v)));
      Json out = Json::array();
      for (const Json& item : v) {
        out.push_back(item.is_object() ? Copy(item.value(attribute.get<std::string>(), Json())) : Undefined());
      }
      return out;
    }
    Fail(absl::StrCat("unknown filter ", f));
  }

  bool Test(const Expr& e) {
    Json own;
    const Json& v = View(*e.a, &own);
    const std::string& t = e.name;
    if (t == "defined") return !IsUndefined(v);
    if (t == "undefined") return IsUndefined(v);
    if (t == "none") return v.is_null();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_number_integer();
    if (t == "float") return v.is_number_float();
    if (t == "mapping") return v.is_object();
    if (t == "iterable") return v.is_array() || v.is_object() || v.is_string();
    if (t == "sequence") return v.is_array() || v.is_string() || v.is_object();
    if (t == "boolean") return v.is_boolean();
    if (t == "true") return v.is_boolean() && v.get<bool>();
    if (t == "false") return v.is_boolean() && !v.get<bool>();
    if (t == "odd" || t == "even") return v.is_number_integer() && (v.get<int64_t>() % 2 != 0) == (t == "odd");
    Fail(absl::StrCat("unknown test ", t));
  }

  TemplateBudget* b_;
  int depth_ = 0;
  std::vector<Json> scopes_;  // the globals, then one per loop or macro call
  std::map<std::string, const Node*> macros_;
};

}  // namespace

struct ChatTemplate::Parsed {
  Body body;
};

StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& tmpl) {
  try {
    auto parsed = std::make_shared<Parsed>();
    parsed->body = TemplateParser(Split(tmpl)).Parse();
    ChatTemplate t;
    t.parsed_ = std::move(parsed);
    return t;
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

StatusOr<std::string> ChatTemplate::Render(const std::string& context_json, TemplateBudget* budget) const {
  ASSIGN_OR_RETURN(Json context, ParseJsonObject(context_json, "a chat template's context"));
  try {
    Renderer r(std::move(context), budget);
    std::string out;
    r.Run(parsed_->body, out);
    return out;
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  } catch (const std::exception& e) {  // nlohmann's type errors: a mistyped value the template meets
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

StatusOr<std::string> RenderChatTemplate(const std::string& tmpl, const std::string& context_json) {
  ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(tmpl));
  TemplateBudget budget;
  return t.Render(context_json, &budget);
}

}  // namespace cleave
