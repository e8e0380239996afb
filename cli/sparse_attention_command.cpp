// `cubevec sparse-attention`: MindIE SD's sparse_attention on q, k, v from a safetensors file, for
// checking a port against MindIE SD's own output on the same inputs: writes `out` (q's layout)
// and `kept_blocks` (u8 [B, N, Lq, Lk], each batch element's own mask: rf_v2's over the pooled
// blocks of the reordered sequence, as MindIE's get_blockwise_mask returns it, though the attention
// uses batch 0's for every batch; ada_bsa's per batch and head), and prints the kept fraction and
// the time.
#include <chrono>
#include <cstdio>
#include <optional>

#include "cli/output_flag.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/range_flag.h"
#include "ops/sparse_attention.h"
#include "base/error.h"
#include "tensor/finite_check.h"
#include "tensor/safetensors.h"

namespace cubevec::cli {

namespace {

struct SparseFlags {
  std::string inputs, out, sparse_type, layout = "BNSD", latent_shape;
  double sparsity = 0.0, cdf_threshold = 1.0;
  std::optional<double> scale;
  int64_t txt_len = 0, head_num = 0;
  int keep_sink = 1, keep_recent = 1, inner_precise = 0;
};

ops::LatentShape parse_latent_shape(const std::string& text) {
  ops::LatentShape s{};
  std::size_t start = 0;
  for (int i = 0; i < 3; ++i) {
    const std::size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part.empty() || part.size() > 18 || part.find_first_not_of("0123456789") != std::string::npos ||
        (i < 2) != (comma != std::string::npos))
      throw Error("--latent-shape must be T,H,W (three positive integers below 10^18), got '" + text + "'");
    s[static_cast<std::size_t>(i)] = std::stoll(part);
    start = comma + 1;
  }
  return s;
}

// Flags of the other algorithm would be ignored silently: refuse them.
void check_flag_applies(const CLI::App& command, const SparseFlags& f) {
  const bool rf = f.sparse_type == "rf_v2", ada = f.sparse_type == "ada_bsa";
  for (const char* name : {"--txt-len", "--latent-shape"})
    if (command.count(name) && !rf) throw Error(std::string(name) + " applies to --sparse-type rf_v2, not " + f.sparse_type);
  for (const char* name : {"--cdf-threshold", "--keep-sink", "--keep-recent"})
    if (command.count(name) && !ada) throw Error(std::string(name) + " applies to --sparse-type ada_bsa, not " + f.sparse_type);
}

int run(const SparseFlags& f, const CLI::App& command, const DeviceFlags& device_flags) {
  if (f.inputs.empty() || f.out.empty()) throw Error("--inputs CASE.safetensors and --out OUT.safetensors are required");
  ops::SparseAttentionOptions o;
  o.sparse_type = ops::parse_sparse_type(f.sparse_type);
  check_flag_applies(command, f);
  o.sparsity = f.sparsity;
  o.txt_len = f.txt_len;
  if (!f.latent_shape.empty()) o.latent_shape_q = parse_latent_shape(f.latent_shape);
  o.keep_sink = f.keep_sink != 0;
  o.keep_recent = f.keep_recent != 0;
  o.cdf_threshold = f.cdf_threshold;
  o.input_layout = ops::parse_attention_layout(f.layout);
  if (o.input_layout != ops::AttentionLayout::bnsd && o.input_layout != ops::AttentionLayout::bsnd)
    throw Error("--layout must be BNSD or BSND (MindIE's sparse_attention layouts), got " + f.layout);
  o.scale = f.scale;
  o.head_num = f.head_num;
  o.inner_precise = f.inner_precise;
  const SafetensorsFile in = SafetensorsFile::open(f.inputs);
  for (const auto& e : in.entries())
    if (e.name != "q" && e.name != "k" && e.name != "v") throw Error(f.inputs + ": unknown tensor '" + e.name + "' (expected q, k and v)");
  for (const char* name : {"q", "k", "v"}) {
    if (!in.contains(name)) throw Error(f.inputs + ": no tensor '" + std::string(name) + "' (expected q, k and v)");
    require_finite(in.tensor(name), f.inputs + ": tensor '" + name + "'");
  }
  Device device(device_flags.resolve());
  const Stream stream = device.default_stream();
  const auto t0 = std::chrono::steady_clock::now();
  const ops::SparseAttentionResult r = ops::sparse_attention(in.tensor("q"), in.tensor("k"), in.tensor("v"), o, stream);
  const Tensor out = r.out.contiguous();
  out.data_ptr();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NamedTensors tensors{{"out", out}};
  double kept = 1.0;
  if (r.kept_blocks.defined()) {
    const Tensor blocks = r.kept_blocks.contiguous();
    const auto* p = static_cast<const uint8_t*>(blocks.data_ptr());
    int64_t count = 0;
    for (int64_t i = 0; i < blocks.numel(); ++i) count += p[i] != 0;
    kept = static_cast<double>(count) / static_cast<double>(std::max<int64_t>(blocks.numel(), 1));
    tensors.push_back({"kept_blocks", blocks});
  }
  write_safetensors(f.out, tensors);
  if (!r.note.empty()) std::fprintf(stderr, "sparse-attention: note: %s\n", r.note.c_str());
  std::fprintf(stderr, "sparse-attention: %s sparsity %g, q %s: kept %.1f%% of the blocks%s, %.3f s; wrote %s\n", f.sparse_type.c_str(),
               f.sparsity, shape_to_string(in.tensor("q").shape()).c_str(), 100.0 * kept,
               r.kept_blocks.defined() ? (" " + shape_to_string(r.kept_blocks.shape())).c_str() : "", seconds, f.out.c_str());
  return 0;
}

}  // namespace

