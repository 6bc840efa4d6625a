// Structured outputs (response_format {"type": "json_schema", ...}): a JSON Schema compiled for
// generation, and a byte-at-a-time recognizer of the JSON texts that the schema accepts.
//
// What a schema may say (JSON Schema 2020-12 and draft 7 spellings):
// - type (a name or a list of names), enum, const;
// - objects: properties, required (a name not in properties is another key, its value held to
//   patternProperties / additionalProperties, and where no such key may come objects are ruled
//   out), additionalProperties (default true, as the standard says), minProperties,
//   maxProperties; dependentRequired (draft 7: dependencies whose values are lists of names): a
//   property that needs a name the object may not have is never written (a required
//   one is refused); propertyNames as a string schema of pattern, minLength, maxLength, enum or
//   const: declared names it refuses are never written (a required one is refused), other keys
//   are held to it as they are written (enum and const: the names listed, each at most once);
//   patternProperties (at most kMaxPatterns patterns, read as unanchored searches): another key
//   whose name matches some of them takes the merge (as allOf) of their schemas, and a set of
//   patterns whose schemas cannot be merged or have no value in common takes no key; a declared
//   property's value meets the patterns its name matches (merged; one of them false: the property
//   never comes); additionalProperties holds only of keys that match none; the patterns run as the
//   key is written, so that no key starts that only names with no value could end;
// - arrays: items, prefixItems (draft 7: items as an array, additionalItems), minItems, maxItems,
//   uniqueItems where the items are scalars (compared as validators do: 1 equals 1.0; an item
//   starts, and goes on, only while it can still end as a value not written yet: counted where
//   its values lie apart (enum values, null, booleans, bounded integers and multiples, strings of
//   a pattern or maxLength with few completions left), and minItems above the distinct values
//   there can be is refused where they are at most kMaxDistinct); contains
//   with minContains (default 1) and maxContains, where contains is true, or lists scalars by
//   const / enum (anyOf of such too; numbers within 2^53): each item that ends equal to one of them
//   counts, the array closes only with minContains of them, an item is made one of them where
//   the room left needs it, and none equals one once maxContains are written (refused where items
//   could then only be written as one of them: a string with maxLength or a pattern, a bounded
//   number); not beside prefixItems or uniqueItems; minContains 0 without maxContains: ignored;
// - strings: minLength, maxLength (in code points), pattern (json_pattern.h says which readings of
//   ECMA-262 it takes);
// - numbers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or draft 4's booleans),
//   compared as doubles (as validators read JSON numbers); a bounded number is written without
//   an exponent and in at most kMaxBoundedNumber bytes; multipleOf a whole number (then values of
//   at most 15 digits, which validators read exactly);
// - anyOf; oneOf whose alternatives exclude each other as the schemas show it (other types, other
//   enum values, bounds that do not meet, a required property whose values differ: a
//   discriminator), read as anyOf (json_schema_oneof.cpp); either beside other keywords: each
//   alternative merged with them (as an allOf of both); $ref to "#", "#/$defs/..." or
//   "#/definitions/..." (recursion too); allOf, and $ref beside other keywords (2020-12: both
//   hold), merged into one schema: types, enum values and bounds of all, required of all,
//   dependentRequired of all (each property's names from every member), each property's schema
//   from every member (its own,
//   else those of its patternProperties that the name matches, else its additionalProperties),
//   items of all position by position (a member's items past its prefix also hold at another's
//   prefix positions), multipleOf's least common multiple, alternatives (anyOf / oneOf) paired with
//   the rest, patternProperties of all (a pattern in two members: its schemas merged); two
//   different patterns, formats or propertyNames, patternProperties beside another member's
//   additionalProperties (other than true), draft 4's boolean exclusive bounds, or a reference
//   back to itself through the merge are refused;
// - format, for a string without a pattern: date, time, date-time (RFC 3339), uuid, ipv4 and
//   email are written as format checkers accept them; other formats are annotations (as the
//   standard's default vocabulary has all of them), as are title, description, default,
//   examples, $schema, $id, $comment, ...
// - not, where its schema is a type, a const or enum of scalars, both (the listed values of those
//   types), or an anyOf of such (an object's properties of such with required too, rewritten as
//   if's not-if is, json_schema_merge.cpp): the types it names are taken out (integer only where
//   numbers with a fraction are not allowed), and a value never ends equal to a listed one (compared as
//   validators do, 1 equal to 1.0); a string or number goes on only while it can still end as
//   another value (as with unique items), so no text dead-ends on it. In an allOf, the `not`s of
//   the members hold together;
// - if / then / else, where if is what not takes, or an object's properties of such with required
//   (type object or none): rewritten (json_schema_merge.cpp) as the rest and an anyOf of (if and
//   then) and (not-if and else), not-if spelled as an object with one of those properties
//   excluded or one of the required names absent (those the rest requires anyway left out), or
//   no object; then and else without if say nothing; dependentSchemas (draft 7: dependencies
//   whose values are schemas) as an if of each name required, then its schema;
// - a property whose schema is false or takes no value: the key never comes (a required one rules
//   out objects); items or a prefix item that take none: the array ends before them; keywords that
//   rule out a type's values (an object's counts that do not meet, an array's, a string's lengths)
//   take that type out of the schema's, as validators read them (they hold of that type only);
// - an alternative (anyOf, oneOf, a branch of if) that takes no value of any type, alone or
//   merged with an allOf's other members, is left out where others remain (schema_merge::EmptySchema);
// - unevaluatedProperties / unevaluatedItems: read at their level once its allOf and $ref are merged
//   in, as the additionalProperties (the items past every prefix) of the merge; nothing where a
//   schema in place evaluates every key (additionalProperties) or item (items); held in each
//   branch of alternatives in place that evaluate none (required, types, bounds); refused beside
//   alternatives (anyOf, oneOf, if, dependentSchemas, an object's not; for items also contains)
//   whose evaluated keys (items) would depend on the branch taken.
// Keywords that would constrain values in other ways (not or if of other schemas, contains of other
// schemas, $dynamicRef, ...) are refused, with the keyword named:
// the server never claims a constraint it does not enforce.
//
// The generated text: values as RFC 8259 JSON (whitespace between tokens within the limits of
// JsonPrefix), object keys written without escapes while they can still be a declared name, each
// key at most once (other keys compared after their escapes are read); an enum or const value
// in its compact form (nlohmann::json::dump), e.g. {"a":1} for an object, kept only where every
// other keyword of its schema takes it, as a validator applies them all (lengths, pattern, bounds,
// items, counts, uniqueItems, contains, the keys' and the values' own schemas); a value that
// reaches a schema still being compiled through a reference (other than its own) is not kept.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/json_pattern.h"
#include "server/json_scan.h"
#include "server/key_set.h"

