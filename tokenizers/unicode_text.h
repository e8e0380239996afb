// The Unicode a tokenizer needs, on UTF-32 code points: strict UTF-8 decoding (a prompt that is
// not UTF-8 is an error naming the byte), NFC, full lower-casing (Python's str.lower(): 'İ' becomes
// two code points, a final 'Σ' becomes 'ς'), and general categories. ICU does the work; these
// wrappers keep it out of the tokenizers' headers.
#pragma once

#include <string>
#include <string_view>

namespace cubevec::tokenizers {

// Throws cubevec::Error "<what>: invalid UTF-8 at byte N" for malformed input.
std::u32string decode_utf8(std::string_view text, const std::string& what);
std::string encode_utf8(std::u32string_view text);

std::u32string nfc(std::u32string_view text);
std::u32string to_lower(std::u32string_view text);

bool is_letter(char32_t c);           // L*
bool is_number(char32_t c);           // N*
bool is_other(char32_t c);            // C* (control, format, private use, surrogate, unassigned)
bool is_space_separator(char32_t c);  // Zs
// Python's str.isspace() for the characters that survive CLIP's cleaning: ' ', Zs, U+2028, U+2029.
bool is_python_space(char32_t c);
// The CJK ideograph blocks BERT-style tokenizers put spaces around.
bool is_cjk_ideograph(char32_t c);

}  // namespace cubevec::tokenizers
