// `cubevec t2v` and `cubevec forward` on a Wan model as a user runs them, on the tiny random Wan
// model in tests/data/wan_tiny (written by tests/reference/make_wan_reference.py): a valid MJPEG
// AVI with 1 + 4k frames at the asked size whose frames decode, the JPEG frame folder, progress and
// the stage table, the JSON report, CFG fused and on two streams giving the same video, simulate
// mode on the full-size Wan2.1-14B configs, one-line errors; `forward` reproduces the PyTorch
// golden's `sample`.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "media/avi.h"
#include "media/jpeg.h"
#include "media/png.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace t2v_cli_test {  // named after the file: unity batches never mix two files' helpers

using T2VCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

using cubevec_cli_test::kWan;

// umT5-like states for the tiny model's 24-wide text input: 7 tokens, the last 2 zero-padded.
std::string write_wan_embeds(const std::filesystem::path& dir, bool negative, int64_t neg_len = 7) {
  const std::string path = (dir / (negative ? "embeds_cfg.safetensors" : "embeds.safetensors")).string();
  cubevec::Tensor positive = cubevec::testing::random_tensor({1, 7, 24}, 1, cubevec::DType::f32, 1.0f);
  std::fill(positive.mutable_data<float>() + 5 * 24, positive.mutable_data<float>() + 7 * 24, 0.0f);
  cubevec::NamedTensors t = {{"prompt_embeds", positive}};
  if (negative) t.push_back({"negative_prompt_embeds", cubevec::testing::random_tensor({1, neg_len, 24}, 3, cubevec::DType::f32, 1.0f)});
  cubevec::write_safetensors(path, t);
  return path;
}

std::vector<cubevec::media::RgbImage> frames_of(const std::string& avi) {
  const cubevec::media::AviInfo info = cubevec::media::read_avi_info(avi);
  std::vector<cubevec::media::RgbImage> frames;
  for (const auto& frame : info.frames) frames.push_back(cubevec::media::decode_jpeg(cubevec::media::read_avi_frame(avi, frame)));
  return frames;
}

TEST_F(T2VCli, WritesAnAviAndFramesWithProgressTableAndJson) {
  const std::string out = (dir_ / "a.avi").string(), json_path = (dir_ / "a.json").string(), frames_dir = (dir_ / "frames").string();
  const auto r = run({"t2v",
                      "--model",
                      kWan,
                      "--prompt-embeds",
                      write_wan_embeds(dir_, true),
                      "--frames",
                      "9",
                      "--width",
                      "48",
                      "--height",
                      "32",
                      "--steps",
                      "3",
                      "--seed",
                      "7",
                      "--out",
                      out,
                      "--frames-dir",
                      frames_dir,
                      "--json",
                      json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* line : {"t2v: 9 frames of 48x32 (latent 3 x 4 x 6), 3 steps, cfg fused", "step 1/3", "step 3/3", "ETA",
                           "decoded 1 frame(s)", "decoded 9 frame(s)", "denoising", "VAE decode", "JPEG + AVI", "peak memory", "wrote "})
    EXPECT_NE(r.err.find(line), std::string::npos) << line << " missing:\n" << r.err;
  const cubevec::media::AviInfo info = cubevec::media::read_avi_info(out);
  EXPECT_EQ(info.width, 48);
  EXPECT_EQ(info.height, 32);
  EXPECT_EQ(info.frame_count, 9);
  EXPECT_DOUBLE_EQ(info.fps, 16.0);
  const auto frames = frames_of(out);
  ASSERT_EQ(frames.size(), 9u);
  for (std::size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].width, 48);
    EXPECT_EQ(frames[i].height, 32);
    // The folder holds the same frames, lossless: encoded as the AVI encodes them (JPEG quality
    // 90), a PNG frame gives the AVI's frame exactly.
    char name[32];
    std::snprintf(name, sizeof name, "/frame_%05zu.png", i);
    const cubevec::media::RgbImage png = cubevec::media::read_png(frames_dir + name);
    EXPECT_EQ(cubevec::media::decode_jpeg(cubevec::media::encode_jpeg(png, 90)).pixels, frames[i].pixels) << name;
  }
  const auto report = nlohmann::json::parse(read_file(json_path));
  EXPECT_EQ(report["frames"], 9);
  EXPECT_EQ(report["step_s"].size(), 3u);
  EXPECT_GT(report["stages_s"]["vae_decode"].get<double>(), 0.0);
  EXPECT_GT(report["peak_live_bytes"].get<double>(), 0.0);
  // The same seed gives the same video; another seed another one.
  const std::string again = (dir_ / "b.avi").string(), other = (dir_ / "c.avi").string();
  for (const auto& [path, seed] : {std::pair{again, "7"}, std::pair{other, "8"}})
    ASSERT_EQ(run({"t2v", "--model", kWan, "--prompt-embeds", write_wan_embeds(dir_, true), "--frames", "9", "--width", "48", "--height",
                   "32", "--steps", "3", "--seed", seed, "--out", path})
                  .status,
              0);
  EXPECT_EQ(read_file(out), read_file(again));
  EXPECT_NE(read_file(out), read_file(other));
}