namespace dsi::server {

class JsonSchema {
 public:
  enum Type : uint8_t {
    kNull = 1,
    kBoolean = 2,
    kInteger = 4,
    kNumber = 8,  // any number (integers included)
    kString = 16,
    kArray = 32,
    kObject = 64,
    kAnyType = 127,
  };
  struct Node {
    uint8_t types = kAnyType;
    bool has_literals = false;          // enum / const: the value is one of literals
    std::vector<std::string> literals;  // compact texts, sorted
    // not (of const / enum scalars): the values a value may not equal (canonical texts, sorted).
    std::vector<std::string> excluded;
    std::vector<const Node*> any_of;    // when not empty: one of these (and nothing else)
    // Objects.
    std::vector<std::string> names;  // declared properties
    std::vector<const Node*> props;
    uint64_t required = 0;           // bit i: names[i] must come (with what they depend on)
    std::vector<uint64_t> dependents;  // empty, or per name: the names that must come once it has
    uint64_t banned = 0;             // bit i: names[i] may not come (propertyNames, dependents)
    // propertyNames for other keys (their code points): a pattern (run beside patternProperties'
    // where the object has them), length limits.
    std::shared_ptr<const JsonPattern> key_pattern;  // null: none
    int64_t key_min = 0, key_max = -1;
    bool keys_limited() const { return key_pattern || key_min > 0 || key_max >= 0; }
    const Node* additional = nullptr;  // values of other keys that match no pattern; null: no such keys
    bool others = false;               // other keys may come (the compiler sets it)
    // patternProperties: the patterns (at most kMaxPatterns), and per set of them (bit i: pattern
    // i) the value of another key that matches exactly that set (set 0: additional); null: such a
    // key may not come. key_pattern then runs them beside propertyNames' pattern, accepting the
    // keys that may come; key_sets has, per state of it, the set of patterns matched.
    std::vector<std::shared_ptr<const JsonPattern>> key_patterns;
    std::vector<const Node*> pattern_values;
    std::vector<uint32_t> key_sets;
    // Another key's value where the name is other_key: its patterns' (or additional).
    const Node* other_value(int32_t key_state) const {
      return pattern_values.empty() ? additional : pattern_values[key_sets[size_t(key_state)]];
    }
    // The same for the name itself (not declared): null where it may not come (propertyNames'
    // limits, or no such key); matched: the patterns it matches (bit i: key_patterns[i]).
    const Node* other_value(const std::string& name) const;
    uint32_t matched(const std::string& name) const;
    // The value of the key `name`, declared or not; null where it may not come.
    const Node* value_of(const std::string& name) const;
    int64_t min_props = 0, max_props = -1;  // keys in all
    // Arrays.
    std::vector<const Node*> prefix_items;  // the first items' schemas
    const Node* items = nullptr;             // the items after them; null: any value
    bool more_items = true;                  // false: no item after the prefix
    bool unique = false;                     // uniqueItems (items are scalars)
    int64_t distinct = -1;                   // unique: how many distinct items there can be (-1: more than kMaxDistinct)
    int64_t min_items = 0, max_items = -1;
    // contains, where its values are scalars listed by const / enum (json_schema_contains.cpp): the
    // items that equal one of contains_values (canonical texts, sorted) are counted, between
    // min_contains and max_contains (-1: no end).
    bool has_contains = false;
    std::vector<std::string> contains_values;
    int64_t min_contains = 0, max_contains = -1;
    const Node* contains_items = nullptr;  // an item that must match: the values items takes; null: none
    bool contains_avoidable = true;        // an item matching none can be written (where a count is full)
    // The array, with `items` items of which `matched` match, can still be completed.
    bool contains_room(int64_t items, int64_t matched) const;
    // Strings.
    int64_t min_length = 0, max_length = -1;
    std::shared_ptr<const JsonPattern> pattern;  // null: none
    // Numbers: lo <= x (lo < x when lo_open), x <= hi (x < hi when hi_open).
    double lo = -HUGE_VAL, hi = HUGE_VAL;
    bool lo_open = false, hi_open = false;
    double multiple_of = 0;  // > 0: a multiple of this whole number (then |x| < 10^15)
    bool bounded() const { return lo > -HUGE_VAL || hi < HUGE_VAL; }
    // The string `text` (parsed: valid UTF-8) is within minLength, maxLength and the pattern.
    bool string_fits(const std::string& text) const;
    // v lies within the bounds (and is a multiple), read as validators read JSON numbers.
    bool within(double v) const;
  };
  // Some x of [a, b) (integer: some integer of it, a and b integers; step > 0: some multiple of
  // the whole number step) with lo <= x <= hi (strict where open): the compiler's and the
  // recognizer's question about number bounds.
  static bool meets(double a, double b, bool integer, double lo, bool lo_open, double hi, bool hi_open,
                    double step = 0);
  // References and one-schema combinations (an any_of of one) followed to the node they stand
  // for (null stays null).
  static const Node* unwrap(const Node* n);
  // The code points of a parsed string (valid UTF-8), as patterns and lengths read it.
  static std::u32string code_points(const std::string& text);
  // A value's type bit: a number without a fraction is an integer, as validators read it.
  static uint8_t type_of(const nlohmann::json& v);
  // Values of these types are impossible in n (why): taken out of its types; where none is left,
  // n takes no value (schema_merge::EmptySchema with why).
  static void no_values_of(Node& n, uint8_t types, const std::string& why);

