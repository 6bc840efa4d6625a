// Structured outputs: what a compiled schema node's values are, for the compiler (json_schema.cpp)
// and the recognizer (json_schema_prefix.cpp): whether a value validates against a node (enum and
// const values are kept only where the rest of their schema takes them), how many distinct scalars
// an item can be, and whether an item of an array with unique items can still become a value not
// written yet (json_schema_values.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/json_schema.h"

namespace dsi::server::schema_values {

// Whether v validates against n, read as the recognizer writes n's values (every keyword the node
// holds, its items', properties' and alternatives' schemas too; null is any value). busy: nodes
// still being compiled (a reference back into a schema under way), which take no value. With
// literals false, n's own enum or const list is not read (the list being filtered).
bool validates(const JsonSchema::Node* n, const nlohmann::json& v, const std::function<bool(const JsonSchema::Node*)>& busy,
               bool literals = true);

// The distinct scalars (compared as validators do: 1 equals 1.0) that a value of n can be, where
// they are at most cap; -1 where there are more, or no end.
int64_t distinct(const JsonSchema::Node* n, int64_t cap);

// A number's text as far as it is written (digits and a dot, no exponent; "12." reads as 12),
// locale-independent.
double parse_number_text(std::string_view text);

// The magnitudes that a number whose text began as `body` (digits and a dot, no sign, no exponent)
// can still end as, up to hi: fn(a, b) for each interval [a, b) of them, until it returns true.
// They lie in [d 10^k, (d + 1) 10^k) for some k (digits d, no dot yet), or in [v, v + 10^-f) (a dot
// and f digits after it: v; at least [v, the next double)); all of [0, inf) before a digit. The recognizer's bounds check
// (json_schema_prefix.cpp) and the unique items' count of numbers left both read them.
template <class F>
bool magnitudes(std::string_view body, double hi, F&& fn) {
  if (body.empty()) return fn(0.0, HUGE_VAL);
  const size_t dot = body.find('.');
  if (dot == std::string_view::npos) {
    if (body == "0") return fn(0.0, 1.0);  // nothing but a fraction can follow a leading 0
    const double d = parse_number_text(body);
    for (double scale = 1.0; d * scale <= hi && std::isfinite(d * scale); scale *= 10.0)
      if (fn(d * scale, (d + 1.0) * scale)) return true;
    return false;
  }
  // (At least up to the next double: past about 16 digits v + 10^-f rounds back to v, and the
  // digits still to come reach v and the doubles just above it.)
  const double v = parse_number_text(body);
  return fn(v, std::max(v + std::pow(10.0, -double(body.size() - dot - 1)), std::nextafter(v, HUGE_VAL)));
}

// The values an item of n may not end as: the items written so far (canonical texts) and those
// n's `not` excludes; `both` holds them where there are both.
const std::vector<std::string>& avoided(const JsonSchema::Node& n, const std::vector<std::string>& items,
                                        std::vector<std::string>& both);

// The canonical texts of the items written so far (JsonSchema::canonical), and an item to come:
// - some value of n (alternatives included) is none of them;
bool some_unused(const JsonSchema::Node* n, const std::vector<std::string>& seen);
// - the string of n under way (its bytes after the opening quote, as written) can still end as a
//   string that is none of them;
bool string_unused(const JsonSchema::Node& n, std::string_view raw, const std::vector<std::string>& seen);
// - the number of n under way (its text so far; integer: no fraction) can still end as one that
//   is none of them. Numbers whose values lie apart (integers, multiples, one point) are counted
//   within the bounds and, where there are few, each is looked at.
bool number_unused(const JsonSchema::Node& n, std::string_view text, bool integer, const std::vector<std::string>& seen);

}  // namespace dsi::server::schema_values
