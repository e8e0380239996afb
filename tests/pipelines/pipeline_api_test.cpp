// The generation library (pipelines/pipeline.h): one load, many requests. Sequential and
// concurrent calls on one loaded pipeline give the same pixels; a cancelled call leaves it usable;
// a request with every stage on gives the same result twice (its state does not leak into the
// next call); the request's JSON errors name the key.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "pipelines/flux_t2i.h"
#include "pipelines/pipeline.h"
#include "pipelines/quant_export.h"
#include "quant/files.h"
#include "tensor/safetensors.h"

namespace pipeline_api_test {

using namespace cubevec;
using namespace cubevec::pipelines;
using cubevec::media::RgbImage;
using cubevec::media::to_rgb;
namespace fs = std::filesystem;

const std::string kTinyFlux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
const std::string kTinyWan = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinywan";

Request flux_request(uint64_t seed = 3) {
  return Request::parse(R"({"prompt": "a large red circle in the center on a blue background", "num_inference_steps": 6, "seed": )" +
                        std::to_string(seed) + "}");
}

Request wan_request() {
  return Request::parse(R"({"prompt": "a red circle moving right on a blue background", "num_inference_steps": 3, "num_frames": 17,
                            "seed": 1})");
}

bool same_pixels(const std::vector<RgbImage>& a, const std::vector<RgbImage>& b) {
  if (a.size() != b.size() || a.empty()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].width != b[i].width || a[i].height != b[i].height || a[i].pixels != b[i].pixels) return false;
  return true;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// Two calls one after the other, then two at once on two threads: all four the same pixels.
void expect_sequential_and_concurrent_agree(const Pipeline& pipeline, const Request& request) {
  const GenerationResult first = pipeline.generate(request);
  const GenerationResult second = pipeline.generate(request);
  ASSERT_FALSE(first.images.empty());
  EXPECT_TRUE(same_pixels(first.images, second.images));
  GenerationResult a, b;
  std::thread ta([&] { a = pipeline.generate(request); });
  std::thread tb([&] { b = pipeline.generate(request); });
  ta.join();
  tb.join();
  EXPECT_TRUE(same_pixels(first.images, a.images));
  EXPECT_TRUE(same_pixels(first.images, b.images));
}

TEST(PipelineApi, FluxCallsOneAfterTheOtherAndAtOnceGiveTheSamePixels) {
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(kTinyFlux);
  EXPECT_EQ(pipeline->model().family(), "flux");
  expect_sequential_and_concurrent_agree(*pipeline, flux_request());
  // The comparison can fail: another seed is another picture.
  EXPECT_FALSE(same_pixels(pipeline->generate(flux_request(3)).images, pipeline->generate(flux_request(4)).images));
}

TEST(PipelineApi, WanCallsOneAfterTheOtherAndAtOnceGiveTheSameFrames) {
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(kTinyWan);
  EXPECT_EQ(pipeline->model().family(), "wan");
  const GenerationResult r = pipeline->generate(wan_request());
  EXPECT_EQ(r.images.size(), 17u);   // one per frame
  EXPECT_EQ(r.images[0].width, 64);  // generation_defaults.json's size
  expect_sequential_and_concurrent_agree(*pipeline, wan_request());
}

TEST(PipelineApi, TheLibraryGivesTheOneShotPipelinesPixels) {
  // The same request through the Flux pipeline by hand, as the pipeline tests run it.
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(kTinyFlux);
  const GenerationResult library = pipeline->generate(flux_request());
  const FluxT2IPipeline flux = FluxT2IPipeline::load(kTinyFlux);
  Device device(builtin_cpu_profile());
  const std::unique_ptr<TextEncoders> encoders =
      TextEncoders::load(kTinyFlux, TextInput::of(flux.transformer().config()), {}, 512, device.default_stream());
  const TextConditioning text = encoders->encode(flux_request().text, false);
  T2IOptions options;
  options.width = options.height = flux.default_image_size();
  options.steps = 6;
  options.seed = 3;
  T2ITimings timings;
  const Tensor latents = flux.denoise(text.positive, nullptr, options, device, {}, timings);
  const RgbImage by_hand = to_rgb(flux.decode(latents, options, device, timings));
  EXPECT_TRUE(same_pixels(library.images, {by_hand}));
}

