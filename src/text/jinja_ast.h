// The parsed form of a Jinja template: expression and statement nodes, as jinja2/nodes.py names them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja.h"
#include "text/jinja_value.h"

namespace dsi::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kConst,     // value
  kName,      // name
  kList,      // items
  kTuple,     // items
  kDict,      // items as key, value pairs (items[2i], items[2i+1])
  kGetattr,   // a.name
  kGetitem,   // a[b]; b may be a kSlice
  kSlice,     // items: start, stop, step (null when omitted)
  kCall,      // a(items..., kwargs...)
  kFilter,    // a|name(items..., kwargs...); a is null inside {% filter %} / {% set x | f %}
  kTest,      // a is [not] name(items...)
  kNeg,
  kPos,
  kNot,
  kAnd,
  kOr,
  kBinary,    // a op b: + - * / // % ** ~
  kCompare,   // a op1 b op2 c ...: == != < <= > >= in notin (ops)
  kCondExpr,  // items: then, cond, else (else may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                    // kConst
  std::string name;               // kName, kGetattr, kFilter, kTest; operator of kBinary
  ExprPtr a;                      // operand / object / callee
  ExprPtr b;                      // second operand / index
  std::vector<ExprPtr> items;     // positional arguments, elements, slice parts, compare operands
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;   // kCompare operators
  bool negated = false;           // kTest: "is not"
  int depth = 1;                  // height of this subtree (the parser bounds it: see kMaxNesting)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

enum class NodeKind {
  kText,        // text
  kPrint,       // expr
  kIf,          // conds[i] -> bodies[i]; else_body
  kFor,         // targets in expr [if filter]: body, else_body
  kSet,         // targets (or ns_attr on targets[0]) = expr
  kSetBlock,    // targets[0] = rendered body, through filter (may be null)
  kMacro,       // name(params = defaults): body
  kCallBlock,   // call(params) expr: body (the body is `caller`)
  kFilterBlock, // body through filter
  kWith,        // targets = values: body
  kBreak,
  kContinue,
  kScope,       // body in place (generation/endgeneration)
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  std::string name;                 // macro name; kSet with a namespace target: the attribute
  ExprPtr expr;                     // print / for iterable / set value / call expression
  ExprPtr filter;                   // for filter condition; set-block and filter-block filter chain
  std::vector<ExprPtr> conds;       // if / elif conditions
  std::vector<Body> bodies;         // if / elif bodies
  Body body;
  Body else_body;
  std::vector<std::string> targets; // for / set / with names
  bool ns_attr = false;             // kSet: targets[0].name = expr
  bool unpack = false;              // targets form a tuple (a, b = ...)
  std::vector<Param> params;        // macro / call-block parameters
  bool catch_varargs = false;       // the macro body names `varargs` (extra positional arguments allowed)
  bool catch_kwargs = false;        // ... `kwargs` (unknown keyword arguments allowed)
  std::vector<ExprPtr> values;      // kWith values
};

struct Program {
  std::string name;
  Options options;
  Body body;
};

// Parses tokens into a program; throws dsi::Error("<name>:<line>: <message>") on a syntax error.
std::unique_ptr<Program> parse(const std::string& source, const std::string& name, const Options& opt);

}  // namespace dsi::jinja
