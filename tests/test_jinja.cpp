// Unit tests of the Jinja engine (src/text/jinja*): one construct at a time, expected strings as Python
// jinja2 3.1.6 renders them in HF's environment (trim_blocks, lstrip_blocks, ImmutableSandbox). The
// byte-for-byte comparison against a live jinja2 is test_jinja_parity.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "dsinfer/error.h"
#include "test_util.h"
#include "text/jinja.h"

namespace dsi::test {
namespace {

using jinja::Options;
using jinja::Template;

std::string render(const std::string& src, const std::string& vars_json = "{}", Options opt = {}) {
  return Template(src, "t", std::move(opt)).render(nlohmann::ordered_json::parse(vars_json));
}

void expect_render_error(const std::string& src, const std::vector<std::string>& needles,
                         const std::string& vars_json = "{}") {
  expect_error([&] { render(src, vars_json); }, needles);
}

TEST(JinjaWhitespace, TrimAndLstripBlocks) {
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\n  c"), "a\n  b\n  c");
  EXPECT_EQ(render("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n"), "  1\n  2\n");
  EXPECT_EQ(render("<\n{% for i in [1, 2] %}\n    {% if i > 1 %}\n        {{ i }}\n    {% endif %}\n{% endfor %}\n>"),
            "<\n        2\n>");
  EXPECT_EQ(render("  {{ 1 }}"), "  1");  // lstrip_blocks leaves {{ }} alone
  EXPECT_EQ(render("{% if true %}  \t\n{% endif %}"), "  \t\n");
  EXPECT_EQ(render("  {# c #}\nx"), "x");  // comments are stripped and trimmed like blocks
  EXPECT_EQ(render("x {# c #}\ny"), "x y");
}

TEST(JinjaWhitespace, MinusAndPlusModifiers) {
  EXPECT_EQ(render("a\n  {%- if true %}\n  b\n  {%+ endif %}\n  c"), "a  b\n    c");
  EXPECT_EQ(render("a {%- if true %} b {% endif -%} c"), "a b c");
  EXPECT_EQ(render("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(render("a  {#- c -#}  \n b"), "ab");
  EXPECT_EQ(render("{% if true +%}\nkeep newline{% endif %}"), "\nkeep newline");
  EXPECT_EQ(render("a\xe3\x80\x80\xc2\xa0 {{- 'b' }}"), "ab");  // "-" strips Unicode whitespace too
}

TEST(JinjaWhitespace, NewlinesAndRaw) {
  EXPECT_EQ(render("x\n\n"), "x\n");  // one trailing newline is dropped
  EXPECT_EQ(render("x\r\ny\rz\r\n"), "x\ny\nz");
  EXPECT_EQ(render("{% raw %}\n {{ x }}\n  {% endraw %}\nz"), "\n {{ x }}\nz");
  EXPECT_EQ(render("{%- raw -%}  {{ x }}  {%- endraw -%}  z"), "{{ x }}z");
  Options keep;
  keep.keep_trailing_newline = true;
  keep.trim_blocks = false;
  keep.lstrip_blocks = false;
  EXPECT_EQ(render("  {% if true %}\nx{% endif %}\n", "{}", keep), "  \nx\n");
}

TEST(JinjaLiterals, ValuesPrintLikePython) {
  EXPECT_EQ(render("{{ 'a\\nb\\tc\\x41\\u00e9\\101\\q' }}"), "a\nb\tcA\xc3\xa9" "A\\q");
  EXPECT_EQ(render("{{ 1_000 }} {{ 0x1f }} {{ 0b101 }} {{ 1e3 }} {{ 1.5e-3 }} {{ 2.50 }}"), "1000 31 5 1000.0 0.0015 2.5");
  EXPECT_EQ(render("{{ 'a' \"b\" 'c' }}"), "abc");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1,), ()] }}"),
            "[1, 'a', None, True, 1.5, {'k': 'v'}, (1,), ()]");
  EXPECT_EQ(render("{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ -0.0 }}"),
            "1e+20 0.30000000000000004 1e-05 1e+16 1000000000000000.0 -0.0");
  EXPECT_EQ(render("{{ x }}", R"({"x": ["it's", "q\"", "nl\n", "\u0001"]})"), R"(["it's", 'q"', 'nl\n', '\x01'])");
  EXPECT_EQ(render("{{ none }}{{ true }}{{ 1, 2 }}"), "NoneTrue(1, 2)");
}

TEST(JinjaExpressions, Arithmetic) {
  EXPECT_EQ(render("{{ 3 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}"),
            "1.5 2.0 3 -4 2 1024 0.5");
  EXPECT_EQ(render("{{ 2.5 // 1 }} {{ -2.5 % 1 }} {{ 7.5 % -2 }}"), "2.0 0.5 -0.5");
  EXPECT_EQ(render("{{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 2 * 3 ~ 4 }}"), "4 64 64");  // jinja: (-2)**2, left-assoc
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1, 2] + [3] }} {{ true + 1 }}"), "ababab [1, 1] [1, 2, 3] 2");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true ~ u }}"), "a1NoneTrue");
  expect_render_error("{{ '5' + 5 }}", {"t:1:", "can only concatenate str (not \"int\") to str"});
  expect_render_error("{{ 1 / 0 }}", {"division by zero"});
  expect_render_error("{{ 1 + 2 ~ 3 }}", {"unsupported operand type(s) for +: 'int' and 'str'"});
}

