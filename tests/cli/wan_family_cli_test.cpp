// `cubevec t2v` on the Wan family's other folders as a user runs them: the tiny two-expert model
// (tests/data/wan22_tiny_a14b, Wan2.2 A14B's layout) and the tiny image-to-video model
// (tests/data/wan_i2v_tiny with the tiny CLIPVisionModel as its image encoder), through the command
// line, matching the library's run of the same request frame for frame (the library's numerics are
// checked against PyTorch in tests/pipelines/wan_i2v_pipeline_test.cpp), the run's description
// and JSON report, and one-line errors for the bad inputs.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "media/png.h"
#include "pipelines/pipeline.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace wan_family_cli_test {

using WanFamilyCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;
namespace fs = std::filesystem;

std::string data(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

// The goldens' 512-row prompt and negative prompt states as a --prompt-embeds file.
std::string write_embeds(const fs::path& dir, const std::string& golden_case, const std::string& file = "goldens_wan_i2v.safetensors") {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open(data(file));
  const std::string path = (dir / (golden_case + "_embeds.safetensors")).string();
  cubevec::write_safetensors(path, {{"prompt_embeds", goldens.tensor(golden_case + ".prompt_embeds")},
                                    {"negative_prompt_embeds", goldens.tensor(golden_case + ".negative_prompt_embeds")}});
  return path;
}

// The tiny two-expert run with `extra` flags.
std::vector<std::string> a14b_run(const std::vector<std::string>& extra) {
  std::vector<std::string> args = cubevec_cli_test::kTinyA14bRun;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The frames the command wrote losslessly must be the library's for the same request.
void expect_same_frames(const std::string& frames_dir, const std::vector<cubevec::media::RgbImage>& library) {
  ASSERT_FALSE(library.empty());
  ASSERT_EQ(library.size(), 9u);
  const auto written = cubevec_cli_test::read_frames(frames_dir, 9);
  for (std::size_t i = 0; i < library.size(); ++i) EXPECT_EQ(written[i].pixels, library[i].pixels) << "frame " << i;
}

TEST_F(WanFamilyCli, TwoExpertsRunAndReport) {
  const std::string model = data("wan22_tiny_a14b"), embeds = write_embeds(dir_, "pipeline_a14b");
  const std::string out = (dir_ / "a.avi").string(), frames = (dir_ / "frames").string(), json = (dir_ / "a.json").string();
  const auto r = run({"t2v", "--model",      model,  "--prompt-embeds", embeds, "--frames",     "9", "--width", "48", "--height",
                      "32",  "--steps",      "4",    "--guidance",      "4",    "--guidance-2", "3", "--seed",  "5",  "--out",
                      out,   "--frames-dir", frames, "--json",          json});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("two experts (boundary_ratio 0.75): transformer/ runs 2 step(s) with guidance 4.00, transformer_2/ 2 with 3.00"),
            std::string::npos)
      << r.err;
  const auto report = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(report["guidance_2"], 3.0);
  EXPECT_EQ(report["boundary_ratio"], 0.75);
  const auto request = cubevec::pipelines::Request::parse(R"({"prompt_embeds": ")" + embeds +
                                                          R"(", "num_frames": 9, "width": 48, "height": 32, "num_inference_steps": 4,
      "guidance_scale": 4, "guidance_scale_2": 3, "seed": 5})");
  expect_same_frames(frames, cubevec::pipelines::Pipeline::load(model)->generate(request).images);
  // Under --offload only the active expert is resident: the same frames, one switch in the run.
  const std::string streamed = (dir_ / "streamed").string();
  const auto o = run({"t2v",
                      "--model",
                      model,
                      "--prompt-embeds",
                      embeds,
                      "--frames",
                      "9",
                      "--width",
                      "48",
                      "--height",
                      "32",
                      "--steps",
                      "4",
                      "--guidance",
                      "4",
                      "--guidance-2",
                      "3",
                      "--seed",
                      "5",
                      "--offload",
                      "1",
                      "--out",
                      (dir_ / "b.avi").string(),
                      "--frames-dir",
                      streamed});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_NE(o.err.find("1 expert switch released"), std::string::npos) << o.err;
  for (int i = 0; i < 9; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/frame_%05d.png", i);
    EXPECT_EQ(cubevec::media::read_png(streamed + name).pixels, cubevec::media::read_png(frames + name).pixels) << name;
  }
  // Without CFG no guidance scale applies: the description does not print one.
  const auto off = run({"t2v", "--model", model, "--prompt-embeds", embeds, "--frames", "9", "--width", "48", "--height", "32", "--steps",
                        "4", "--cfg", "off", "--guidance-2", "3", "--out", (dir_ / "c.avi").string()});
  ASSERT_EQ(off.status, 0) << off.err;
  EXPECT_NE(off.err.find("transformer/ runs 2 step(s), transformer_2/ 2 (CFG off)"), std::string::npos) << off.err;
}

