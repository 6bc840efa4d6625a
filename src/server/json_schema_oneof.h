// Structured outputs: whether a oneOf's alternatives exclude each other, so that the compiler
// (json_schema.cpp) can read it as an anyOf (json_schema_oneof.cpp).
#pragma once

#include <string>
#include <vector>

#include "server/json_schema.h"

namespace dsi::server::schema_oneof {

// Returns where no value can match two of alts, as far as their schemas show it: other types,
// other enum values, number bounds that do not meet, objects with a required property whose values
// exclude each other (a discriminator). Else throws dsi::Error at `at`, naming the two.
void exclusive(const std::vector<const JsonSchema::Node*>& alts, const std::string& at);

}  // namespace dsi::server::schema_oneof
