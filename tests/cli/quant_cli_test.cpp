// Quantization as a user runs it on the shipped tiny model (assets/tinyflux): `cubevec quantize`
// calibrates and writes MindIE SD's files with a progress bar and a per-layer report, worst first;
// `cubevec t2i --quant` renders from them within 30 dB PSNR of the float picture; `cubevec forward
// --quant --timestep-policy --step-index` runs a W8A8_TIMESTEP model at a chosen step; bad flags and
// files are one-line errors.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "media/jpeg.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace quant_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using QuantCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

using cubevec_cli_test::kTinyFlux;
const std::string kPrompt = "a large red circle in the center on a blue background";

double psnr(const cubevec::media::RgbImage& a, const cubevec::media::RgbImage& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i) {
    const double d = static_cast<double>(a.pixels[i]) - static_cast<double>(b.pixels[i]);
    sum += d * d;
  }
  const double mse = sum / static_cast<double>(a.pixels.size());
  return mse == 0 ? INFINITY : 10 * std::log10(255.0 * 255.0 / mse);
}

TEST_F(QuantCli, QuantizeThenRenderWithTheFiles) {
  const std::string out = (dir_ / "q").string(), report = (dir_ / "report.json").string();
  const auto q =
      run({"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", kPrompt, "--prompt",
           "two small green squares on a white background", "--steps", "8", "--exclude", "proj_out", "--out", out, "--json", report});
  ASSERT_EQ(q.status, 0) << q.err;
  EXPECT_NE(q.err.find("calibrating 2/2 [##############################] step 8/8"), std::string::npos) << q.err;
  EXPECT_NE(q.err.find("per-layer cosine of the quantized output against float on calibration rows (worst first)"), std::string::npos);
  EXPECT_TRUE(fs::exists(out + "/quant_model_description_w8a8.json"));
  EXPECT_TRUE(fs::exists(out + "/quant_model_weight_w8a8.safetensors"));
  const nlohmann::json json = nlohmann::json::parse(read_file(report));
  EXPECT_EQ(json["excluded"], nlohmann::json::array({"proj_out"}));
  const nlohmann::json& layers = json["layers"];
  ASSERT_GT(layers.size(), 20u);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    EXPECT_GT(layers[i]["cosine"].get<double>(), 0.99) << layers[i]["module"];
    if (i > 0) {
      EXPECT_LE(layers[i - 1]["cosine"].get<double>(), layers[i]["cosine"].get<double>()) << "worst first";
    }
    EXPECT_NE(layers[i]["module"], "proj_out");
  }
  const nlohmann::json description = nlohmann::json::parse(read_file(out + "/quant_model_description_w8a8.json"));
  EXPECT_EQ(description["model_quant_type"], "W8A8");
  EXPECT_EQ(description["proj_out.weight"], "FLOAT");
  EXPECT_EQ(description["transformer_blocks.0.attn.to_q.weight"], "W8A8");
  EXPECT_EQ(description["transformer_blocks.0.attn.to_q.deq_scale"], "W8A8");

  const std::string float_jpg = (dir_ / "float.jpg").string(), quant_jpg = (dir_ / "quant.jpg").string();
  const auto f = run({"t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--out", float_jpg});
  ASSERT_EQ(f.status, 0) << f.err;
  const auto r =
      run({"t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--quant", out + "/quant_model_description_w8a8.json", "--out", quant_jpg});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("quantize W8A8"), std::string::npos) << r.err;
  const double db = psnr(cubevec::media::read_jpeg(float_jpg), cubevec::media::read_jpeg(quant_jpg));
  std::printf("[ tinyflux W8A8 via the CLI ] PSNR against float %.1f dB\n", db);
  EXPECT_GE(db, 30.0);
  EXPECT_LT(db, INFINITY);  // quantization changed something
}

// Inputs of tinyflux's transformer forward at 64x64 (16 image tokens) with 4 text tokens.
std::string write_inputs(const fs::path& dir) {
  using cubevec::testing::random_tensor;
  const std::string path = (dir / "in.safetensors").string();
  std::vector<float> img_ids, txt_ids(4 * 3, 0.0f);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) img_ids.insert(img_ids.end(), {0.0f, static_cast<float>(y), static_cast<float>(x)});
  cubevec::write_safetensors(path, {{"hidden_states", random_tensor({1, 16, 16}, 1, cubevec::DType::f32, 1.0f)},
                                    {"encoder_hidden_states", random_tensor({1, 4, 64}, 2, cubevec::DType::f32, 1.0f)},
                                    {"pooled_projections", random_tensor({1, 64}, 3, cubevec::DType::f32, 1.0f)},
                                    {"timestep", cubevec::Tensor::from_vector(std::vector<float>{0.5f}, {1})},
                                    {"img_ids", cubevec::Tensor::from_vector(img_ids, {16, 3})},
                                    {"txt_ids", cubevec::Tensor::from_vector(txt_ids, {4, 3})}});
  return path;
}