// At the switch the stages drop what they hold of the first expert and keep the run's counts:
// sparse masks estimated once per run (--sparse-mask-refresh 4) are estimated again when
// transformer_2/ takes over at step 2, and the report still has step 0's estimates.
TEST_F(WanFamilyCli, StagesStartOverAtTheExpertSwitchAndKeepTheirCounts) {
  const std::string json = (dir_ / "s.json").string();
  const auto r = run(a14b_run({"--sparse", "rf_v2", "--sparse-mask-refresh", "4", "--out", (dir_ / "s.avi").string(), "--json", json}));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto stages = nlohmann::json::parse(read_file(json))["stages"];
  bool found = false;
  for (const auto& stage : stages)
    if (stage["settings"].contains("mask_estimates_per_step")) {
      found = true;
      const auto& per_step = stage["settings"]["mask_estimates_per_step"];
      ASSERT_EQ(per_step.size(), 4u) << stage;
      EXPECT_GT(per_step[0].get<int>(), 0) << stage;  // the first expert's, kept in the report
      EXPECT_EQ(per_step[1].get<int>(), 0) << stage;
      EXPECT_EQ(per_step[2].get<int>(), per_step[0].get<int>()) << stage;  // the second expert's own masks
      EXPECT_EQ(per_step[3].get<int>(), 0) << stage;
    }
  EXPECT_TRUE(found) << stages;
}

// The packed cache holds both experts' panels: the second run maps every Linear of both and
// packs none of them, with the frames of a run without the cache.
TEST_F(WanFamilyCli, PackedCacheHoldsBothExperts) {
  const std::string cache = (dir_ / "cache").string();
  const auto with = [&](const std::vector<std::string>& extra) { return run(a14b_run(extra)); };
  ASSERT_EQ(with({"--out", (dir_ / "plain.avi").string()}).status, 0);
  ASSERT_EQ(with({"--out", (dir_ / "first.avi").string(), "--packed-cache", cache}).status, 0);
  const auto second = with({"--out", (dir_ / "second.avi").string(), "--packed-cache", cache, "--json", (dir_ / "s.json").string()});
  ASSERT_EQ(second.status, 0) << second.err;
  const auto report = nlohmann::json::parse(read_file((dir_ / "s.json").string()))["packed_cache"];
  EXPECT_EQ(report["state"], "mapped") << report;
  EXPECT_EQ(report["packed"], 0) << report;
  // Every Linear of both tiny experts (2 blocks x 10 each, plus the embedders and the head) and the VAE's.
  EXPECT_GT(report["layers"].get<int>(), 40) << report;
  EXPECT_EQ(read_file((dir_ / "second.avi").string()), read_file((dir_ / "plain.avi").string()));
}

