// Wan2.2 TI2V-5B's pipeline (expand_timesteps) against PyTorch goldens: the first-frame rules
// (tests/data/goldens_wan22.safetensors, make_wan22_reference.py: the blend and the per-token
// timesteps as WanImageToVideoPipeline computes them) and 3-step runs of the tiny TI2V folder
// (tests/data/wan22_ti2v_tiny: the tiny Wan2.2 VAE, 16x) with and without a first frame
// (goldens_wan22_ti2v.safetensors, make_wan22_ti2v_reference.py); plus its option and folder errors.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 x max |expected| (f32); the rules exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "media/image_input.h"
#include "ops/vector_ops.h"
#include "pipelines/wan_t2v.h"
#include "tensor/safetensors.h"

#include "common/scratch_model.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace wan22_ti2v_pipeline_test {

using namespace cubevec::testing;
namespace fs = std::filesystem;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

Tensor golden(const std::string& file, const std::string& name) {
  static std::map<std::string, SafetensorsFile> files;
  auto it = files.find(file);
  if (it == files.end()) it = files.emplace(file, SafetensorsFile::open(data_path(file))).first;
  return it->second.tensor(name);
}
Tensor rules(const std::string& name) { return golden("goldens_wan22.safetensors", name); }
Tensor runs(const std::string& name) { return golden("goldens_wan22_ti2v.safetensors", name); }

const pipelines::WanT2VPipeline& ti2v() {
  static const pipelines::WanT2VPipeline p = pipelines::WanT2VPipeline::load(data_path("wan22_ti2v_tiny"));
  return p;
}

pipelines::T2VOptions golden_options() {
  pipelines::T2VOptions o;
  o.initial_noise = runs("pipeline_ti2v.noise");  // [1, 8, 3, 4, 6]: 9 frames of 96 x 64
  o.frames = 9, o.height = 64, o.width = 96;
  o.steps = 3;
  o.guidance = 4.0;
  return o;
}

std::pair<Tensor, Tensor> run(const pipelines::T2VOptions& o) {
  const pipelines::PromptEmbeddings pos{runs("pipeline_ti2v.prompt_embeds"), {}};
  const pipelines::PromptEmbeddings neg{runs("pipeline_ti2v.negative_prompt_embeds"), {}};
  Device& device = default_device();
  pipelines::T2ITimings timings;
  const Tensor latents = ti2v().denoise(pos, &neg, o, device, {}, timings);
  std::vector<Tensor> chunks;
  ti2v().decode(
      latents, o, device, [&](const Tensor& frames) { chunks.push_back(frames); }, timings);
  return {latents, ops::concat(chunks, 2, device.default_stream())};
}

TEST(Wan22TI2VPipeline, FirstFrameRulesAsTheImageToVideoPipeline) {
  const Stream s = ops::default_op_stream();
  // The blend: frame 0 from the condition (batch 2, the condition repeated), the rest the latents.
  expect_close_rel(pipelines::wan_first_frame_blend(rules("ti2v_mask.latents"), rules("ti2v_mask.condition"), s),
                   rules("ti2v_mask.latent_model_input"), 0, "blend before a step");
  expect_close_rel(pipelines::wan_first_frame_blend(rules("ti2v_mask.latents_after_loop"), rules("ti2v_mask.condition"), s),
                   rules("ti2v_mask.final_latents"), 0, "blend after the loop");
  // A condition of batch 1 is used for every sample.
  expect_close_rel(
      pipelines::wan_first_frame_blend(rules("ti2v_mask.latents"), ops::contiguous(rules("ti2v_mask.condition").narrow(0, 0, 1), s), s),
      rules("ti2v_mask.latent_model_input"), 0, "blend with a batch-1 condition");
  // The per-token timesteps: 0 on frame 0's 6 tokens, t on the other 12, for both samples.
  expect_close_rel(pipelines::wan_first_frame_timesteps(999.0f, 2, 3, 4, 6), rules("ti2v_timesteps.timestep"), 0, "per-token timesteps");
  // Shapes that do not fit are named.
  EXPECT_NE(message_of([&] {
              pipelines::wan_first_frame_blend(rules("ti2v_mask.latents"), rules("ti2v_mask.latents"), s);
            }).find("expected [1 or B, C, 1, h, w]"),
            std::string::npos);
}

