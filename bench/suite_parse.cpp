// Suite `parse`: the cost of reading untrusted headers and declaring big models, which must grow
// linearly (issue 17): safetensors headers of 10^4, 10^5 and 10^6 one-element tensors parsed and
// validated from memory (target: 10^6 in under 3 s), and a parameter table of 10^4 transformer
// layers (12 parameters each) declared. Rows give the time per tensor or parameter, whose
// constancy across sizes is the linearity.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "models/parameters.h"
#include "tensor/safetensors_format.h"

namespace cubevec::bench {

namespace {

// A safetensors file image: n F32 tensors of one element each.
std::vector<std::byte> header_file(int64_t n) {
  std::string json = "{";
  for (int64_t i = 0; i < n; ++i) {
    json += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) +
            "," + std::to_string(4 * i + 4) + "]}";
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t length = json.size();
  // Built as chars, then copied once: growing a small std::byte vector in place makes GCC 12 report
  // impossible paths inside its own memmove (-Warray-bounds, -Wnull-dereference).
  std::string bytes(8, '\0');  // the header length, little-endian
  for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  bytes += json;
  bytes.append(4 * static_cast<std::size_t>(n), '\0');
  const auto* first = reinterpret_cast<const std::byte*>(bytes.data());
  return std::vector<std::byte>(first, first + bytes.size());
}

}  // namespace

void parse_suite(Context& context) {
  for (const int64_t n : {int64_t{10000}, int64_t{100000}, int64_t{1000000}}) {
    const std::vector<std::byte> file = header_file(n);
    std::size_t entries = 0;
    const Timing t = time_runs([&] { entries = parse_safetensors(file, "bench.safetensors").entries.size(); }, n >= 1000000 ? 2 : 3,
                               n >= 1000000 ? 0 : 1);
    Result r{"parse", "safetensors header, " + std::to_string(n) + " tensors", "parse_safetensors"};
    r.timing = t;
    r.gbps = static_cast<double>(file.size()) / t.median_s / 1e9;
    r.extra["us_per_tensor"] = t.median_s / static_cast<double>(n) * 1e6;
    r.extra["tensors"] = static_cast<double>(entries);
    r.extra["target_s"] = n == 1000000 ? 3.0 : 0.0;
    context.add(r);
  }
  const int layers = 10000;
  const char* parameters[] = {"attn1.to_q.weight",     "attn1.to_q.bias",     "attn1.to_k.weight",     "attn1.to_k.bias",
                              "attn1.to_v.weight",     "attn1.to_v.bias",     "attn1.to_out.0.weight", "attn1.to_out.0.bias",
                              "ffn.net.0.proj.weight", "ffn.net.0.proj.bias", "ffn.net.2.weight",      "ffn.net.2.bias"};
  std::vector<Tensor> slots(static_cast<std::size_t>(layers) * std::size(parameters));
  const Timing t = time_runs(
      [&] {
        models::ParameterTable table;
        std::size_t slot = 0;
        for (int l = 0; l < layers; ++l)
          for (const char* p : parameters) table.add("blocks." + std::to_string(l) + "." + p, {4, 4}, &slots[slot++]);
        models::make_meta_parameters(table, DType::f32);
      },
      3);
  Result r{"parse", "declare 10000 layers x 12 parameters", "ParameterTable"};
  r.timing = t;
  r.extra["us_per_parameter"] = t.median_s / static_cast<double>(slots.size()) * 1e6;
  context.add(r);
}

}  // namespace cubevec::bench