// Two experts quantized one description each, as msModelSlim quantizes each transformer:
// `cubevec quantize` writes transformer/'s pair in --out and transformer_2/'s in --out/transformer_2,
// each calibrated on the steps its expert runs; t2v takes them as --quant and --quant-2.
TEST_F(WanFamilyCli, EachExpertTakesItsOwnQuantization) {
  const std::string model = data("wan22_tiny_a14b"), q = (dir_ / "q").string();
  const auto made = run({"quantize", "--model", model, "--algo", "W8A8_DYNAMIC", "--prompt", "a red circle moving right", "--steps", "4",
                         "--width", "48", "--height", "32", "--frames", "9", "--out", q, "--json", (dir_ / "q.json").string()});
  ASSERT_EQ(made.status, 0) << made.err;
  const std::string first = q + "/quant_model_description_w8a8_dynamic.json";
  const std::string second = q + "/transformer_2/quant_model_description_w8a8_dynamic.json";
  ASSERT_TRUE(fs::exists(first) && fs::exists(second)) << made.err;
  EXPECT_NE(made.err.find("run the two experts quantized with --quant " + first + " --quant-2 " + second), std::string::npos) << made.err;
  const auto report = nlohmann::json::parse(read_file((dir_ / "q.json").string()));
  EXPECT_EQ(report["transformer_2"]["layers"].size(), report["layers"].size());
  // A link where the second expert's folder goes is refused (it would write over another folder).
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directories(dir_ / "linked");
  fs::create_directory_symlink(dir_ / "elsewhere", dir_ / "linked" / "transformer_2");
  const auto linked = run({"quantize", "--model", model, "--algo", "W8A8_DYNAMIC", "--prompt", "a red circle moving right", "--steps", "4",
                           "--width", "48", "--height", "32", "--frames", "9", "--out", (dir_ / "linked").string()});
  EXPECT_NE(linked.err.find("transformer_2 is a symbolic link"), std::string::npos) << linked.err;
  EXPECT_TRUE(fs::is_empty(dir_ / "elsewhere"));
  const auto t2v = [&](const std::vector<std::string>& quant, const std::string& name) {
    std::vector<std::string> args = a14b_run(
        {"--out", (dir_ / (name + ".avi")).string(), "--json", (dir_ / (name + ".json")).string(), "--frames-dir", (dir_ / name).string()});
    args.insert(args.end(), quant.begin(), quant.end());
    return run(args);
  };
  const auto both = t2v({"--quant", first, "--quant-2", second}, "both");
  ASSERT_EQ(both.status, 0) << both.err;
  const auto stages = nlohmann::json::parse(read_file((dir_ / "both.json").string()))["stages"];
  bool reported = false;
  for (const auto& stage : stages)
    if (stage.contains("settings") && stage["settings"].contains("description_2")) {
      reported = true;
      EXPECT_EQ(stage["settings"]["layers"]["W8A8_DYNAMIC"].get<std::size_t>(), 2 * report["layers"].size()) << stage;
    }
  EXPECT_TRUE(reported) << stages;
  // The int8 video stays near the float one.
  ASSERT_EQ(t2v({}, "float").status, 0);
  double squared = 0;
  std::size_t values = 0;
  const auto quantized = cubevec_cli_test::read_frames((dir_ / "both").string(), 9);
  const auto plain = cubevec_cli_test::read_frames((dir_ / "float").string(), 9);
  for (std::size_t i = 0; i < quantized.size(); ++i)
    for (std::size_t k = 0; k < quantized[i].pixels.size(); ++k) {
      const double d = double(quantized[i].pixels[k]) - double(plain[i].pixels[k]);
      squared += d * d;
      ++values;
    }
  const double mse = squared / static_cast<double>(values);
  EXPECT_GT(mse, 0.0) << "the quantized run gave the float frames";
  EXPECT_GE(10.0 * std::log10(255.0 * 255.0 / mse), 30.0) << "int8 frames vs float, PSNR in dB (mse " << mse << ")";
  // Each expert's file is checked against that expert (its FLOAT tensors are the model's own): the
  // pair swapped, or one expert's twice, would give a wrong video and is refused naming the tensor.
  for (const auto& pair :
       {std::vector<std::string>{"--quant", second, "--quant-2", first}, std::vector<std::string>{"--quant", first, "--quant-2", first}}) {
    const auto wrong = t2v(pair, "wrong");
    EXPECT_NE(wrong.status, 0);
    EXPECT_NE(wrong.err.find("the description was made for another model or expert"), std::string::npos) << wrong.err;
  }
  // One description for two experts, a second without a first, a second for one transformer: named.
  EXPECT_NE(t2v({"--quant", first}, "x").err.find("describes transformer/ only: a two-expert model needs the low-noise expert's"),
            std::string::npos);
  EXPECT_NE(t2v({"--quant-2", second}, "x").err.find("--quant-2 " + second + " needs --quant"), std::string::npos);
  const auto one =
      run({"t2v", "--model", data("wan_i2v_tiny"), "--prompt", "a red circle moving right", "--image", data("images/rgb.png"), "--frames",
           "9", "--width", "48", "--height", "32", "--quant", first, "--quant-2", second, "--out", (dir_ / "x.avi").string()});
  EXPECT_NE(one.err.find("--quant-2 is the second expert's (transformer_2/) quantization"), std::string::npos) << one.err;
  EXPECT_FALSE(fs::exists(dir_ / "x.avi"));
}