std::vector<double> sample_of(const std::string& path) {
  return cubevec::testing::values(cubevec::SafetensorsFile::open(path).tensor("sample"));
}

TEST_F(QuantCli, ForwardAtAStepIndexOfATimestepModel) {
  const std::string out = (dir_ / "q").string();
  const auto q = run({"quantize", "--model", kTinyFlux, "--algo", "W8A8_TIMESTEP", "--prompt", kPrompt, "--steps", "4", "--out", out});
  ASSERT_EQ(q.status, 0) << q.err;
  const std::string description = out + "/quant_model_description_w8a8_timestep.json";
  const std::string inputs = write_inputs(dir_);
  std::ofstream(dir_ / "static.json") << R"({"default": "static"})";
  std::ofstream(dir_ / "dynamic.json") << R"({"default": "dynamic"})";
  const auto forward = [&](const std::string& policy, const std::string& step, const std::string& name) {
    const std::string path = (dir_ / (name + ".safetensors")).string();
    std::vector<std::string> args = {"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", path};
    if (!policy.empty())
      args.insert(args.end(), {"--quant", description, "--timestep-policy", (dir_ / policy).string(), "--step-index", step});
    const auto r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return sample_of(path);
  };
  const std::vector<double> reference = forward("", "", "float");
  const std::vector<double> static0 = forward("static.json", "0", "s0"), static3 = forward("static.json", "3", "s3");
  const std::vector<double> dynamic0 = forward("dynamic.json", "0", "d0"), dynamic3 = forward("dynamic.json", "3", "d3");
  ASSERT_EQ(static0.size(), reference.size());
  EXPECT_EQ(dynamic0, dynamic3);  // dynamic steps do not depend on the step
  EXPECT_NE(static0, static3);    // each static step has its own scales
  EXPECT_NE(static0, dynamic0);
  double scale = 0, worst = 0;
  for (double v : reference) scale = std::max(scale, std::abs(v));
  for (const auto* got : {&static0, &static3, &dynamic0})
    for (std::size_t i = 0; i < reference.size(); ++i) worst = std::max(worst, std::abs((*got)[i] - reference[i]));
  EXPECT_LT(worst, 0.05 * scale) << "quantized forward vs float";

  const auto bad = run({"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", (dir_ / "x.safetensors").string(), "--quant",
                        description, "--timestep-policy", (dir_ / "static.json").string(), "--step-index", "7"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("has static scales for 4 steps (0 to 3), but the timestep policy " + (dir_ / "static.json").string() +
                         " makes step 7 static"),
            std::string::npos)
      << bad.err;
}

TEST_F(QuantCli, BadFlagsAndFilesAreOneLineErrors) {
  const std::string inputs = write_inputs(dir_), out = (dir_ / "o.safetensors").string(), jpg = (dir_ / "o.jpg").string();
  const std::string missing = (dir_ / "nothing.json").string();
  std::ofstream(dir_ / "bad.json") << R"({"model_quant_type": "W8A8_DYNAMIC", "x_embedder.weight": "W8A8_DYNAMIC"})";
  const std::string fifo = (dir_ / "quant_model_description_w8a8.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string a_file = (dir_ / "a_file").string();
  std::ofstream(a_file) << "x";
  cubevec::write_safetensors((dir_ / "empty.safetensors").string(),
                             {{"prompt_embeds", cubevec::Tensor::zeros({1, 0, 64}, cubevec::DType::f32)},
                              {"pooled_prompt_embeds", cubevec::Tensor::zeros({1, 64}, cubevec::DType::f32)}});
  const std::string q = (dir_ / "q").string();
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"quantize", "--model", kTinyFlux, "--algo", "W4A4_MXFP4", "--prompt", kPrompt, "--out", (dir_ / "q").string()},
       "--algo W4A4_MXFP4: MindIE SD has that algorithm, but cubevec exports W8A16, W8A8_DYNAMIC, W8A8, W8A8_TIMESTEP"},
      {{"quantize", "--model", kTinyFlux, "--algo", "INT3", "--prompt", kPrompt, "--out", (dir_ / "q").string()}, "INT3"},
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--out", (dir_ / "q").string()}, "calibration needs data: give --prompt TEXT"},
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", "a red cat", "--out", (dir_ / "q").string()}, "cat"},
      {{"t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--quant", missing, "--out", jpg}, "nothing.json"},
      {{"t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--timestep-policy", missing, "--out", jpg},
       "--timestep-policy applies with --quant"},
      {{"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", out, "--timestep-policy", missing},
       "--timestep-policy applies with --quant"},
      {{"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", out, "--quant", missing, "--step-index", "-2"},
       "--step-index must be >= 0, got -2"},
      // The weight file beside the description is missing: named, before anything is swapped.
      {{"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", out, "--quant", (dir_ / "bad.json").string()},
       "quant_model_weight_w8a8_dynamic.safetensors"},
      {{"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", out, "--step-index", "2"}, "--step-index applies with --quant"},
      {{"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", out, "--quant", ""},
       "--quant needs a quant_model_description_*.json file"},
      {{"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", out, "--quant", "W8A8_DYNAMIC"},
       "--quant W8A8_DYNAMIC: an algorithm name stands for shape-only weights with --simulate"},
      {{"forward", "--model", kTinyFlux + "/vae", "--inputs", inputs, "--out", out, "--quant", (dir_ / "bad.json").string()},
       "this model has no Linear layers to quantize"},
      // A FIFO is refused, not opened (which would wait for a writer forever).
      {{"t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--quant", fifo, "--out", jpg},
       "is not a regular file (a FIFO, socket or device)"},
      // quantize: the outputs are checked before calibration; no work is lost and no file is overwritten.
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", kPrompt, "--out", a_file},
       "--out " + a_file + ": cannot create the output folder"},
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", kPrompt, "--out", q, "--json",
        q + "/quant_model_weight_w8a8.safetensors"},
       "is one of the quantization files this run writes"},
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", kPrompt, "--out", q, "--json",
        (dir_ / "no_dir" / "r.json").string()},
       "does not exist"},
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", kPrompt, "--out", q, "--exclude", "*"},
       "--exclude leaves no Linear to quantize"},
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--calibration-embeds", (dir_ / "empty.safetensors").string(), "--out", q},
       "'prompt_embeds' [1, 0, 64] is empty"},
  };
  for (const auto& c : cases) {
    const auto r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args[0] << " " << c.message << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(q + "/quant_model_description_w8a8.json"));
}

