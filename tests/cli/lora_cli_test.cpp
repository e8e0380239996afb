// `cubevec forward --lora FILE[:SCALE]` (models/lora.h): a diffusers / PEFT LoRA fused into the tiny
// Flux transformer equals the torch reference's fused forward (tests/reference/make_lora_reference.py:
// W + scale (alpha / rank) B A, six layers, one with an alpha) within 1e-4 of the output scale, at
// two scales; two LoRAs add up; a layer the model lacks is an error listing it (or, with
// --lora-ignore-unmatched, a count); and every malformed file is an error naming it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "cli/run_cubevec.h"
#include "common/tensor_testing.h"
#include "tensor/safetensors.h"

namespace lora_cli_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec_cli_test;
using LoraCli = CliTest;

const std::string kLora = (kData / "lora" / "flux_tiny_lora.safetensors").string();
const std::string kTransformer = (kData / "flux_tiny" / "transformer").string();

std::string write_inputs(const fs::path& dir) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_lora.safetensors").string());
  cubevec::NamedTensors inputs;
  for (const char* name : {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids", "guidance"})
    inputs.push_back({name, goldens.tensor(name)});
  const std::string path = (dir / "in.safetensors").string();
  cubevec::write_safetensors(path, inputs);
  return path;
}

cubevec::Tensor golden(const std::string& name) {
  return cubevec::SafetensorsFile::open((kData / "goldens_lora.safetensors").string()).tensor(name);
}

TEST_F(LoraCli, FusedLoraMatchesTheReferenceAtTwoScalesAndTwoLorasAddUp) {
  const std::string inputs = write_inputs(dir_), out = (dir_ / "out.safetensors").string();
  const auto forward = [&](const std::vector<std::string>& loras) {
    std::vector<std::string> args = {"forward", "--model", kTransformer, "--inputs", inputs, "--out", out};
    for (const std::string& l : loras) args.insert(args.end(), {"--lora", l});
    const Process r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return cubevec::SafetensorsFile::open(out).tensor("sample");
  };
  cubevec::testing::expect_close_rel(forward({kLora + ":0.7"}), golden("expected"), 1e-4, "LoRA at 0.7");
  cubevec::testing::expect_close_rel(forward({kLora + ":-1"}), golden("expected_scale_minus_1"), 1e-4, "LoRA at -1");
  cubevec::testing::expect_close_rel(forward({kLora + ":0.7", kLora + ":-1.7"}), golden("expected_scale_minus_1"), 1e-4,
                                     "two LoRAs: 0.7 - 1.7 = -1");
  const Process r = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", out, "--lora", kLora + ":0.7"});
  EXPECT_NE(r.err.find("fused into 6 layers"), std::string::npos) << r.err;
}

// kohya / sd-scripts names on Flux (fused qkv and linear1 split, the global layers, the final adaLN's
// swapped rows) and Wan's original names (alphas, diff_b bias differences, a dropped norm diff), each
// against the reference's fuse of diffusers' conversion.
TEST_F(LoraCli, KohyaFluxAndOriginalWanFilesMatchDiffusersConversion) {
  const std::string inputs = write_inputs(dir_), out = (dir_ / "out.safetensors").string();
  Process r = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", out, "--lora",
                   (kData / "lora" / "flux_tiny_kohya.safetensors").string() + ":0.8"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("kohya-flux"), std::string::npos) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), golden("kohya.expected"), 1e-4, "kohya at 0.8");
  const std::string wan_inputs = (dir_ / "wan_in.safetensors").string();
  cubevec::write_safetensors(wan_inputs, {{"hidden_states", golden("wan.hidden_states")},
                                          {"timestep", golden("wan.timestep")},
                                          {"encoder_hidden_states", golden("wan.encoder_hidden_states")}});
  r = run({"forward", "--model", (kData / "wan_tiny" / "transformer").string(), "--inputs", wan_inputs, "--out", out, "--lora",
           (kData / "lora" / "wan_tiny_original.safetensors").string() + ":0.6"});
  ASSERT_EQ(r.status, 0) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), golden("wan.expected"), 1e-4, "Wan at 0.6");
  // The kohya file on the Wan model: refused as a Flux LoRA (its final_layer_linear would land on
  // Wan's proj_out).
  r = run({"forward", "--model", (kData / "wan_tiny" / "transformer").string(), "--inputs", wan_inputs, "--out", out, "--lora",
           (kData / "lora" / "flux_tiny_kohya.safetensors").string()});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("a LoRA in kohya-flux names is for a Flux transformer, and this model is not one"), std::string::npos) << r.err;
}