// wan_i2v_tiny is a whole folder: the tiny CLIPVisionModel as its image_encoder/ + image_processor/,
// a random 24-wide text encoder with tinywan's word tokenizer.
fs::path i2v_folder(const fs::path&) { return data("wan_i2v_tiny"); }

TEST_F(WanFamilyCli, ImageToVideoRunsTheImageEncoder) {
  const std::string model = i2v_folder(dir_).string(), embeds = write_embeds(dir_, "pipeline_i2v");
  const std::string out = (dir_ / "a.avi").string(), frames = (dir_ / "frames").string();
  const auto r = run(
      {"t2v",     "--model", model,     "--prompt-embeds",      embeds,   "--frames", "9",     "--width", "48",           "--height", "32",
       "--steps", "3",       "--image", data("images/rgb.png"), "--seed", "5",        "--out", out,       "--frames-dir", frames});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("image-to-video: first frame given, image tokens from the image encoder"), std::string::npos) << r.err;
  const auto request = cubevec::pipelines::Request::parse(R"({"prompt_embeds": ")" + embeds + R"(", "image": ")" + data("images/rgb.png") +
                                                          R"(", "num_frames": 9, "width": 48, "height": 32, "num_inference_steps": 3,
      "seed": 5})");
  const auto library = cubevec::pipelines::Pipeline::load(model)->generate(request);
  expect_same_frames(frames, library.images);
  // From a prompt (the folder's text encoder) too.
  const auto prompt =
      run({"t2v", "--model", model, "--prompt", "a red circle moving right", "--frames", "9", "--width", "48", "--height", "32", "--steps",
           "2", "--image", data("images/rgb.png"), "--out", (dir_ / "p.avi").string(), "--json", (dir_ / "p.json").string()});
  ASSERT_EQ(prompt.status, 0) << prompt.err;
  const auto report = nlohmann::json::parse(read_file((dir_ / "p.json").string()));
  EXPECT_GT(report["stages_s"]["image_encoding"].get<double>(), 0.0) << report;
  // The picture matters: another first frame gives another video.
  const auto other = run({"t2v", "--model", model, "--prompt-embeds", embeds, "--frames", "9", "--width", "48", "--height", "32", "--steps",
                          "3", "--image", data("images/photo.jpg"), "--seed", "5", "--out", (dir_ / "b.avi").string()});
  ASSERT_EQ(other.status, 0) << other.err;
  EXPECT_NE(read_file(out), read_file((dir_ / "b.avi").string()));
}

