// The Wan family's pipelines beyond text-to-video against PyTorch goldens
// (tests/data/goldens_wan_i2v.safetensors, written by tests/reference/make_wan_i2v_reference.py from
// diffusers' WanImageToVideoPipeline and WanPipeline): the image-to-video condition (mask and
// encoded picture(s)) for a real picture, the two-expert schedule (which expert each step uses, for
// several step counts, boundary ratios and schedulers), and 3- or 4-step runs of the tiny I2V,
// first-last-frame and two-expert models from the reference's noise; plus the folder and option
// errors.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 x max |expected| (f32).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "media/image_input.h"
#include "ops/vector_ops.h"
#include "pipelines/stages/offload.h"
#include "pipelines/wan_t2v.h"
#include "tensor/safetensors.h"

#include "common/scratch_model.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace wan_i2v_pipeline_test {

using namespace cubevec::testing;
namespace fs = std::filesystem;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_wan_i2v.safetensors"));
  return file;
}
Tensor golden(const std::string& name) { return goldens().tensor(name); }

const pipelines::WanT2VPipeline& pipeline(const std::string& folder) {
  static std::map<std::string, std::unique_ptr<pipelines::WanT2VPipeline>> cache;
  auto& slot = cache[folder];
  if (!slot) slot = std::make_unique<pipelines::WanT2VPipeline>(pipelines::WanT2VPipeline::load(data_path(folder)));
  return *slot;
}

pipelines::T2VOptions golden_options(const std::string& c, int steps) {
  pipelines::T2VOptions o;
  o.initial_noise = golden(c + ".noise");  // [1, 4, 3, 4, 6]: 9 frames of 48 x 32
  o.frames = 1 + 4 * (o.initial_noise.size(2) - 1);
  o.height = o.initial_noise.size(3) * 8;
  o.width = o.initial_noise.size(4) * 8;
  o.steps = steps;
  o.guidance = 4.0;
  return o;
}

// The run's latents and its decoded video (clamped to [-1, 1]).
std::pair<Tensor, Tensor> run(const pipelines::WanT2VPipeline& p, const std::string& c, const pipelines::T2VOptions& o) {
  const pipelines::PromptEmbeddings pos{golden(c + ".prompt_embeds"), {}};
  const pipelines::PromptEmbeddings neg{golden(c + ".negative_prompt_embeds"), {}};
  Device& device = default_device();
  pipelines::T2ITimings timings;
  const Tensor latents = p.denoise(pos, o.cfg == pipelines::CfgMode::off ? nullptr : &neg, o, device, {}, timings);
  std::vector<Tensor> chunks;
  p.decode(
      latents, o, device, [&](const Tensor& frames) { chunks.push_back(frames); }, timings);
  return {latents, ops::concat(chunks, 2, device.default_stream())};
}

std::shared_ptr<const media::RgbImage> picture(const std::string& rel) {
  return std::make_shared<const media::RgbImage>(media::read_input_image(data_path(rel)));
}

TEST(WanI2VPipeline, ConditionFromARealPicture) {
  const pipelines::WanT2VPipeline& p = pipeline("wan_i2v_tiny");
  EXPECT_TRUE(p.image_to_video());
  EXPECT_EQ(p.latent_channels(), 4);
  const Stream s = default_device().default_stream();
  for (const bool flf : {false, true}) {
    const std::string c = flf ? "condition_flf2v" : "condition_i2v";
    pipelines::T2VOptions o;
    o.frames = 9, o.height = 32, o.width = 48;
    o.image = data_path("images/rgb.png");
    if (flf) o.last_image = data_path("images/photo.jpg");
    expect_close_rel(pipelines::wan_frame_mask(9, 4, 6, flf), golden(c + ".intermediate.mask"), 0, c + " mask");
    expect_close_rel(p.image_condition(o, s), golden(c + ".condition"), 1e-4, c);
  }
}

