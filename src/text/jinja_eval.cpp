// The Jinja evaluator: statements, expressions and jinja2's scoping (a loop iteration, macro call, call,
// set or with block gets a child scope; if does not), with Python operator semantics and the sandbox's
// attribute rules (environment.getattr / getitem in jinja2/sandbox.py).
#include <cmath>

#include "dsinfer/error.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"
#include "text/jinja_utf8.h"

namespace dsi::jinja {

namespace {

// jinja2's object_type_repr: how Undefined messages name an object's type.
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  return v.type_name() + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + name + "'");
}

}  // namespace

void raise_undefined(const Value& u) {
  const Undefined& un = u.as_undefined();
  throw RenderError{un.hint.empty() ? "undefined value" : un.hint, 0, false};
}

// ---- the interpreter -------------------------------------------------------------------------------

Interp::Interp(const Program& prog, const Dict& vars) : prog_(prog) {
  scope_ = std::make_shared<Scope>();
  for (const auto& [k, v] : vars.items()) scope_->vars[k] = v;
}

Interp::~Interp() {
  for (const auto& w : namespaces_) {
    if (auto ns = w.lock()) {
      Dict attrs = std::move(ns->attrs);  // freed after the namespace no longer refers to it
      ns->attrs = Dict();
    }
  }
}

namespace {

// Nested eval/exec calls allowed at run time. The parser bounds one expression's height and one
// template's block nesting, but macro recursion multiplies them; this bounds the stack in total
// (a few hundred bytes per call, more under sanitizers).
constexpr int kMaxFrames = 2000;

struct FrameGuard {
  int& frames;
  explicit FrameGuard(int& f) : frames(f) {
    if (++frames > kMaxFrames) {
      --frames;
      raise("maximum recursion depth exceeded (the template nests too deeply at run time)");
    }
  }
  ~FrameGuard() { --frames; }
  FrameGuard(const FrameGuard&) = delete;
  FrameGuard& operator=(const FrameGuard&) = delete;
};

}  // namespace

std::string Interp::run() {
  std::string out;
  try {
    exec(prog_.body, out);
  } catch (const RenderError& e) {
    if (e.raw) throw Error(e.msg);
    throw Error(fmt::format("{}:{}: {}", prog_.name, e.line, e.msg));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a library error the checks missed: still one line, named
    throw Error(fmt::format("{}: {}", prog_.name, e.what()));
  }
  return out;
}

void Interp::step() {
  if (++steps_ > options().max_steps) {
    raise("the template did too much work (more than " + std::to_string(options().max_steps) +
          " loop iterations and macro calls)");
  }
}

Value Interp::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (const Value* g = builtin_globals().find(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_namespace()) {
    const Value* v = obj.as_namespace().attrs.find(name);
    return v ? *v : missing_attr(obj, name);
  }
  // Python's getattr first (methods win over dict keys), then obj[name] (jinja2 Environment.getattr).
  bool found = false;
  Value m = method(*this, obj, name, &found);
  if (found) return m;
  if (obj.is_dict()) {
    const Value* v = obj.as_dict().find(name);
    if (v) return *v;
  }
  return missing_attr(obj, name);
}

Value Interp::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
      return getattr(obj, key.as_string());
    }
  } else if (obj.is_string() || plain_list(obj)) {
    if (key.is_int() || key.is_bool()) {
      int64_t i = key.int_value();
      const int64_t n = obj.is_string() ? int64_t(utf8::length(obj.as_string())) : int64_t(obj.as_list().items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) {
        return Value::undefined("'" + object_type_repr(obj) + "' has no element " + std::to_string(key.int_value()));
      }
      if (obj.is_string()) {
        const std::u32string u = utf8::decode(obj.as_string());
        return Value(utf8::encode(std::u32string(1, u[size_t(i)])));
      }
      return obj.as_list().items[size_t(i)];
    }
    if (key.is_string()) return getattr(obj, key.as_string());
  } else if (key.is_string()) {
    return getattr(obj, key.as_string());
  }
  return Value::undefined("'" + object_type_repr(obj) + "' has no element " + key.repr());
}

