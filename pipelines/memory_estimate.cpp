#include "pipelines/memory_estimate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <stdexcept>

#include "ops/gemm/tuner.h"
#include "pipelines/stages/offload.h"
#include "tensor/caching_allocator.h"
#include "tensor/error.h"

namespace cubevec::pipelines {

namespace {

// Flash attention's per-thread tiles, the GEMM's packing buffers and the allocator's size-class
// rounding: a fixed allowance on top of the counted tensors.
constexpr uint64_t kWorkspace = uint64_t{64} << 20;

// Every parameter as it is stored: matrices and kernels as `dtype`, vectors (and keep_f32 tables) f32.
uint64_t stored_bytes(const models::ParameterTable& table, DType dtype) {
  uint64_t bytes = 0;
  for (const models::ParameterSpec& spec : table.specs()) {
    const bool narrow = dtype == DType::bf16 && spec.shape.size() >= 2 && !spec.keep_f32;
    bytes += static_cast<uint64_t>(shape_numel(spec.shape)) * (narrow ? 2 : 4);
  }
  return bytes;
}

// The transformer's weights and packed panels, with --offload R counting the blocks' only for the
// blocks that can be in memory at once (R resident, R packed ahead, two in flight).
struct TransformerBytes {
  uint64_t weights = 0, packed = 0;
};

template <class Transformer>
TransformerBytes transformer_bytes(const Transformer& transformer, DType dtype, int offload, int cube_threads) {
  const auto& table = transformer.parameters();
  const std::vector<std::string> modules = block_modules(transformer);
  const auto block_of = [&](const std::string& name) {
    for (std::size_t b = 0; b < modules.size(); ++b)
      if (name.compare(0, modules[b].size() + 1, modules[b] + ".") == 0) return static_cast<int>(b);
    return -1;
  };
  const ops::gemm::Isa isa = ops::gemm::best_isa();
  const ops::gemm::Bf16Path path = ops::gemm::expected_bf16_path(isa, cube_threads);
  TransformerBytes outside;
  std::vector<TransformerBytes> blocks(modules.size());
  std::set<std::string> kept_f32;
  for (const models::ParameterSpec& spec : table.specs()) {
    if (spec.keep_f32) kept_f32.insert(spec.name);
    const bool narrow = dtype == DType::bf16 && spec.shape.size() >= 2 && !spec.keep_f32;
    const int block = block_of(spec.name);
    (block < 0 ? outside : blocks[static_cast<std::size_t>(block)]).weights +=
        static_cast<uint64_t>(shape_numel(spec.shape)) * (narrow ? 2 : 4);
  }
  for (const auto& [name, linear] : table.linears()) {
    const bool bf16 = dtype == DType::bf16 && !kept_f32.count(name + ".weight");
    const uint64_t bytes = ops::gemm::packed_b_bytes(linear->out, linear->in, bf16 ? ops::gemm::Element::bf16 : ops::gemm::Element::f32, isa,
                                                     bf16 ? path : ops::gemm::Bf16Path::f32);
    const int block = block_of(name);
    (block < 0 ? outside : blocks[static_cast<std::size_t>(block)]).packed += bytes;
  }
  TransformerBytes total = outside;
  if (offload <= 0) {
    for (const auto& b : blocks) total.weights += b.weights, total.packed += b.packed;
    return total;
  }
  // The largest blocks stand in for the ones in memory at once.
  std::sort(blocks.begin(), blocks.end(), [](const TransformerBytes& x, const TransformerBytes& y) { return x.weights + x.packed > y.weights + y.packed; });
  const std::size_t window = std::min<std::size_t>(blocks.size(), 2 * static_cast<std::size_t>(offload) + 2);
  for (std::size_t i = 0; i < window; ++i) total.weights += blocks[i].weights, total.packed += blocks[i].packed;
  return total;
}

uint64_t bytes_of(DType activations) { return activations == DType::bf16 ? 2 : 4; }

// AutoencoderKL's decode of an h x w latent (tiled above the config's tile size, as the pipeline
// decodes): the widest activation of a tile times the tensors held at once (a residual block's
// input, norm, SiLU, conv output and shortcut, and those the kernels launched ahead pin: 10,
// measured 8 on the tiny VAEs), plus the picture three times over (the decoded tiles, the blend and
// the result).
uint64_t autoencoder_kl_bytes(const models::AutoencoderKLConfig& c, int64_t latent_h, int64_t latent_w) {
  const int64_t tile = c.tile_latent_size() > 0 ? c.tile_latent_size() : std::max(latent_h, latent_w);
  const int64_t th = std::min(latent_h, tile), tw = std::min(latent_w, tile);
  std::vector<int64_t> channels(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  uint64_t largest = 0;
  int64_t h = th, w = tw;
  for (std::size_t i = 0; i < channels.size(); ++i) {
    const int64_t in = i == 0 ? channels[0] : channels[i - 1];
    largest = std::max(largest, static_cast<uint64_t>(std::max(in, channels[i]) * h * w));
    if (i + 1 < channels.size()) {  // the upsampler's output keeps this block's width at 2x
      h *= 2;
      w *= 2;
      largest = std::max(largest, static_cast<uint64_t>(channels[i] * h * w));
    }
  }
  const uint64_t picture = static_cast<uint64_t>(c.out_channels * latent_h * latent_w * c.upscale() * c.upscale()) * 4;
  return 10 * largest * 4 + 3 * picture + kWorkspace;
}

}  // namespace

std::string MemoryEstimate::describe() const {
  return human_bytes(peak()) + " (weights " + human_bytes(weights) + " + packed GEMM panels " + human_bytes(packed) +
         " + the larger of denoising " + human_bytes(denoising) +
         " and VAE decode " + human_bytes(vae_decode) + ")";
}

MemoryEstimate estimate_memory(const FluxT2IPipeline& pipeline, const T2IOptions& o, int64_t text_tokens, int batch, int offload,
                               int cube_threads) {
  const models::FluxConfig& c = pipeline.transformer().config();
  MemoryEstimate e;
  const TransformerBytes transformer = transformer_bytes(pipeline.transformer(), o.activations, offload, cube_threads);
  e.weights = transformer.weights;
  e.packed = transformer.packed;
  if (pipeline.vae()) e.weights += stored_bytes(pipeline.vae()->parameters(), DType::f32);
  // A single-stream block at its widest holds, per token, the joint input and its norm (2 D), the
  // MLP hidden (4 D), q, k, v and the attention output (4 D), their concatenation (5 D) and the
  // output (D), besides the residual stream (2 D): 18 D. The kernels the host may launch ahead of
  // the device (device/stream.cpp) pin about as much again, and the allocator rounds to size
  // classes: measured 39-57 D per token on both tiny models (D = 32 and 128), so 64 D.
  const int64_t multiple = pipeline.size_multiple();
  const uint64_t tokens = static_cast<uint64_t>((o.width / multiple) * (o.height / multiple) + text_tokens);
  const uint64_t rope = tokens * static_cast<uint64_t>(c.attention_head_dim) * 2 * 4;
  const uint64_t per_token = 64 * static_cast<uint64_t>(c.inner_dim()) * bytes_of(o.activations);
  e.denoising = static_cast<uint64_t>(batch) * tokens * per_token + rope + kWorkspace;
  if (pipeline.vae()) {
    const int64_t up = pipeline.vae()->config().upscale();
    e.vae_decode = autoencoder_kl_bytes(pipeline.vae()->config(), o.height / up, o.width / up);
  }
  return e;
}

MemoryEstimate estimate_memory(const WanT2VPipeline& pipeline, const T2VOptions& o, int64_t text_tokens, int batch, int offload,
                               int cube_threads) {
  const models::WanConfig& c = pipeline.transformer().config();
  MemoryEstimate e;
  const TransformerBytes transformer = transformer_bytes(pipeline.transformer(), o.activations, offload, cube_threads);
  e.weights = transformer.weights;
  e.packed = transformer.packed;
  if (pipeline.vae()) e.weights += stored_bytes(pipeline.vae()->parameters(), DType::f32);
  // A Wan block holds, per video token, the residual stream and its norm (2 D), q, k, v and the
  // self-attention output (4 D), the cross-attention query and output (2 D), and the FFN hidden
  // before and after its activation (2 ffn_dim): 8 D + 2 F. The kernels launched ahead of the
  // device pin about as much again: measured 2.1x that on the tiny model, so 24 D + 4 F.
  const uint64_t tokens = static_cast<uint64_t>((o.latent_frames() / c.patch_size[0]) * (o.height / 8 / c.patch_size[1]) *
                                                (o.width / 8 / c.patch_size[2]));
  const uint64_t per_token = 24 * static_cast<uint64_t>(c.inner_dim()) + 4 * static_cast<uint64_t>(c.ffn_dim);
  const uint64_t text = static_cast<uint64_t>(text_tokens) * 2 * static_cast<uint64_t>(c.inner_dim());  // cross-attention k, v
  const uint64_t rope = tokens * static_cast<uint64_t>(c.attention_head_dim) * 2 * 4;
  e.denoising = static_cast<uint64_t>(batch) * (tokens * per_token + text) * bytes_of(o.activations) + rope + kWorkspace;
  if (pipeline.vae()) e.vae_decode = static_cast<uint64_t>(pipeline.vae()->estimate_peak_bytes(1, o.height / 8, o.width / 8));
  return e;
}

uint64_t available_memory_bytes() {
  uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    meminfo.ignore(64, '\n');
    if (key == "MemAvailable:") available = kib * 1024;
  }
  // A cgroup v2 limit (containers, systemd slices) binds before the machine's free memory does.
  uint64_t max = 0, current = 0;
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  if ((max_file >> max) && (current_file >> current) && max > current) {
    const uint64_t cgroup = max - current;
    available = available == 0 ? cgroup : std::min(available, cgroup);
  }
  return available;
}

uint64_t parse_memory_size(const std::string& text, const std::string& flag) {
  const auto fail = [&] {
    throw Error((flag.empty() ? "" : flag + " ") + "'" + text + "': expected a size in bytes with an optional K, M, G or T suffix (powers of 1024), e.g. 24G or 512MiB");
  };
  // Decimal digits with at most one point, then the suffix: no sign, "inf", hex or exponents.
  const std::size_t number_end = std::min(text.find_first_not_of("0123456789."), text.size());
  const std::string number = text.substr(0, number_end);
  if (number.empty() || !std::isdigit(static_cast<unsigned char>(number[0])) || number.find('.') != number.rfind('.')) fail();
  double value = 0;
  try {
    value = std::stod(number);
  } catch (const std::out_of_range&) {  // hundreds of digits
    fail();
  }
  std::string suffix = text.substr(number_end);
  for (char& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (suffix.size() == 3 && suffix.substr(1) == "IB") suffix = suffix.substr(0, 1);
  else if (suffix.size() == 2 && suffix[1] == 'B') suffix = suffix.substr(0, 1);
  const std::string units = "KMGT";
  double scale = 1;
  if (suffix == "B") suffix.clear();
  if (!suffix.empty()) {
    const std::size_t at = units.find(suffix);
    if (suffix.size() != 1 || at == std::string::npos) fail();
    scale = std::pow(1024.0, static_cast<double>(at + 1));
  }
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 1 || bytes >= 18446744073709551615.0) fail();
  return static_cast<uint64_t>(bytes);
}

void require_fits(const MemoryEstimate& estimate, uint64_t limit_bytes, const std::string& limit_source) {
  if (limit_bytes == 0 || estimate.peak() <= limit_bytes) return;
  throw Error("this request needs an estimated " + estimate.describe() + ", above " + limit_source + " of " + human_bytes(limit_bytes) +
              " (a smaller size, fewer frames, --dtype bf16 or --cfg off need less)");
}

}  // namespace cubevec::pipelines