// Runtime mode (models/lora_runtime.h): every format's golden within 1e-4 as in fused mode, and the
// fused output within f32 rounding (1e-5 of the output scale); two runtime LoRAs add up.
TEST_F(LoraCli, RuntimeModeEqualsFusedMode) {
  const std::string inputs = write_inputs(dir_);
  const std::string wan_inputs = (dir_ / "wan_in.safetensors").string();
  cubevec::write_safetensors(wan_inputs, {{"hidden_states", golden("wan.hidden_states")},
                                          {"timestep", golden("wan.timestep")},
                                          {"encoder_hidden_states", golden("wan.encoder_hidden_states")}});
  struct Case {
    std::string model, inputs;
    std::vector<std::string> loras;
    std::string golden;
  };
  const std::string kohya = (kData / "lora" / "flux_tiny_kohya.safetensors").string();
  const std::string wan = (kData / "lora" / "wan_tiny_original.safetensors").string();
  const std::vector<Case> cases = {{kTransformer, inputs, {kLora + ":0.7"}, "expected"},
                                   {kTransformer, inputs, {kLora + ":0.7", kLora + ":-1.7"}, "expected_scale_minus_1"},
                                   {kTransformer, inputs, {kohya + ":0.8"}, "kohya.expected"},
                                   {(kData / "wan_tiny" / "transformer").string(), wan_inputs, {wan + ":0.6"}, "wan.expected"}};
  for (const Case& c : cases) {
    const auto forward = [&](const std::string& mode) {
      const std::string out = (dir_ / (mode + ".safetensors")).string();
      std::vector<std::string> args = {"forward", "--model", c.model, "--inputs", c.inputs, "--out", out, "--lora-mode", mode};
      for (const std::string& l : c.loras) args.insert(args.end(), {"--lora", l});
      const Process r = run(args);
      EXPECT_EQ(r.status, 0) << r.err;
      if (mode == "runtime") {
        EXPECT_NE(r.err.find("applied at run time"), std::string::npos) << r.err;
      }
      return cubevec::SafetensorsFile::open(out).tensor("sample");
    };
    const cubevec::Tensor runtime = forward("runtime"), fused = forward("fused");
    cubevec::testing::expect_close_rel(runtime, golden(c.golden), 1e-4, "runtime " + c.golden);
    cubevec::testing::expect_close_rel(runtime, fused, 1e-5, "runtime vs fused " + c.golden);
  }
  const Process bad = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", (dir_ / "x.safetensors").string(), "--lora",
                           kLora, "--lora-mode", "later"});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--lora-mode must be fused or runtime, got 'later'"), std::string::npos) << bad.err;
}