  // Throws dsi::Error with the keyword's path for a schema that is malformed or says what is not
  // supported. closed_objects: an object schema with `properties` that says nothing of other keys
  // takes no other keys (as OpenAI's strict functions and xgrammar's strict mode read schemas);
  // read after allOf's merge, so an allOf's members add their properties up.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema, bool closed_objects = false);
  const Node* root() const { return root_; }
  // An item as validators compare scalars: a string after its escapes, a number by its value as a
  // double (1 equals 1.0, -0 equals 0); other texts as they are.
  static std::string canonical(const std::string& text);
  const Node* any() const { return any_; }  // the schema `true`

  static constexpr int kMaxProperties = 64;  // declared properties of one object
  static constexpr int kMaxPatterns = 4;     // patternProperties of one object (all their sets merged)
  static constexpr int kMaxBoundedNumber = 32;  // bytes of a number with bounds
  static constexpr double kMaxMultiple = 999999999999999.0;  // multipleOf's values: 15 digits at most
  static constexpr int64_t kMaxDistinct = 1024;  // uniqueItems: the items' values counted at compile time

 private:
  class Compiler;
  std::deque<Node> nodes_;
  const Node* root_ = nullptr;
  const Node* any_ = nullptr;
};

// The prefixes of texts that the schema accepts. Several readings can be open at once (anyOf, a
// type list, enum values that share a start); a byte keeps those it fits.
class SchemaPrefix {
 public:
  // Whitespace between tokens, in bytes in a row: by default 2 + 2 x the containers open (a
  // newline and an indent of two spaces a level), so a sampler cannot spend its tokens on blanks;
  // space_run > 0 fixes the limit instead (JsonPrefix's is kMaxSpaceRun).
  explicit SchemaPrefix(std::shared_ptr<const JsonSchema> schema, int space_run = 0);
  bool push(unsigned char c);        // false (and the state unchanged) when c does not fit
  bool push(std::string_view bytes);  // all or nothing
  bool advance(std::string_view bytes);  // false when they do not fit; the state then means nothing
  bool complete() const;             // the text so far is a whole accepted value
  // Two states with equal signatures take the same texts (the argument is for JsonPrefix's form).
  std::string signature(size_t max_bytes = 0) const;
  size_t readings() const { return threads_.size(); }
  // Some reading is inside a string without a maxLength or pattern, at rest: every
  // json_string_text() token fits.
  bool takes_string_text() const;

