// Sparse attention as a user runs it: `cubevec sparse-attention` writes out and kept_blocks equal to
// ops::sparse_attention on the same file (rf_v2's per batch element, as MindIE's); `t2v --sparse`
// on the tiny Wan model reports the stage;
// `--simulate --sparse rf_v2 --sparsity 0.8` models a cheaper Wan2.1-14B step; bad flags and
// inputs are one-line errors.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cli/run_cubevec.h"
#include "ops/sparse_attention.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace sparse_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using SparseCli = cubevec_cli_test::CliTest;

using cubevec_cli_test::kWan;

// A u8 tensor's bytes, row-major.
std::vector<uint8_t> bytes_of(const cubevec::Tensor& t) {
  const cubevec::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.numel()};
}

std::string write_qkv(const fs::path& dir, const cubevec::Shape& shape) {
  const std::string path = (dir / "case.safetensors").string();
  cubevec::write_safetensors(path, {{"q", cubevec::testing::random_tensor(shape, 1, cubevec::DType::f32, 1.0f)},
                                    {"k", cubevec::testing::random_tensor(shape, 2, cubevec::DType::f32, 1.0f)},
                                    {"v", cubevec::testing::random_tensor(shape, 3, cubevec::DType::f32, 1.0f)}});
  return path;
}