// Per-request LoRA at run time (Request::lora): a resident pipeline applies it to one request only,
// matching the same LoRA fused at load within rounding; the next request is the plain picture again,
// and two requests at once, one with and one without, each get their own.
TEST(PipelineApi, RequestLorasSwitchPerRequest) {
  const fs::path dir = fs::temp_directory_path() / ("cubevec_request_lora_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "tiny.safetensors").string();
  std::vector<float> a(2 * 192), b(192 * 2), a2(2 * 192), b2(768 * 2);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = a2[i] = static_cast<float>(0.2 * std::sin(0.3 * static_cast<double>(i)));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(0.3 * std::cos(0.7 * static_cast<double>(i)));
  for (std::size_t i = 0; i < b2.size(); ++i) b2[i] = static_cast<float>(0.3 * std::cos(0.9 * static_cast<double>(i)));
  write_safetensors(file, {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", Tensor::from_vector(a, {2, 192})},
                           {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", Tensor::from_vector(b, {192, 2})},
                           {"transformer.transformer_blocks.1.ff.net.0.proj.lora_A.weight", Tensor::from_vector(a2, {2, 192})},
                           {"transformer.transformer_blocks.1.ff.net.0.proj.lora_B.weight", Tensor::from_vector(b2, {768, 2})}});
  const std::unique_ptr<Pipeline> plain = Pipeline::load(kTinyFlux);
  LoadOptions fused_options;
  fused_options.lora = {file + ":0.8"};
  const std::unique_ptr<Pipeline> fused = Pipeline::load(kTinyFlux, fused_options);
  Request with_lora = flux_request();
  with_lora.lora = {file + ":0.8"};
  const GenerationResult base = plain->generate(flux_request());
  const GenerationResult runtime = plain->generate(with_lora);
  const GenerationResult at_load = fused->generate(flux_request());
  EXPECT_EQ(runtime.lora["runtime_layers"], 2);
  EXPECT_EQ(at_load.lora["mode"], "fused");
  const auto max_difference = [](const RgbImage& x, const RgbImage& y) {
    int worst = 0;
    for (std::size_t i = 0; i < x.pixels.size(); ++i) worst = std::max(worst, std::abs(int{x.pixels[i]} - int{y.pixels[i]}));
    return worst;
  };
  EXPECT_LE(max_difference(runtime.images[0], at_load.images[0]), 2);             // the same LoRA, rounded in another order
  EXPECT_GT(max_difference(runtime.images[0], base.images[0]), 20);               // and it changes the picture
  EXPECT_TRUE(same_pixels(plain->generate(flux_request()).images, base.images));  // nothing left behind
  GenerationResult x, y;
  std::thread tx([&] { x = plain->generate(with_lora); });
  std::thread ty([&] { y = plain->generate(flux_request()); });
  tx.join();
  ty.join();
  EXPECT_TRUE(same_pixels(x.images, runtime.images));
  EXPECT_TRUE(same_pixels(y.images, base.images));
  // A request's LoRA is read and matched before any work.
  Request missing = flux_request();
  missing.lora = {(dir / "missing.safetensors").string()};
  EXPECT_NE(message_of([&] { plain->checked(missing); }).find("missing.safetensors"), std::string::npos);
  fs::remove_all(dir);
}

TEST(PipelineApi, ACancelledCallLeavesThePipelineUsable) {
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(kTinyFlux);
  const GenerationResult reference = pipeline->generate(flux_request());
  std::atomic<bool> cancel{false};
  int steps_seen = 0;
  GenerateHooks hooks;
  hooks.cancel = &cancel;
  hooks.on_step = [&](const Progress& p) {
    steps_seen = p.step;
    if (p.step == 2) cancel = true;
  };
  EXPECT_THROW(pipeline->generate(flux_request(), hooks), Cancelled);
  EXPECT_EQ(steps_seen, 2);  // honoured at the next step
  EXPECT_TRUE(same_pixels(pipeline->generate(flux_request()).images, reference.images));
  cancel = true;  // already set: nothing runs
  EXPECT_THROW(pipeline->generate(flux_request(), hooks), Cancelled);
}

class PipelineStages : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("cubevec_pipeline_api_" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir_); }
  void TearDown() override { fs::remove_all(dir_); }

  // W8A8_TIMESTEP files for tinyflux from one calibration run, as `cubevec quantize` makes them.
  std::string export_timestep_quantization(int steps) {
    FluxT2IPipeline flux = FluxT2IPipeline::load(kTinyFlux);
    Device device(builtin_cpu_profile());
    const std::unique_ptr<TextEncoders> encoders =
        TextEncoders::load(kTinyFlux, TextInput::of(flux.transformer().config()), {}, 512, device.default_stream());
    const TextConditioning text = encoders->encode(flux_request().text, false);
    QuantExportOptions e;
    e.algorithm = quant::Algorithm::w8a8_timestep;
    StageList calibrate;
    auto stage = std::make_unique<CalibrationStage>(e);
    CalibrationStage& calibration = *stage;
    calibrate.add(std::move(stage));
    calibrate.after_load(flux.mutable_transformer().mutable_parameters());
    T2IOptions o;
    o.width = o.height = 64;
    o.steps = steps;
    T2ITimings t;
    flux.denoise(text.positive, nullptr, o, device, {}, t, &calibrate);
    calibration.detach(flux.mutable_transformer().mutable_parameters());
    return export_quantized(flux.mutable_transformer().mutable_parameters(), calibration, e, steps, (dir_ / "q").string()).description_path;
  }
};