// Wan2.2 TI2V (tests/data/wan22_ti2v_tiny: the tiny Wan2.2 VAE, expand_timesteps): with a first
// frame and without, through the command line, the library's frames; the bad inputs named.
TEST_F(WanFamilyCli, TextImageToVideoRunsWithAndWithoutAPicture) {
  const std::string model = data("wan22_ti2v_tiny"), embeds = write_embeds(dir_, "pipeline_ti2v", "goldens_wan22_ti2v.safetensors");
  const std::vector<std::string> common = {"t2v",      model, "--prompt-embeds", embeds, "--frames",   "9", "--width", "96",
                                           "--height", "64",  "--steps",         "3",    "--guidance", "4", "--seed",  "5"};
  for (const bool picture : {true, false}) {
    std::vector<std::string> args = common;
    args.insert(args.begin() + 1, "--model");
    const std::string frames = (dir_ / (picture ? "with" : "without")).string();
    for (const std::string& a :
         {std::string("--out"), (dir_ / (picture ? "a.avi" : "b.avi")).string(), std::string("--frames-dir"), frames})
      args.push_back(a);
    if (picture) args.insert(args.end(), {"--image", data("images/rgb.png")});
    const auto r = run(args);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find(picture ? "Wan2.2 TI2V (per-token timesteps): text-image-to-video, the first frame given"
                                 : "Wan2.2 TI2V (per-token timesteps): text-to-video"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("latent 3 x 4 x 6"), std::string::npos) << r.err;  // the Wan2.2 VAE's 16x
    const std::string image = picture ? R"(, "image": ")" + data("images/rgb.png") + "\"" : std::string();
    const auto request = cubevec::pipelines::Request::parse(R"({"prompt_embeds": ")" + embeds + "\"" + image +
                                                            R"(, "num_frames": 9, "width": 96, "height": 64, "num_inference_steps": 3,
        "guidance_scale": 4, "seed": 5})");
    expect_same_frames(frames, cubevec::pipelines::Pipeline::load(model)->generate(request).images);
  }
  EXPECT_NE(read_file((dir_ / "a.avi").string()), read_file((dir_ / "b.avi").string()));
  const auto last = run({"t2v", "--model", model, "--prompt-embeds", embeds, "--frames", "9", "--width", "96", "--height", "64", "--image",
                         data("images/rgb.png"), "--last-image", data("images/photo.jpg"), "--out", (dir_ / "c.avi").string()});
  EXPECT_NE(last.err.find("--last-image: Wan2.2 TI2V takes a first frame only"), std::string::npos) << last.err;
  const auto size = run({"t2v", "--model", model, "--prompt-embeds", embeds, "--frames", "9", "--width", "88", "--height", "64", "--out",
                         (dir_ / "c.avi").string()});
  EXPECT_NE(size.err.find("positive multiples of 16 (the VAE's scale), got 88x64"), std::string::npos) << size.err;
  EXPECT_FALSE(fs::exists(dir_ / "c.avi"));
}

