// Structured outputs: what a compiled schema node's values are, for the compiler (json_schema.cpp)
// and the recognizer (json_schema_prefix.cpp): whether a value validates against a node (enum and
// const values are kept only where the rest of their schema takes them), how many distinct scalars
// an item can be, and whether an item of an array with unique items can still become a value not
// written yet (json_schema_values.cpp).
#pragma once

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