TEST_F(PipelineStages, EveryStageOnTwiceInARowAndAtOnceGivesTheSameResult) {
  LoadOptions options;
  options.quant = export_timestep_quantization(6);
  options.timestep_policy = (dir_ / "policy.json").string();
  std::ofstream(options.timestep_policy) << R"({"default": "dynamic", "static": [0, 2, 4]})";
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(kTinyFlux, options);
  Request request = flux_request();
  request.cache =
      CacheConfig::from_json(nlohmann::json::parse(R"({"cache": "dit-block", "cache-step-start": 1, "cache-interval": 2})"), "test");
  request.sparse = SparseConfig{};
  request.sparse->type = ops::SparseType::ada_bsa;
  request.width = request.height = 128;
  const GenerationResult first = pipeline->generate(request);
  // The stages acted: blocks were replayed from the cache and the layers ran quantized.
  int skipped = 0;
  for (const StepCounts& c : first.stages.step_counts()) skipped += c.block_calls - c.blocks_computed;
  EXPECT_GT(skipped, 0);
  ASSERT_EQ(first.stages.stages().size(), 3u);
  EXPECT_EQ(first.stages.stages()[0]->name(), "quantize W8A8_TIMESTEP");
  EXPECT_EQ(first.report["family"], "flux");
  expect_sequential_and_concurrent_agree(*pipeline, request);
  // Without the stages the picture differs (the comparison above can fail).
  const std::unique_ptr<Pipeline> plain = Pipeline::load(kTinyFlux);
  Request dense = flux_request();
  dense.width = dense.height = 128;
  EXPECT_FALSE(same_pixels(first.images, plain->generate(dense).images));
}

TEST(PipelineApi, LoadErrorsNameTheFolder) {
  EXPECT_NE(message_of([] { Pipeline::load("/nonexistent/model"); }).find("/nonexistent/model: no such model folder"), std::string::npos);
  EXPECT_NE(message_of([] { Pipeline::load(std::string(CUBEVEC_SOURCE_DIR) + "/assets"); }).find("expected transformer/config.json"),
            std::string::npos);
  LoadOptions options;
  options.offload = 1000;
  EXPECT_NE(message_of([&] { Pipeline::load(kTinyFlux, options); }).find("--offload 1000: the resident blocks must number 1 to"),
            std::string::npos);
}

TEST(PipelineApi, RequestErrorsComeBeforeAnyWork) {
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(kTinyFlux);
  EXPECT_NE(message_of([&] {
              pipeline->generate(Request::parse(R"({"prompt": "a red circle", "width": 70})"));
            }).find("width and height must be positive multiples of"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              pipeline->generate(Request::parse(R"({"prompt": "a red circle", "num_frames": 5})"));
            }).find("this is an image model"),
            std::string::npos);
  EXPECT_NE(message_of([&] { pipeline->generate(Request::parse(R"({"prompt": "   "})")); }).find("--prompt TEXT is required"),
            std::string::npos);
}

