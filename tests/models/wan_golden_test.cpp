// The Wan2.1 transformer port against PyTorch goldens (tests/data/goldens_wan.safetensors and the
// tiny diffusers checkpoint tests/data/wan_tiny/transformer, written by
// tests/reference/make_wan_reference.py from docs/models.md, "Wan transformer"): the 3-D RoPE
// table, the time and text embeddings, each block, the whole transformer at batch 2 (two timesteps,
// one prompt zero-padded), in f32 and with bf16 weights; the Euler schedule with Wan's shift; a
// 3-step WanT2VPipeline run from the reference's noise (CFG fused, streams and off, the latents and
// the video its FrameSink receives); plus config and input errors.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 * max |expected| in f32; tables 1e-6
// absolute. bf16 weights: 2e-2 of the scale (the weights themselves are rounded to 8 bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "models/wan_transformer.h"
#include "ops/vector_ops.h"
#include "pipelines/flow_match.h"
#include "pipelines/wan_t2v.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace wan_golden_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_wan.safetensors"));
  return file;
}
Tensor golden(const std::string& name) { return goldens().tensor(name); }

const models::WanTransformer3DModel& tiny(DType dtype = DType::f32) {
  static std::map<DType, std::unique_ptr<models::WanTransformer3DModel>> cache;
  auto& slot = cache[dtype];
  if (!slot) slot = models::WanTransformer3DModel::load(data_path("wan_tiny/transformer"), dtype);
  return *slot;
}

models::WanInputs golden_inputs() {
  return {golden("transformer.hidden_states"), golden("transformer.timestep"), golden("transformer.encoder_hidden_states")};
}

TEST(WanGolden, ConfigAndRopeTable) {
  const models::WanConfig& c = tiny().config();
  EXPECT_EQ(c.inner_dim(), 32);
  EXPECT_EQ(c.rope_axes(), (std::array<int64_t, 3>{8, 4, 4}));
  EXPECT_EQ(models::WanConfig::wan21_14b().rope_axes(), (std::array<int64_t, 3>{44, 42, 42}));
  // hidden_states [2, 4, 3, 4, 6] with patch (1, 2, 2): a 3 x 2 x 3 grid of tokens.
  const models::RopeTable t = models::wan_rope(3, 2, 3, c);
  expect_close_rel(t.cos, golden("rope.cos"), 0, "rope cos", 1e-6);
  expect_close_rel(t.sin, golden("rope.sin"), 0, "rope sin", 1e-6);
}

TEST(WanGolden, TimeAndTextEmbeddings) {
  const Stream s = ops::default_op_stream();
  const auto [temb, proj] = tiny().time_embedding(golden("transformer.timestep"), s);
  expect_close_rel(temb, golden("transformer.temb"), 1e-5, "temb");
  expect_close_rel(proj, golden("transformer.timestep_proj"), 1e-5, "timestep_proj");
  expect_close_rel(tiny().text_embedding(golden("transformer.encoder_hidden_states"), s), golden("transformer.context"), 1e-5,
                   "text embedding");
  expect_close_rel(tiny().patch_embed(golden("transformer.hidden_states"), s), golden("block0.hidden_states"), 1e-5, "patch embedding");
}

TEST(WanGolden, Blocks) {
  const Stream s = ops::default_op_stream();
  const models::RopeTable rope{golden("rope.cos"), golden("rope.sin")};
  const Tensor ctx = golden("transformer.context"), proj = golden("transformer.timestep_proj");
  const models::WanBlockInputs shared{ctx, proj, rope};
  const Tensor out0 = tiny().blocks()[0].forward({golden("block0.hidden_states"), {}}, shared, {}, s).hidden;
  expect_close_rel(out0, golden("block0.out"), 1e-4, "block 0");
  // Block 1 from the reference's block-0 output, so each block is checked on its own.
  expect_close_rel(tiny().blocks()[1].forward({golden("block0.out"), {}}, shared, {}, s).hidden, golden("block1.out"), 1e-4, "block 1");
}