Value Interp::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) raise_undefined(callee);
  if (!callee.is_callable()) raise("'" + callee.type_name() + "' object is not callable");
  return callee.as_callable().fn(*this, args);
}

Value Interp::filter(const std::string& name, const Value& input, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) raise("No filter named '" + name + "'.");
  return f(*this, input, args);
}

bool Interp::test(const std::string& name, const Value& input, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) raise("No test named '" + name + "'.");
  return t(*this, input, args);
}

Value Interp::eval(const Expr& e) {
  try {
    const FrameGuard guard(frames_);
    return eval_inner(e);
  } catch (RenderError& err) {
    if (err.line == 0) err.line = e.line;
    throw;
  }
}

Value Interp::eval_inner(const Expr& e) {
  auto eval_args = [this](const Expr& x) {
    CallArgs args;
    for (const auto& a : x.items) args.pos.push_back(eval(*a));
    for (const auto& [k, a] : x.kwargs) args.kw.emplace_back(k, eval(*a));
    return args;
  };
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return lookup(e.name);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& x : e.items) items.push_back(eval(*x));
      return Value::list(std::move(items), e.kind == ExprKind::kTuple ? ListKind::kTuple : ListKind::kList);
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = eval(*e.items[i]);
        if (!k.is_string()) raise("dict keys must be strings (got " + k.type_name() + ")");
        d.set(k.as_string(), eval(*e.items[i + 1]));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kGetattr:
      return getattr(eval(*e.a), e.name);
    case ExprKind::kGetitem: {
      Value obj = eval(*e.a);
      if (e.b->kind == ExprKind::kSlice) {
        auto part = [this, &e](size_t i) { return e.b->items[i] ? eval(*e.b->items[i]) : Value::none(); };
        return slice(obj, part(0), part(1), part(2));
      }
      return getitem(obj, eval(*e.b));
    }
    case ExprKind::kSlice:
      raise("slice outside of a subscript");
    case ExprKind::kCall: {
      Value callee = eval(*e.a);
      CallArgs args = eval_args(e);
      return call(callee, args);
    }
    case ExprKind::kFilter: {
      Value input = eval(*e.a);
      CallArgs args = eval_args(e);
      return filter(e.name, input, args);
    }
    case ExprKind::kTest: {
      Value input = eval(*e.a);
      CallArgs args = eval_args(e);
      return Value(test(e.name, input, args) != e.negated);
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.a);
      if (v.is_undefined()) raise_undefined(v);
      if (!v.is_number()) {
        raise(std::string("bad operand type for unary ") + (e.kind == ExprKind::kNeg ? "-" : "+") + ": '" +
              v.type_name() + "'");
      }
      if (e.kind == ExprKind::kPos) return v.is_bool() ? Value(v.int_value()) : v;
      if (v.is_float()) return Value(-v.as_float());
      check_overflow(v.int_value() == INT64_MIN);
      return Value(-v.int_value());
    }
    case ExprKind::kNot:
      return Value(!eval(*e.a).truthy());
    case ExprKind::kAnd: {
      Value l = eval(*e.a);
      return l.truthy() ? eval(*e.b) : l;
    }
    case ExprKind::kOr: {
      Value l = eval(*e.a);
      return l.truthy() ? l : eval(*e.b);
    }
    case ExprKind::kBinary:
      return binary_op(e.name, eval(*e.a), eval(*e.b));
    case ExprKind::kCompare: {
      Value left = eval(*e.a);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.items[i]);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==") {
          r = equals(left, right);
        } else if (op == "!=") {
          r = !equals(left, right);
        } else if (op == "<") {
          r = less_than(left, right);
        } else if (op == ">") {
          r = less_than(right, left);
        } else if (op == "<=") {
          r = equals(left, right) ? (less_than(left, right), true) : less_than(left, right);
        } else if (op == ">=") {
          r = equals(left, right) ? (less_than(right, left), true) : less_than(right, left);
        } else if (op == "in") {
          r = contains(right, left);
        } else {
          r = !contains(right, left);
        }
        if (!r) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::kCondExpr: {
      if (eval(*e.items[1]).truthy()) return eval(*e.items[0]);
      if (e.items[2]) return eval(*e.items[2]);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  raise("unknown expression");
}

