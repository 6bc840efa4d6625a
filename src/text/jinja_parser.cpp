// The Jinja parser: tokens -> Program, a transcription of jinja2/parser.py's recursive descent (same
// precedence: condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < postfix/filters).
#include <algorithm>
#include <set>

#include "dsinfer/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace dsi::jinja {

namespace {

// Nesting limits, so that a hostile template can neither overflow the stack while being parsed
// (parentheses, `not not ...`, nested blocks recurse) nor build an expression tree so tall that
// evaluating or freeing it recurses too deep (a chain `a + a + ... + a` nests without recursing).
// jinja2 itself stops far earlier (Python's recursion limit); chat templates nest a few levels.
constexpr int kMaxNesting = 200;

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& name) : toks_(std::move(toks)), name_(name) {}

  Body parse_template() {
    Body body = subparse({});
    return body;
  }

 private:
  // ---- token stream -------------------------------------------------------------------------------
  const Token& cur() const { return toks_[i_]; }
  const Token& look() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void error(const std::string& msg, int line = 0) const {
    fail("{}:{}: {}", name_, line ? line : cur().line, msg);
  }

  void expect_op(const char* op) {
    if (is_op(op)) {
      next();
      return;
    }
    if (cur().type == Tok::kEof) error(std::string("unexpected end of template, expected '") + op + "'.");
    error(std::string("expected token '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) {
      if (cur().type == Tok::kEof) error("unexpected end of template, expected 'name'.");
      error("expected token 'name', got " + describe(cur()));
    }
    return next().text;
  }
  void expect_name(const char* n) {
    if (is_name(n)) {
      next();
      return;
    }
    if (cur().type == Tok::kEof) error(std::string("unexpected end of template, expected '") + n + "'.");
    error(std::string("expected token '") + n + "', got " + describe(cur()));
  }
  void expect_type(Tok t, const char* what) {
    if (cur().type == t) {
      next();
      return;
    }
    if (cur().type == Tok::kEof) error(std::string("unexpected end of template, expected '") + what + "'.");
    error(std::string("expected token '") + what + "', got " + describe(cur()));
  }
  void expect_block_end() { expect_type(Tok::kBlockEnd, "end of statement block"); }

  // Counts one level of parser recursion for its lifetime.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxNesting) {
        p.error("the template nests too deeply (more than " + std::to_string(kMaxNesting) + " levels)");
      }
    }
    ~Nest() { --p.nesting_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
  };

  // Sets e's depth from its children's, refusing trees taller than kMaxNesting.
  ExprPtr fin(ExprPtr e) {
    int d = 0;
    auto see = [&d](const ExprPtr& c) {
      if (c) d = std::max(d, c->depth);
    };
    see(e->a);
    see(e->b);
    for (const auto& c : e->items) see(c);
    for (const auto& kv : e->kwargs) see(kv.second);
    e->depth = d + 1;
    if (e->depth > kMaxNesting) {
      error("the expression nests too deeply (more than " + std::to_string(kMaxNesting) + " levels)", e->line);
    }
    return e;
  }

  static ExprPtr make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  static NodePtr make_node(NodeKind k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
  }

  // ---- statements ---------------------------------------------------------------------------------
  Body subparse(const std::vector<std::string>& ends) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kData) {
        auto n = make_node(NodeKind::kText, t.line);
        n->text = t.text;
        body.push_back(std::move(n));
        next();
      } else if (t.type == Tok::kVarBegin) {
        next();
        auto n = make_node(NodeKind::kPrint, t.line);
        n->expr = parse_tuple(true, false, {});
        expect_type(Tok::kVarEnd, "end of print statement");
        body.push_back(std::move(n));
      } else if (t.type == Tok::kBlockBegin) {
        next();
        if (cur().type == Tok::kName) {
          for (const auto& e : ends)
            if (cur().text == e) return body;
        }
        body.push_back(parse_statement());
        expect_block_end();
      } else if (t.type == Tok::kEof) {
        if (!ends.empty()) fail_eof(ends);
        return body;
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  [[noreturn]] void fail_eof(const std::vector<std::string>& ends) {
    std::string looking;
    for (size_t k = 0; k < ends.size(); ++k) looking += (k ? " or '" : "'") + ends[k] + "'";
    std::string msg = "Unexpected end of template. Jinja was looking for the following tags: " + looking + ".";
    if (!stack_.empty()) msg += " The innermost block that needs to be closed is '" + stack_.back() + "'.";
    error(msg);
  }

  // Parses "%}" then statements until one of `ends`; leaves the end tag's name as the current token
  // (consumed too when drop_needle).
  Body parse_statements(const std::vector<std::string>& ends, bool drop_needle) {
    skip_op(":");
    expect_block_end();
    Body body = subparse(ends);
    if (cur().type == Tok::kEof) fail_eof(ends);
    if (drop_needle) next();
    return body;
  }

  NodePtr parse_statement() {
    const Nest nest(*this);
    const Token& t = cur();
    if (t.type != Tok::kName) error("tag name expected");
    static const std::set<std::string> kKnown = {"for", "if", "set", "macro", "call", "filter", "with",
                                                 "break", "continue", "generation", "print"};
    if (!kKnown.count(t.text)) {
      std::string msg = "Encountered unknown tag '" + t.text + "'.";
      error(msg);
    }
    stack_.push_back(t.text);
    NodePtr n;
    const std::string tag = t.text;
    if (tag == "for") {
      n = parse_for();
    } else if (tag == "if") {
      n = parse_if();
    } else if (tag == "set") {
      n = parse_set();
    } else if (tag == "macro") {
      n = parse_macro();
    } else if (tag == "call") {
      n = parse_call_block();
    } else if (tag == "filter") {
      n = parse_filter_block();
    } else if (tag == "with") {
      n = parse_with();
    } else if (tag == "break" || tag == "continue") {
      if (loops_ == 0) error("'" + tag + "' outside loop");
      n = make_node(tag == "break" ? NodeKind::kBreak : NodeKind::kContinue, next().line);
    } else if (tag == "generation") {
      // HF's AssistantTracker: the body renders through a call block (its own scope).
      n = make_node(NodeKind::kScope, next().line);
      n->body = parse_statements({"endgeneration"}, true);
    } else {  // print
      n = make_node(NodeKind::kPrint, next().line);
      n->expr = parse_tuple(true, false, {});
    }
    stack_.pop_back();
    return n;
  }

  // Assignment targets: a name, names separated by commas (optionally parenthesised), or ns.attr.
  void parse_assign_target(Node& n, bool with_namespace, const std::vector<std::string>& extra_end) {
    if (with_namespace && cur().type == Tok::kName && look().type == Tok::kOp && look().text == ".") {
      n.targets.push_back(next().text);
      next();
      n.name = expect_name();
      n.ns_attr = true;
      return;
    }
    const bool paren = skip_op("(");
    while (true) {
      if (cur().type != Tok::kName) {
        if (cur().type == Tok::kEof) error("unexpected end of template, expected 'name'.");
        error("can't assign to " + describe(cur()));
      }
      const std::string nm = next().text;
      if (nm == "true" || nm == "false" || nm == "none" || nm == "True" || nm == "False" || nm == "None") {
        error("can't assign to 'const'");
      }
      n.targets.push_back(nm);
      if (!is_op(",")) break;
      next();
      n.unpack = true;
      if (paren && is_op(")")) break;
      bool at_end = cur().type == Tok::kBlockEnd || is_op("=") || is_op("|");
      for (const auto& e : extra_end) at_end = at_end || is_name(e.c_str());
      if (at_end) break;
    }
    if (paren) {
      expect_op(")");
      n.unpack = n.unpack || n.targets.size() > 1;
    }
  }

  NodePtr parse_for() {
    auto n = make_node(NodeKind::kFor, next().line);
    parse_assign_target(*n, false, {"in"});
    expect_name("in");
    n->expr = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) n->filter = parse_expression(true);
    if (skip_name("recursive")) error("recursive for loops are not supported", n->line);
    ++loops_;
    n->body = parse_statements({"endfor", "else"}, false);
    --loops_;
    if (next().text == "else") n->else_body = parse_statements({"endfor"}, true);
    return n;
  }

  NodePtr parse_if() {
    auto n = make_node(NodeKind::kIf, next().line);
    while (true) {
      n->conds.push_back(parse_tuple(false, false, {}));
      n->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
      const std::string t = next().text;
      if (t == "elif") continue;
      if (t == "else") n->else_body = parse_statements({"endif"}, true);
      break;
    }
    return n;
  }

  NodePtr parse_set() {
    const int line = next().line;
    auto n = make_node(NodeKind::kSet, line);
    parse_assign_target(*n, true, {});
    if (skip_op("=")) {
      n->expr = parse_tuple(true, false, {});
      return n;
    }
    if (n->unpack) error("can't assign a block to a tuple", line);
    n->kind = NodeKind::kSetBlock;
    if (is_op("|")) n->filter = parse_filter(nullptr, false);
    n->body = parse_statements({"endset"}, true);
    return n;
  }

  void parse_signature(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.params.empty()) expect_op(",");
      Param p;
      p.name = expect_name();
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
      } else if (!n.params.empty() && n.params.back().default_value) {
        error("non-default argument follows default argument");
      }
      n.params.push_back(std::move(p));
    }
    expect_op(")");
  }

  NodePtr parse_macro() {
    auto n = make_node(NodeKind::kMacro, next().line);
    n->name = expect_name();
    parse_signature(*n);
    const int saved_loops = loops_;
    loops_ = 0;  // a macro body is a function: break/continue cannot reach an enclosing loop
    n->body = parse_statements({"endmacro"}, true);
    loops_ = saved_loops;
    n->catch_varargs = names(n->body, "varargs");
    n->catch_kwargs = names(n->body, "kwargs");
    return n;
  }

  NodePtr parse_call_block() {
    auto n = make_node(NodeKind::kCallBlock, next().line);
    if (is_op("(")) parse_signature(*n);
    n->expr = parse_expression(true);
    if (n->expr->kind != ExprKind::kCall) error("expected call", n->line);
    const int saved_loops = loops_;
    loops_ = 0;
    n->body = parse_statements({"endcall"}, true);
    loops_ = saved_loops;
    n->catch_varargs = names(n->body, "varargs");
    n->catch_kwargs = names(n->body, "kwargs");
    return n;
  }

  // Whether a macro body reads `name` (jinja2 lets a macro take extra arguments only then).
  static bool names(const Expr* e, const std::string& name) {
    if (!e) return false;
    if (e->kind == ExprKind::kName && e->name == name) return true;
    if (names(e->a.get(), name) || names(e->b.get(), name)) return true;
    for (const auto& x : e->items)
      if (names(x.get(), name)) return true;
    for (const auto& [k, x] : e->kwargs)
      if (names(x.get(), name)) return true;
    return false;
  }
  static bool names(const Body& body, const std::string& name) {
    for (const auto& n : body) {
      if (names(n->expr.get(), name) || names(n->filter.get(), name)) return true;
      for (const auto& c : n->conds)
        if (names(c.get(), name)) return true;
      for (const auto& v : n->values)
        if (names(v.get(), name)) return true;
      for (const auto& p : n->params)
        if (names(p.default_value.get(), name)) return true;
      for (const auto& b : n->bodies)
        if (names(b, name)) return true;
      if (names(n->body, name) || names(n->else_body, name)) return true;
    }
    return false;
  }

  NodePtr parse_filter_block() {
    auto n = make_node(NodeKind::kFilterBlock, next().line);
    n->filter = parse_filter(nullptr, true);
    n->body = parse_statements({"endfilter"}, true);
    return n;
  }

  NodePtr parse_with() {
    auto n = make_node(NodeKind::kWith, next().line);
    while (cur().type != Tok::kBlockEnd) {
      if (!n->targets.empty()) expect_op(",");
      n->targets.push_back(expect_name());
      expect_op("=");
      n->values.push_back(parse_expression(true));
    }
    n->body = parse_statements({"endwith"}, true);
    return n;
  }

  // ---- expressions --------------------------------------------------------------------------------
  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) return true;
    for (const auto& e : extra_end)
      if (is_name(e.c_str())) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, const std::vector<std::string>& extra_end) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) error("Expected an expression, got " + describe(cur()));
    }
    auto t = make(ExprKind::kTuple, line);
    t->items = std::move(args);
    return fin(std::move(t));
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    const Nest nest(*this);
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_condexpr();
      auto c = make(ExprKind::kCondExpr, line);
      c->items.push_back(std::move(expr1));
      c->items.push_back(std::move(cond));
      c->items.push_back(std::move(other));
      expr1 = fin(std::move(c));
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr parse_or() {
    const int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      auto e = make(ExprKind::kOr, line);
      e->a = std::move(left);
      e->b = parse_and();
      left = fin(std::move(e));
    }
    return left;
  }

  ExprPtr parse_and() {
    const int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      auto e = make(ExprKind::kAnd, line);
      e->a = std::move(left);
      e->b = parse_not();
      left = fin(std::move(e));
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const Nest nest(*this);
      auto e = make(ExprKind::kNot, next().line);
      e->a = parse_not();
      return fin(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr expr = parse_math1();
    auto cmp = make(ExprKind::kCompare, line);
    while (true) {
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        cmp->ops.push_back(next().text);
      } else if (skip_name("in")) {
        cmp->ops.push_back("in");
      } else if (is_name("not") && look().type == Tok::kName && look().text == "in") {
        next();
        next();
        cmp->ops.push_back("notin");
      } else {
        break;
      }
      cmp->items.push_back(parse_math1());
    }
    if (cmp->ops.empty()) return expr;
    cmp->a = std::move(expr);
    return fin(std::move(cmp));
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(ExprKind::kBinary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return fin(std::move(e));
  }

  ExprPtr parse_math1() {
    const int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr left = parse_math2();
    while (skip_op("~")) left = binary("~", std::move(left), parse_math2(), line);
    return left;
  }

  ExprPtr parse_math2() {
    const int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    const int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) {
      ExprPtr right = parse_unary(true);
      // jinja2 folds `-2` to the constant -2 and writes it unparenthesised into Python, so
      // `-2 ** x` is -(2 ** x) when x is not a constant, and (-2) ** x when it is (folded whole).
      const bool neg_literal = left->kind == ExprKind::kNeg && left->a->kind == ExprKind::kConst &&
                               left->a->value.is_number();
      const bool const_right = right->kind == ExprKind::kConst ||
                               (right->kind == ExprKind::kNeg && right->a->kind == ExprKind::kConst);
      if (neg_literal && !const_right) {
        left->a = binary("**", std::move(left->a), std::move(right), line);
        left = fin(std::move(left));
      } else {
        left = binary("**", std::move(left), std::move(right), line);
      }
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Nest nest(*this);
    const int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const bool neg = next().text == "-";
      node = make(neg ? ExprKind::kNeg : ExprKind::kPos, line);
      node->a = parse_unary(false);
      node = fin(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.type == Tok::kName) {
      next();
      auto e = make(ExprKind::kConst, t.line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::kString) {
      auto e = make(ExprKind::kConst, t.line);
      std::string s = next().text;
      while (cur().type == Tok::kString) s += next().text;  // adjacent literals concatenate
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = make(ExprKind::kConst, t.line);
      e->value = t.type == Tok::kInt ? Value(t.ival) : Value(t.fval);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, true, {});
      expect_op(")");
      return e;
    }
    if (is_op("[")) return parse_list();
    if (is_op("{")) return parse_dict();
    if (t.type == Tok::kEof) error("unexpected end of template");
    error("unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    auto e = make(ExprKind::kList, next().line);
    while (!is_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("]")) break;
      e->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return fin(std::move(e));
  }

  ExprPtr parse_dict() {
    auto e = make(ExprKind::kDict, next().line);
    while (!is_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("}")) break;
      e->items.push_back(parse_expression(true));
      expect_op(":");
      e->items.push_back(parse_expression(true));
    }
    expect_op("}");
    return fin(std::move(e));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.text == ".") {
      const Token& attr = next();
      if (attr.type == Tok::kName) {
        auto e = make(ExprKind::kGetattr, t.line);
        e->a = std::move(node);
        e->name = attr.text;
        return fin(std::move(e));
      }
      if (attr.type != Tok::kInt) error("expected name or number", attr.line);
      auto e = make(ExprKind::kGetitem, t.line);
      e->a = std::move(node);
      e->b = make(ExprKind::kConst, attr.line);
      e->b->value = Value(attr.ival);
      return fin(std::move(e));
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(ExprKind::kGetitem, t.line);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = make(ExprKind::kTuple, t.line);
      e->b->items = std::move(args);
      e->b = fin(std::move(e->b));
    }
    return fin(std::move(e));
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    auto s = make(ExprKind::kSlice, line);
    if (is_op(":")) {
      next();
      s->items.push_back(nullptr);
    } else {
      ExprPtr node = parse_expression(true);
      if (!is_op(":")) return node;
      next();
      s->items.push_back(std::move(node));
    }
    if (is_op(":") || is_op("]") || is_op(",")) {
      s->items.push_back(nullptr);
    } else {
      s->items.push_back(parse_expression(true));
    }
    if (skip_op(":")) {
      if (is_op("]") || is_op(",")) {
        s->items.push_back(nullptr);
      } else {
        s->items.push_back(parse_expression(true));
      }
    } else {
      s->items.push_back(nullptr);
    }
    return fin(std::move(s));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::kName && look().type == Tok::kOp && look().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error("invalid syntax for function call expression");
        e.items.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::kCall, cur().line);
    e->a = std::move(node);
    parse_call_args(*e);
    return fin(std::move(e));
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const int line = cur().line;
      auto e = make(ExprKind::kFilter, line);
      e->name = expect_name();
      while (skip_op(".")) e->name.append(".").append(expect_name());
      e->a = std::move(node);
      if (is_op("(")) parse_call_args(*e);
      node = fin(std::move(e));
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;  // "is"
    auto e = make(ExprKind::kTest, line);
    e->negated = skip_name("not");
    e->name = expect_name();
    while (skip_op(".")) e->name.append(".").append(expect_name());
    e->a = std::move(node);
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error("You cannot chain multiple tests with is");
      e->items.push_back(parse_postfix(parse_primary()));
    }
    return fin(std::move(e));
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  const std::string& name_;
  std::vector<std::string> stack_;  // open statement tags, for end-of-template messages
  int loops_ = 0;                   // enclosing for-loop bodies (break/continue need one)
  int nesting_ = 0;                 // parser recursion depth (Nest)
};

}  // namespace

std::unique_ptr<Program> parse(const std::string& source, const std::string& name, const Options& opt) {
  auto prog = std::make_unique<Program>();
  prog->name = name;
  prog->options = opt;
  Parser p(tokenize(source, name, opt), prog->name);
  prog->body = p.parse_template();
  return prog;
}

}  // namespace dsi::jinja
