// The Jinja lexer: template text -> tokens, with jinja2's whitespace control ("-" and "+" on tags,
// trim_blocks, lstrip_blocks), comments, raw blocks and newline normalisation. Mirrors jinja2/lexer.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsi::jinja {

struct Options;

enum class Tok {
  kData,        // literal template text
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOp,  // operators and punctuation: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  kEof,
};

struct Token {
  Tok type;
  std::string text;  // data, name, decoded string value or operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
};

// Splits `source` into tokens; throws dsi::Error("<name>:<line>: ...") on a lexical error.
std::vector<Token> tokenize(const std::string& source, const std::string& name, const Options& opt);

// A token as jinja2 quotes it in syntax errors: "'end of print statement'", "'x'", "'string'", ...
std::string describe(const Token& t);

}  // namespace dsi::jinja