TEST(WanI2VPipeline, FrameMaskLayout) {
  // Independent of the goldens: 13 frames (4 latent frames); channel c of latent frame t is the
  // expanded pixel mask at 4t + c, the first frame counted 4 times.
  const std::vector<double> m = values(pipelines::wan_frame_mask(13, 1, 1, true));
  ASSERT_EQ(m.size(), 16u);
  for (int c = 0; c < 4; ++c)
    for (int t = 0; t < 4; ++t) {
      const double want = t == 0 ? 1.0 : (t == 3 && c == 3 ? 1.0 : 0.0);
      EXPECT_EQ(m[static_cast<std::size_t>(c * 4 + t)], want) << "channel " << c << " frame " << t;
    }
}

TEST(WanI2VPipeline, ExpertScheduleAsWanPipeline) {
  const std::map<std::string, pipelines::WanSchedulerConfig> schedulers = [] {
    std::map<std::string, pipelines::WanSchedulerConfig> m;
    pipelines::FlowMatchConfig euler;
    euler.shift = 3.0;
    m["euler3"] = euler;
    for (const double shift : {12.0, 5.0, 3.0}) {
      pipelines::UniPCConfig u;
      u.flow_shift = shift;
      m["unipc" + std::to_string(static_cast<int>(shift))] = u;
    }
    return m;
  }();
  int cases = 0, switches = 0;
  for (const auto& [name, config] : schedulers)
    for (const auto& [ratio, tag] : {std::pair<double, const char*>{0.875, "r0875"}, {0.9, "r09"}, {0.5, "r05"}})
      for (const int steps : {1, 2, 3, 4, 10, 40, 50}) {
        const std::string key = "experts." + name + "_" + tag + "_n" + std::to_string(steps);
        const std::unique_ptr<pipelines::Scheduler> scheduler = pipelines::make_scheduler(config, steps);
        expect_close_rel(Tensor::from_vector(scheduler->timesteps(), {steps}), golden(key + "_timesteps"), 0, key + " timesteps");
        const std::vector<int> experts = pipelines::wan_expert_schedule(scheduler->timesteps(), ratio, 1000);
        const std::vector<double> want = values(golden(key));
        ASSERT_EQ(experts.size(), want.size()) << key;
        for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(experts[i], static_cast<int>(want[i])) << key << " step " << i;
        switches += std::count(experts.begin(), experts.end(), 1) > 0 ? 1 : 0;
        ++cases;
      }
  EXPECT_EQ(cases, 84);
  EXPECT_GT(switches, 40);  // most cases do reach the low-noise expert
}

TEST(WanI2VPipeline, ImageToVideoRunMatchesThePipeline) {
  for (const bool flf : {false, true}) {
    const std::string c = flf ? "pipeline_flf2v" : "pipeline_i2v";
    const pipelines::WanT2VPipeline& p = pipeline(flf ? "wan_flf2v_tiny" : "wan_i2v_tiny");
    pipelines::T2VOptions o = golden_options(c, 3);
    o.image_pixels = picture("images/rgb.png");
    if (flf) o.last_image_pixels = picture("images/photo.jpg");
    o.image_embeds = golden(c + ".image_embeds");
    for (const pipelines::CfgMode cfg : {pipelines::CfgMode::fused, pipelines::CfgMode::streams}) {
      o.cfg = cfg;
      const auto [latents, video] = run(p, c, o);
      const std::string what = c + ", cfg " + std::string(pipelines::cfg_mode_name(cfg));
      expect_close_rel(latents, golden(c + ".latents"), 1e-4, what + " latents");
      expect_close_rel(video, golden(c + ".video"), 1e-4, what + " video");
    }
  }
}

