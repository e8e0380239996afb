// The quantization stage on the tiny Flux and Wan checkpoints, end to end: calibration of the float
// model through the denoising loop, the MindIE-format export, and the stage swapping every Linear
// after load. Each algorithm's denoised latents stay within a stated tolerance of the float ones
// (and differ from them: the int8 path ran); W8A8_TIMESTEP takes its static scales on the policy's
// static steps and is W8A8_DYNAMIC on the others (the step from the loop's context); a bad file
// leaves the model untouched; the stage reports the int8 bytes and drops the float weights.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "pipelines/flux_t2i.h"
#include "pipelines/quant_export.h"
#include "pipelines/stages/quantize.h"
#include "pipelines/wan_t2v.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace quantize_stage_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using quant::Algorithm;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

constexpr int kSteps = 4;

// A tiny model behind the shared loop: its parameters and one seeded denoising run (the lambdas
// point into the FluxModel / WanModel that made it).
struct TinyModel {
  std::function<models::ParameterTable&()> parameters;
  std::function<Tensor(pipelines::StageList*)> denoise;
};

struct FluxModel {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"));
  pipelines::PromptEmbeddings prompt{random_tensor({1, 5, 40}, 1, DType::f32, 1.0f), random_tensor({1, 24}, 2, DType::f32, 1.0f)};
  TinyModel model() {
    return {[this]() -> models::ParameterTable& { return pipeline.mutable_transformer().mutable_parameters(); },
            [this](pipelines::StageList* stages) {
              pipelines::T2IOptions o;
              o.width = 32, o.height = 32, o.steps = kSteps, o.cfg = pipelines::CfgMode::off;
              Device device(builtin_cpu_profile());
              pipelines::T2ITimings timings;
              return pipeline.denoise(prompt, nullptr, o, device, {}, timings, stages);
            }};
  }
};

struct WanModel {
  pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(data_path("wan_tiny"));
  pipelines::PromptEmbeddings prompt{random_tensor({1, 7, 24}, 5, DType::f32, 1.0f), {}};
  TinyModel model() {
    return {[this]() -> models::ParameterTable& { return pipeline.mutable_transformer().mutable_parameters(); },
            [this](pipelines::StageList* stages) {
              pipelines::T2VOptions o;
              o.width = 48, o.height = 32, o.frames = 5, o.steps = kSteps, o.cfg = pipelines::CfgMode::off;
              Device device(builtin_cpu_profile());
              pipelines::T2ITimings timings;
              return pipeline.denoise(prompt, nullptr, o, device, {}, timings, stages);
            }};
  }
};

// Calibrates `m` (float) over one run and writes `algorithm`'s files into `dir`; returns the description.
std::string export_files(TinyModel m, Algorithm algorithm, const std::string& dir) {
  pipelines::QuantExportOptions options;
  options.algorithm = algorithm;
  pipelines::StageList stages;
  auto owner = std::make_unique<pipelines::CalibrationStage>(options);
  pipelines::CalibrationStage& calibration = *owner;
  stages.add(std::move(owner));
  stages.after_load(m.parameters());
  m.denoise(&stages);
  calibration.detach(m.parameters());
  return pipelines::export_quantized(m.parameters(), calibration, options, kSteps, dir).description_path;
}

// Denoises with the quantization stage installed from `description` (and `policy`).
Tensor run_quantized(TinyModel m, const std::string& description, const std::string& policy = "",
                     pipelines::QuantizeStage** stage_out = nullptr) {
  pipelines::StageList stages;
  auto stage = std::make_unique<pipelines::QuantizeStage>(pipelines::QuantizeOptions{description, policy, false});
  if (stage_out) *stage_out = stage.get();
  stages.add(std::move(stage));
  stages.after_load(m.parameters());
  return m.denoise(&stages);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : values(t)) m = std::max(m, std::abs(v));
  return m;
}
double max_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// The stated tolerance: the quantized run's latents within 5% of the float latents' largest
// magnitude after 4 steps with every Linear int8 (measured on tiny Flux and Wan: 0.6% to 1.5%; the test prints them).
constexpr double kQuantTolerance = 0.05;

