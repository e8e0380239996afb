// `cubevec t2i` and `cubevec forward` as a user runs them, on the tiny Flux checkpoint in
// tests/data/flux_tiny: a JPEG that decodes at the asked size, progress and the stage table, the
// JSON report, true CFG fused and on two streams giving the same picture, simulate mode, and
// one-line errors; `forward` reproduces the PyTorch golden's `sample`; the shipped tiny model
// (assets/tinyflux) from a prompt, with CFG, and its prompt errors.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "device/device_profile.h"
#include "cli/run_cubevec.h"
#include "media/jpeg.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace t2i_cli_test {  // named after the file: unity batches never mix two files' helpers

using T2ICli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

using cubevec_cli_test::kFlux;

std::string write_flux_embeds(const std::filesystem::path& dir, bool negative, int64_t neg_len = 5) {
  const std::string path = (dir / "embeds.safetensors").string();
  cubevec::NamedTensors t = {{"prompt_embeds", cubevec::testing::random_tensor({1, 5, 40}, 1, cubevec::DType::f32, 1.0f)},
                             {"pooled_prompt_embeds", cubevec::testing::random_tensor({1, 24}, 2, cubevec::DType::f32, 1.0f)}};
  if (negative) {
    t.push_back({"negative_prompt_embeds", cubevec::testing::random_tensor({1, neg_len, 40}, 3, cubevec::DType::f32, 1.0f)});
    t.push_back({"negative_pooled_prompt_embeds", cubevec::testing::random_tensor({1, 24}, 4, cubevec::DType::f32, 1.0f)});
  }
  cubevec::write_safetensors(path, t);
  return path;
}