TEST(JinjaExpressions, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ [1] == (1,) }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'Z' < 'a' }}"),
            "True False True False True");
  EXPECT_EQ(render("{{ 3 in [1, 2, 3] }} {{ 'b' in {'b': 1} }} {{ 'bc' in 'abc' }} {{ 'x' not in 'abc' }}"),
            "True True True True");
  // and/or return operands, as in Python.
  EXPECT_EQ(render("{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ u or 'dflt' }}|{{ not 1 == 2 }}"),
            "x|b||dflt|True");
  EXPECT_EQ(render("{{ 'x' if false }}|{{ 1 if true else 2 }}|{{ 'a' if none else 'b' if 0 else 'c' }}"), "|1|c");
  expect_render_error("{{ 1 < 'a' }}", {"'<' not supported between instances of 'int' and 'str'"});
  expect_render_error("{{ 'a' in none }}", {"argument of type 'NoneType' is not iterable"});
}

TEST(JinjaExpressions, Truthiness) {
  EXPECT_EQ(render("{% for v in [0, 1, 0.0, 0.5, '', 'a', [], [0], {}, {'a': 1}, none, true, false] %}"
                   "{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if u else 'F' }}"),
            "FTFTFTFTFTFTFF");
  // A filter's generator is always true in Python, even when empty.
  EXPECT_EQ(render("{{ 'T' if [1]|select('even') else 'F' }}{{ 'T' if [1]|select('even')|list else 'F' }}"), "TF");
}

TEST(JinjaExpressions, AttributeItemAndSlices) {
  const std::string vars = R"({"d": {"a": 1, "b": {"c": 2}, "items": "key!"}, "l": [10, 20, 30]})";
  EXPECT_EQ(render("{{ d.a }} {{ d['b']['c'] }} {{ l[-1] }} {{ l.1 }} [{{ l[5] }}] [{{ d.missing }}]", vars),
            "1 2 30 20 [] []");
  // Python's getattr comes first: d.items is the method, d['items'] the key.
  EXPECT_EQ(render("{{ d.items is callable }} {{ d['items'] }}", vars), "True key!");
  EXPECT_EQ(render("{{ [1, 2, 3][::-1] }}{{ 'abcdef'[1:-1:2] }}{{ 'h\xc3\xa9llo'[1:3] }}{{ [1, 2][5:] }}"),
            "[3, 2, 1]bd\xc3\xa9l[]");
  EXPECT_EQ(render("{{ m.content.0.type }}", R"({"m": {"content": [{"type": "x"}]}})"), "x");
}

TEST(JinjaUndefined, DefaultUndefinedSemantics) {
  EXPECT_EQ(render("[{{ u }}][{{ u|length }}][{{ u|list }}][{{ u|default('d') }}][{{ u is defined }}]"),
            "[][0][[]][d][False]");
  EXPECT_EQ(render("{% for x in u %}a{% else %}empty{% endfor %}{{ 'a' in u }}{{ u == u }}"), "emptyFalseTrue");
  EXPECT_EQ(render("{{ d.x is defined }} {{ d.x.y is defined }}", R"({"d": {"x": {}}})"), "True False");
  // Using an undefined value for more than printing, testing or iterating raises.
  expect_render_error("{{ x.y }}", {"t:1:", "'x' is undefined"});
  expect_render_error("{% set d = {} %}{{ d.a.b }}", {"'dict object' has no attribute 'a'"});
  expect_render_error("{{ u() }}", {"'u' is undefined"});
  expect_render_error("{{ u + 1 }}", {"'u' is undefined"});
  expect_render_error("{{ u|tojson }}", {"Object of type Undefined is not JSON serializable"});
}

