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
std::vector<Piece> SplitPieces(std::string t) {
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
  // `name` as one of `names` (a filter, test or method of the renderer's), else the
  // template is refused now.
  void Known(const std::set<std::string>& names, const char* what, const std::string& name) const {
    if (names.count(name)) return;
    std::string known;
    for (const std::string& n : names) absl::StrAppend(&known, known.empty() ? "" : ", ", n);
    Fail(absl::StrCat("line ", line_, ": unknown ", what, " ", name, " (known: ", known, ")"));
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
        Known(TestNames(), "test", test->name);
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
      Known(FilterNames(), "filter", f->name);
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
        if (e->kind == Expr::kAttr) Known(MethodNames(), "method", e->name);
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

}  // namespace

Body ParseTemplate(const std::string& tmpl) { return TemplateParser(SplitPieces(tmpl)).Parse(); }

}  // namespace cleave::jinja