template <class Model>
void expect_quantized_close(const std::string& model_name) {
  Model float_model;
  const Tensor reference = float_model.model().denoise(nullptr);
  for (const Algorithm algorithm : {Algorithm::w8a16, Algorithm::w8a8_dynamic, Algorithm::w8a8, Algorithm::w8a8_timestep}) {
    const std::string name(quant::algorithm_name(algorithm));
    SCOPED_TRACE(model_name + " " + name);
    TempDir dir;
    Model calibrated, quantized;
    const std::string description = export_files(calibrated.model(), algorithm, dir.path.string());
    const std::string policy = algorithm == Algorithm::w8a8_timestep ? dir.write("p.json", R"({"default": "static"})") : "";
    const Tensor q = run_quantized(quantized.model(), description, policy);
    const double rel = max_diff(q, reference) / max_abs(reference);
    std::printf("[ quantized %s %-14s ] max |latent - float| = %.2e of the float latents' scale\n", model_name.c_str(), name.c_str(), rel);
    EXPECT_LT(rel, kQuantTolerance);
    EXPECT_GT(rel, 0.0);  // the int8 kernels ran
  }
}

TEST(QuantizeStage, TinyFluxEveryAlgorithmStaysCloseToFloat) { expect_quantized_close<FluxModel>("Flux"); }
TEST(QuantizeStage, TinyWanEveryAlgorithmStaysCloseToFloat) { expect_quantized_close<WanModel>("Wan"); }

