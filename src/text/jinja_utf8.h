// UTF-8 and the bits of Python's str semantics the Jinja engine needs: code-point length, indexing and
// slicing, whitespace (str.isspace), case mapping (str.upper/lower/title) and printability (repr).
#pragma once

#include <string>
#include <string_view>

namespace dsi::jinja::utf8 {

// Code points of s; a byte that is not valid UTF-8 decodes to itself as U+00xx (never throws).
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append(std::string& out, char32_t c);
size_t length(std::string_view s);  // number of code points

bool is_space(char32_t c);      // Python str.isspace() for one character
bool is_printable(char32_t c);  // Python str.isprintable() (approximation outside Latin-1, see .cpp)
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_cased_upper(char32_t c);
bool is_cased_lower(char32_t c);
bool is_word(char32_t c);  // regex \w: letters, digits, underscore

std::string upper(std::string_view s);  // Python str.upper (incl. ß -> SS)
std::string lower(std::string_view s);
std::u32string upper32(std::u32string_view s);
std::u32string lower32(std::u32string_view s);
char32_t to_upper(char32_t c);  // one-to-one mappings only
char32_t to_lower(char32_t c);

}  // namespace dsi::jinja::utf8