TEST(JinjaStatements, IfForAndLoopVariables) {
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %};{% endfor %}"),
            "one;two;many;");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/"
                   "{{ loop.first }}/{{ loop.last }}/{{ loop.revindex }} {% endfor %}"),
            "1/0/2/True/False/2 2/1/2/False/True/1 ");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}"),
            "a2|b13|a2|");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}"
                   "{% if x == 3 %}{% break %}{% endif %}{% endfor %}"),
            "13");
  expect_render_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {"too many values to unpack (expected 2)"});
}

TEST(JinjaStatements, ScopingLikeJinja2) {
  // Each loop iteration is a fresh scope; if does not open one.
  EXPECT_EQ(render("{% for i in [1, 2] %}{% if i == 1 %}{% set x = 'a' %}{% endif %}[{{ x }}]{% endfor %}{{ x is defined }}"),
            "[a][]False");
  EXPECT_EQ(render("{% set x = 'o' %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}"), "o1o2o");
  EXPECT_EQ(render("{% if true %}{% set w = 5 %}{% endif %}{{ w }}"), "5");
  // A namespace carries state out of loops.
  EXPECT_EQ(render("{% set ns = namespace(a=1, b='x') %}{% for i in [1, 2] %}{% set ns.b = ns.b ~ i %}"
                   "{% set ns.a = ns.a + 1 %}{% endfor %}{{ ns.a }}{{ ns.b }}"),
            "3x12");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set x | upper %}ab{% endset %}{{ x }}"), "12AB");
  EXPECT_EQ(render("{% with a = 1 %}{% set z = 3 %}{{ a + z }}{% endwith %}{{ z is defined }}"), "4False");
  EXPECT_EQ(render("{% filter upper %}ab{{ 'c' }}{% endfilter %}"), "ABC");
  EXPECT_EQ(render("{% generation %}{% set q = 1 %}g{% endgeneration %}{{ q is defined }}"), "gFalse");
  expect_render_error("{% set s = 'a' %}{% set s.x = 1 %}", {"cannot assign attribute on non-namespace object"});
}

TEST(JinjaStatements, MacrosAndCallBlocks) {
  EXPECT_EQ(render("{% macro f(a, b=2) %}[{{ a }}{{ b }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ f(1) }}{{ f(1, 3, 4, z=5) }}"),
            "[12(){}][13(4,){'z': 5}]");
  EXPECT_EQ(render("{% macro f(a, b=a * 2) %}{{ a }}{{ b }}{% endmacro %}{{ f(3) }}{{ f(b=1, a=0) }}"), "3601");
  // Macros see top-level variables as they are when called.
  EXPECT_EQ(render("{% set x = 1 %}{% macro f() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ f() }}"), "2");
  EXPECT_EQ(render("{% macro one() %}1{% endmacro %}{% if one() %}truthy{% endif %}{{ one() ~ one() }}"), "truthy11");
  EXPECT_EQ(render("{% macro count(n) %}{{ n }}{% if n > 0 %},{{ count(n - 1) }}{% endif %}{% endmacro %}{{ count(3) }}"),
            "3,2,1,0");
  EXPECT_EQ(render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                   "{% call(item) each(['a', 'b']) %}<{{ item }}>{% endcall %}"),
            "<a><b>");
  expect_render_error("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", {"macro 'f' takes not more than 1 argument(s)"});
  expect_render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", {"maximum recursion depth exceeded"});
}

