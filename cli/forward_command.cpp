// `cubevec forward`: one transformer forward (Flux or Wan, by the config's _class_name) on tensors
// named as diffusers' forward arguments,
// written as `sample`, so a port can be compared with a PyTorch dump of the same checkpoint
// (docs/porting.md).
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "models/flux_transformer.h"
#include "models/wan_transformer.h"
#include "cli/attention_tune_cache.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "tensor/error.h"
#include "tensor/safetensors.h"
#include "tensor/strict_json.h"

namespace cubevec::cli {

namespace {

struct ForwardFlags {
  std::string model, inputs, out, dtype = "f32";
};

int run(const ForwardFlags& f, const DeviceFlags& device_flags, const AttentionTuneCacheFlag& cache) {
  const DType dtype = parse_dtype(f.dtype);
  if (dtype != DType::f32 && dtype != DType::bf16) throw Error("--dtype must be f32 or bf16, got " + f.dtype);
  Device device(device_flags.resolve());
  cache.load(device);
  const std::string dir = std::filesystem::exists(f.model + "/transformer/config.json") ? f.model + "/transformer" : f.model;
  const nlohmann::json config = read_json_file(dir + "/config.json");
  const std::string model_class = config.is_object() ? config.value("_class_name", std::string()) : std::string();
  const SafetensorsFile in = SafetensorsFile::open(f.inputs);
  auto get = [&](const std::string& name) { return in.contains(name) ? in.tensor(name) : Tensor{}; };
  // Only the forward's own argument names are accepted, so a misspelt tensor is not silently unused.
  auto check_names = [&](const std::vector<std::string>& known, const std::string& signature) {
    for (const auto& e : in.entries())
      if (std::find(known.begin(), known.end(), e.name) == known.end())
        throw Error(f.inputs + ": unknown tensor '" + e.name + "' (" + signature + ")");
  };
  std::function<Tensor()> forward;
  Shape input_shape;
  if (model_class == "WanTransformer3DModel") {
    check_names({"hidden_states", "timestep", "encoder_hidden_states"},
                "WanTransformer3DModel.forward takes hidden_states, timestep, encoder_hidden_states");
    auto model = std::shared_ptr<models::WanTransformer3DModel>(models::WanTransformer3DModel::load(dir, dtype));
    const models::WanInputs inputs{get("hidden_states"), get("timestep"), get("encoder_hidden_states")};
    input_shape = inputs.hidden_states.defined() ? inputs.hidden_states.shape() : Shape{};
    forward = [model, inputs, &device] { return model->forward(inputs, device.default_stream()); };
  } else if (model_class.empty() || model_class == "FluxTransformer2DModel") {
    check_names({"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids", "guidance"},
                "FluxTransformer2DModel.forward takes hidden_states, encoder_hidden_states, pooled_projections, timestep, "
                "img_ids, txt_ids, guidance");
    auto model = std::shared_ptr<models::FluxTransformer2DModel>(models::FluxTransformer2DModel::load(dir, dtype));
    models::FluxInputs inputs;
    inputs.hidden_states = get("hidden_states");
    inputs.encoder_hidden_states = get("encoder_hidden_states");
    inputs.pooled_projections = get("pooled_projections");
    inputs.timestep = get("timestep");
    inputs.img_ids = get("img_ids");
    inputs.txt_ids = get("txt_ids");
    inputs.guidance = get("guidance");
    input_shape = inputs.hidden_states.defined() ? inputs.hidden_states.shape() : Shape{};
    forward = [model, inputs, &device] { return model->forward(inputs, device.default_stream()); };
  } else {
    throw Error(dir + "/config.json: _class_name '" + model_class +
                "' is not a transformer cubevec runs (FluxTransformer2DModel, WanTransformer3DModel)");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor sample = forward().contiguous();
  sample.data_ptr();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_safetensors(f.out, {{"sample", sample}});
  std::fprintf(stderr, "forward: %s -> sample %s in %.3f s, written to %s\n", shape_to_string(input_shape).c_str(),
               shape_to_string(sample.shape()).c_str(), seconds, f.out.c_str());
  cache.save(device);
  return 0;
}

}  // namespace

CommandRunner add_forward_command(CLI::App& app) {
  auto* command = app.add_subcommand("forward", "One Flux or Wan transformer forward on diffusers-named input tensors; writes `sample`");
  auto flags = std::make_shared<ForwardFlags>();
  auto device_flags = add_device_flags(*command);
  auto cache = add_attention_tune_cache_flag(*command);
  command->add_option("--model", flags->model, "Diffusers model directory, or its transformer/ directory")->required();
  command->add_option("--inputs", flags->inputs, "safetensors with hidden_states, encoder_hidden_states, ...")->required();
  command->add_option("--out", flags->out, "Output safetensors (one tensor: sample)")->required();
  command->add_option("--dtype", flags->dtype, "Weights: f32 or bf16");
  return [flags, device_flags, cache] { return run(*flags, *device_flags, *cache); };
}

}  // namespace cubevec::cli
