// libFuzzer target for the safetensors header parser and the strict JSON parser. A cubevec::Error
// is the expected answer to a malformed input; any other exception, a sanitizer report, or a
// header that passes validation but breaks its own invariants is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "base/error.h"
#include "tensor/safetensors_format.h"
#include "base/strict_json.h"

namespace {

// Reports a broken invariant as a crash, so libFuzzer saves the input.
void require(bool condition) {
  if (!condition) std::abort();
}

// What a successful parse promises (safetensors_format.h): spans sorted and contiguous from 0,
// each exactly shape x dtype bits, the last ending at the end of the file.
void check_header(const cubevec::SafetensorsHeader& header, const uint8_t* data, std::size_t size) {
  require(header.data_start == 8 + header.header_length && header.data_start <= size);
  require(header.header_length <= cubevec::kMaxSafetensorsHeader);
  const std::size_t data_bytes = size - header.data_start;
  uint64_t expected_begin = 0;
  volatile uint8_t sink = 0;
  for (const cubevec::SafetensorsEntry& e : header.entries) {
    require(e.dtype != nullptr);
    require(e.begin == expected_begin && e.begin <= e.end && e.end <= data_bytes);
    // In the reference reader's order (elements, then bits; docs/robustness.md, "The safetensors
    // rules"): a zero dimension may follow a huge one.
    uint64_t elements = 1, bits = 0;
    for (uint64_t dim : e.shape) require(!__builtin_mul_overflow(elements, dim, &elements));
    require(!__builtin_mul_overflow(elements, uint64_t{e.dtype->bits}, &bits));
    require(bits % 8 == 0 && bits / 8 == e.end - e.begin);
    // Read every byte the entry claims: a span outside the input is an ASan report.
    for (uint64_t i = e.begin; i < e.end; ++i) sink = static_cast<uint8_t>(sink ^ data[header.data_start + i]);
    expected_begin = e.end;
  }
  require(expected_begin == data_bytes);
}

// The header's entries and metadata as text, or the error message: the fast and the strict
// parsing paths must give the same (safetensors_format.h).
std::string outcome(std::span<const std::byte> bytes, bool strict) {
  try {
    const cubevec::SafetensorsHeader h =
        strict ? cubevec::parse_safetensors_strict(bytes, "fuzz.safetensors") : cubevec::parse_safetensors(bytes, "fuzz.safetensors");
    std::string text = std::to_string(h.data_start);
    for (const auto& e : h.entries) {
      text += "|" + e.name + " " + std::string(e.dtype->name) + " " + std::to_string(e.begin) + " " + std::to_string(e.end);
      for (uint64_t d : e.shape) text += " " + std::to_string(d);
    }
    for (const auto& [k, v] : h.metadata) text += "|" + k + "=" + v;
    return text;
  } catch (const cubevec::Error& e) {
    return std::string("error ") + e.what();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    check_header(cubevec::parse_safetensors(bytes, "fuzz.safetensors"), data, size);
  } catch (const cubevec::Error& e) {
    require(e.what()[0] != '\0');
  }
  require(outcome(bytes, false) == outcome(bytes, true));
  // The whole input as JSON text, at the safetensors header's depth and at a generous one.
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (int max_depth : {2, 64}) {
    try {
      (void)cubevec::parse_strict_json(text, max_depth);
    } catch (const cubevec::Error&) {
    }
  }
  return 0;
}