TEST_F(T2ICli, WritesAJpegWithProgressTableAndJson) {
  const std::string out = (dir_ / "a.jpg").string(), json_path = (dir_ / "a.json").string();
  const auto r = run({"t2i", "--model", kFlux, "--prompt-embeds", write_flux_embeds(dir_, false), "--width", "48", "--height", "32",
                      "--steps", "3", "--seed", "7", "--out", out, "--json", json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* line : {"step 1/3", "step 3/3", "ETA", "denoising", "VAE decode", "JPEG encode", "peak memory", "wrote "})
    EXPECT_NE(r.err.find(line), std::string::npos) << line << " missing:\n" << r.err;
  const cubevec::media::RgbImage image = cubevec::media::read_jpeg(out);
  EXPECT_EQ(image.width, 48);
  EXPECT_EQ(image.height, 32);
  const auto report = nlohmann::json::parse(read_file(json_path));
  EXPECT_EQ(report["steps"], 3);
  EXPECT_EQ(report["step_s"].size(), 3u);
  EXPECT_GT(report["stages_s"]["denoising"].get<double>(), 0.0);
  EXPECT_GT(report["peak_live_bytes"].get<double>(), 0.0);
  EXPECT_EQ(report["profile"], "cpu-default");
  EXPECT_EQ(report["cube_threads"], cubevec::machine_unit_threads()) << "the built-in profile: every core this process may use";
  EXPECT_EQ(report["vector_threads"], cubevec::machine_unit_threads());
  // The same seed gives the same picture; another seed another one.
  const std::string again = (dir_ / "b.jpg").string(), other = (dir_ / "c.jpg").string();
  ASSERT_EQ(run({"t2i", "--model", kFlux, "--prompt-embeds", write_flux_embeds(dir_, false), "--width", "48", "--height", "32", "--steps",
                 "3", "--seed", "7", "--out", again})
                .status,
            0);
  ASSERT_EQ(run({"t2i", "--model", kFlux, "--prompt-embeds", write_flux_embeds(dir_, false), "--width", "48", "--height", "32", "--steps",
                 "3", "--seed", "8", "--out", other})
                .status,
            0);
  EXPECT_EQ(read_file(out), read_file(again));
  EXPECT_NE(read_file(out), read_file(other));
}

TEST_F(T2ICli, MissingSchedulerIsFluxDevsWithANotice) {
  // diffusers has no default scheduler for a Flux folder; cubevec uses FLUX.1-dev's and says so.
  const std::filesystem::path bare = dir_ / "flux_bare";
  std::filesystem::copy(kFlux, bare, std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(bare / "scheduler");
  const auto r = run({"t2i", "--model", bare.string(), "--prompt-embeds", write_flux_embeds(dir_, false), "--width", "32", "--height", "32",
                      "--steps", "1", "--out", (dir_ / "bare.jpg").string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("note: " + bare.string() +
                       " has no scheduler/scheduler_config.json; using FLUX.1-dev's (FlowMatchEulerDiscreteScheduler, "
                       "shift 3, dynamic shifting)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("has no scheduler"), r.err.rfind("has no scheduler")) << "the notice appears once: " << r.err;
}

TEST_F(T2ICli, FusedAndTwoStreamCfgGiveTheSamePicture) {
  const std::string embeds = write_flux_embeds(dir_, true);
  std::vector<cubevec::media::RgbImage> images;
  for (const char* mode : {"fused", "streams"}) {
    const std::string out = (dir_ / (std::string(mode) + ".jpg")).string();
    const auto r = run({"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--width", "32", "--height", "32", "--steps", "2", "--cfg",
                        mode, "--cfg-scale", "3", "--out", out});
    ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
    images.push_back(cubevec::media::read_jpeg(out));
  }
  int worst = 0;
  for (std::size_t i = 0; i < images[0].pixels.size(); ++i)
    worst = std::max(worst, std::abs(int(images[0].pixels[i]) - int(images[1].pixels[i])));
  EXPECT_LE(worst, 2) << "fused and two-stream CFG compute the same velocities";
  // Negative embeddings of another length work on two streams but not in one batch.
  const std::string uneven = write_flux_embeds(dir_, true, 7);
  EXPECT_EQ(run({"t2i", "--model", kFlux, "--prompt-embeds", uneven, "--width", "32", "--height", "32", "--steps", "1", "--cfg", "streams",
                 "--out", (dir_ / "u.jpg").string()})
                .status,
            0);
  const auto fused = run({"t2i", "--model", kFlux, "--prompt-embeds", uneven, "--width", "32", "--height", "32", "--steps", "1", "--cfg",
                          "fused", "--out", (dir_ / "v.jpg").string()});
  EXPECT_EQ(fused.status, 1);
  EXPECT_NE(fused.err.find("--cfg fused needs prompt and negative prompt embeddings of one length, got 5 and 7"), std::string::npos)
      << fused.err;
}

TEST_F(T2ICli, SimulateReportsModelledStepTime) {
  const std::string json_path = (dir_ / "sim.json").string();
  const auto r = run({"t2i", "--simulate", "--model", std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/flux1-dev", "--steps", "2",
                      "--device-profile", std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/ascend-910b.json", "--dtype", "bf16", "--json",
                      json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("SIMULATED"), std::string::npos);
  const auto report = nlohmann::json::parse(read_file(json_path));
  const double step = report["modelled_step_mean_s"].get<double>();
  EXPECT_GT(step, 0.05);
  EXPECT_LT(step, 5.0);
}

TEST_F(T2ICli, BadInputsAreOneLineErrors) {
  const std::string embeds = write_flux_embeds(dir_, false), out = (dir_ / "x.jpg").string();
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"t2i", "--model", kFlux, "--out", out}, "has no text_encoder/ to encode --prompt with"},
      {{"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--width", "36", "--out", out},
       "width and height must be positive multiples of 8 for this model, got 36x32"},
      {{"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--cfg", "fused", "--out", out}, "needs negative embeddings"},
      {{"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--cfg", "both", "--out", out}, "unknown CFG mode 'both'"},
      {{"t2i", "--model", "/nonexistent", "--prompt-embeds", embeds, "--out", out}, "not a diffusers Flux model directory"},
      {{"t2i", "--model", kFlux, "--prompt-embeds", kFlux + "/vae/config.json", "--out", out}, "config.json"},
      {{"t2i", "--model", kFlux, "--prompt-embeds", embeds}, "--out FILE.png or FILE.jpg is required"},
      {{"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--out", (dir_ / "x.webp").string()}, "'.webp' is neither"},
  };
  for (const auto& c : cases) {
    const auto r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.expected << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in: " << r.err;
  }
}

// The shipped tiny model: the README's first command, its text encoder's errors, and true CFG with
// the empty negative prompt (the caption dropout's unconditional input).
using cubevec_cli_test::kTinyFlux;

TEST_F(T2ICli, TinyModelRendersThePromptAtItsOwnSize) {
  const std::string out = (dir_ / "tiny.jpg").string();
  const auto r = run({"t2i", "--model", kTinyFlux, "--prompt", "a large red circle in the center on a blue background", "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("t2i: text: tiny text encoder"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("t2i: 64x64, 28 steps"), std::string::npos) << r.err;
  const cubevec::media::RgbImage image = cubevec::media::read_jpeg(out);
  ASSERT_EQ(image.width, 64);
  ASSERT_EQ(image.height, 64);
  // A blue corner and a red center (tinyflux_test checks colors exactly; this is the JPEG).
  auto at = [&](int x, int y, int c) { return int(image.pixels[static_cast<std::size_t>((y * 64 + x) * 3 + c)]); };
  EXPECT_GT(at(1, 1, 2), at(1, 1, 0) + 80) << "corner is not blue";
  EXPECT_GT(at(32, 32, 0), at(32, 32, 2) + 80) << "center is not red";
}

TEST_F(T2ICli, TinyModelCfgWithTheEmptyNegativePrompt) {
  std::vector<cubevec::media::RgbImage> images;
  for (const char* mode : {"fused", "streams"}) {
    const std::string out = (dir_ / (std::string(mode) + ".jpg")).string();
    const auto r = run({"t2i", "--model", kTinyFlux, "--prompt", "a small green square on the left", "--cfg", mode, "--cfg-scale", "2",
                        "--steps", "8", "--out", out});
    ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
    images.push_back(cubevec::media::read_jpeg(out));
  }
  int worst = 0;
  for (std::size_t i = 0; i < images[0].pixels.size(); ++i)
    worst = std::max(worst, std::abs(int(images[0].pixels[i]) - int(images[1].pixels[i])));
  EXPECT_LE(worst, 2);
  const auto note = run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--negative-prompt", "a blue circle", "--steps", "2",
                         "--out", (dir_ / "n.jpg").string()});
  EXPECT_EQ(note.status, 0) << note.err;
  EXPECT_NE(note.err.find("--negative-prompt is used only with --cfg"), std::string::npos) << note.err;
}

// --max-sequence-length pads T5 prompts: with the tiny encoder it cannot apply, and a note says so
// (the image is the one without it); without the flag there is no note.
TEST_F(T2ICli, MaxSequenceLengthWithTheTinyEncoderIsNoted) {
  const std::string with = (dir_ / "with.jpg").string(), without = (dir_ / "without.jpg").string();
  const auto noted =
      run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "2", "--max-sequence-length", "77", "--out", with});
  ASSERT_EQ(noted.status, 0) << noted.err;
  EXPECT_NE(noted.err.find("note: --max-sequence-length 77 is not used: this model's text encoder pads every prompt to its own"),
            std::string::npos)
      << noted.err;
  const auto plain = run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "2", "--out", without});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.err.find("--max-sequence-length"), std::string::npos) << plain.err;
  EXPECT_EQ(cubevec_cli_test::read_file(with), cubevec_cli_test::read_file(without));
  // Embeddings from a file are already encoded: the same note.
  const auto embeds = run({"t2i", "--model", kFlux, "--prompt-embeds", write_flux_embeds(dir_, false), "--width", "48", "--height", "32",
                           "--steps", "1", "--max-sequence-length", "64", "--out", (dir_ / "e.jpg").string()});
  ASSERT_EQ(embeds.status, 0) << embeds.err;
  EXPECT_NE(embeds.err.find("note: --max-sequence-length 64 is not used: the embeddings in"), std::string::npos) << embeds.err;
}