TEST(WanGolden, WholeTransformer) {
  const Tensor out = tiny().forward(golden_inputs(), ops::default_op_stream());
  expect_close_rel(out, golden("transformer.sample"), 1e-4, "transformer sample");
}

TEST(WanGolden, BatchOfOneMatchesTheBatchOfTwo) {
  // Batch 1 alone (the padded prompt) through the fused-epilogue path (gate folded into the GEMM).
  const models::WanInputs in = golden_inputs();
  const models::WanInputs one{in.hidden_states.narrow(0, 1, 1), in.timestep.narrow(0, 1, 1), in.encoder_hidden_states.narrow(0, 1, 1)};
  const Tensor out = tiny().forward(one, ops::default_op_stream());
  expect_close_rel(out, golden("transformer.sample").narrow(0, 1, 1), 1e-4, "batch 1 alone");
}

TEST(WanGolden, Bf16Weights) {
  const models::WanTransformer3DModel& model = tiny(DType::bf16);
  // Matrices bf16, vectors and the modulation tables f32 (diffusers keeps scale_shift_table in fp32).
  EXPECT_EQ(model.blocks()[0].to_q.weight.dtype(), DType::bf16);
  EXPECT_EQ(model.blocks()[0].scale_shift_table.dtype(), DType::f32);
  EXPECT_EQ(model.blocks()[0].norm_q.value.dtype(), DType::f32);
  expect_close_rel(model.forward(golden_inputs(), ops::default_op_stream()), golden("transformer.sample"), 2e-2, "bf16 sample");
}

TEST(WanGolden, EulerSchedulerWithWansDoubleShift) {
  // Wan calls set_timesteps(N) with neither sigmas nor mu: the shifted sigma_min is shifted again.
  pipelines::FlowMatchEulerScheduler scheduler(pipelines::FlowMatchConfig::load(data_path("wan_tiny/scheduler/scheduler_config.json")));
  scheduler.set_timesteps(10);
  const Tensor sigmas = Tensor::from_vector(scheduler.sigmas(), {static_cast<int64_t>(scheduler.sigmas().size())});
  const Tensor timesteps = Tensor::from_vector(scheduler.timesteps(), {static_cast<int64_t>(scheduler.timesteps().size())});
  expect_close_rel(sigmas, golden("scheduler.sigmas"), 0, "sigmas", 1e-7);           // within an f32 ulp of 1
  expect_close_rel(timesteps, golden("scheduler.timesteps"), 0, "timesteps", 1e-4);  // within an f32 ulp of 1000
}

// The reference's pipeline case (docs/models.md "WanPipeline", "FlowMatch Euler scheduler"): the
// tiny model directory with its Euler scheduler (shift 3), the golden noise as initial_noise, 3
// steps, CFG 4.0; the latents after the loop and the video collected through the FrameSink
// (un-normalized per channel, decoded frame by frame, clamped).
struct PipelineRun {
  Tensor latents, video;
  int step_calls = 0, sink_calls = 0;
};

const pipelines::WanT2VPipeline& tiny_pipeline() {
  static const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(data_path("wan_tiny"));
  return pipeline;
}

PipelineRun run_pipeline(pipelines::CfgMode cfg, double guidance) {
  const pipelines::WanT2VPipeline& pipeline = tiny_pipeline();
  pipelines::T2VOptions o;
  o.initial_noise = golden("pipeline.noise");  // [1, 4, 3, 4, 6]: 9 frames of 48 x 32
  o.frames = 1 + 4 * (o.initial_noise.size(2) - 1);
  o.height = o.initial_noise.size(3) * 8;
  o.width = o.initial_noise.size(4) * 8;
  o.steps = 3;
  o.guidance = guidance;
  o.cfg = cfg;
  const pipelines::PromptEmbeddings pos{golden("pipeline.prompt_embeds"), {}};
  const pipelines::PromptEmbeddings neg{golden("pipeline.negative_prompt_embeds"), {}};
  Device& device = default_device();
  pipelines::T2ITimings timings;
  PipelineRun run;
  run.latents = pipeline.denoise(
      pos, cfg == pipelines::CfgMode::off ? nullptr : &neg, o, device, [&](int, int, double) { ++run.step_calls; }, timings);
  std::vector<Tensor> chunks;
  pipeline.decode(
      run.latents, o, device,
      [&](const Tensor& frames) {
        ++run.sink_calls;
        chunks.push_back(frames);
      },
      timings);
  run.video = ops::concat(chunks, 2, device.default_stream());
  return run;
}