// A LoRA over W8A8 layers (tinyflux quantized by `cubevec quantize`): runtime mode (the default with
// --quant) stays within the quantization's tolerance of the float model with the LoRA fused, while
// the LoRA's own change is several times larger; --lora-mode fused with --quant is refused.
TEST_F(LoraCli, RuntimeLoraOverW8A8Layers) {
  using cubevec::testing::random_tensor;
  const std::string quant = (dir_ / "q").string(), model = cubevec_cli_test::kTinyFlux;
  const Process q = run({"quantize", "--model", model, "--algo", "W8A8", "--prompt", "a red circle", "--steps", "2", "--out", quant});
  ASSERT_EQ(q.status, 0) << q.err;
  const std::string description = quant + "/quant_model_description_w8a8.json";
  // A rank-4 LoRA on a plain projection, the activation's input, a gated output and a single block.
  cubevec::NamedTensors lora;
  const std::vector<std::tuple<std::string, int64_t, int64_t>> layers = {{"transformer_blocks.0.attn.to_q", 192, 192},
                                                                         {"transformer_blocks.0.ff.net.0.proj", 192, 768},
                                                                         {"transformer_blocks.1.attn.to_out.0", 192, 192},
                                                                         {"single_transformer_blocks.0.proj_out", 960, 192}};
  unsigned seed = 40;
  for (const auto& [name, in, out] : layers) {
    lora.push_back({"transformer." + name + ".lora_A.weight", random_tensor({4, in}, seed++, cubevec::DType::f32, 0.15f)});
    lora.push_back({"transformer." + name + ".lora_B.weight", random_tensor({out, 4}, seed++, cubevec::DType::f32, 0.15f)});
  }
  const std::string file = (dir_ / "tiny_lora.safetensors").string();
  cubevec::write_safetensors(file, lora);
  std::vector<float> img_ids, txt_ids(4 * 3, 0.0f);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) img_ids.insert(img_ids.end(), {0.0f, static_cast<float>(y), static_cast<float>(x)});
  const std::string inputs = (dir_ / "in.safetensors").string();
  cubevec::write_safetensors(inputs, {{"hidden_states", random_tensor({1, 16, 16}, 1, cubevec::DType::f32, 1.0f)},
                                      {"encoder_hidden_states", random_tensor({1, 4, 64}, 2, cubevec::DType::f32, 1.0f)},
                                      {"pooled_projections", random_tensor({1, 64}, 3, cubevec::DType::f32, 1.0f)},
                                      {"timestep", cubevec::Tensor::from_vector(std::vector<float>{0.5f}, {1})},
                                      {"img_ids", cubevec::Tensor::from_vector(img_ids, {16, 3})},
                                      {"txt_ids", cubevec::Tensor::from_vector(txt_ids, {4, 3})}});
  const auto forward = [&](const std::vector<std::string>& extra, const std::string& name) {
    const std::string out = (dir_ / (name + ".safetensors")).string();
    std::vector<std::string> args = {"forward", "--model", model, "--inputs", inputs, "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    const Process r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return cubevec::testing::values(cubevec::SafetensorsFile::open(out).tensor("sample"));
  };
  const std::vector<double> float_lora = forward({"--lora", file}, "float_lora");
  const std::vector<double> quant_plain = forward({"--quant", description}, "quant");
  const std::vector<double> quant_lora = forward({"--quant", description, "--lora", file}, "quant_lora");
  double scale = 0, error = 0, change = 0;
  for (std::size_t i = 0; i < float_lora.size(); ++i) {
    scale = std::max(scale, std::fabs(float_lora[i]));
    error = std::max(error, std::fabs(quant_lora[i] - float_lora[i]));
    change = std::max(change, std::fabs(quant_lora[i] - quant_plain[i]));
  }
  std::printf("[ lora ] over W8A8: max |quant+LoRA - float+LoRA| %.4g, LoRA's change %.4g (output scale %.4g)\n", error, change, scale);
  EXPECT_LT(error, 0.05 * scale);  // the quantization's tolerance (QuantCli.ForwardAtAStepIndexOfATimestepModel)
  EXPECT_GT(change, 3 * error);
  const Process fused = run({"forward", "--model", model, "--inputs", inputs, "--out", (dir_ / "x.safetensors").string(), "--quant",
                             description, "--lora", file, "--lora-mode", "fused"});
  EXPECT_NE(fused.status, 0);
  EXPECT_NE(fused.err.find("would not reach them"), std::string::npos) << fused.err;
}

