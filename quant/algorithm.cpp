#include "quant/algorithm.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "base/enum_names.h"
#include "base/error.h"

namespace cubevec::quant {

namespace {

constexpr auto kNames = enum_names<Algorithm>("quantization algorithm",
                                              {{Algorithm::w8a16, "W8A16"},
                                               {Algorithm::w8a8, "W8A8"},
                                               {Algorithm::w8a8_dynamic, "W8A8_DYNAMIC"},
                                               {Algorithm::w8a8_timestep, "W8A8_TIMESTEP"}},
                                              /*ignore_case=*/true);

// mindiesd/quantization/mode.py QuantAlgorithm values.
constexpr std::array<std::string_view, 24> kMindie = {"W8A8",
                                                      "W8A8_TIMESTEP",
                                                      "W8A8_DYNAMIC",
                                                      "W4A4_DYNAMIC",
                                                      "W8A8_MXFP8",
                                                      "W4A4_MXFP4_DYNAMIC",
                                                      "W8A16",
                                                      "W4A16",
                                                      "W4A16_AWQ",
                                                      "W4A8_AWQ",
                                                      "W8A16_GPTQ",
                                                      "W4A16_GPTQ",
                                                      "W8A8_PER_CHANNEL",
                                                      "W8A8_PER_TENSOR",
                                                      "W8A8_PER_CHANNEL_PER_TOKEN",
                                                      "W8A8_PER_CHANNEL_PER_TENSOR",
                                                      "W8A8_PER_TENSOR_PER_TOKEN",
                                                      "INT8",
                                                      "MIXED_PERCISION",
                                                      "FP8_DYNAMIC",
                                                      "NO_QUANT",
                                                      "W4A4_MXFP4_SVD",
                                                      "W4A4_MXFP4_DUALSCALE",
                                                      "W4A4_MXFP4"};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string_view algorithm_name(Algorithm algorithm) { return kNames.name(algorithm); }

bool is_mindie_algorithm(std::string_view name) {
  const std::string u = upper(name);
  return std::find(kMindie.begin(), kMindie.end(), u) != kMindie.end();
}

std::optional<Algorithm> parse_algorithm(std::string_view name, const std::string& source) {
  if (kNames.contains(name)) return kNames.parse(name);
  if (is_mindie_algorithm(name)) return std::nullopt;
  throw Error(source + ": unknown quantization algorithm '" + std::string(name) + "' (cubevec runs " + kNames.list() + ")");
}

}  // namespace cubevec::quant
