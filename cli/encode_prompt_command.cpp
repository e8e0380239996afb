// `cubevec encode-prompt`: one text encoder of a diffusers folder on one or more prompts, its
// tokens and outputs written as safetensors, so a port can be compared with transformers' dump of
// the same folder (docs/porting.md, "Text encoders"). For prompt i (from 0):
//   input_ids_i          i64 [1, L]
//   attention_mask_i     i64 [1, L] (1 = token), T5 / umT5 only
//   last_hidden_state_i  f32 [1, L, D]
//   pooler_output_i      f32 [1, D], CLIP only
//   prompt_embeds_i      f32 [1, L, D], --pipeline wan only: WanPipeline's rows past the prompt zeroed
// How the encoder is called:
//   CLIP                 FluxPipeline's call: 77 (or --max-length) tokens padded, no mask
//   T5 / umT5            the tokenizer's padded ids and mask; the mask goes to the encoder
//                        (transformers' model(**tokenizer(...))), except with --pipeline flux
//                        (FluxPipeline passes none); --pipeline wan also cleans the prompt first
#include <cstdio>

#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/output_flag.h"
#include "cli/range_flag.h"
#include "models/clip_text_model.h"
#include "models/pipeline_text_encoders.h"
#include "models/t5_encoder.h"
#include "base/error.h"
#include "tensor/finite_check.h"
#include "base/regular_file.h"
#include "tensor/safetensors.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/prompt_clean.h"
#include "tokenizers/t5_tokenizer.h"

namespace cubevec::cli {

namespace {

struct EncodePromptFlags {
  std::string model, encoder = "text_encoder", pipeline, out, dtype = "f32";
  std::vector<std::string> prompts;
  int max_length = 0;  // 0: the tokenizer's (CLIP 77) or 512 (T5)
};

Tensor ids_tensor(const std::vector<int32_t>& ids) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return Tensor::from_vector(wide, {1, static_cast<int64_t>(wide.size())});
}

void require_folder(const std::string& path, const std::string& what) {
  if (!folder_exists(path, " (" + what + ")")) throw Error(what + " " + path + " does not exist");
}

int run(const EncodePromptFlags& f, const DeviceFlags& device_flags) {
  if (f.dtype != "f32" && f.dtype != "bf16") throw Error("--dtype must be f32 or bf16, got '" + f.dtype + "'");
  const DType dtype = parse_dtype(f.dtype);
  if (f.model.empty()) throw Error("--model DIR is required (a diffusers folder with text_encoder/ and tokenizer/)");
  require_folder(f.model, "--model");
  if (f.encoder != "text_encoder" && f.encoder != "text_encoder_2")
    throw Error("--encoder must be text_encoder or text_encoder_2, got '" + f.encoder + "'");
  if (!f.pipeline.empty() && f.pipeline != "flux" && f.pipeline != "wan")
    throw Error("--pipeline must be flux or wan, got '" + f.pipeline + "'");
  if (f.prompts.empty()) throw Error("--prompt TEXT is required (repeat it for more prompts)");
  if (f.max_length < 0) throw Error("--max-length must be at least 1, got " + std::to_string(f.max_length));
  const std::string dir = f.model + "/" + f.encoder;
  const std::string tokenizer_dir = f.model + (f.encoder == "text_encoder" ? "/tokenizer" : "/tokenizer_2");
  require_folder(dir, "--encoder's folder");
  require_folder(tokenizer_dir, "its tokenizer folder");
  models::check_text_component_classes(f.model);
  Device device(device_flags.resolve());
  const Stream stream = device.default_stream();
  const DType weights = models::encoder_weight_dtype(dir, dtype);
  NamedTensors out;
  std::string described;
  const models::EncoderConfigKind kind = models::encoder_config_kind(dir + "/config.json");
  if (kind == models::EncoderConfigKind::tiny)
    throw Error(dir +
                ": the shipped CubevecTinyTextEncoder is not a transformers encoder (encode-prompt runs CLIPTextModel, "
                "T5EncoderModel and UMT5EncoderModel)");
  if (kind == models::EncoderConfigKind::clip) {
    if (f.pipeline == "wan") throw Error(dir + " is a CLIP text encoder; Wan has none (--pipeline wan is for its umT5 encoder)");
    if (f.max_length == 1) throw Error("--max-length must be at least 2 for CLIP (<|startoftext|> and <|endoftext|>), got 1");
    const tokenizers::ClipTokenizer tokenizer = tokenizers::ClipTokenizer::load(tokenizer_dir);
    const auto model = models::ClipTextModel::load(dir, weights, stream);
    models::compute_in_run_dtype(model->parameters(), dtype);
    if (f.max_length > model->config().max_position_embeddings)
      throw Error("--max-length " + std::to_string(f.max_length) + " exceeds " + dir + "'s max_position_embeddings " +
                  std::to_string(model->config().max_position_embeddings));
    for (std::size_t i = 0; i < f.prompts.size(); ++i) {
      const std::string n = std::to_string(i);
      const std::vector<int32_t> ids = tokenizer.encode_padded(f.prompts[i], f.max_length, "--prompt " + n);
      const models::ClipTextOutput o = model->forward(ids);
      out.emplace_back("input_ids_" + n, ids_tensor(ids));
      out.emplace_back("last_hidden_state_" + n, o.last_hidden_state.contiguous());
      out.emplace_back("pooler_output_" + n, o.pooler_output.contiguous());
    }
    described = "CLIPTextModel";
  } else {
    const tokenizers::T5Tokenizer tokenizer = tokenizers::T5Tokenizer::load(tokenizer_dir);
    const auto model = models::T5EncoderModel::load(dir, weights, stream);
    models::compute_in_run_dtype(model->parameters(), dtype);
    if (f.pipeline == "wan" && !model->config().umt5)
      throw Error(dir + " is a T5EncoderModel; --pipeline wan is for Wan's UMT5EncoderModel");
    if (f.pipeline == "flux" && model->config().umt5)
      throw Error(dir + " is a UMT5EncoderModel; --pipeline flux is for Flux's T5EncoderModel (text_encoder_2)");
    const int length = f.max_length > 0 ? f.max_length : 512;
    for (std::size_t i = 0; i < f.prompts.size(); ++i) {
      const std::string n = std::to_string(i);
      const std::string text = f.pipeline == "wan" ? tokenizers::wan_prompt_clean(f.prompts[i], "--prompt " + n) : f.prompts[i];
      const tokenizers::PaddedIds ids = tokenizer.encode_padded(text, length, "--prompt " + n);
      const Tensor hidden = model->forward(ids.ids, f.pipeline == "flux" ? std::vector<int32_t>{} : ids.attention_mask).contiguous();
      out.emplace_back("input_ids_" + n, ids_tensor(ids.ids));
      out.emplace_back("attention_mask_" + n, ids_tensor(ids.attention_mask));
      out.emplace_back("last_hidden_state_" + n, hidden);
      if (f.pipeline == "wan") out.emplace_back("prompt_embeds_" + n, models::zero_padded_rows(hidden, ids.attention_mask));
    }
    described = model->class_name();
  }
  for (const auto& [name, tensor] : out)
    if (tensor.dtype() == DType::f32)
      require_finite(tensor, described + ": output '" + name + "' (a weight gives NaN or inf); nothing was written");
  write_safetensors(f.out, out, {{"encoder", f.encoder}, {"class", described}, {"pipeline", f.pipeline.empty() ? "none" : f.pipeline}});
  std::fprintf(stderr, "encode-prompt: %s (%s weights) on %zu prompt(s), written to %s\n", described.c_str(), dtype_name(weights).data(),
               f.prompts.size(), f.out.c_str());
  return 0;
}

}  // namespace

