#include "tokenizers/unicode_text.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

#include "base/error.h"

namespace cubevec::tokenizers {

namespace {

icu::UnicodeString to_icu(std::u32string_view text) {
  return icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(text.data()), static_cast<int32_t>(text.size()));
}

std::u32string from_icu(const icu::UnicodeString& s) {
  std::u32string out;
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    out.push_back(static_cast<char32_t>(c));
    i += U16_LENGTH(c);
  }
  return out;
}

int8_t category(char32_t c) { return u_charType(static_cast<UChar32>(c)); }

}  // namespace

std::u32string decode_utf8(std::string_view text, const std::string& what) {
  std::u32string out;
  out.reserve(text.size());
  const auto bad = [&](std::size_t at) { return Error(what + ": invalid UTF-8 at byte " + std::to_string(at) + " (expected UTF-8 text)"); };
  for (std::size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    int extra = 0;
    char32_t c = 0;
    if (b0 < 0x80) {
      c = b0;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
      extra = 1, c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      extra = 2, c = b0 & 0x0F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      extra = 3, c = b0 & 0x07;
    } else {
      throw bad(i);
    }
    if (i + static_cast<std::size_t>(extra) >= text.size() && extra > 0) throw bad(i);
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]);
      if ((b & 0xC0) != 0x80) throw bad(i);
      c = (c << 6) | (b & 0x3F);
    }
    // Overlong forms, surrogates and values above U+10FFFF are not UTF-8.
    if ((extra == 2 && c < 0x800) || (extra == 3 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF)) throw bad(i);
    out.push_back(c);
    i += 1 + static_cast<std::size_t>(extra);
  }
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  for (char32_t c : text) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

std::u32string nfc(std::u32string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw Error(std::string("ICU: no NFC normalizer: ") + u_errorName(status));
  const icu::UnicodeString normalized = normalizer->normalize(to_icu(text), status);
  if (U_FAILURE(status)) throw Error(std::string("ICU: NFC failed: ") + u_errorName(status));
  return from_icu(normalized);
}

std::u32string to_lower(std::u32string_view text) {
  icu::UnicodeString s = to_icu(text);
  s.toLower(icu::Locale::getRoot());
  return from_icu(s);
}

bool is_letter(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_L_MASK) != 0; }
bool is_number(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0; }
bool is_other(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_C_MASK) != 0; }
bool is_space_separator(char32_t c) { return category(c) == U_SPACE_SEPARATOR; }
bool is_python_space(char32_t c) { return c == U' ' || c == 0x2028 || c == 0x2029 || is_space_separator(c); }

bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

}  // namespace cubevec::tokenizers
