// Structured outputs: what the schema compiler (json_schema.cpp) shares with allOf's merge
// (json_schema_merge.cpp): keyword names, paths in messages, references, and the merge itself.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"

namespace dsi::server::schema_merge {

// What the compiler and the merge throw for a schema that is well-formed but takes no value of any
// type (types or enum values with none in common; each type's values ruled out, e.g. objects by a
// required name that may not come: JsonSchema::no_values_of). An alternative (of anyOf, oneOf, or
// if's branches) that takes none is left out, where others remain; a property's value that takes
// none means the key never comes, items' that no such item comes. Any other error (malformed, or
// saying what is not supported) is the schema's.
class EmptySchema : public dsi::Error {
 public:
  using dsi::Error::Error;
};
template <typename... Args>
[[noreturn]] void fail_empty(fmt::format_string<Args...> f, Args&&... args) {
  throw EmptySchema(fmt::format(f, std::forward<Args>(args)...));
}

// A keyword that says nothing of which values are accepted (title, description, $defs, ...).
bool annotation(const std::string& k);
// On an object schema that a rewrite wrote (not's negations, the condition of an if), an
// annotation: the names of its properties that only the rewrite named (an array). They say what
// the rewrite reads, not which keys may come: closed objects (JsonSchema::compile's
// closed_objects) close only over the other names (those a schema of the tree declares), and take
// none of these names; an object whose properties are all such names is not closed. A merge keeps
// the names that neither side declares.
inline constexpr const char* kRewriteNames = "$dsinfer-rewrite-names";
// kRewriteNames of s (empty where it has none).
std::set<std::string> rewrite_names(const nlohmann::json& s);
// A property name as a part of a path in messages: control bytes as \xNN, at most 40 bytes.
std::string part(const std::string& name);
// The schema a reference inside root points at ("#..."); throws dsi::Error with path.
const nlohmann::json& target(const nlohmann::json& root, const std::string& ref, const std::string& path);
// s has a keyword beside `key` that constrains values (not an annotation).
bool constrains_beside(const nlohmann::json& s, const char* key);

// s says what merge() rewrites into keywords the compiler takes: if / then / else, and
// dependentSchemas (draft 7: dependencies whose values are schemas), each of which is
// {"if": {"type": "object", "required": [name]}, "then": schema}.
bool conditional(const nlohmann::json& s);

// The schema s with its allOf and $ref taken in (and with them its unevaluatedProperties and
// unevaluatedItems read as additionalProperties and items): one schema without either at its top (its
// keywords, or an anyOf / oneOf of such) that accepts what s accepts. References are followed
// where they are merged with something; one that leads back to itself there is refused (the merge
// would not end). Keywords that cannot be merged (two patterns, two formats) are refused, with the
// path. merges counts the pairs merged, across calls (a bound on the work).
nlohmann::json merge(const nlohmann::json& root, const nlohmann::json& s, const std::string& path, int& merges);
// What every schema of `all` accepts, merged into one (as an allOf of them).
nlohmann::json all_of(const nlohmann::json& root, const std::vector<nlohmann::json>& all, const std::string& path,
                      int& merges);

}  // namespace dsi::server::schema_merge
