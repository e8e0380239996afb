// One table per enum that the command line, config files or reports name: the value's name for
// printing, and parsing with one error format ("unknown <what> 'x' (expected one of: a, b, c)").
// Each enum writes its names once, as an `EnumNames` constant beside its declaration.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "base/error.h"

namespace cubevec {

template <class E, std::size_t N>
class EnumNames {
 public:
  // `what` names the kind of value in errors ("CFG mode"); with `ignore_case`, parse accepts any case.
  constexpr EnumNames(std::string_view what, std::array<std::pair<E, std::string_view>, N> entries, bool ignore_case = false)
      : what_(what), entries_(entries), ignore_case_(ignore_case) {}

  std::string_view name(E value) const {
    for (const auto& [v, n] : entries_)
      if (v == value) return n;
    return "?";
  }

  // Throws cubevec::Error naming the text (as text_for_message shows it) and every accepted name.
  E parse(std::string_view text) const {
    for (const auto& [v, n] : entries_)
      if (equal(n, text)) return v;
    throw Error("unknown " + std::string(what_) + " '" + text_for_message(text) + "' (expected one of: " + list() + ")");
  }

  bool contains(std::string_view text) const {
    return std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return equal(e.second, text); });
  }

  std::string list() const {  // "a, b, c"
    std::string out;
    for (const auto& [v, n] : entries_) out += (out.empty() ? "" : ", ") + std::string(n);
    return out;
  }

  const std::array<std::pair<E, std::string_view>, N>& entries() const { return entries_; }

 private:
  bool equal(std::string_view a, std::string_view b) const {
    if (!ignore_case_) return a == b;
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  }

  std::string_view what_;
  std::array<std::pair<E, std::string_view>, N> entries_;
  bool ignore_case_;
};

// Deduces N: `inline constexpr auto kNames = enum_names<E>("what", {{{E::a, "a"}, {E::b, "b"}}});`
template <class E, std::size_t N>
constexpr EnumNames<E, N> enum_names(std::string_view what, const std::pair<E, std::string_view> (&entries)[N], bool ignore_case = false) {
  std::array<std::pair<E, std::string_view>, N> table{};
  for (std::size_t i = 0; i < N; ++i) table[i] = entries[i];
  return EnumNames<E, N>(what, table, ignore_case);
}

}  // namespace cubevec