// ---- statements ------------------------------------------------------------------------------------

// A filter chain parsed without input ({% filter a|b %}, {% set x | a %}): the innermost filter's
// operand is null; feed it `input` and apply the filters in order.
Value Interp::apply_chain(const Expr& chain, Value input) {
  std::vector<const Expr*> filters;
  for (const Expr* f = &chain; f; f = f->a.get()) filters.push_back(f);
  for (auto it = filters.rbegin(); it != filters.rend(); ++it) {
    CallArgs args;
    for (const auto& a : (*it)->items) args.pos.push_back(eval(*a));
    for (const auto& [k, a] : (*it)->kwargs) args.kw.emplace_back(k, eval(*a));
    input = filter((*it)->name, input, args);
  }
  return input;
}

Interp::Flow Interp::exec(const Body& body, std::string& out) {
  for (const auto& n : body) {
    const Flow f = exec(*n, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

namespace {

// Runs fn with `scope` as the current scope, restoring the previous one afterwards.
template <typename Fn>
auto with_scope(std::shared_ptr<Scope>& current, std::shared_ptr<Scope> scope, Fn&& fn) {
  std::shared_ptr<Scope> saved = std::move(current);
  current = std::move(scope);
  struct Restore {
    std::shared_ptr<Scope>& cur;
    std::shared_ptr<Scope>& saved;
    ~Restore() { cur = std::move(saved); }
  } restore{current, saved};
  return fn();
}

std::shared_ptr<Scope> child_of(const std::shared_ptr<Scope>& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

}  // namespace

void Interp::assign(const Node& n, Value v) {
  if (n.ns_attr) {
    Value target = lookup(n.targets[0]);
    if (!target.is_namespace()) raise("cannot assign attribute on non-namespace object");
    target.as_namespace().attrs.set(n.name, std::move(v));
    return;
  }
  if (!n.unpack) {
    scope_->vars[n.targets[0]] = std::move(v);
    return;
  }
  std::vector<Value> items = iterate(v);
  if (items.size() > n.targets.size()) {
    raise("too many values to unpack (expected " + std::to_string(n.targets.size()) + ")");
  }
  if (items.size() < n.targets.size()) {
    raise("not enough values to unpack (expected " + std::to_string(n.targets.size()) + ", got " +
          std::to_string(items.size()) + ")");
  }
  for (size_t i = 0; i < items.size(); ++i) scope_->vars[n.targets[i]] = std::move(items[i]);
}

Value Interp::make_macro(const Node& n, const std::string& name) {
  macro_scopes_.push_back(scope_);
  std::weak_ptr<Scope> def_scope = scope_;
  const Node* node = &n;
  return Value::callable(
      name,
      [node, def_scope, name](Interp& in, CallArgs& args) -> Value {
        if (in.depth_ >= in.options().max_depth) raise("maximum recursion depth exceeded");
        in.step();
        std::shared_ptr<Scope> parent = def_scope.lock();
        if (!parent) raise("macro '" + name + "' called after its template finished rendering");
        auto scope = child_of(parent);
        const auto& params = node->params;
        if (args.pos.size() > params.size() && !node->catch_varargs) {
          raise("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
        }
        std::vector<bool> given(params.size(), false);
        std::vector<Value> varargs;
        for (size_t i = 0; i < args.pos.size(); ++i) {
          if (i < params.size()) {
            scope->vars[params[i].name] = args.pos[i];
            given[i] = true;
          } else {
            varargs.push_back(args.pos[i]);
          }
        }
        Dict kwargs;
        Value caller;
        for (auto& [k, v] : args.kw) {
          bool matched = false;
          for (size_t i = 0; i < params.size(); ++i) {
            if (params[i].name != k) continue;
            if (given[i]) raise("macro '" + name + "' got multiple values for argument '" + k + "'");
            scope->vars[k] = v;
            given[i] = matched = true;
          }
          if (matched) continue;
          if (k == "caller") {
            caller = v;
          } else if (node->catch_kwargs) {
            kwargs.set(k, v);
          } else {
            raise("macro '" + name + "' takes no keyword argument '" + k + "'");
          }
        }
        scope->vars["varargs"] = Value::list(std::move(varargs), ListKind::kTuple);
        scope->vars["kwargs"] = Value::dict(std::move(kwargs));
        if (!caller.is_undefined()) scope->vars["caller"] = caller;
        std::string out;
        ++in.depth_;
        struct Depth {
          int& d;
          ~Depth() { --d; }
        } depth_guard{in.depth_};
        with_scope(in.scope_, scope, [&] {
          for (size_t i = 0; i < params.size(); ++i) {  // defaults may read earlier parameters
            if (given[i]) continue;
            in.scope_->vars[params[i].name] =
                params[i].default_value ? in.eval(*params[i].default_value)
                                        : Value::undefined("parameter '" + params[i].name + "' was not provided");
          }
          in.exec(node->body, out);
          return 0;
        });
        return Value(std::move(out));
      },
      "Macro");
}

void Interp::exec_for(const Node& n, std::string& out) {
  const Value iterable = eval(*n.expr);
  std::vector<Value> items = iterate(iterable);
  auto bind = [&](Scope& s, const Value& item) {
    if (!n.unpack) {
      s.vars[n.targets[0]] = item;
      return;
    }
    std::vector<Value> parts = iterate(item);
    if (parts.size() != n.targets.size()) {
      raise(parts.size() > n.targets.size()
                ? "too many values to unpack (expected " + std::to_string(n.targets.size()) + ")"
                : "not enough values to unpack (expected " + std::to_string(n.targets.size()) + ", got " +
                      std::to_string(parts.size()) + ")");
    }
    for (size_t i = 0; i < parts.size(); ++i) s.vars[n.targets[i]] = parts[i];
  };
  if (n.filter) {  // the inline `if`: evaluated per item with the target bound
    std::vector<Value> kept;
    for (const Value& item : items) {
      step();
      auto s = child_of(scope_);
      bind(*s, item);
      const bool keep = with_scope(scope_, s, [&] { return eval(*n.filter).truthy(); });
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t len = int64_t(items.size());
  for (int64_t i = 0; i < len; ++i) {
    step();
    auto s = child_of(scope_);
    bind(*s, items[size_t(i)]);
    Dict loop;
    loop.set("index", Value(i + 1));
    loop.set("index0", Value(i));
    loop.set("revindex", Value(len - i));
    loop.set("revindex0", Value(len - i - 1));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == len - 1));
    loop.set("length", Value(len));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    loop.set("previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < len ? items[size_t(i + 1)] : Value::undefined("there is no next item"));
    loop.set("cycle", Value::callable("cycle", [i](Interp&, CallArgs& a) -> Value {
               if (a.pos.empty()) raise("no items for cycling given");
               return a.pos[size_t(i) % a.pos.size()];
             }));
    s->vars["loop"] = Value::dict(std::move(loop));
    const Flow f = with_scope(scope_, s, [&] { return exec(n.body, out); });
    if (f == Flow::kBreak) break;
  }
  if (len == 0 && !n.else_body.empty()) {
    with_scope(scope_, child_of(scope_), [&] { return exec(n.else_body, out); });
  }
}

void Interp::check_output(const std::string& out) const {
  if (int64_t(out.size()) > options().max_output_bytes) {
    raise("the output is too large (more than " + std::to_string(options().max_output_bytes) + " bytes)");
  }
}

Interp::Flow Interp::exec(const Node& n, std::string& out) {
  try {
    const FrameGuard guard(frames_);
    switch (n.kind) {
      case NodeKind::kText:
        out += n.text;
        check_output(out);
        return Flow::kNormal;
      case NodeKind::kPrint:
        out += eval(*n.expr).str();
        check_output(out);
        return Flow::kNormal;
      case NodeKind::kIf:
        for (size_t i = 0; i < n.conds.size(); ++i) {
          if (eval(*n.conds[i]).truthy()) return exec(n.bodies[i], out);
        }
        return exec(n.else_body, out);
      case NodeKind::kFor:
        exec_for(n, out);
        return Flow::kNormal;
      case NodeKind::kSet:
        assign(n, eval(*n.expr));
        return Flow::kNormal;
      case NodeKind::kSetBlock: {
        std::string text;
        with_scope(scope_, child_of(scope_), [&] { return exec(n.body, text); });
        assign(n, n.filter ? apply_chain(*n.filter, Value(std::move(text))) : Value(std::move(text)));
        return Flow::kNormal;
      }
      case NodeKind::kFilterBlock: {
        std::string text;
        with_scope(scope_, child_of(scope_), [&] { return exec(n.body, text); });
        out += apply_chain(*n.filter, Value(std::move(text))).str();
        return Flow::kNormal;
      }
      case NodeKind::kMacro:
        scope_->vars[n.name] = make_macro(n, n.name);
        return Flow::kNormal;
      case NodeKind::kCallBlock: {
        Value caller = make_macro(n, "caller");
        const Expr& call_expr = *n.expr;
        Value callee = eval(*call_expr.a);
        CallArgs args;
        for (const auto& a : call_expr.items) args.pos.push_back(eval(*a));
        for (const auto& [k, a] : call_expr.kwargs) args.kw.emplace_back(k, eval(*a));
        args.kw.emplace_back("caller", caller);
        out += call(callee, args).str();
        return Flow::kNormal;
      }
      case NodeKind::kWith: {
        auto s = child_of(scope_);
        for (size_t i = 0; i < n.targets.size(); ++i) s->vars[n.targets[i]] = eval(*n.values[i]);
        return with_scope(scope_, s, [&] { return exec(n.body, out); });
      }
      case NodeKind::kScope: {
        std::string text;
        with_scope(scope_, child_of(scope_), [&] { return exec(n.body, text); });
        out += text;
        return Flow::kNormal;
      }
      case NodeKind::kBreak:
        return Flow::kBreak;
      case NodeKind::kContinue:
        return Flow::kContinue;
    }
  } catch (RenderError& err) {
    if (err.line == 0) err.line = n.line;
    throw;
  }
  return Flow::kNormal;
}

// ---- Template --------------------------------------------------------------------------------------

Template::Template(std::string_view source, std::string name, Options opt)
    : program_(parse(std::string(source), name, opt)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::name() const { return program_->name; }

std::string Template::render(const Dict& vars) const {
  Interp in(*program_, vars);
  return in.run();
}

namespace {

template <typename Json>
Dict vars_from_json(const Json& vars, const std::string& name) {
  DSI_CHECK(vars.is_object() || vars.is_null(), "{}: render variables must be a JSON object, got {}", name,
            vars.type_name());
  Dict d;
  if (vars.is_object())
    for (const auto& [k, v] : vars.items()) d.set(k, from_json(v));
  return d;
}

}  // namespace

std::string Template::render(const nlohmann::json& vars) const { return render(vars_from_json(vars, program_->name)); }

std::string Template::render(const nlohmann::ordered_json& vars) const {
  return render(vars_from_json(vars, program_->name));
}

}  // namespace dsi::jinja