TEST(JinjaFilters, StringFilters) {
  EXPECT_EQ(render("[{{ '  x y  '|trim }}][{{ 'xxhixx'|trim('x') }}][{{ none|trim }}]"), "[x y][hi][None]");
  EXPECT_EQ(render("{{ 'hELLO wORLD'|capitalize }} {{ 'hello-world foo(bar'|title }} {{ '\xc3\x9f'|upper }}"),
            "Hello world Hello-World Foo(Bar SS");
  EXPECT_EQ(render("{{ 'aaa'|replace('a', 'b', 2) }} {{ ['a', 'b']|join(', ') }} {{ 'ab'|center(6) }}|"), "bba a, b   ab  |");
  EXPECT_EQ(render("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
  EXPECT_EQ(render("{{ 'hello world  foo_bar, x'|wordcount }} {{ 'abc'|length }} {{ '\xc3\xa9\xf0\x9f\x98\x80'|length }}"),
            "4 3 2");
}

TEST(JinjaFilters, TojsonAsHuggingFace) {
  const std::string vars = R"({"x": {"b": "\u00e9\"\n", "a": [1, 2.5, null, true], "c": {}}})";
  EXPECT_EQ(render("{{ x|tojson }}", vars), "{\"b\": \"\xc3\xa9\\\"\\n\", \"a\": [1, 2.5, null, true], \"c\": {}}");
  EXPECT_EQ(render("{{ x.a|tojson(indent=2) }}", vars), "[\n  1,\n  2.5,\n  null,\n  true\n]");
  EXPECT_EQ(render("{{ x|tojson(ensure_ascii=True, sort_keys=True, separators=(',', ':')) }}", vars),
            "{\"a\":[1,2.5,null,true],\"b\":\"\\u00e9\\\"\\n\",\"c\":{}}");
}

TEST(JinjaFilters, SequenceFilters) {
  const std::string ms = R"({"ms": [{"role": "user", "x": 1}, {"role": "assistant"}, {"role": "user", "x": 0}]})";
  EXPECT_EQ(render("{{ ms|selectattr('role', 'equalto', 'user')|list|length }}"
                   "{{ ms|rejectattr('x', 'defined')|map(attribute='role')|list }}{{ ms|selectattr('x')|list }}",
                   ms),
            "2['assistant'][{'role': 'user', 'x': 1}]");
  EXPECT_EQ(render("{{ [1, 2, 3, 4]|select('odd')|list }}{{ [1, 5, 10]|reject('>', 4)|list }}{{ ['a']|map('upper')|list }}"),
            "[1, 3][1]['A']");
  EXPECT_EQ(render("{{ ['b', 'A', 'a']|unique|list }}{{ ['b', 'A', 'a']|sort }}{{ [1, 2]|reverse|list }}{{ 'ab'|reverse }}"),
            "['b', 'A']['A', 'a', 'b'][2, 1]ba");
  EXPECT_EQ(render("{{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}{{ {'a': 1}|items|list }}{{ 'abc'|list }}"),
            "13[('a', 1)]['a', 'b', 'c']");
  EXPECT_EQ(render("{{ 1.5|round }} {{ 2.5|round }} {{ 2.567|round(2) }} {{ 5|round }} {{ -3|abs }}"), "2.0 2.0 2.57 5 3");
  EXPECT_EQ(render("{{ '42.7'|int }} {{ 'x'|int(7) }} {{ '3.5'|float }} {{ 12|string }} {{ none|default('d') }}"),
            "42 7 3.5 12 None");
  expect_render_error("{{ [1, 2]|select('odd')|length }}", {"object of type 'generator' has no len()"});
  expect_render_error("{{ 1|nofilter }}", {"No filter named 'nofilter'."});
}

TEST(JinjaTests, IsTests) {
  EXPECT_EQ(render("{% for v in [none, true, 1, 1.5, 'a', [1], {'a': 1}] %}{{ v is none }}{{ v is boolean }}"
                   "{{ v is integer }}{{ v is number }}{{ v is string }}{{ v is mapping }}{{ v is iterable }};{% endfor %}"),
            "TrueFalseFalseFalseFalseFalseFalse;FalseTrueFalseTrueFalseFalseFalse;FalseFalseTrueTrueFalseFalseFalse;"
            "FalseFalseFalseTrueFalseFalseFalse;FalseFalseFalseFalseTrueFalseTrue;FalseFalseFalseFalseFalseFalseTrue;"
            "FalseFalseFalseFalseFalseTrueTrue;");
  EXPECT_EQ(render("{{ 1 is equalto 1 }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 2 is in [1, 2] }}{{ u is not defined }}"
                   "{{ 1 is true }}{{ true is true }}{{ 'abc' is lower }}"),
            "TrueTrueTrueTrueTrueFalseTrueTrue");
  expect_render_error("{{ 1 is nosuchtest }}", {"No test named 'nosuchtest'."});
}