TEST_F(QuantCli, AFailedExportLeavesThePreviousFilesWhole) {
  const std::string q = (dir_ / "q").string(), inputs = write_inputs(dir_);
  const auto first = run({"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", kPrompt, "--steps", "2", "--exclude",
                          "single_transformer_blocks.*", "--exclude", "no_such_layer", "--out", q});
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_NE(first.err.find("warning: --exclude 'no_such_layer' matches no Linear of the model"), std::string::npos) << first.err;
  const std::string description = read_file(q + "/quant_model_description_w8a8.json"),
                    weights = read_file(q + "/quant_model_weight_w8a8.safetensors");
  // The second run may not replace its weight file (now a symlink, which cubevec never replaces):
  // it fails and both earlier files stay as they were, the link and its target included.
  fs::rename(q + "/quant_model_weight_w8a8.safetensors", q + "/kept.safetensors");
  fs::create_symlink("kept.safetensors", q + "/quant_model_weight_w8a8.safetensors");
  const auto second = run({"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", kPrompt, "--steps", "2", "--out", q});
  EXPECT_EQ(second.status, 1);
  EXPECT_NE(second.err.find("quant_model_weight_w8a8.safetensors: is a symbolic link"), std::string::npos) << second.err;
  EXPECT_EQ(read_file(q + "/quant_model_description_w8a8.json"), description);
  EXPECT_TRUE(fs::is_symlink(q + "/quant_model_weight_w8a8.safetensors"));
  EXPECT_EQ(read_file(q + "/kept.safetensors"), weights);
  EXPECT_EQ(std::distance(fs::directory_iterator(q), fs::directory_iterator()), 3) << "no temporary left behind";
  const auto forward = run({"forward", "--model", kTinyFlux, "--inputs", inputs, "--out", (dir_ / "o.safetensors").string(), "--quant",
                            q + "/quant_model_description_w8a8.json"});
  EXPECT_EQ(forward.status, 0) << forward.err;
}

TEST_F(QuantCli, SimulateTimestepHasARowPerStep) {
  std::ofstream(dir_ / "static.json") << R"({"default": "static"})";
  const auto r = run({"t2i", "--simulate", "--model", std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/flux1-dev", "--steps", "3",
                      "--quant", "W8A8_TIMESTEP", "--timestep-policy", (dir_ / "static.json").string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("quantize W8A8_TIMESTEP"), std::string::npos) << r.err;
}

}  // namespace quant_cli_test