TEST(WanI2VPipeline, TwoExpertsRunMatchesWanPipeline) {
  const pipelines::WanT2VPipeline& p = pipeline("wan22_tiny_a14b");
  ASSERT_NE(p.transformer_2(), nullptr);
  EXPECT_EQ(p.boundary_ratio().value_or(0), 0.75);
  const std::vector<double> want = values(golden("pipeline_a14b.intermediate.expert"));
  const std::vector<int> schedule = p.expert_schedule(4);
  ASSERT_EQ(schedule.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(schedule[i], static_cast<int>(want[i])) << "step " << i;
  pipelines::T2VOptions o = golden_options("pipeline_a14b", 4);
  o.guidance_2 = 3.0;
  const auto [latents, video] = run(p, "pipeline_a14b", o);
  expect_close_rel(latents, golden("pipeline_a14b.latents"), 1e-4, "two experts' latents");
  expect_close_rel(video, golden("pipeline_a14b.video"), 1e-4, "two experts' video");
  // A test that can fail: the second expert's own scale matters.
  o.guidance_2.reset();
  const auto [same_scale, unused] = run(p, "pipeline_a14b", o);
  const std::vector<double> a = values(same_scale), b = values(golden("pipeline_a14b.latents"));
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(WanI2VPipeline, OffloadKeepsOnlyTheActiveExpert) {
  // Fresh pipelines (the offload stage releases the panels of the one it streams).
  const pipelines::WanT2VPipeline resident = pipelines::WanT2VPipeline::load(data_path("wan22_tiny_a14b"));
  pipelines::T2VOptions o = golden_options("pipeline_a14b", 4);
  o.guidance_2 = 3.0;
  const auto [want, unused] = run(resident, "pipeline_a14b", o);
  pipelines::WanT2VPipeline streamed = pipelines::WanT2VPipeline::load(data_path("wan22_tiny_a14b"));
  // One stage for both runs, as a loaded pipeline keeps it across requests.
  pipelines::StageList stages;
  auto stage = std::make_unique<pipelines::OffloadStage>(1, pipelines::block_modules(streamed.transformer()), 1);
  const pipelines::OffloadStage& seen = *stage;
  stages.add(std::move(stage));
  stages.after_load(streamed.mutable_transformer().mutable_parameters());
  stages.stages().front()->after_load_second_model(streamed.mutable_transformer_2()->mutable_parameters());
  for (int pass = 0; pass < 2; ++pass) {  // the second run packs the first expert again
    const pipelines::PromptEmbeddings pos{golden("pipeline_a14b.prompt_embeds"), {}};
    const pipelines::PromptEmbeddings neg{golden("pipeline_a14b.negative_prompt_embeds"), {}};
    pipelines::T2ITimings timings;
    const Tensor got = streamed.denoise(pos, &neg, o, default_device(), {}, timings, &stages);
    expect_close_rel(got, want, 0, "offloaded two experts, run " + std::to_string(pass));
    EXPECT_EQ(seen.other_model_packed_max(), 0) << "the idle expert held panels";
    EXPECT_EQ(seen.report()["expert_switches"], 2 * pass + 1);  // high noise, then low noise: once a run, and back at the next
    EXPECT_GT(seen.report()["expert_switch_released_bytes"].get<double>(), 0.0);
  }
}

TEST(WanI2VPipeline, FolderErrorsNameWhatIsWrong) {
  {
    ScratchModel m("wan22_tiny_a14b");
    fs::remove_all(m.dir / "transformer_2");
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load(m.dir.string()); }).find("transformer_2 (the low-noise expert) is missing"),
              std::string::npos);
  }
  for (const char* ratio : {"0", "1", "1.5", "-0.2", "\"half\""}) {
    ScratchModel m("wan22_tiny_a14b");
    m.write("model_index.json", std::string(R"({"_class_name": "WanPipeline", "boundary_ratio": )") + ratio + "}");
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load_meta(m.dir.string()); }).find("'boundary_ratio' must be a number in (0, 1)"),
              std::string::npos)
        << ratio;
  }
  {
    ScratchModel m("wan22_tiny_a14b");
    fs::remove_all(m.dir / "transformer_2");
    m.write("transformer_2", "not a folder");
    EXPECT_NE(message_of([&] {
                pipelines::WanT2VPipeline::load_meta(m.dir.string());
              }).find("transformer_2 (the low-noise expert) is not a folder"),
              std::string::npos);
  }
  {
    ScratchModel m("wan22_tiny_a14b");
    m.replace("transformer_2/config.json", "\"text_dim\": 24", "\"text_dim\": 16");
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load_meta(m.dir.string()); }).find("text_dim is 24 and 16"), std::string::npos);
  }
  {
    // One module tree: a second expert of another depth is refused (offload and tensor parallel plan both alike).
    ScratchModel m("wan22_tiny_a14b");
    m.replace("transformer_2/config.json", "\"num_layers\": 2", "\"num_layers\": 1");
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load_meta(m.dir.string()); }).find("num_layers is 2 and 1"), std::string::npos);
  }
  // The image processor must make the encoder's picture size, with finite settings: refused at load.
  for (const auto& [config, expected] :
       {std::pair<std::string, std::string>{R"({"crop_size": 56, "size": {"shortest_edge": 56}})", "makes 56x56 pixel_values"},
        {R"({"do_center_crop": false})", "neither crops nor resizes to a fixed size"},
        {R"({"rescale_factor": 1e38})", "rescale_factor"},
        {R"({"image_std": [1e-45, 1, 1]})", "image_std"}}) {
    ScratchModel m("wan_i2v_tiny");
    m.write("image_processor/preprocessor_config.json", config);
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load_meta(m.dir.string()); }).find(expected), std::string::npos) << config;
  }
  {
    ScratchModel m("wan22_tiny_a14b");
    m.write("model_index.json", R"({"_class_name": "WanPipeline"})");
    EXPECT_NE(message_of([&] { pipelines::WanT2VPipeline::load_meta(m.dir.string()); }).find("sets no boundary_ratio"), std::string::npos);
  }
}