TEST_F(T2VCli, FusedAndTwoStreamCfgGiveTheSameVideo) {
  const std::string embeds = write_wan_embeds(dir_, true);
  std::vector<std::vector<cubevec::media::RgbImage>> videos;
  for (const char* mode : {"fused", "streams"}) {
    const std::string out = (dir_ / (std::string(mode) + ".avi")).string();
    const auto r = run({"t2v", "--model", kWan, "--prompt-embeds", embeds, "--frames", "5", "--width", "32", "--height", "32", "--steps",
                        "2", "--cfg", mode, "--guidance", "4", "--out", out});
    ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
    videos.push_back(frames_of(out));
  }
  ASSERT_EQ(videos[0].size(), 5u);
  ASSERT_EQ(videos[1].size(), 5u);
  int worst = 0;
  for (std::size_t f = 0; f < 5; ++f)
    for (std::size_t i = 0; i < videos[0][f].pixels.size(); ++i)
      worst = std::max(worst, std::abs(int(videos[0][f].pixels[i]) - int(videos[1][f].pixels[i])));
  EXPECT_LE(worst, 2) << "fused and two-stream CFG compute the same velocities";
}

TEST_F(T2VCli, RunsTheSchedulerTheModelShips) {
  // The tiny model with the UniPC config the diffusers Wan2.1 repos ship instead of its Euler one.
  const std::filesystem::path model = dir_ / "wan_unipc";
  std::filesystem::copy(kWan, model, std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/wan2.1-t2v-14b/scheduler/scheduler_config.json",
                             model / "scheduler" / "scheduler_config.json", std::filesystem::copy_options::overwrite_existing);
  const std::string embeds = write_wan_embeds(dir_, true);
  std::vector<std::string> videos;
  for (const std::string& m : {model.string(), kWan}) {
    const std::string out = (dir_ / (std::to_string(videos.size()) + ".avi")).string();
    const auto r = run(
        {"t2v", "--model", m, "--prompt-embeds", embeds, "--frames", "5", "--width", "32", "--height", "32", "--steps", "4", "--out", out});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find(videos.empty() ? "t2v: scheduler: UniPC multistep (order 2, flow shift 3)"
                                        : "t2v: scheduler: FlowMatch Euler (shift 3)"),
              std::string::npos)
        << r.err;
    videos.push_back(read_file(out));
  }
  EXPECT_NE(videos[0], videos[1]) << "UniPC and Euler take different steps";
  // Without scheduler/ the run says it uses the Wan2.1 repositories' UniPC, and does.
  const std::filesystem::path bare = dir_ / "wan_bare";
  std::filesystem::copy(kWan, bare, std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(bare / "scheduler");
  const std::string bare_out = (dir_ / "bare.avi").string();
  const auto defaulted = run({"t2v", "--model", bare.string(), "--prompt-embeds", embeds, "--frames", "5", "--width", "32", "--height",
                              "32", "--steps", "4", "--out", bare_out});
  ASSERT_EQ(defaulted.status, 0) << defaulted.err;
  EXPECT_NE(defaulted.err.find("note: " + bare.string() +
                               " has no scheduler/scheduler_config.json; using the Wan2.1 480p repositories' "
                               "(UniPCMultistepScheduler, flow shift 3)"),
            std::string::npos)
      << defaulted.err;
  EXPECT_EQ(read_file(bare_out), videos[0]) << "the default is the shipped Wan2.1 UniPC config";
  // A UniPC option cubevec does not implement is a named error.
  std::ofstream(model / "scheduler" / "scheduler_config.json")
      << R"({"_class_name": "UniPCMultistepScheduler", "prediction_type": "flow_prediction", "use_flow_sigmas": true, "solver_type": "bh1"})";
  const auto bad = run({"t2v", "--model", model.string(), "--prompt-embeds", embeds, "--frames", "1", "--out", (dir_ / "x.avi").string()});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("solver_type"), std::string::npos) << bad.err;
}

