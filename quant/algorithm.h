// MindIE SD's quantization algorithms, by the names its description files use
// (mindiesd/quantization/mode.py QuantAlgorithm), and which of them cubevec runs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cubevec::quant {

// The schemes cubevec implements (quant/schemes.h).
enum class Algorithm { w8a16, w8a8, w8a8_dynamic, w8a8_timestep };

std::string_view algorithm_name(Algorithm algorithm);  // "W8A16", "W8A8", "W8A8_DYNAMIC", "W8A8_TIMESTEP"
// A description value, matched case-insensitively as MindIE SD matches per-layer values: the
// algorithm, or nothing for a name MindIE SD knows that cubevec does not run (W4A4_MXFP4, ...);
// an Error naming `source` for a name MindIE SD does not know either.
std::optional<Algorithm> parse_algorithm(std::string_view name, const std::string& source);
// True for any of MindIE SD's QuantAlgorithm values (case-insensitive).
bool is_mindie_algorithm(std::string_view name);

}  // namespace cubevec::quant
