// Structured outputs: what the schema compiler (json_schema.cpp) takes from contains, minContains
// and maxContains into an array's node (json_schema_contains.cpp; json_schema.h says what is
// supported).
#pragma once

#include <cstdint>
#include <string>

#include "server/json_schema.h"

namespace dsi::server::schema_contains {

// n (its items, prefixItems, uniqueItems, counts and enum read already) takes the compiled
// contains schema, and counts; matching is a fresh node that becomes the items that match.
// Throws dsi::Error with path for what is not supported, or where no array can then be written
// and the node has no other type.
void setup(JsonSchema::Node& n, const JsonSchema::Node* contains, JsonSchema::Node& matching, int64_t min_contains,
           int64_t max_contains, const std::string& path);

}  // namespace dsi::server::schema_contains