TEST_F(T2ICli, TinyModelPromptErrors) {
  const std::string out = (dir_ / "x.jpg").string();
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red cat", "--out", out},
       "the prompt has a word this model does not know: 'cat'. It knows these 30 words: a an two small"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--negative-prompt", "no dogs", "--cfg", "fused", "--out", out},
       "words this model does not know: 'no', 'dogs'"},
      {{"t2i", "--model", kTinyFlux, "--out", out}, "--prompt TEXT is required (this model's text encoder knows these words: a an two"},
  };
  for (const auto& c : cases) {
    const auto r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.expected << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << "no picture for a prompt the model cannot read";
  }
}

TEST_F(T2ICli, ForwardReproducesThePyTorchSample) {
  const cubevec::SafetensorsFile goldens =
      cubevec::SafetensorsFile::open(std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/goldens_flux.safetensors");
  cubevec::NamedTensors inputs;
  for (const char* name : {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids", "guidance"})
    inputs.push_back({name, goldens.tensor(std::string("transformer.") + name)});
  const std::string in = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(in, inputs);
  const auto r = run({"forward", "--model", kFlux, "--inputs", in, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto got = cubevec::testing::values(cubevec::SafetensorsFile::open(out).tensor("sample"));
  const auto want = cubevec::testing::values(goldens.tensor("transformer.expected"));
  ASSERT_EQ(got.size(), want.size());
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(worst, 1e-4 * scale);
  // An input name diffusers' forward does not take is an error naming it.
  cubevec::write_safetensors(in, {{"hidden_state", goldens.tensor("transformer.hidden_states")}});
  const auto bad = run({"forward", "--model", kFlux, "--inputs", in, "--out", out});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("unknown tensor 'hidden_state'"), std::string::npos) << bad.err;
}

}  // namespace t2i_cli_test