TEST(WanI2VPipeline, OptionErrorsNameTheFlag) {
  pipelines::T2VOptions o;
  o.frames = 9, o.height = 32, o.width = 48;
  // An image for a text-only model.
  o.image = data_path("images/rgb.png");
  EXPECT_NE(message_of([&] { pipeline("wan22_tiny_a14b").check(o, true); }).find("--image is for image-to-video models"),
            std::string::npos);
  // No image for an image-to-video model.
  o.image.clear();
  EXPECT_NE(message_of([&] { pipeline("wan_i2v_tiny").check(o, true); }).find("--image FIRST.png is required"), std::string::npos);
  // A last picture on a checkpoint without FLF2V's position table.
  o.image = data_path("images/rgb.png");
  o.last_image = data_path("images/photo.jpg");
  EXPECT_NE(message_of([&] { pipeline("wan_i2v_tiny").check(o, true); }).find("--last-image (first-last-frame) needs a checkpoint"),
            std::string::npos);
  EXPECT_NO_THROW(pipeline("wan_flf2v_tiny").check(o, true));
  // A first-last-frame checkpoint needs the last picture too (diffusers fails on its shapes late).
  o.last_image.clear();
  EXPECT_NE(message_of([&] { pipeline("wan_flf2v_tiny").check(o, true); }).find("--last-image LAST.png is required"), std::string::npos);
  o.last_image = data_path("images/photo.jpg");
  o.frames = 1;
  EXPECT_NE(message_of([&] { pipeline("wan_flf2v_tiny").check(o, true); }).find("--last-image needs at least 5 frames"), std::string::npos);
  o.frames = 10;
  EXPECT_NE(message_of([&] { pipeline("wan_flf2v_tiny").check(o, true); }).find("--frames must be 1 + 4k"), std::string::npos);
  // A second expert's scale on a one-transformer model.
  o = {};
  o.frames = 9, o.height = 32, o.width = 48;
  o.guidance_2 = 3.0;
  EXPECT_NE(message_of([&] { pipeline("wan_i2v_tiny").check(o, true); }).find("--guidance-2"), std::string::npos);
}

}  // namespace wan_i2v_pipeline_test
}  // namespace cubevec