TEST(QuantizeStage, TimestepPolicyPicksStaticOrDynamicByTheLoopsStep) {
  TempDir dir, dynamic_dir;
  FluxModel base;
  const std::string timestep = export_files(base.model(), Algorithm::w8a8_timestep, dir.path.string());
  FluxModel base2;
  const std::string dynamic = export_files(base2.model(), Algorithm::w8a8_dynamic, dynamic_dir.path.string());
  const std::string all_dynamic = dir.write("dynamic.json", R"({"default": "dynamic"})");
  const std::string static_first = dir.write("static_first.json", R"({"default": "dynamic", "static": [0]})");
  const std::string static_last = dir.write("static_last.json", R"({"default": "dynamic", "static": [3]})");

  FluxModel a, b, c, d;
  const Tensor by_dynamic_file = run_quantized(a.model(), dynamic);
  // Every step dynamic: the timestep file's weights and weight scales are W8A8_DYNAMIC's, bit for bit.
  const Tensor timestep_dynamic = run_quantized(b.model(), timestep, all_dynamic);
  EXPECT_EQ(max_diff(timestep_dynamic, by_dynamic_file), 0.0);
  // A static step changes the result; which step is static matters (each has its own row of scales,
  // and the stage follows the loop's step index).
  const Tensor first = run_quantized(c.model(), timestep, static_first), last = run_quantized(d.model(), timestep, static_last);
  EXPECT_GT(max_diff(first, by_dynamic_file), 0.0);
  EXPECT_GT(max_diff(last, by_dynamic_file), 0.0);
  EXPECT_GT(max_diff(first, last), 0.0);

  // One layer at a given step: static steps are the W8A8 scheme on that step's row of the file.
  FluxModel e;
  pipelines::QuantizeStage stage({timestep, static_first, false});
  stage.after_load(e.model().parameters());
  models::Linear& layer = e.model().parameters().linear("transformer_blocks.0.attn.to_q");
  const quant::Description desc = quant::Description::load(timestep);
  const quant::QuantTensors t = quant::read_layer_tensors(SafetensorsFile::open(desc.weight_path()), "transformer_blocks.0.attn.to_q",
                                                          Algorithm::w8a8_timestep, true);
  const Tensor x = random_tensor({6, layer.in}, 17, DType::f32, 1.0f);
  for (const int step : {0, 2}) {
    stage.set_step(step);
    const Tensor got = layer(x, ops::default_op_stream());
    quant::QuantTensors row = t;
    Algorithm scheme = Algorithm::w8a8_dynamic;
    if (step == 0) {
      scheme = Algorithm::w8a8;
      row.input_scale = t.input_scale.narrow(0, step, 1).contiguous();
      row.input_offset = t.input_offset.narrow(0, step, 1).contiguous();
      row.deq_scale = t.deq_scale.select(0, step).contiguous();
      row.quant_bias = t.quant_bias.select(0, step).contiguous();
      row.bias = Tensor();  // the static step's bias is in quant_bias
      row.weight_scale = Tensor();
    } else {
      row.input_scale = row.input_offset = row.deq_scale = row.quant_bias = Tensor();
    }
    const Tensor want = quant::make_quantized_linear(scheme, layer.in, layer.out, row, nullptr, "reference")
                            ->forward(x, {}, step, ops::default_op_stream());
    EXPECT_EQ(max_diff(got, want), 0.0) << "step " << step;
  }
  stage.set_step(9);  // dynamic under this policy
  EXPECT_NO_THROW(layer(x, ops::default_op_stream()));

  // A policy making a step static that the file has no scales for: found before the step runs,
  // the error names the file, a layer, the rows and the step.
  FluxModel f;
  const std::string all_static_policy = dir.write("all_static.json", R"({"default": "static"})");
  pipelines::QuantizeStage all_static({timestep, all_static_policy, false});
  all_static.after_load(f.model().parameters());
  EXPECT_NE(
      message_of([&] { all_static.set_step(9); })
          .find("quant_model_weight_w8a8_timestep.safetensors: layer 'context_embedder' has static scales for 4 steps (0 to 3), but the "
                "timestep policy " +
                all_static_policy + " makes step 9 static"),
      std::string::npos);
  pipelines::RunInfo six, four;
  six.steps = 6;
  four.steps = 4;
  EXPECT_NE(message_of([&] { all_static.begin_run(six); }).find("makes step 4 static"), std::string::npos);
  EXPECT_NO_THROW(all_static.begin_run(four));
  // A policy for a description without timestep layers is a mistake, not silently ignored.
  FluxModel g;
  pipelines::QuantizeStage wrong({dynamic, all_static_policy, false});
  wrong.after_load(g.model().parameters());  // checked before the first step (a second expert may hold them)
  EXPECT_NE(message_of([&] { wrong.begin_run(four); }).find("applies to W8A8_TIMESTEP layers, but --quant " + dynamic + " quantize none"),
            std::string::npos);
}

// Rewrites the weight file beside `description` without `key`.
void drop_tensor(const std::string& description, const std::string& key) {
  const std::string path = quant::Description::load(description).weight_path();
  NamedTensors kept;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const auto& e : file.entries())
      if (e.name != key) kept.push_back({e.name, file.tensor(e.name).contiguous()});
  }
  write_safetensors(path, kept);
}

TEST(QuantizeStage, ABadFileLeavesTheModelFloat) {
  TempDir dir;
  FluxModel base;
  const std::string description = export_files(base.model(), Algorithm::w8a8_dynamic, dir.path.string());
  // The last layer in name order misses its weight scale: every other layer reads fine first.
  drop_tensor(description, "x_embedder.weight_scale");
  FluxModel reference_model, model;
  const Tensor reference = reference_model.model().denoise(nullptr);
  pipelines::QuantizeStage stage({description, "", false});
  const std::string error = message_of([&] { stage.after_load(model.model().parameters()); });
  EXPECT_NE(error.find("quant_model_weight_w8a8_dynamic.safetensors: layer 'x_embedder' (W8A8_DYNAMIC) has no tensor "
                       "'x_embedder.weight_scale'"),
            std::string::npos)
      << error;
  EXPECT_EQ(stage.layers(), 0);
  for (const auto& [name, linear] : model.model().parameters().linears()) {
    EXPECT_EQ(linear->kernel, nullptr) << name;
    EXPECT_TRUE(linear->weight.has_storage()) << name;
  }
  EXPECT_EQ(max_diff(model.model().denoise(nullptr), reference), 0.0);
}