TEST(JinjaMethods, StrDictAndListMethods) {
  EXPECT_EQ(render("{{ 'a,b,c'.split(',', 1) }}{{ ' a  b '.split() }}{{ 'a b c'.rsplit(' ', 1) }}{{ 'xxhixx'.strip('x') }}"),
            "['a', 'b,c']['a', 'b']['a b', 'c']hi");
  EXPECT_EQ(render("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'h\xc3\xa9llo'.find('l') }}"
                   "{{ 'banana'.count('an') }}{{ 'they are'.title() }}{{ 'a-b'.replace('-', '+') }}"),
            "TrueTrue22They Area+b");
  EXPECT_EQ(render("{{ '{} and {:>3}|{:.2f}'.format(1, 'b', 3.14159) }} {{ '%s-%03d' % ('a', 7) }} {{ ', '.join(['x', 'y']) }}"),
            "1 and   b|3.14 a-007 x, y");
  EXPECT_EQ(render("{% set d = {'a': 1} %}{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.items()|list }}{{ d.keys()|list }}"
                   "{{ d.values()|list }}{{ [1, 2, 1].count(1) }}"),
            "1dflt[('a', 1)]['a'][1]2");
  // HF renders in an ImmutableSandboxedEnvironment: mutating methods raise...
  expect_render_error("{% set ns = namespace(a=[]) %}{{ ns.a.append(1) }}",
                      {"access to attribute 'append' of 'list' object is unsafe."});
  // ...unless the engine is told otherwise.
  Options mutable_opt;
  mutable_opt.immutable = false;
  EXPECT_EQ(render("{% set ns = namespace(a=[]) %}{% set _ = ns.a.append(1) %}{% set _ = ns.a.extend([2, 3]) %}{{ ns.a }}",
                   "{}", mutable_opt),
            "[1, 2, 3]");
}

TEST(JinjaGlobals, HuggingFaceGlobals) {
  EXPECT_EQ(render("{{ range(3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1) }}{{ namespace(x=1).x }}"),
            "[0, 1, 2][5, 3, 1]{'a': 1}1");
  Options opt;
  opt.now = [] {
    std::tm t{};
    t.tm_year = 2025 - 1900, t.tm_mon = 2, t.tm_mday = 7, t.tm_hour = 13, t.tm_min = 5, t.tm_sec = 9;
    t.tm_wday = 5, t.tm_yday = 65;
    return t;
  };
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d %H:%M:%S %A %d %B %Y') }}", "{}", opt),
            "2025-03-07 13:05:09 Friday 07 March 2025");
  // raise_exception's message reaches the caller unchanged (it is the error a client sees).
  try {
    render("x\n{{ raise_exception('unsupported role: ' ~ 'tool') }}");
    ADD_FAILURE() << "raise_exception did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unsupported role: tool");
  }
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  expect_error([] { Template("line1\n{{ 1 +* 2 }}", "chat.jinja"); }, {"chat.jinja:2:", "unexpected '*'"});
  expect_error([] { Template("{% if true %}\n{{ x }}", "t"); },
               {"t:2:", "Unexpected end of template", "'elif' or 'else' or 'endif'", "innermost block", "'if'"});
  expect_error([] { Template("\n\n{% foo %}", "t"); }, {"t:3:", "Encountered unknown tag 'foo'."});
  expect_error([] { Template("{{ 1 ", "t"); }, {"t:1:", "unexpected end of template, expected 'end of print statement'."});
  expect_error([] { Template("a\n{# unclosed", "t"); }, {"t:2:", "Missing end of comment tag"});
  expect_error([] { Template("{{ 'abc }}", "t"); }, {"t:1:", "unexpected char"});
  expect_error([] { Template("\n\n{{ x(}}", "t"); }, {"t:3:", "unexpected '}', expected ')'"});
  expect_error([] { Template("{% break %}", "t"); }, {"t:1:", "'break' outside loop"});
  expect_error([] { Template("{{ 'abc' | }}", "t"); }, {"t:1:", "expected token 'name', got 'end of print statement'"});
  // Messages are one line.
  try {
    Template("{% for x in y %}\n", "t");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  expect_render_error("a\nb\n{% for m in messages %}\n{{ m.content + 1 }}\n{% endfor %}",
                      {"t:4:", "can only concatenate str (not \"int\") to str"}, R"({"messages": [{"content": "x"}]})");
  expect_render_error("\n{% macro f() %}\n{{ 1 / 0 }}\n{% endmacro %}\n{{ f() }}", {"t:3:", "division by zero"});
  expect_render_error("{{ range(200000)|length }}", {"Range too big"});
}