TEST_F(T2VCli, SimulateFullSizeWan14B) {
  const std::string json_path = (dir_ / "sim.json").string();
  const auto r = run({"t2v", "--simulate", "--model", std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/wan2.1-t2v-14b", "--steps", "1",
                      "--device-profile", std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/ascend-910b.json", "--dtype", "bf16", "--json",
                      json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("SIMULATED"), std::string::npos);
  EXPECT_NE(r.err.find("81 frames of 832x480 (latent 21 x 60 x 104)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("t2v: scheduler: UniPC multistep (order 2, flow shift 3)"), std::string::npos) << r.err;
  const auto report = nlohmann::json::parse(read_file(json_path));
  // A 14B step with CFG at 32,760 tokens is tens of seconds on a 910B.
  const double step = report["modelled_step_mean_s"].get<double>();
  EXPECT_GT(step, 5.0);
  EXPECT_LT(step, 500.0);
}

// The modelled self-attention follows its 32,760-key length (the profile's attention_keys): against
// the same profile without the curve, each self-attention kernel is faster by exactly
// g(32760) / g(4608) with g(S) = S / (S + 3050), and FLUX's length, the reference, is unchanged.
TEST_F(T2VCli, SimulatedAttentionFollowsItsKeyLength) {
  const std::string shipped = std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/ascend-910b.json";
  nlohmann::json flat = nlohmann::json::parse(read_file(shipped));
  ASSERT_TRUE(flat["kernels"].contains("attention_keys"));
  flat["kernels"].erase("attention_keys");
  const std::string flat_path = (dir_ / "flat.json").string();
  std::ofstream(flat_path) << flat.dump();
  // The longest self-attention kernel's modelled time in a one-step trace.
  const auto self_attention_us = [&](const std::string& profile, const std::string& tag) {
    const std::string trace = (dir_ / (tag + ".trace.json")).string();
    const auto r = run({"t2v", "--simulate", "--model", std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/wan2.1-t2v-14b", "--steps", "1",
                        "--device-profile", profile, "--dtype", "bf16", "--trace", trace});
    EXPECT_EQ(r.status, 0) << r.err;
    double longest = 0;
    const nlohmann::json doc = nlohmann::json::parse(read_file(trace));  // named: a range-for over a temporary's member dangles
    for (const auto& e : doc["traceEvents"])
      if (e.value("ph", "") == "X" && e["name"].get<std::string>().rfind("attention", 0) == 0 && e.contains("args") &&
          e["args"].contains("modelled_us"))
        longest = std::max(longest, e["args"]["modelled_us"].get<double>());
    return longest;
  };
  const double curved = self_attention_us(shipped, "curved"), one_rate = self_attention_us(flat_path, "flat");
  const auto g = [](double keys) { return keys / (keys + 3050.0); };
  ASSERT_GT(curved, 0.0);
  EXPECT_NEAR(one_rate / curved, g(32760) / g(4608), 1e-3) << one_rate << " us against " << curved << " us";
}

TEST_F(T2VCli, BadInputsAreOneLineErrors) {
  const std::string embeds = write_wan_embeds(dir_, false), with_negative = write_wan_embeds(dir_, true), out = (dir_ / "x.avi").string();
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"t2v", "--model", kWan, "--prompt", "a cat", "--out", out}, "has no text_encoder/ (umT5) to encode --prompt with"},
      {{"t2v", "--model", kWan, "--prompt-embeds", with_negative, "--frames", "8", "--out", out}, "frames must be 1 + 4k"},
      {{"t2v", "--model", kWan, "--prompt-embeds", with_negative, "--width", "36", "--out", out},
       "width and height must be positive multiples of 8"},
      {{"t2v", "--model", kWan, "--prompt-embeds", with_negative, "--width", "40", "--out", out},
       "--width 40 gives 5 latent positions, not a multiple of the transformer's patch size 2"},
      {{"t2v", "--model", kWan, "--prompt-embeds", embeds, "--out", out}, "needs negative_prompt_embeds"},
      {{"t2v", "--model", kWan, "--prompt-embeds", with_negative, "--cfg", "both", "--out", out}, "unknown CFG mode 'both'"},
      {{"t2v", "--model", "/nonexistent", "--prompt-embeds", embeds, "--out", out}, "not a diffusers Wan model directory"},
      {{"t2v", "--model", kWan, "--prompt-embeds", with_negative}, "--out FILE.avi is required"},
      {{"t2v", "--model", kWan, "--prompt-embeds", with_negative, "--out", "/nonexistent/dir/x.avi", "--frames", "1", "--steps", "1",
        "--width", "16", "--height", "16"},
       "/nonexistent/dir/x.avi"},
  };
  for (const auto& c : cases) {
    const auto r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.expected << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in: " << r.err;
  }
  // CFG off needs no negative embeddings.
  EXPECT_EQ(run({"t2v", "--model", kWan, "--prompt-embeds", embeds, "--cfg", "off", "--frames", "1", "--steps", "1", "--width", "16",
                 "--height", "16", "--out", out})
                .status,
            0);
}