TEST(QuantizeStage, DescriptionsThatDoNotFitTheModel) {
  TempDir dir;
  FluxModel base;
  const std::string description = export_files(base.model(), Algorithm::w8a8_dynamic, dir.path.string());
  const auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json json = nlohmann::json::parse(std::ifstream(description));
    edit(json);
    std::ofstream(description) << json.dump();
    FluxModel m;
    pipelines::QuantizeStage stage({description, "", false});
    return message_of([&] { stage.after_load(m.model().parameters()); });
  };
  EXPECT_NE(edited([](auto& j) {
              j["transformer_blocks.0.attn.to_qq.weight"] = "W8A8_DYNAMIC";
            }).find("quant_model_description_w8a8_dynamic.json: module 'transformer_blocks.0.attn.to_qq' is not a Linear of this model"),
            std::string::npos);
  EXPECT_NE(edited([](auto& j) {
              j.erase("transformer_blocks.0.attn.to_qq.weight");
              j["transformer_blocks.0.attn.to_k.weight"] = "W4A4_MXFP4";
            }).find("module 'transformer_blocks.0.attn.to_k' is quantized as W4A4_MXFP4, which cubevec does not run"),
            std::string::npos);
  // A weight of the wrong shape for the model's layer.
  edited([](auto& j) { j["transformer_blocks.0.attn.to_k.weight"] = "W8A8_DYNAMIC"; });
  const std::string weights = quant::Description::load(description).weight_path();
  NamedTensors tensors;
  {
    const SafetensorsFile file = SafetensorsFile::open(weights);
    for (const auto& e : file.entries())
      tensors.push_back({e.name, e.name == "transformer_blocks.0.attn.to_k.weight" ? Tensor::zeros({32, 31}, DType::i8)
                                                                                   : file.tensor(e.name).contiguous()});
  }
  write_safetensors(weights, tensors);
  EXPECT_NE(edited([](auto&) {}).find("layer 'transformer_blocks.0.attn.to_k': 'weight' must be i8 [32, 32], got i8 [32, 31]"),
            std::string::npos);
  std::filesystem::remove(weights);
  EXPECT_NE(edited([](auto&) {}).find("quant_model_weight_w8a8_dynamic.safetensors"), std::string::npos);
}

TEST(QuantizeStage, ReportsInt8BytesAndReleasesTheFloatWeights) {
  TempDir dir;
  FluxModel base;
  const std::string description = export_files(base.model(), Algorithm::w8a16, dir.path.string());
  FluxModel m;
  models::ParameterTable& table = m.model().parameters();
  std::size_t float_before = 0, swapped_float = 0, int8_expected = 0;
  for (const auto& spec : table.specs()) float_before += spec.slot->nbytes();
  for (const auto& [name, linear] : table.linears()) {
    swapped_float += linear->weight.nbytes();
    // W8A16 holds the i8 weight [out, in], an f32 scale per output channel and the f32 bias.
    const auto out = static_cast<std::size_t>(linear->out), in = static_cast<std::size_t>(linear->in);
    int8_expected += out * in + 4 * out + (linear->bias.defined() ? 4 * out : 0);
  }
  pipelines::QuantizeStage stage({description, "", false});
  stage.after_load(table);
  EXPECT_EQ(stage.layers(), static_cast<int>(table.linears().size()));
  EXPECT_EQ(stage.float_weight_bytes(), float_before - swapped_float);
  EXPECT_EQ(stage.int8_weight_bytes(), int8_expected);
  for (const auto& [name, linear] : table.linears()) EXPECT_FALSE(linear->weight.has_storage()) << name;
  const nlohmann::ordered_json report = stage.report();
  EXPECT_EQ(report["layers"]["W8A16"].get<int>(), stage.layers());
  EXPECT_EQ(report["int8_weight_bytes"].get<std::size_t>(), stage.int8_weight_bytes());
}

}  // namespace quantize_stage_test
}  // namespace cubevec