TEST_F(SparseCli, PortingCheckWritesOutAndKeptBlocks) {
  const std::string in = write_qkv(dir_, {1, 2, 3 * 16 * 16, 16}), out = (dir_ / "out.safetensors").string();
  const auto r =
      run({"sparse-attention", "--inputs", in, "--sparse-type", "rf_v2", "--sparsity", "0.5", "--latent-shape", "3,16,16", "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("sparse-attention: rf_v2 sparsity 0.5, q [1, 2, 768, 16]: kept"), std::string::npos) << r.err;
  const cubevec::SafetensorsFile file = cubevec::SafetensorsFile::open(out);
  const cubevec::SafetensorsFile inputs = cubevec::SafetensorsFile::open(in);
  cubevec::ops::SparseAttentionOptions o;
  o.sparse_type = cubevec::ops::SparseType::rf_v2;
  o.sparsity = 0.5;
  o.latent_shape_q = cubevec::ops::LatentShape{3, 16, 16};
  const cubevec::ops::SparseAttentionResult want =
      cubevec::ops::sparse_attention(inputs.tensor("q"), inputs.tensor("k"), inputs.tensor("v"), o);
  EXPECT_EQ(cubevec::testing::values(file.tensor("out")), cubevec::testing::values(want.out));
  EXPECT_EQ(file.tensor("kept_blocks").shape(), (cubevec::Shape{1, 2, 6, 6}));
  EXPECT_EQ(file.tensor("kept_blocks").dtype(), cubevec::DType::u8);

  const auto ada =
      run({"sparse-attention", "--inputs", in, "--sparse-type", "ada_bsa", "--sparsity", "0.5", "--cdf-threshold", "0.9", "--out", out});
  ASSERT_EQ(ada.status, 0) << ada.err;
  EXPECT_EQ(cubevec::SafetensorsFile::open(out).tensor("kept_blocks").shape(), (cubevec::Shape{1, 2, 6, 6}));
}

// MindIE's get_blockwise_mask gives each batch element its own rf_v2 mask ([B, N, L, L]); the
// attention itself uses batch 0's for all of them.
TEST_F(SparseCli, RfV2KeptBlocksPerBatch) {
  const std::string in = write_qkv(dir_, {2, 2, 3 * 16 * 16, 16}), out = (dir_ / "out.safetensors").string();
  const auto r =
      run({"sparse-attention", "--inputs", in, "--sparse-type", "rf_v2", "--sparsity", "0.5", "--latent-shape", "3,16,16", "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  const cubevec::SafetensorsFile file = cubevec::SafetensorsFile::open(out);
  const cubevec::SafetensorsFile inputs = cubevec::SafetensorsFile::open(in);
  const cubevec::Tensor kept = file.tensor("kept_blocks");
  ASSERT_EQ(kept.shape(), (cubevec::Shape{2, 2, 6, 6}));
  cubevec::ops::SparseAttentionOptions o;
  o.sparse_type = cubevec::ops::SparseType::rf_v2;
  o.sparsity = 0.5;
  o.latent_shape_q = cubevec::ops::LatentShape{3, 16, 16};
  const cubevec::Tensor q = inputs.tensor("q"), k = inputs.tensor("k"), v = inputs.tensor("v");
  EXPECT_EQ(cubevec::testing::values(file.tensor("out")), cubevec::testing::values(cubevec::ops::sparse_attention(q, k, v, o).out));
  // Batch b's mask is the one batch b alone gives, and the two differ (it is not batch 0's copied).
  std::vector<std::vector<uint8_t>> per_batch;
  for (int64_t b = 0; b < 2; ++b) {
    const auto alone = cubevec::ops::sparse_attention(q.narrow(0, b, 1), k.narrow(0, b, 1), v.narrow(0, b, 1), o).kept_blocks;
    per_batch.push_back(bytes_of(kept.narrow(0, b, 1)));
    EXPECT_EQ(per_batch.back(), bytes_of(alone)) << "batch " << b;
  }
  EXPECT_NE(per_batch[0], per_batch[1]);
}

TEST_F(SparseCli, T2vWithSparseAttentionAndSimulate) {
  const std::string embeds = (dir_ / "e.safetensors").string();
  cubevec::write_safetensors(embeds, {{"prompt_embeds", cubevec::testing::random_tensor({1, 7, 24}, 2, cubevec::DType::f32, 1.0f)}});
  const std::string json = (dir_ / "r.json").string();
  const auto r = run({"t2v",
                      "--model",
                      kWan,
                      "--prompt-embeds",
                      embeds,
                      "--frames",
                      "9",
                      "--width",
                      "256",
                      "--height",
                      "128",
                      "--steps",
                      "4",
                      "--cfg",
                      "off",
                      "--sparse",
                      "rf_v2",
                      "--sparsity",
                      "0.5",
                      "--sparse-step-start",
                      "1",
                      "--sparse-mask-refresh",
                      "2",
                      "--out",
                      (dir_ / "v.avi").string(),
                      "--json",
                      json});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("sparse rf_v2 0.5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mask estimates (every 2 steps); kept"), std::string::npos) << r.err;
  EXPECT_NE(cubevec_cli_test::read_file(json).find("\"kept_fraction_per_step\""), std::string::npos);

  // The modelled Wan2.1-14B step: cheaper with 80% of the blocks skipped (self-attention is about
  // 40% of the dense step, so skipping 80% of it saves over a fifth).
  const auto modelled = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"t2v",
                                     "--simulate",
                                     "--model",
                                     std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/wan2.1-t2v-14b",
                                     "--device-profile",
                                     std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/ascend-910b.json",
                                     "--dtype",
                                     "bf16",
                                     "--steps",
                                     "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto p = run(args);
    EXPECT_EQ(p.status, 0) << p.err;
    // "modelled denoising   47.6   (23.818 s/step ...)": the number after the parenthesis.
    const std::size_t line = p.err.find("modelled denoising"), open = p.err.find('(', line);
    EXPECT_NE(line, std::string::npos) << p.err;
    return line == std::string::npos || open == std::string::npos ? 0.0 : std::stod(p.err.substr(open + 1));
  };
  const double dense = modelled({}), sparse = modelled({"--sparse", "rf_v2", "--sparsity", "0.8"});
  EXPECT_GT(dense, 0.0);
  EXPECT_LT(sparse, 0.8 * dense) << "dense " << dense << " s/step, rf_v2 0.8 " << sparse << " s/step";
}

TEST_F(SparseCli, BadFlagsAndInputsAreOneLineErrors) {
  const std::string in = write_qkv(dir_, {1, 2, 768, 16}), out = (dir_ / "out.safetensors").string();
  const std::string embeds = (dir_ / "e.safetensors").string();
  cubevec::write_safetensors(embeds, {{"prompt_embeds", cubevec::testing::random_tensor({1, 7, 24}, 2, cubevec::DType::f32, 1.0f)}});
  const std::string partial = (dir_ / "qk.safetensors").string();
  cubevec::write_safetensors(partial, {{"q", cubevec::Tensor::zeros({1, 2, 768, 16}, cubevec::DType::f32)},
                                       {"k", cubevec::Tensor::zeros({1, 2, 768, 16}, cubevec::DType::f32)}});
  const std::string empty_batch = (dir_ / "b0.safetensors").string();
  cubevec::write_safetensors(empty_batch, {{"q", cubevec::Tensor::zeros({0, 2, 768, 16}, cubevec::DType::f32)},
                                           {"k", cubevec::Tensor::zeros({0, 2, 768, 16}, cubevec::DType::f32)},
                                           {"v", cubevec::Tensor::zeros({0, 2, 768, 16}, cubevec::DType::f32)}});
  const std::string nan_input = (dir_ / "inf.safetensors").string();
  {
    cubevec::Tensor k = cubevec::testing::random_tensor({1, 2, 768, 16}, 2, cubevec::DType::f32, 1.0f);
    static_cast<float*>(k.mutable_data_ptr())[(768 + 700) * 16 + 3] = std::numeric_limits<float>::infinity();
    const cubevec::Tensor q = cubevec::testing::random_tensor({1, 2, 768, 16}, 1, cubevec::DType::f32, 1.0f);
    cubevec::write_safetensors(nan_input, {{"q", q}, {"k", k}, {"v", q}});
  }
  const std::string before = cubevec_cli_test::read_file(in);
  const std::string extra = (dir_ / "qkvx.safetensors").string();
  cubevec::write_safetensors(extra, {{"query", cubevec::Tensor::zeros({1}, cubevec::DType::f32)}});
  const std::vector<std::string> t2v = {
      "t2v",   "--model", kWan,    "--prompt-embeds",        embeds, "--frames", "9", "--width", "64", "--height", "64", "--steps", "2",
      "--cfg", "off",     "--out", (dir_ / "v.avi").string()};
  const auto with = [&](std::vector<std::string> extra_args) {
    std::vector<std::string> a = t2v;
    a.insert(a.end(), extra_args.begin(), extra_args.end());
    return a;
  };
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"sparse-attention", "--inputs", in, "--sparse-type", "rf_v2", "--sparsity", "0.5", "--latent-shape", "3,16", "--out", out},
       "--latent-shape must be T,H,W"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "rf_v2", "--sparsity", "0.5", "--out", out},
       "rf_v2 needs latent_shape_q (t, h, w)"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "rf_v3", "--sparsity", "0.5", "--out", out}, "use rf_v2"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "ada_bsa", "--sparsity", "2", "--out", out},
       "sparsity must be in [0, 1], got 2"},
      {{"sparse-attention", "--inputs", partial, "--sparse-type", "ada_bsa", "--sparsity", "0.5", "--out", out},
       "no tensor 'v' (expected q, k and v)"},
      {{"sparse-attention", "--inputs", extra, "--sparse-type", "ada_bsa", "--sparsity", "0.5", "--out", out},
       "unknown tensor 'query' (expected q, k and v)"},
      {{"sparse-attention", "--inputs", in, "--sparsity", "0.5", "--out", out}, "--sparse-type is required"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "rf_v2", "--sparsity", "0.5", "--latent-shape", "3946752,174763,160465489",
        "--out", out},
       "latent_shape_q (3946752, 174763, 160465489) holds more than 2^63 tokens"},
      {{"sparse-attention", "--inputs", empty_batch, "--sparse-type", "rf_v2", "--sparsity", "0.5", "--latent-shape", "3,16,16", "--out",
        out},
       "rf_v2 takes every batch's mask from batch 0, so q needs at least one batch"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "rf_v2", "--sparsity", "0.5", "--latent-shape", "3,16,16", "--cdf-threshold",
        "0.3", "--out", out},
       "--cdf-threshold applies to --sparse-type ada_bsa, not rf_v2"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "ada_bsa", "--sparsity", "0.5", "--latent-shape", "3,16,16", "--out", out},
       "--latent-shape applies to --sparse-type rf_v2, not ada_bsa"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "ada_bsa", "--sparsity", "0.5", "--layout", "BSH", "--out", out},
       "--layout must be BNSD or BSND (MindIE's sparse_attention layouts), got BSH"},
      {{"sparse-attention", "--inputs", in, "--sparse-type", "ada_bsa", "--sparsity", "0.5", "--out", in}, "is the --inputs file"},
      {{"sparse-attention", "--inputs", nan_input, "--sparse-type", "ada_bsa", "--sparsity", "0.5", "--out", out},
       "tensor 'k': element [0, 1, 700, 3] is inf (expected finite values)"},
      {with({"--sparse", "rf_v2", "--sparse-step-start", "2"}), "--sparse-step-start 2 must be below the step count 2"},
      {{"t2i", "--model", std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux", "--prompt", "a red circle", "--sparse", "rf_v2", "--out",
        (dir_ / "x.jpg").string()},
       "an image is one frame: it would skip nothing; use --sparse ada_bsa for images"},
      {with({"--sparsity", "0.5"}), "--sparsity applies with --sparse rf_v2|ada_bsa"},
      {with({"--sparse", "rf_v2", "--sparse-cdf-threshold", "0.9"}), "--sparse-cdf-threshold applies with --sparse ada_bsa"},
      {with({"--sparse", "rf_v2", "--sparse-blocks", "0-7"}), "--sparse-blocks 0-7 must lie in 0-1 (this model has 2 blocks)"},
      {with({"--sparse", "dense"}), "unknown sparse_type 'dense'"},
      {with({"--sparse", "ada_bsa", "--sparse-mask-refresh", "0"}), "--sparse-mask-refresh must be >= 1"},
  };
  for (const auto& c : cases) {
    const auto r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.message << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_EQ(cubevec_cli_test::read_file(in), before) << "the input file survived --out naming it";
}

}  // namespace sparse_cli_test
