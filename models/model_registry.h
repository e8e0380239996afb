// The models `cubevec forward` (and any tool that runs one model on named tensors) can load, found
// by the `_class_name` of a component folder's config.json (a transformers config has none: its
// `architectures` or `model_type` names it): a registry, not a chain of ifs. Each entry takes its
// forward's arguments by their diffusers names and returns one tensor, `sample`:
//   FluxTransformer2DModel   hidden_states, encoder_hidden_states, pooled_projections, timestep,
//                            img_ids, txt_ids, guidance   -> the velocity
//   WanTransformer3DModel    hidden_states, timestep, encoder_hidden_states  -> the flow
//   AutoencoderKL            latent  -> vae.decode(latent).sample (no scaling or shift)
//   AutoencoderKLWan         latent  -> vae.decode(latent).sample (clamped, as diffusers' _decode)
// except CLIPVisionModel (transformers' CLIPVisionModel or CLIPVisionModelWithProjection), which
// takes pixel_values [B, 3, S, S] and returns three: penultimate_hidden_state (hidden_states[-2],
// what Wan's image conditioning uses), last_hidden_state and pooler_output.
#pragma once

#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/stream.h"
#include "models/forward_context.h"
#include "models/parameters.h"
#include "models/tensor_parallel_plan.h"

namespace cubevec::models {

class ForwardModel {
 public:
  virtual ~ForwardModel() = default;
  virtual std::string class_name() const = 0;
  virtual std::vector<std::string> input_names() const = 0;  // every argument it accepts
  virtual ParameterTable& parameters() = 0;
  // The layers tensor parallelism shards; none for a model that cannot be sharded (the VAEs).
  virtual std::optional<TensorParallelPlan> tensor_parallel_plan() const { return std::nullopt; }
  // What forward() returns for these inputs, as the output file names it: "sample" (a transformer's
  // prediction, a decoded image) or "latent" (an encoded image).
  virtual std::string output_name(const std::map<std::string, Tensor>&) const { return "sample"; }
  // An estimate of the bytes forward() allocates for these inputs, when the model can tell (0: it
  // cannot): the command refuses inputs that would not fit before any work.
  virtual uint64_t estimate_bytes(const std::map<std::string, Tensor>&) const { return 0; }
  // `inputs` by argument name (only names from input_names(); missing optional ones undefined).
  virtual Tensor forward(const std::map<std::string, Tensor>& inputs, const ForwardContext& ctx, const Stream& stream) const = 0;
  // Every output by the name the output file gives it, the main one (forward's, output_name's)
  // first; a model with one output returns just that.
  virtual std::vector<std::pair<std::string, Tensor>> forward_outputs(const std::map<std::string, Tensor>& inputs,
                                                                      const ForwardContext& ctx, const Stream& stream) const {
    return {{output_name(inputs), forward(inputs, ctx, stream)}};
  }
};

struct ForwardModelLoad {
  DType dtype = DType::f32;  // weights (and, for the transformers, the activations of forward's ctx)
  std::string variant;       // diffusion_pytorch_model.<variant>.safetensors
  // The stream of a model that keeps the one it loads with (CLIPVisionModel); unset: the default
  // device's.
  std::optional<Stream> stream{};
};

// The component folder `dir` (config.json + weights). Throws naming the config's _class_name and
// the classes there are when it is not one of them. A config without _class_name is a
// CLIPVisionModel when its architectures or model_type say so, else (the tiny test checkpoints)
// a FluxTransformer2DModel.
std::unique_ptr<ForwardModel> load_forward_model(const std::string& dir, const ForwardModelLoad& load = {});
std::vector<std::string> forward_model_classes();  // sorted

}  // namespace cubevec::models