TEST(Request, JsonErrorsNameTheKeyAndTheValue) {
  const auto error = [](const std::string& json) { return message_of([&] { Request::parse(json); }); };
  EXPECT_NE(error(R"({"prompt": "x", "steps": 4})").find("'steps'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "width": "64"})").find("'width'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "num_inference_steps": 0})").find("'num_inference_steps'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "guidance_scale": 1e9})").find("'guidance_scale'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "seed": -1})").find("'seed'"), std::string::npos);
  // Every uint64_t seed the command line takes (--seed) is a request's too; beyond, named.
  EXPECT_NE(error(R"({"prompt": "x", "seed": 18446744073709551616})").find("'seed' must be an integer in [0, 18446744073709551615]"),
            std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "seed": 1.5})").find("'seed'"), std::string::npos);
  EXPECT_EQ(Request::parse(R"({"prompt": "x", "seed": 18446744073709551615})").seed, 18446744073709551615u);
  EXPECT_EQ(Request::parse(R"({"prompt": "x", "seed": 9223372036854775808})").seed, 9223372036854775808u);
  EXPECT_NE(error(R"({"prompt": "x", "cfg": "maybe"})").find("'cfg'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "cache": "fast"})").find("'cache' must be one of none, attention, dit-block, db"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "cache": {"cache": "db", "cache-fn": 0}})").find("'cache-fn'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "sparse": {"type": "dense"}})").find("'type'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "sparse": {"type": "rf_v2", "cdf_threshold": 0.5}})").find("'cdf_threshold'"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "sparse": 3})").find("'sparse'"), std::string::npos);
  EXPECT_NE(error(R"({"negative_prompt": "x"})").find("'prompt' is required"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x",})").find("request: not valid JSON"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "prompt": "y"})").find("request: not valid JSON"), std::string::npos);
  EXPECT_NE(error(R"([1, 2])").find("request"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "prompt_embeds": "e.safetensors"})").find("'prompt_embeds' and 'prompt' are both given"),
            std::string::npos);
  EXPECT_NE(error(R"({"prompt": "a red\u0000 circle"})").find("'prompt' holds a NUL character"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "sparse": "ADA_BSA"})").find("'sparse' must be rf_v2 or ada_bsa"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "x", "sparse": {"type": null}})").find("'type' is required"), std::string::npos);
  // The parser's own catalogue tags stay out of the message, and it says "not valid JSON" once.
  const std::string syntax = error("{");
  EXPECT_EQ(syntax.find("json.exception"), std::string::npos) << syntax;
  EXPECT_EQ(syntax.find("not valid JSON: not valid JSON"), std::string::npos) << syntax;
}

TEST(Request, JsonRoundTrips) {
  const Request r = Request::parse(R"({"prompt": "a cat", "negative_prompt": "blur", "width": 64, "height": 128, "num_frames": 9,
      "num_inference_steps": 7, "guidance_scale": 2.5, "true_cfg_scale": 3, "cfg": "streams", "seed": 12345678901,
      "max_sequence_length": 77, "cache": {"cache": "db", "cache-fn": 2}, "sparse": {"type": "ada_bsa", "sparsity": 0.25, "blocks": "1-3"}})");
  const Request back = Request::from_json(r.to_json());
  EXPECT_EQ(back.to_json().dump(), r.to_json().dump());
  EXPECT_EQ(back.seed, 12345678901u);
  EXPECT_EQ(*back.num_frames, 9);
  EXPECT_EQ(back.text.max_sequence_length, 77);
  EXPECT_EQ(back.cache.fn, 2);
  EXPECT_EQ(back.sparse->block_first, 1);
  EXPECT_EQ(back.sparse->block_last, 3);
}

TEST(Request, LibraryMessagesInTheRequestsKeys) {
  EXPECT_EQ(in_request_terms("--steps must be at least 1"), "num_inference_steps must be at least 1");
  EXPECT_EQ(in_request_terms("--prompt-embeds FILE or --prompt TEXT"), "prompt_embeds FILE or prompt TEXT");
  EXPECT_EQ(in_request_terms("--cache-fn 9 and --cache db"), "cache.cache-fn 9 and cache db");
  EXPECT_EQ(in_request_terms("--frames-dir stays"), "--frames-dir stays");  // not a request key
  EXPECT_EQ(in_request_terms("--cfg-scale, --cfg"), "true_cfg_scale, cfg");
}

}  // namespace pipeline_api_test
