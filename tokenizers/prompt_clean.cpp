#include "tokenizers/prompt_clean.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "tokenizers/unicode_text.h"

namespace cubevec::tokenizers {

namespace {

struct NamedReference {
  const char* name;
  const char* value;
};
struct NumericFixup {
  uint32_t code;
  const char* value;
};

#include "tokenizers/html_entities.inc"

const char* named_reference(std::string_view name) {
  const auto* end = std::end(kNamedReferences);
  const auto* it = std::lower_bound(std::begin(kNamedReferences), end, name,
                                    [](const NamedReference& r, std::string_view n) { return std::string_view(r.name) < n; });
  return it != end && std::string_view(it->name) == name ? it->value : nullptr;
}

// Python's str.isspace() (strip) and the regex module's \s (whitespace_clean) differ on U+001C-001F.
bool python_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
bool regex_space(char32_t c) { return python_isspace(c) && !(c >= 0x1C && c <= 0x1F); }

std::u32string strip(const std::u32string& s) {
  std::size_t begin = 0, end = s.size();
  while (begin < end && python_isspace(s[begin])) ++begin;
  while (end > begin && python_isspace(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

bool is_digit(char32_t c) { return c >= U'0' && c <= U'9'; }
bool is_hex(char32_t c) { return is_digit(c) || (c >= U'a' && c <= U'f') || (c >= U'A' && c <= U'F'); }

// One numeric reference's replacement (digits without "&#" / "&#x" and ';').
std::u32string numeric(const std::u32string& digits, int base) {
  uint64_t value = 0;
  bool huge = false;
  for (char32_t c : digits) {
    const uint64_t d = is_digit(c) ? c - U'0' : (c | 0x20) - U'a' + 10;
    if (value > (uint64_t{1} << 40)) huge = true;  // far beyond U+10FFFF: the exact value no longer matters
    else value = value * static_cast<uint64_t>(base) + d;
  }
  if (!huge)
    for (const NumericFixup& f : kNumericFixups)
      if (f.code == value) return decode_utf8(f.value, "an HTML table entry");
  if (huge || (value >= 0xD800 && value <= 0xDFFF) || value > 0x10FFFF) return U"\uFFFD";
  if (std::find(std::begin(kDroppedCodePoints), std::end(kDroppedCodePoints), value) != std::end(kDroppedCodePoints)) return U"";
  return std::u32string(1, static_cast<char32_t>(value));
}

std::u32string unescape(const std::u32string& s) {
  std::u32string out;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] != U'&') {
      out.push_back(s[i++]);
      continue;
    }
    const std::size_t at = i + 1;
    // &#123; or &#x7B; (';' optional)
    if (at < s.size() && s[at] == U'#') {
      const bool hex = at + 1 < s.size() && (s[at + 1] == U'x' || s[at + 1] == U'X');
      std::size_t d = at + (hex ? 2 : 1), e = d;
      while (e < s.size() && (hex ? is_hex(s[e]) : is_digit(s[e]))) ++e;
      if (e > d) {
        out += numeric(s.substr(d, e - d), hex ? 16 : 10);
        i = e + (e < s.size() && s[e] == U';' ? 1 : 0);
        continue;
      }
      out.push_back(s[i++]);  // "&#" without digits stays
      continue;
    }
    // A name: 1 to 32 characters other than \t \n \f space < & # ;, then an optional ';'.
    std::size_t e = at;
    while (e < s.size() && e - at < 32 && s[e] != U'\t' && s[e] != U'\n' && s[e] != U'\f' && s[e] != U' ' && s[e] != U'<' && s[e] != U'&' &&
           s[e] != U'#' && s[e] != U';')
      ++e;
    if (e == at) {
      out.push_back(s[i++]);
      continue;
    }
    if (e < s.size() && s[e] == U';') ++e;
    const std::u32string name = s.substr(at, e - at);
    const std::string utf8 = encode_utf8(name);
    if (const char* value = named_reference(utf8)) {
      out += decode_utf8(value, "an HTML table entry");
    } else {
      // The longest prefix of at least 2 characters that is a name, the rest kept as it is.
      bool found = false;
      for (std::size_t x = name.size() - 1; x >= 2 && !found; --x)
        if (const char* prefix = named_reference(encode_utf8(name.substr(0, x)))) {
          out += decode_utf8(prefix, "an HTML table entry") + name.substr(x);
          found = true;
        }
      if (!found) out += U"&" + name;
    }
    i = e;
  }
  return out;
}

}  // namespace

std::string html_unescape(const std::string& text, const std::string& what) { return encode_utf8(unescape(decode_utf8(text, what))); }

std::string wan_prompt_clean(const std::string& prompt, const std::string& what) {
  const std::u32string basic = strip(unescape(unescape(decode_utf8(prompt, what))));
  std::u32string collapsed;
  for (std::size_t i = 0; i < basic.size();) {
    if (regex_space(basic[i])) {
      collapsed.push_back(U' ');
      while (i < basic.size() && regex_space(basic[i])) ++i;
    } else {
      collapsed.push_back(basic[i++]);
    }
  }
  return encode_utf8(strip(collapsed));
}

}  // namespace cubevec::tokenizers