CommandRunner add_encode_prompt_command(CLI::App& app) {
  auto* command = app.add_subcommand("encode-prompt",
                                     "Run a folder's text encoder (CLIP, T5 or umT5) on prompts; writes the token ids, mask and "
                                     "hidden states to compare with transformers");
  auto flags = std::make_shared<EncodePromptFlags>();
  auto device_flags = add_device_flags(*command);
  command->add_option("--model", flags->model, "A diffusers folder (text_encoder/ + tokenizer/, text_encoder_2/ + tokenizer_2/)")
      ->required();
  command->add_option("--encoder", flags->encoder, "text_encoder (default; tokenizer/) or text_encoder_2 (tokenizer_2/)");
  command->add_option("--prompt", flags->prompts, "A prompt (repeat for more; output tensors are numbered from 0)")->required();
  command->add_option("--max-length", flags->max_length, "Tokens to pad to (default: CLIP's model_max_length, 512 for T5)")
      ->check(in_range(1, 4096));
  command->add_option("--pipeline", flags->pipeline,
                      "flux: T5 without the mask, as FluxPipeline; wan: the prompt cleaned, the mask, and prompt_embeds_i zeroed past it");
  command->add_option("--dtype", flags->dtype, "f32 (default) or bf16 weights (weights stored bf16 stay bf16)");
  command->add_option("--out", flags->out, "Output safetensors")->check(output_file_path())->required();
  return [flags, device_flags] { return run(*flags, *device_flags); };
}

}  // namespace cubevec::cli