std::string repeat(const std::string& s, int n) {
  std::string r;
  for (int i = 0; i < n; ++i) r += s;
  return r;
}

// A hostile template ends in a one-line dsi::Error: no stack overflow while parsing, evaluating or
// freeing a deep tree, no hang in nested loops, no unbounded allocation.
TEST(JinjaLimits, DeepNestingIsRefusedAtParseTime) {
  const int n = 100000;
  expect_error([&] { Template("{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}", "t"); }, {"t:1:", "nests too deeply"});
  expect_error([&] { Template("{{ " + repeat("[", n) + repeat("]", n) + " }}", "t"); }, {"nests too deeply"});
  expect_error([&] { Template("{{ " + repeat("not ", n) + "x }}", "t"); }, {"nests too deeply"});
  expect_error([&] { Template("{{ " + repeat("-", n) + "1 }}", "t"); }, {"nests too deeply"});
  expect_error([&] { Template("{{ " + repeat("1 + ", n) + "1 }}", "t"); }, {"nests too deeply"});
  expect_error([&] { Template("{{ x" + repeat(".a", n) + " }}", "t"); }, {"nests too deeply"});
  expect_error([&] { Template("{{ x" + repeat("|trim", n) + " }}", "t"); }, {"nests too deeply"});
  expect_error([&] { Template("{{ " + repeat("1 if x else ", n) + "2 }}", "t"); }, {"nests too deeply"});
  expect_error([&] { Template(repeat("{% if x %}", n) + repeat("{% endif %}", n), "t"); }, {"nests too deeply"});
  // What templates really use stays far below the limits.
  EXPECT_EQ(render("{{ " + repeat("(", 50) + "1" + repeat(")", 50) + " }}{{ " + repeat("1 + ", 150) + "1 }}"), "1151");
  EXPECT_EQ(render(repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100)), "x");
}

TEST(JinjaLimits, RuntimeWorkAndSizeAreBounded) {
  expect_render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", {"maximum recursion depth exceeded"});
  // Recursion through a deep expression in each call still ends cleanly (stack use per call is bounded).
  expect_render_error("{% macro f(n) %}{{ " + repeat("(", 90) + "f(n + 1)" + repeat(")", 90) + repeat(" ~ ''", 190) +
                          " }}{% endmacro %}{{ f(0) }}",
                      {"maximum recursion depth exceeded"});
  expect_render_error("{% macro f(n) %}" + repeat("{% if true %}", 150) + "{{ f(n + 1) }}" + repeat("{% endif %}", 150) +
                          "{% endmacro %}{{ f(0) }}",
                      {"maximum recursion depth exceeded"});
  // A namespace that refers to itself is freed when the render ends (the sanitizer build checks leaks).
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% set ns.me = ns %}{{ ns.me.me.x }}"), "1");
  Options small;
  small.max_steps = 100000;
  expect_error([&] {
    render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "{}", small);
  }, {"t:1:", "too much work", "100000"});
  EXPECT_EQ(render("{% for a in range(300) %}{% for b in range(300) %}{% endfor %}{% endfor %}ok", "{}", small), "ok");
  expect_render_error("{{ 'x' * 10**12 }}", {"result too large"});
  expect_render_error("{{ [1, 2] * 10**9 }}", {"result too large"});
  expect_render_error("{{ 'x'.center(10**12) }}", {"result too large"});
  expect_render_error("{{ 'x'|center(10**12) }}", {"result too large"});
  expect_render_error("{{ '%*d' % (10**8, 1) }}", {"result too large"});
  expect_render_error("{{ '%*d' % (10**10, 1) }}", {"too large"});
  expect_render_error("{{ '%99999999999999d' % 1 }}", {"too large"});
  expect_render_error("{{ '{:>99999999999}'.format(1) }}", {"result too large"});
  expect_render_error("{{ 'x'|indent(10**12, true) }}", {"result too large"});
  expect_render_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                      {"result too large"});
  expect_render_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", {"output is too large"});
  EXPECT_EQ(render("{{ '%5d|%-4s|%*d|%.2f' % (42, 'ab', -3, 7, 3.14159) }}"), "   42|ab  |7  |3.14");
}

}  // namespace
}  // namespace dsi::test