TEST_F(WanFamilyCli, BadInputsAreOneLineErrors) {
  const std::string a14b = data("wan22_tiny_a14b"), i2v = i2v_folder(dir_).string();
  const std::string embeds = write_embeds(dir_, "pipeline_i2v"), out = (dir_ / "x.avi").string();
  const std::vector<std::string> common = {"--prompt-embeds", embeds, "--frames", "9", "--width", "48",
                                           "--height",        "32",   "--steps",  "2", "--out",   out};
  const auto error = [&](const std::string& model, std::vector<std::string> extra) {
    std::vector<std::string> args = {"t2v", "--model", model};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run(args);
    EXPECT_NE(r.status, 0);
    EXPECT_FALSE(fs::exists(out));
    return r.err;
  };
  EXPECT_NE(error(a14b, {"--image", data("images/rgb.png")}).find("--image is for image-to-video models"), std::string::npos);
  // The stages that rewrite the weights work on one transformer so far: refused, not half applied.
  EXPECT_NE(error(a14b, {"--tp", "2"}).find("--tp"), std::string::npos);
  EXPECT_NE(error(i2v, {}).find("--image FIRST.png is required"), std::string::npos);
  EXPECT_NE(
      error(i2v, {"--image", data("images/rgb.png"), "--last-image", data("images/photo.jpg")}).find("--last-image (first-last-frame)"),
      std::string::npos);
  EXPECT_NE(error(i2v, {"--image", data("images/rgb.png"), "--guidance-2", "3"}).find("--guidance-2"), std::string::npos);
  EXPECT_NE(error(i2v, {"--image", (dir_ / "missing.png").string()}).find("missing.png"), std::string::npos);
  EXPECT_NE(error(i2v, {"--image", ""}).find("--image: expected a PNG or JPEG file"), std::string::npos);
  EXPECT_NE(error(i2v, {"--image", embeds}).find(embeds), std::string::npos);  // not a picture
  EXPECT_NE(error(i2v, {"--image", data("images/rgb.png"), "--mask", data("images/rgb.png")}).find("--mask"), std::string::npos);
  // --frames-dir must not overwrite an input or another output with a frame.
  const fs::path frames = dir_ / "frames";
  fs::create_directories(frames);
  fs::copy_file(data("images/photo.jpg"), frames / "frame_00000.png");
  const std::string picture = read_file((frames / "frame_00000.png").string());
  EXPECT_NE(error(i2v, {"--image", (frames / "frame_00000.png").string(), "--frames-dir", frames.string()})
                .find("would overwrite the --image file"),
            std::string::npos);
  EXPECT_EQ(read_file((frames / "frame_00000.png").string()), picture);
  // The frames folder is created, its parents are not (a mistyped path is not a new tree).
  EXPECT_NE(error(i2v, {"--image", data("images/rgb.png"), "--frames-dir", (dir_ / "no" / "such").string()})
                .find("its parent folder " + (dir_ / "no").string() + " does not exist"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "no"));
  EXPECT_NE(error(i2v, {"--image", data("images/rgb.png"), "--frames-dir", ""}).find("--frames-dir"), std::string::npos);
  // A frame's path that is a folder fails before any work (not after the denoising).
  const fs::path blocked = dir_ / "blocked";
  fs::create_directories(blocked / "frame_00004.png");
  EXPECT_NE(error(i2v, {"--image", data("images/rgb.png"), "--frames-dir", blocked.string()}).find("frame_00004.png is not a regular file"),
            std::string::npos);
}

TEST_F(WanFamilyCli, ForwardRunsTheImageToVideoTransformer) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open(data("goldens_wan_i2v.safetensors"));
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  for (const auto& [folder, c] :
       {std::pair<std::string, std::string>{"wan_i2v_tiny", "transformer_i2v"}, {"wan_flf2v_tiny", "transformer_flf2v"}}) {
    cubevec::write_safetensors(inputs, {{"hidden_states", goldens.tensor(c + ".hidden_states")},
                                        {"timestep", goldens.tensor(c + ".timestep")},
                                        {"encoder_hidden_states", goldens.tensor(c + ".encoder_hidden_states")},
                                        {"encoder_hidden_states_image", goldens.tensor(c + ".encoder_hidden_states_image")}});
    const auto r = run({"forward", "--model", data(folder + "/transformer"), "--inputs", inputs, "--out", out});
    ASSERT_EQ(r.status, 0) << r.err;
    cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), goldens.tensor(c + ".sample"), 1e-4, c);
  }
  // Without the image states: named.
  cubevec::write_safetensors(inputs, {{"hidden_states", goldens.tensor("transformer_i2v.hidden_states")},
                                      {"timestep", goldens.tensor("transformer_i2v.timestep")},
                                      {"encoder_hidden_states", goldens.tensor("transformer_i2v.encoder_hidden_states")}});
  const auto bad = run({"forward", "--model", data("wan_i2v_tiny/transformer"), "--inputs", inputs, "--out", out});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("encoder_hidden_states_image must be [2, L >= 1, 32]"), std::string::npos) << bad.err;
  // A text-to-video transformer does not take them.
  cubevec::write_safetensors(inputs, {{"encoder_hidden_states_image", goldens.tensor("transformer_i2v.encoder_hidden_states_image")}});
  const auto t2v = run({"forward", "--model", data("wan22_tiny_a14b/transformer"), "--inputs", inputs, "--out", out});
  EXPECT_NE(t2v.err.find("unknown tensor 'encoder_hidden_states_image'"), std::string::npos) << t2v.err;
}