// Checks max |got - want| <= 1e-4 x max |want| (the bar) and prints the ratio.
void report_error(const Tensor& got, const Tensor& want, const std::string& what) {
  expect_close_rel(got, want, 1e-4, what);
  const auto g = values(got), w = values(want);
  if (g.size() != w.size()) return;  // reported above
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    worst = std::max(worst, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  std::printf("%s: max |error| %.3g = %.3g x max |reference| %.4g\n", what.c_str(), worst, worst / scale, scale);
}

TEST(WanPipelineGolden, ThreeStepsWithCfgFusedAndStreams) {
  ASSERT_EQ(pipelines::scheduler_name(tiny_pipeline().scheduler_config()), "FlowMatch Euler (shift 3)");
  for (const pipelines::CfgMode cfg : {pipelines::CfgMode::fused, pipelines::CfgMode::streams}) {
    const std::string mode(pipelines::cfg_mode_name(cfg));
    const PipelineRun run = run_pipeline(cfg, 4.0);
    EXPECT_EQ(run.step_calls, 3) << mode;
    EXPECT_EQ(run.sink_calls, 3) << mode;  // one chunk per latent frame: 1 + 4 + 4 frames
    report_error(run.latents, golden("pipeline.latents"), "latents after 3 steps, cfg " + mode);
    report_error(run.video, golden("pipeline.video"), "decoded video, cfg " + mode);
  }
}

TEST(WanPipelineGolden, CfgOffIsOneForwardPerStep) {
  // Guidance is ignored when CFG is off: v = v_c.
  const PipelineRun run = run_pipeline(pipelines::CfgMode::off, 4.0);
  EXPECT_EQ(run.step_calls, 3);
  report_error(run.latents, golden("pipeline.latents_cfg_off"), "latents after 3 steps, cfg off");
}

TEST(WanConfigErrors, NamedKeysAndValues) {
  const std::string src = "wan/config.json";
  auto error = [&](const nlohmann::json& j) { return message_of([&] { models::WanConfig::from_json(j, src); }); };
  EXPECT_NE(error({{"num_layers", 2}, {"flash", true}}).find("unknown key 'flash'"), std::string::npos);
  EXPECT_NE(error({{"patch_size", {1, 2}}}).find("'patch_size' must be a list of 3 integers"), std::string::npos);
  EXPECT_NE(error({{"num_attention_heads", 0}}).find("'num_attention_heads' must be an integer in [1, 1024], got 0"), std::string::npos);
  EXPECT_NE(error({{"qk_norm", "rms_norm"}}).find("'qk_norm' must be one of \"rms_norm_across_heads\", got \"rms_norm\""),
            std::string::npos);
  EXPECT_NE(error({{"image_dim", 1280}}).find("'added_kv_proj_dim' is null while image_dim is set"), std::string::npos);
  EXPECT_NE(error({{"cross_attn_norm", 1}}).find("'cross_attn_norm' must be true or false"), std::string::npos);
  EXPECT_NE(error({{"eps", "small"}}).find("'eps' must be a positive finite number"), std::string::npos);
  EXPECT_NE(error(nlohmann::json::array()).find("expected a JSON object"), std::string::npos);
  // Every message names the file.
  EXPECT_EQ(error({{"flash", true}}).rfind(src, 0), 0u);
  // The real configs' defaults.
  const auto small = models::WanConfig::wan21_1_3b();
  EXPECT_EQ(small.inner_dim(), 1536);
  EXPECT_EQ(small.ffn_dim, 8960);
  EXPECT_EQ(small.num_layers, 30);
  EXPECT_EQ(models::WanConfig::wan21_14b().inner_dim(), 5120);
}

TEST(WanConfigErrors, ForwardInputShapes) {
  const Stream s = ops::default_op_stream();
  models::WanInputs in = golden_inputs();
  auto error = [&](const models::WanInputs& bad) { return message_of([&] { tiny().forward(bad, s); }); };
  models::WanInputs odd = in;
  odd.hidden_states = Tensor::zeros({2, 4, 3, 5, 6}, DType::f32);
  EXPECT_NE(error(odd).find("multiples of patch_size (1, 2, 2)"), std::string::npos);
  models::WanInputs channels = in;
  channels.hidden_states = Tensor::zeros({2, 3, 3, 4, 6}, DType::f32);
  EXPECT_NE(error(channels).find("hidden_states must be [B, 4, T, H, W], got [2, 3, 3, 4, 6]"), std::string::npos);
  models::WanInputs text = in;
  text.encoder_hidden_states = Tensor::zeros({2, 7, 25}, DType::f32);
  EXPECT_NE(
      error(text).find("encoder_hidden_states must be [2, L >= 1, 24] (the batch from hidden_states [2, 4, 3, 4, 6]), got [2, 7, 25]"),
      std::string::npos)
      << error(text);
  models::WanInputs steps = in;
  steps.timestep = Tensor::zeros({1}, DType::f32);
  EXPECT_NE(error(steps).find("timestep must be [2], or [2, 18] (one per token) (the batch from hidden_states [2, 4, 3, 4, 6]), got [1]"),
            std::string::npos)
      << error(steps);
  // Each argument's dtype is checked by name, before a kernel that does not know the name sees it.
  models::WanInputs integer = in;
  integer.hidden_states = Tensor::zeros({2, 4, 3, 4, 6}, DType::i64);
  EXPECT_NE(error(integer).find("wan forward: hidden_states must be f32, bf16 or f16, got i64 [2, 4, 3, 4, 6]"), std::string::npos)
      << error(integer);
  models::WanInputs int_steps = in;
  int_steps.timestep = Tensor::zeros({2}, DType::i32);
  EXPECT_NE(error(int_steps).find("wan forward: timestep must be f32, bf16 or i64, got i32 [2]"), std::string::npos) << error(int_steps);
  // Empty batches, grids and texts are errors, not a division by zero or an empty result.
  models::WanInputs empty = in;
  empty.hidden_states = Tensor::zeros({0, 4, 3, 4, 6}, DType::f32);
  EXPECT_NE(error(empty).find("hidden_states [0, 4, 3, 4, 6] must have B, T, H, W of at least 1"), std::string::npos) << error(empty);
  models::WanInputs no_text = in;
  no_text.encoder_hidden_states = Tensor::zeros({2, 0, 24}, DType::f32);
  EXPECT_NE(error(no_text).find("encoder_hidden_states must be [2, L >= 1, 24]"), std::string::npos) << error(no_text);
  models::WanInputs long_video = in;
  long_video.hidden_states = Tensor::zeros({1, 4, 1025, 2, 2}, DType::f32);
  EXPECT_NE(error(long_video).find("gives a patch grid of 1025x1x1, above rope_max_seq_len 1024"), std::string::npos) << error(long_video);
  EXPECT_NE(message_of([&] { models::wan_rope(1025, 2, 2, tiny().config()); }).find("exceeds rope_max_seq_len 1024"), std::string::npos);
}

TEST(WanConfigErrors, CheckpointMismatchIsNamed) {
  // The tiny checkpoint against a config with one block more: the missing tensors are listed.
  models::WanConfig c = tiny().config();
  c.num_layers = 3;
  models::WanTransformer3DModel model(c);
  const std::string message =
      message_of([&] { models::load_parameters(model.parameters(), Checkpoint::open(data_path("wan_tiny/transformer"))); });
  EXPECT_NE(message.find("blocks.2.attn1.to_q.weight"), std::string::npos) << message;
}

}  // namespace wan_golden_test
}  // namespace cubevec