TEST(Wan22TI2VPipeline, TextImageToVideoRunMatchesThePipeline) {
  const pipelines::WanT2VPipeline& p = ti2v();
  EXPECT_TRUE(p.text_image_to_video());
  EXPECT_FALSE(p.image_to_video());
  EXPECT_EQ(p.spatial_scale(), 16);
  pipelines::T2VOptions o = golden_options();
  o.image_pixels = std::make_shared<const media::RgbImage>(media::read_input_image(data_path("images/rgb.png")));
  expect_close_rel(p.image_condition(o, default_device().default_stream()), runs("pipeline_ti2v.condition"), 1e-4, "condition");
  for (const pipelines::CfgMode cfg : {pipelines::CfgMode::fused, pipelines::CfgMode::streams}) {
    o.cfg = cfg;
    const auto [latents, video] = run(o);
    const std::string what = "TI2V, cfg " + std::string(pipelines::cfg_mode_name(cfg));
    expect_close_rel(latents, runs("pipeline_ti2v.latents"), 1e-4, what + " latents");
    expect_close_rel(video, runs("pipeline_ti2v.video"), 1e-4, what + " video");
  }
}

TEST(Wan22TI2VPipeline, TextToVideoRunMatchesThePipeline) {
  pipelines::T2VOptions o = golden_options();
  const auto [latents, video] = run(o);
  expect_close_rel(latents, runs("pipeline_ti2v_text.latents"), 1e-4, "TI2V text-only latents");
  expect_close_rel(video, runs("pipeline_ti2v_text.video"), 1e-4, "TI2V text-only video");
  // The picture matters: the two runs differ well beyond the tolerance.
  const std::vector<double> a = values(runs("pipeline_ti2v_text.latents")), b = values(runs("pipeline_ti2v.latents"));
  double differ = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) differ = std::max(differ, std::abs(a[i] - b[i]));
  EXPECT_GT(differ, 0.1);
}

TEST(Wan22TI2VPipeline, DefaultsAreTheModelCards) {
  const pipelines::T2VOptions d = ti2v().default_options();
  EXPECT_EQ(d.width, 1280);
  EXPECT_EQ(d.height, 704);
  EXPECT_EQ(d.frames, 121);
}

TEST(Wan22TI2VPipeline, OptionErrorsNameTheFlag) {
  pipelines::T2VOptions o;
  o.frames = 9, o.height = 64, o.width = 96;
  EXPECT_NO_THROW(ti2v().check(o, true));
  o.image = data_path("images/rgb.png");
  EXPECT_NO_THROW(ti2v().check(o, true));
  o.last_image = data_path("images/photo.jpg");
  EXPECT_NE(message_of([&] { ti2v().check(o, true); }).find("--last-image: Wan2.2 TI2V takes a first frame only"), std::string::npos);
  o.last_image.clear();
  o.width = 88;  // a multiple of 8 but not of the Wan2.2 VAE's 16
  EXPECT_NE(message_of([&] { ti2v().check(o, true); }).find("positive multiples of 16 (the VAE's scale), got 88x64"), std::string::npos);
}

TEST(Wan22TI2VPipeline, FolderErrorsNameWhatIsWrong) {
  {
    ScratchModel m("wan22_ti2v_tiny");
    m.replace("model_index.json", "\"expand_timesteps\": true", "\"expand_timesteps\": \"yes\"");
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load_meta(m.dir.string()); }).find("'expand_timesteps' must be true or false"),
              std::string::npos);
  }
  {
    // diffusers' per-token rule takes every second latent row and column: the patch must be (1, 2, 2).
    ScratchModel m("wan22_ti2v_tiny");
    const std::string config = m.read("transformer/config.json");
    const auto at = config.find("\"patch_size\"");
    ASSERT_NE(at, std::string::npos) << config;
    const auto end = config.find(']', at);
    m.write("transformer/config.json", config.substr(0, at) + "\"patch_size\": [1, 1, 1" + config.substr(end));
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load_meta(m.dir.string()); }).find("patch_size [1, 2, 2]"), std::string::npos);
  }
  {
    // Without expand_timesteps the same folder is plain text-to-video: a picture is refused.
    ScratchModel m("wan22_ti2v_tiny");
    m.replace("model_index.json", "\"expand_timesteps\": true", "\"expand_timesteps\": false");
    const pipelines::WanT2VPipeline p = pipelines::WanT2VPipeline::load_meta(m.dir.string());
    EXPECT_FALSE(p.text_image_to_video());
    pipelines::T2VOptions o;
    o.frames = 9, o.height = 64, o.width = 96;
    o.image = data_path("images/rgb.png");
    EXPECT_NE(message_of([&] { p.check(o, true); }).find("--image is for image-to-video models"), std::string::npos);
  }
}

}  // namespace wan22_ti2v_pipeline_test
}  // namespace cubevec
