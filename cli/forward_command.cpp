// `cubevec forward`: one model forward on tensors named as diffusers' forward arguments, written as
// `sample`, so a port can be compared with a PyTorch dump of the same checkpoint (docs/porting.md).
// The model class comes from the folder's config.json `_class_name` through the registry in
// models/model_registry.h: the Flux and Wan transformers, the AutoencoderKL / AutoencoderKLWan
// decoders (`latent` -> vae.decode(latent).sample) and encoders, and transformers'
// CLIPVisionModel (`pixel_values` -> penultimate_hidden_state, last_hidden_state, pooler_output).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "cli/output_flag.h"
#include "cli/attention_tune_cache.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/parallel_flags.h"
#include "cli/stage_flags.h"
#include "models/model_registry.h"
#include "ops/vector_ops.h"
#include "pipelines/memory_estimate.h"
#include "pipelines/stages/quantize.h"
#include "base/error.h"
#include "tensor/finite_check.h"
#include "models/lora.h"
#include "models/lora_runtime.h"
#include "tensor/safetensors.h"

namespace cubevec::cli {

namespace {

struct ForwardFlags {
  std::string model, inputs, out, dtype = "f32", variant;
  std::string quant, timestep_policy;  // pipelines/stages/quantize.h
  int step_index = 0;                  // the step a timestep-aware quantized model runs at
  bool quant_given = false, step_index_given = false;
  bool check_weights = true;           // a port is compared number by number: a NaN weight is named up front
  std::vector<std::string> loras;      // --lora FILE[:SCALE], repeatable: fused in order
  bool lora_ignore_unmatched = false;  // --lora-ignore-unmatched
  std::string lora_mode;               // --lora-mode fused | runtime (empty: fused, runtime with --quant)
};

int run(const ForwardFlags& f, const DeviceFlags& device_flags, const AttentionTuneCacheFlag& cache, const ParallelFlags& parallel_flags) {
  const DType dtype = parse_dtype(f.dtype);
  if (dtype != DType::f32 && dtype != DType::bf16) throw Error("--dtype must be f32 or bf16, got " + f.dtype);
  if (!f.quant_given && !f.timestep_policy.empty()) throw Error("--timestep-policy applies with --quant (a W8A8_TIMESTEP description)");
  if (!f.quant_given && f.step_index_given) throw Error("--step-index applies with --quant (a W8A8_TIMESTEP description)");
  if (f.step_index < 0) throw Error("--step-index must be >= 0, got " + std::to_string(f.step_index));
  const parallel::ParallelGroups groups = parallel_flags.resolve();  // before any work
  if (f.quant_given && groups.degrees.tp > 1)
    throw Error("--quant with --tp is not supported yet: the quantized layers would need their shards too");
  // The LoRA files are read before the model loads: a bad one fails at once.
  std::vector<std::pair<models::LoraAdapter, double>> loras;
  for (const std::string& flag : f.loras) {
    const auto [path, scale] = models::parse_lora_flag(flag);
    loras.emplace_back(models::read_lora(path), scale);
  }
  // The quantization files are read and checked before the model loads, as in t2i / t2v.
  std::unique_ptr<pipelines::QuantizeStage> quantize;
  if (f.quant_given) quantize = std::make_unique<pipelines::QuantizeStage>(pipelines::QuantizeOptions{f.quant, f.timestep_policy, false});
  Device device(device_flags.resolve());
  cache.load(device);
  // A whole diffusers folder means its transformer; otherwise the folder is the component.
  const std::string dir = std::filesystem::exists(f.model + "/transformer/config.json") ? f.model + "/transformer" : f.model;
  const SafetensorsFile in = SafetensorsFile::open(f.inputs);
  const std::unique_ptr<models::ForwardModel> model = models::load_forward_model(dir, {dtype, f.variant, device.default_stream()});
  if (f.check_weights) models::require_finite_parameters(model->parameters(), dir);
  // LoRA fused into the weights (diffusers' fuse_lora), before any quantization of them; or kept
  // beside them (runtime mode, after the quantization: the int8 layers stay as they are).
  if (!f.lora_mode.empty() && f.lora_mode != "fused" && f.lora_mode != "runtime")
    throw Error("--lora-mode must be fused or runtime, got '" + f.lora_mode + "'");
  if (f.lora_mode == "fused" && f.quant_given && !loras.empty())
    throw Error(
        "--lora-mode fused with --quant: the quantized layers load their int8 weights from the quantization's own files, so a "
        "LoRA fused into the float weights would not reach them; use --lora-mode runtime (the default with --quant)");
  const bool runtime_lora = f.lora_mode == "runtime" || (f.lora_mode.empty() && f.quant_given);
  if (runtime_lora && groups.degrees.tp > 1)
    throw Error("--lora-mode runtime with --tp is not supported: the LoRA's matrices would need their shards too");
  for (const auto& [adapter, scale] : runtime_lora ? std::vector<std::pair<models::LoraAdapter, double>>{} : loras) {
    int unmatched = 0;
    const int fused = models::fuse_lora(model->parameters(), adapter, scale, f.lora_ignore_unmatched, &unmatched);
    std::fprintf(stderr, "forward: LoRA %s (%s) at %g fused into %d layers%s\n", adapter.path.c_str(), adapter.format.c_str(), scale, fused,
                 unmatched ? (" (" + std::to_string(unmatched) + " of its layers match none of the model's: skipped)").c_str() : "");
  }
  // Tensor parallel: this rank's shares of the layers' weights.
  pipelines::StageList stages;
  if (groups.degrees.tp > 1) {
    const std::optional<models::TensorParallelPlan> plan = model->tensor_parallel_plan();
    if (!plan) throw Error("--tp shards a transformer's layers; " + dir + " is a " + model->class_name());
    stages.add(pipelines::tensor_parallel_stage(groups, *plan));
    stages.after_load(model->parameters());
  }
  if (quantize) {
    quantize->after_load(model->parameters());
    quantize->set_step(f.step_index);
    std::fprintf(stderr, "forward: %s (step %d)\n", quantize->summary().c_str(), f.step_index);
  }
  models::RuntimeLora runtime;
  if (runtime_lora)
    for (const auto& [adapter, scale] : loras) {
      int unmatched = 0;
      const std::vector<models::LoraDelta> deltas =
          models::resolve_lora(model->parameters(), adapter, scale, f.lora_ignore_unmatched, &unmatched);
      runtime.add(deltas);
      std::fprintf(stderr, "forward: LoRA %s (%s) at %g applied at run time to %zu layers%s\n", adapter.path.c_str(),
                   adapter.format.c_str(), scale, deltas.size(),
                   unmatched ? (" (" + std::to_string(unmatched) + " of its layers match none of the model's: skipped)").c_str() : "");
    }
  const models::RuntimeLoraScope runtime_scope(&runtime);
  const std::vector<std::string> names = model->input_names();
  std::string signature;
  for (const std::string& n : names) signature += (signature.empty() ? "" : ", ") + n;
  // Only the forward's own argument names are accepted, so a misspelt tensor is not silently unused.
  std::map<std::string, Tensor> inputs;
  for (const auto& e : in.entries()) {
    if (std::find(names.begin(), names.end(), e.name) == names.end())
      throw Error(f.inputs + ": unknown tensor '" + e.name + "' (" + model->class_name() + ".forward takes " + signature + ")");
    inputs[e.name] = in.tensor(e.name);
    require_finite(inputs[e.name], f.inputs + ": tensor '" + e.name + "'");
  }
  // Sequence parallel: this rank keeps its share of the tokens through the blocks (see
  // pipelines/stages/sequence_parallel.h); every rank ends with the whole output.
  if (groups.degrees.sequence() > 1) {
    if (model->class_name().find("Transformer") == std::string::npos)
      throw Error("--ulysses and --ring share a transformer's tokens; " + dir + " is a " + model->class_name());
    stages.add(pipelines::sequence_parallel_stage(groups));
  }
  // Inputs whose working set would not fit are refused before any work (not left to the OOM killer).
  if (const uint64_t need = model->estimate_bytes(inputs); need > 0)
    if (const uint64_t available = pipelines::available_memory_bytes(); available > 0 && need > available)
      throw Error(f.inputs + ": " + model->class_name() + ".forward on these inputs needs about " + human_bytes(need) + ", more than the " +
                  human_bytes(available) + " available now");
  const auto t0 = std::chrono::steady_clock::now();
  const models::ForwardContext ctx = stages.context({}, dtype);
  NamedTensors outputs = model->forward_outputs(inputs, ctx, device.default_stream());
  for (auto& named : outputs) {
    named.second = ops::cast(named.second, DType::f32).contiguous();
    named.second.data_ptr();
  }
  for (const auto& [name, tensor] : outputs)
    require_finite(tensor,
                   model->class_name() + ".forward: the output '" + name + "' (a weight or input gives NaN or inf); nothing was written");
  const std::string& output = outputs.front().first;
  const Tensor& sample = outputs.front().second;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool writer = groups.world.rank() == 0;  // rank 0 writes; every rank reports
  if (writer) write_safetensors(f.out, outputs);
  Tensor first;  // the first argument given, for the summary line
  for (const std::string& n : names)
    if (inputs.count(n)) {
      first = inputs.at(n);
      break;
    }
  const std::string who = groups.world.size() > 1 ? " (rank " + std::to_string(groups.world.rank()) + " of " +
                                                        std::to_string(groups.world.size()) + ", " + groups.degrees.describe() + ")"
                                                  : "";
  std::fprintf(stderr, "forward%s: %s %s -> %s %s%s in %.3f s%s\n", who.c_str(), model->class_name().c_str(),
               first.defined() ? shape_to_string(first.shape()).c_str() : "", output.c_str(), shape_to_string(sample.shape()).c_str(),
               outputs.size() > 1 ? (" (and " + std::to_string(outputs.size() - 1) + " more)").c_str() : "", seconds,
               writer ? (", written to " + f.out).c_str() : "");
  print_stage_report(stages);
  cache.save(device);
  return 0;
}

}  // namespace

CommandRunner add_forward_command(CLI::App& app) {
  auto* command = app.add_subcommand("forward",
                                     "One model forward (Flux / Wan transformer, AutoencoderKL / AutoencoderKLWan decode and encode, "
                                     "CLIPVisionModel) on diffusers-named input tensors; writes `sample` (`latent` for an encode, "
                                     "`penultimate_hidden_state` and the other outputs for CLIPVisionModel)");
  auto flags = std::make_shared<ForwardFlags>();
  auto device_flags = add_device_flags(*command);
  auto cache = add_attention_tune_cache_flag(*command);
  auto parallel_flags = add_parallel_flags(*command, /*cfg_parallel=*/false);
  command
      ->add_option("--model", flags->model,
                   "A component folder (transformer/, vae/, image_encoder/), or a diffusers model folder (its transformer/)")
      ->required();
  command
      ->add_option("--inputs", flags->inputs,
                   "safetensors with the forward's arguments (hidden_states, ...; for a VAE latent to decode or sample to encode; "
                   "for CLIPVisionModel pixel_values)")
      ->required();
  command
      ->add_option("--out", flags->out,
                   "Output safetensors (sample, or latent for an encode; CLIPVisionModel: penultimate_hidden_state, "
                   "last_hidden_state, pooler_output)")
      ->check(output_file_path())
      ->required();
  command->add_option("--dtype", flags->dtype, "f32, or bf16 (bf16 weights, and bf16 activations in the transformers)");
  command->add_option("--lora", flags->loras,
                      "A LoRA (diffusers / PEFT, kohya Flux or Wan safetensors) fused into the weights: FILE or FILE:SCALE "
                      "(default 1); repeatable, fused in order");
  command->add_option("--lora-mode", flags->lora_mode,
                      "fused (added into the weights at load, as diffusers' fuse_lora; the default) or runtime (computed beside "
                      "each layer, the weights untouched; the default with --quant, whose int8 layers a fused LoRA would not reach)");
  command->add_flag("--lora-ignore-unmatched", flags->lora_ignore_unmatched,
                    "Skip (and count) a LoRA's layers the model does not have, instead of failing");
  command->add_option("--variant", flags->variant, "Read diffusion_pytorch_model.<variant>.safetensors");
  command->add_flag("--check-weights,!--no-check-weights", flags->check_weights,
                    "Check that every weight is finite before the forward (default: on)");
  auto* quant = command->add_option("--quant", flags->quant,
                                    "MindIE SD quant description (quant_model_description_*.json; its weight file beside it)");
  command->add_option("--timestep-policy", flags->timestep_policy,
                      "W8A8_TIMESTEP: JSON {\"default\": \"dynamic\", \"static\": [steps...]}");
  auto* step_index = command->add_option("--step-index", flags->step_index, "Denoising step a W8A8_TIMESTEP model runs at (default 0)");
  return [flags, device_flags, cache, quant, step_index, parallel_flags] {
    flags->quant_given = quant->count() > 0;
    flags->step_index_given = step_index->count() > 0;
    return run(*flags, *device_flags, *cache, *parallel_flags);
  };
}

}  // namespace cubevec::cli