TEST_F(WanFamilyCli, SimulateTheFullSizeConfigs) {
  const std::string configs = std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/";
  const std::string profile = std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/ascend-910b.json";
  const auto simulate = [&](const std::string& model, std::vector<std::string> extra) {
    const std::string json = (dir_ / "sim.json").string();
    std::vector<std::string> args = {"t2v", "--simulate", "--model", configs + model,    "--prompt", "a cat",  "--steps",
                                     "2",   "--dtype",    "bf16",    "--device-profile", profile,    "--json", json};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return std::pair{r.err, r.status == 0 ? nlohmann::json::parse(read_file(json)) : nlohmann::json()};
  };
  const auto [t2v_err, t2v] = simulate("wan2.1-t2v-14b", {});
  const auto [a14b_err, a14b] = simulate("wan2.2-t2v-a14b", {});
  const auto [i2v_err, i2v] = simulate("wan2.1-i2v-14b-480p", {"--image", data("images/rgb.png")});
  // Two steps of UniPC (shift 3): t = 999 then 749, so each expert runs one.
  EXPECT_NE(a14b_err.find("two experts (boundary_ratio 0.875): transformer/ runs 1 step(s) with guidance 5.00, transformer_2/ 1"),
            std::string::npos)
      << a14b_err;
  EXPECT_NE(i2v_err.find("image-to-video: first frame given, image tokens from the image encoder"), std::string::npos) << i2v_err;
  // Each step runs one 14B expert: the step costs what Wan2.1-14B's does; the estimate holds both.
  const double t2v_step = t2v["modelled_step_mean_s"].get<double>();
  EXPECT_NEAR(a14b["modelled_step_mean_s"].get<double>(), t2v_step, 0.01 * t2v_step);
  EXPECT_GT(a14b["memory_estimate"]["weights_bytes"].get<double>(), 1.9 * t2v["memory_estimate"]["weights_bytes"].get<double>());
  // Simulate mode's algorithm name quantizes both experts' block Linears (400 each), priced at the int8 rate.
  const auto [quant_err, quant] = simulate("wan2.2-t2v-a14b", {"--quant", "W8A8_DYNAMIC"});
  EXPECT_NE(quant_err.find("800 Linears quantized"), std::string::npos) << quant_err;
  EXPECT_LT(quant["modelled_step_mean_s"].get<double>(), 0.9 * a14b["modelled_step_mean_s"].get<double>());
  // Image-to-video adds the 257 image tokens' keys and values to every cross-attention and 20 input channels.
  EXPECT_GT(i2v["modelled_step_mean_s"].get<double>(), t2v_step);
  EXPECT_LT(i2v["modelled_step_mean_s"].get<double>(), 1.2 * t2v_step);
  // TI2V-5B at its own default size (1280x704 x 121: latent 31 x 44 x 80 with the Wan2.2 VAE's 16x), with and without a picture.
  const auto [ti2v_err, ti2v] = simulate("wan2.2-ti2v-5b", {"--image", data("images/rgb.png")});
  EXPECT_NE(ti2v_err.find("121 frames of 1280x704 (latent 31 x 44 x 80)"), std::string::npos) << ti2v_err;
  EXPECT_NE(ti2v_err.find("text-image-to-video, the first frame given"), std::string::npos) << ti2v_err;
  const auto [ti2v_text_err, ti2v_text] = simulate("wan2.2-ti2v-5b", {});
  EXPECT_NE(ti2v_text_err.find("Wan2.2 TI2V (per-token timesteps): text-to-video"), std::string::npos) << ti2v_text_err;
  // 27,280 tokens through 30 blocks 3072 wide: cheaper per step than Wan2.1-14B's 32,760 through 40 x 5120.
  EXPECT_LT(ti2v["modelled_step_mean_s"].get<double>(), 0.5 * t2v_step);
  EXPECT_GT(ti2v["modelled_step_mean_s"].get<double>(), 0.0);
  EXPECT_GT(ti2v_text["modelled_step_mean_s"].get<double>(), 0.0);
}

}  // namespace wan_family_cli_test