CommandRunner add_sparse_attention_command(CLI::App& app) {
  auto* command = app.add_subcommand("sparse-attention",
                                     "MindIE SD's sparse_attention (rf_v2, ada_bsa) on q, k, v from a file; writes out and "
                                     "kept_blocks for comparison with MindIE SD");
  auto flags = std::make_shared<SparseFlags>();
  auto device_flags = add_device_flags(*command);
  command->add_option("--inputs", flags->inputs, "safetensors with q, k, v (self-attention: one shape)");
  command->add_option("--out", flags->out, "Output safetensors: out, and kept_blocks (u8)")->check(output_file_path());
  command->add_option("--sparse-type", flags->sparse_type, "rf_v2, ada_bsa or none (dense attention: writes only out)")->required();
  command->add_option("--sparsity", flags->sparsity, "Fraction of blocks to skip, [0, 1]")->required();
  command->add_option("--txt-len", flags->txt_len, "rf_v2: the first N tokens are text");
  command->add_option("--latent-shape", flags->latent_shape, "rf_v2: T,H,W of the image tokens (T * H * W = S - txt-len)");
  command->add_option("--keep-sink", flags->keep_sink, "ada_bsa: force the first key block (0 or 1, default 1)")->check(in_range(0, 1));
  command
      ->add_option("--keep-recent", flags->keep_recent,
                   "ada_bsa: keep_recent (0 or 1, default 1; non-causal attention always keeps the last key block, as MindIE's kernel, so "
                   "it changes nothing here)")
      ->check(in_range(0, 1));
  command->add_option("--cdf-threshold", flags->cdf_threshold, "ada_bsa: CDF threshold, (0, 1] (default 1)");
  command->add_option("--layout", flags->layout, "BNSD (default) or BSND");
  command->add_option("--head-num", flags->head_num, "Heads (must equal q's)");
  command->add_option("--scale", flags->scale, "Softmax scale (default D^-0.5)");
  command->add_option("--inner-precise", flags->inner_precise, "MindIE's NPU precision mode 0..4 (no effect here)");
  return [flags, device_flags, command] { return run(*flags, *command, *device_flags); };
}

}  // namespace cubevec::cli