TEST_F(LoraCli, UnmatchedLayersAndMalformedFilesAreErrorsNamingThem) {
  const std::string inputs = write_inputs(dir_), out = (dir_ / "out.safetensors").string();
  const auto a = cubevec::Tensor::zeros({2, 24}, cubevec::DType::f32), b = cubevec::Tensor::zeros({24, 2}, cubevec::DType::f32);
  const auto lora_file = [&](const std::string& name, const cubevec::NamedTensors& tensors) {
    const std::string path = (dir_ / name).string();
    cubevec::write_safetensors(path, tensors);
    return path;
  };
  const std::string unmatched =
      lora_file("unmatched.safetensors", {{"transformer.transformer_blocks.9.attn.to_q.lora_A.weight", a},
                                          {"transformer.transformer_blocks.9.attn.to_q.lora_B.weight", b},
                                          {"transformer.x_embedder.lora_A.weight", cubevec::Tensor::zeros({2, 64}, cubevec::DType::f32)},
                                          {"transformer.x_embedder.lora_B.weight", cubevec::Tensor::zeros({32, 2}, cubevec::DType::f32)}});
  Process r = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", out, "--lora", unmatched});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("1 of its 2 layers match no layer of the model (transformer_blocks.9.attn.to_q)"), std::string::npos) << r.err;
  r = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", out, "--lora", unmatched, "--lora-ignore-unmatched"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("1 of its layers match none of the model's: skipped"), std::string::npos) << r.err;
  // A LoRA none of whose layers the model has is an error even when unmatched layers are skipped.
  r = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", out, "--lora-ignore-unmatched", "--lora",
           lora_file("none_at_all.safetensors", {{"transformer.transformer_blocks.9.attn.to_q.lora_A.weight", a},
                                                 {"transformer.transformer_blocks.9.attn.to_q.lora_B.weight", b}})});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("none of its 1 layers match a layer of the model"), std::string::npos) << r.err;
  struct Case {
    std::string file, expect;
  };
  const std::vector<Case> cases = {
      {(dir_ / "missing.safetensors").string(), "missing.safetensors"},
      {lora_file("other.safetensors", {{"transformer.x_embedder.weight", a}}), "is not a LoRA weight"},
      {lora_file("half.safetensors", {{"transformer.x_embedder.lora_A.weight", a}}), "has lora_A but no lora_B"},
      {lora_file("ranks.safetensors", {{"transformer.x_embedder.lora_A.weight", a},
                                       {"transformer.x_embedder.lora_B.weight", cubevec::Tensor::zeros({24, 3}, cubevec::DType::f32)}}),
       "different ranks"},
      {lora_file("shape.safetensors", {{"transformer.x_embedder.lora_A.weight", cubevec::Tensor::zeros({2, 5}, cubevec::DType::f32)},
                                       {"transformer.x_embedder.lora_B.weight", b}}),
       "but its LoRA makes"},
      {lora_file("none.safetensors", {{"transformer.transformer_blocks.9.attn.to_q.lora_A.weight", a},
                                      {"transformer.transformer_blocks.9.attn.to_q.lora_B.weight", b}}),
       "1 of its 1 layers match no layer"},
      {lora_file("rank0.safetensors", {{"transformer.x_embedder.lora_A.weight", cubevec::Tensor::zeros({0, 64}, cubevec::DType::f32)},
                                       {"transformer.x_embedder.lora_B.weight", cubevec::Tensor::zeros({24, 0}, cubevec::DType::f32)}}),
       "a rank of at least 1"},
      {lora_file("twice.safetensors", {{"transformer.x_embedder.lora_A.weight", a}, {"x_embedder.lora_A.weight", a}}), "is given twice"},
      {lora_file("ints.safetensors", {{"transformer.x_embedder.lora_A.weight", cubevec::Tensor::zeros({2, 64}, cubevec::DType::i32)},
                                      {"transformer.x_embedder.lora_B.weight", b}}),
       "tensor 'transformer.x_embedder.lora_A.weight': expected a float tensor"},
      {lora_file("huge.safetensors",
                 {{"transformer.x_embedder.lora_A.weight", cubevec::Tensor::from_vector(std::vector<float>(128, 1e30f), {2, 64})},
                  {"transformer.x_embedder.lora_B.weight", cubevec::Tensor::from_vector(std::vector<float>(64, 1e30f), {32, 2})}}),
       "overflows when fused"},
      {lora_file("nan.safetensors",
                 {{"transformer.x_embedder.lora_A.weight", cubevec::Tensor::from_vector(std::vector<float>{NAN, 0}, {2, 1})},
                  {"transformer.x_embedder.lora_B.weight", b}}),
       "non-finite"},
  };
  for (const Case& c : cases) {
    r = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", out, "--lora", c.file});
    EXPECT_NE(r.status, 0) << c.file;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
  r = run({"forward", "--model", kTransformer, "--inputs", inputs, "--out", out, "--lora", kLora + ":inf"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("the scale must be a finite number"), std::string::npos) << r.err;
}

// --lora on t2i: fused into the shipped tinyflux at load (the library's LoadOptions::lora); scale 0
// draws the picture without it, another scale a different one.
TEST_F(LoraCli, TextToImageFusesTheLoraAtLoad) {
  const cubevec::SafetensorsFile weights = cubevec::SafetensorsFile::open(kTinyFlux + "/transformer/diffusion_pytorch_model.safetensors");
  const cubevec::Shape to_q = weights.tensor("transformer_blocks.0.attn.to_q.weight").shape();  // [out, in]
  std::vector<float> down(static_cast<std::size_t>(2 * to_q[1])), up(static_cast<std::size_t>(to_q[0] * 2));
  for (std::size_t i = 0; i < down.size(); ++i) down[i] = std::sin(0.3f * static_cast<float>(i));
  for (std::size_t i = 0; i < up.size(); ++i) up[i] = std::cos(0.7f * static_cast<float>(i));
  const std::string lora = (dir_ / "tiny.safetensors").string();
  cubevec::write_safetensors(
      lora, {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", cubevec::Tensor::from_vector(down, {2, to_q[1]})},
             {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", cubevec::Tensor::from_vector(up, {to_q[0], 2})}});
  const auto picture = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"t2i", "--model", kTinyFlux, "--prompt", "a red circle",        "--steps",
                                     "3",   "--seed",  "2",       "--out",    (dir_ / name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const Process r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return read_file((dir_ / name).string());
  };
  const std::string plain = picture("plain.png", {}), zero = picture("zero.png", {"--lora", lora + ":0"}),
                    half = picture("half.png", {"--lora", lora + ":0.5"});
  EXPECT_EQ(zero, plain);
  EXPECT_NE(half, plain);
  const Process bad = run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", (dir_ / "x.png").string(), "--lora",
                           (dir_ / "none.safetensors").string()});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("none.safetensors"), std::string::npos) << bad.err;
}

}  // namespace lora_cli_test