  static constexpr int kMaxDepth = 64;       // nesting beyond this is refused
  static constexpr size_t kMaxReadings = 64;  // readings beyond these are dropped, the last first

 private:
  using Node = JsonSchema::Node;
  enum class Kind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral };
  enum class Phase : uint8_t {
    kFirst,       // object: a key or '}'; array: a value or ']'
    kKey,         // object: a key after ','
    kInKey,       // object: inside a key
    kColon,       // object: after a key
    kAfterValue,  // ',' or the end
  };
  struct Frame {
    const Node* node = nullptr;  // kValue, kObject, kArray, kString (its limits), kLiteral (its texts)
    Kind kind = Kind::kValue;
    Phase phase = Phase::kFirst;
    JsonStringScan str;   // kString, and kObject in a key
    int32_t pat = 0;      // kString with a pattern: its state; kObject in a key: key_pattern's
    int32_t chars = 0;    // kObject in a key: its code points (propertyNames' lengths)
    int32_t at = 0;       // kObject in a key: the byte where its character under way began
    JsonNumberScan num;   // kNumber
    uint8_t num_len = 0;  // kNumber with bounds: its bytes so far
    char num_text[JsonSchema::kMaxBoundedNumber] = {};
    uint64_t seen = 0;    // kObject: declared properties written
    int32_t props = 0;    // kObject: keys written
    uint64_t cand = 0;    // kObject in a key: declared properties it can still be
    bool other = false;   // kObject in a key: it can still be another key
    int32_t count = 0;    // kArray: items; kString: code points (with limits); kObject: the key's bytes
    int32_t matched = 0;  // kArray with contains: the items that match it
    int32_t lo = 0, hi = 0;  // kLiteral: the texts that start with what came
    const Node* value = nullptr;  // kObject after a key: its value's schema
    const std::vector<std::string>* texts = nullptr;  // kLiteral
    // kString / kNumber: its text so far, kept in item: an item of an array with unique items or
    // beside contains, or a value of a node with `not`.
    bool capture = false;
    std::string item;
    std::shared_ptr<const std::vector<std::string>> items_seen;  // kArray with unique items: theirs
    std::string key_text;  // kObject in another key: its text so far (escapes read), as UTF-8
    KeySet keys_seen;  // kObject: the other keys written (a persistent set: copies share it)
    void key(std::string& out) const;                 // what of it decides what may follow
  };
  struct Thread {
    std::vector<Frame> stack;
    int depth = 0;         // containers open
    uint8_t space_run = 0;  // whitespace bytes in a row between tokens
    bool started = false;  // the root value began
    std::string key() const;
  };
  bool push_in_place(unsigned char c);
  // A byte that a string's scan took: its length limits and pattern; false when it does not fit.
  static bool string_byte(Frame& f);
  static bool text_byte(const JsonStringScan& str, int32_t& count, int32_t& pat, const JsonPattern* pattern,
                        int64_t min_length, int64_t max_length);
  // Objects (f on top): the names still to come (required, and what those written need); the
  // declared names that may come next (not written, allowed, with room left within maxProperties
  // for what they need); whether another key may come next.
  static uint64_t needed(const Node& n, const Frame& f);
  static uint64_t open_names(const Node& n, const Frame& f);
  static bool other_open(const Node& n, const Frame& f);
  // The key under way (or one about to start: start) can still end as a key that may come.
  static bool key_can_end(const Node& n, const Frame& f, bool start = false);
  // Another key under way, at propertyNames' state pat after chars code points, the names to avoid
  // (declared ones, other keys written) matching its text up to byte at (where its character under
  // way began; ranges: what that character can still be, none at rest), can end as a name that
  // propertyNames takes and that is none of them, writing no escape while a name still matches.
  static bool other_ends(const Node& n, int32_t pat, int32_t chars, const std::vector<const std::string*>& avoid,
                         size_t at, const std::pair<uint32_t, uint32_t>* ranges, size_t k, int depth);
  // Steps the reading t with byte c; what it becomes (none, one or several readings) goes to out.
  void step_top(Thread t, unsigned char c, std::vector<Thread>& out) const;
  // A value of node starting with c, the reading's frames so far in t; hops: references followed.
  void value_start(Thread t, const Node* node, unsigned char c, std::vector<Thread>& out, int hops) const;
  // The nodes without alternatives that n stands for (through anyOf and references), each once,
  // in order; seen: the nodes met (a node shared by several alternatives is read once).
  static void alternatives(const Node* n, std::vector<const Node*>& leaves, std::vector<const Node*>& seen, int hops);
  static void end_value(Thread& t);
  // The scalar `text` ended an item of the array on top of t: false when the array asks for unique
  // items and an earlier one equals it, or it matches contains where no more may; counts a match.
  static bool item_ends(Thread& t, const std::string& text);
  // An item the array may not take next: equal to an earlier one (uniqueItems), or matching
  // contains where no more may match.
  static bool barred(const Frame& array, const std::string& text);
  // The literal on top can only be a barred item, or a value its node's `not` excludes.
  static bool literal_barred(const Thread& t);
  static const Frame* below_top(const Thread& t);  // the frame under the top one; null: none
  // The values a scalar of node n (an item of array, or about to be; array null: none) may not
  // end as: the items written of an array with unique items (then unique), and what n's `not`
  // excludes; both holds them where there are both. Null: none such.
  static const std::vector<std::string>* avoided(const Frame* array, const Node& n, std::vector<std::string>& both,
                                                 bool& unique);
  // The string f (on top of t) can only end as a barred item or an excluded value: every string
  // it can still become was written (unique items) or is excluded (not); beside contains, only
  // its closing quote can come.
  static bool closing_barred(const Thread& t, const Frame& f);
  // A string f (under way, its text captured for its node's `not` only) that no excluded value
  // starts like any more stops keeping its text: it can end as none of them, and its states then
  // share their signatures (and masks) as other strings' do.
  static void release(const Frame* parent, Frame& f);
  static bool string_barred(const Frame* array, const Frame& f);  // f an item of array (or about to be; null: none)
  // The number f (an item of array; null: none) can only end as a barred item or an excluded
  // value: every number it can still become was written (unique items) or is excluded (not);
  // beside contains, an integer's 0 or -0.
  static bool number_barred(const Frame* array, const Frame& f);
  // The array a with contains: the next item may match it, may match none of it.
  static bool may_match(const Node& n, const Frame& a);
  static bool may_avoid(const Node& n, const Frame& a);
  bool blank(Thread& t) const;
  static void dedupe(std::vector<Thread>& threads);

  std::shared_ptr<const JsonSchema> schema_;
  int space_run_;  // the whitespace limit (0: by depth)
  std::vector<Thread> threads_;
};

}  // namespace dsi::server