TEST_F(T2VCli, ForwardRunsTheWanTransformer) {
  const cubevec::SafetensorsFile goldens =
      cubevec::SafetensorsFile::open(std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/goldens_wan.safetensors");
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(inputs, {{"hidden_states", goldens.tensor("transformer.hidden_states")},
                                      {"timestep", goldens.tensor("transformer.timestep")},
                                      {"encoder_hidden_states", goldens.tensor("transformer.encoder_hidden_states")}});
  const auto r = run({"forward", "--model", kWan, "--inputs", inputs, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), goldens.tensor("transformer.sample"), 1e-4,
                                     "forward sample");
  // A Flux argument name is rejected for a Wan model.
  cubevec::write_safetensors(inputs, {{"hidden_states", goldens.tensor("transformer.hidden_states")},
                                      {"pooled_projections", goldens.tensor("transformer.timestep")}});
  const auto bad = run({"forward", "--model", kWan, "--inputs", inputs, "--out", out});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("unknown tensor 'pooled_projections' (WanTransformer3DModel.forward takes"), std::string::npos) << bad.err;
}

}  // namespace t2v_cli_test

// The shipped tiny video model (assets/tinywan, trained by tools/tinywan/train.py): the README's
// video command at the model's own defaults (generation_defaults.json), its text encoder, and the
// defaults file's errors.
namespace t2v_cli_test {  // named after the file: unity batches never mix two files' helpers

using cubevec_cli_test::kTinyWan;

// A copy of the shipped model whose generation_defaults.json holds `text`.
std::string tiny_wan_with_defaults(const std::filesystem::path& dir, const std::string& text) {
  const std::filesystem::path copy = dir / "tinywan";
  std::filesystem::remove_all(copy);
  std::filesystem::copy(kTinyWan, copy, std::filesystem::copy_options::recursive);
  std::ofstream(copy / "generation_defaults.json") << text;
  return copy.string();
}

TEST_F(T2VCli, TinyWanRendersThePromptAtItsDefaults) {
  const std::string out = (dir_ / "tiny.avi").string();
  const auto r = run({"t2v", "--model", kTinyWan, "--prompt", "a red circle moving right on a blue background", "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("t2v: text: tiny text encoder"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("t2v: 17 frames of 64x64 (latent 5 x 8 x 8), 30 steps, cfg fused (scale 5.00)"), std::string::npos) << r.err;
  const cubevec::media::AviInfo info = cubevec::media::read_avi_info(out);
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.height, 64);
  EXPECT_EQ(info.frame_count, 17);
  const auto frames = frames_of(out);
  ASSERT_EQ(frames.size(), 17u);
  for (const auto& f : frames) ASSERT_EQ(f.width * f.height, 64 * 64);
  // The background the prompt asks for (tools/tinywan/evaluate.py grades color and motion over 60
  // prompts: the model card has its rates).
  const auto& first = frames.front().pixels;
  EXPECT_GT(int(first[2]), int(first[0]) + 80) << "corner is not blue";
  // Flags given on the command line win over the model's defaults.
  const auto smaller = run({"t2v", "--model", kTinyWan, "--prompt", "a red circle moving right", "--width", "32", "--height", "48",
                            "--steps", "2", "--cfg", "off", "--out", out});
  ASSERT_EQ(smaller.status, 0) << smaller.err;
  EXPECT_NE(smaller.err.find("t2v: 17 frames of 32x48 (latent 5 x 6 x 4), 2 steps, cfg off"), std::string::npos) << smaller.err;
  const cubevec::media::AviInfo smaller_info = cubevec::media::read_avi_info(out);
  EXPECT_EQ(smaller_info.width, 32);
  EXPECT_EQ(smaller_info.height, 48);
  EXPECT_EQ(smaller_info.frame_count, 17);
}

TEST_F(T2VCli, TinyWanPromptAndDefaultsErrors) {
  const std::string out = (dir_ / "x.avi").string();
  const struct {
    std::string defaults;  // empty: the shipped model as is
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {"",
       {"--prompt", "a red cat moving left"},
       "the prompt has a word this model does not know: 'cat'. It knows these 22 words: a an red"},
      {"", {"--prompt", " ,. "}, "--prompt TEXT is required (' ,. ' has no words)"},
      {"",
       {"--prompt", "a red circle", "--negative-prompt", "no dogs"},
       "--negative-prompt: the prompt has 2 words this model does not know: 'no', 'dogs'"},
      // One token holds all 5 latent frames of its place (patch (5, 2, 2)): 9 frames are 3 latent frames.
      {"",
       {"--prompt", "a red circle", "--frames", "9"},
       "--frames 9 gives 3 latent positions, not a multiple of the transformer's patch size 5"},
      {R"({"width": 40})", {"--prompt", "a red circle"}, "generation_defaults.json: 'width' must be a multiple of 16, got 40"},
      {R"({"frames": 8})", {"--prompt", "a red circle"}, "generation_defaults.json: 'frames' must be 1 + 4k, got 8"},
      {R"({"frames": 9})",
       {"--prompt", "a red circle"},
       "generation_defaults.json sets --frames: --frames 9 gives 3 latent positions, not a multiple of the transformer's patch size 5"},
      {R"({"steps": 0})", {"--prompt", "a red circle"}, "generation_defaults.json: 'steps' must be an integer"},
      {R"({"guidance": "high"})", {"--prompt", "a red circle"}, "generation_defaults.json: 'guidance' must be"},
      {R"({"fps": 8})", {"--prompt", "a red circle"}, "generation_defaults.json: unknown key 'fps'"},
      {R"({"width": 64, "width": 32})", {"--prompt", "a red circle"}, "generation_defaults.json"},
      {"[64, 64]", {"--prompt", "a red circle"}, "generation_defaults.json"},
      {"{\"width\": ", {"--prompt", "a red circle"}, "generation_defaults.json"},
      // A NUL byte would end the parse early and hide what follows.
      {std::string("{\"frames\": 5}\0{\"bogus\": 1}", 26),
       {"--prompt", "a red circle"},
       "generation_defaults.json: not valid JSON: a NUL byte at offset 13"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"t2v", "--model", c.defaults.empty() ? kTinyWan : tiny_wan_with_defaults(dir_, c.defaults), "--out", out};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto r = run(args);
    EXPECT_EQ(r.status, 1) << c.expected << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << "no video for an input the run refuses";
  }
}

}  // namespace t2v_cli_test
