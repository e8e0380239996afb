// `cubevec encode-image`: a picture through transformers' CLIPImageProcessor and CLIPVisionModel
// (Wan2.1 I2V's image_processor and image_encoder), written as safetensors so a port can be
// compared with transformers' output on the same folder:
//   pixel_values              f32 [1, 3, S, S]   the processor's output (preprocessor_config.json)
//   penultimate_hidden_state  f32 [1, N, D]      hidden_states[-2], what WanImageToVideoPipeline's
//                                                encode_image gives the transformer
// --model is a CLIPVisionModel folder (config.json, model.safetensors, preprocessor_config.json) or
// a diffusers pipeline folder (image_encoder/ and image_processor/preprocessor_config.json).
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "base/regular_file.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/output_flag.h"
#include "media/image_input.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision_model.h"
#include "models/pipeline_text_encoders.h"
#include "tensor/finite_check.h"
#include "tensor/safetensors.h"

namespace cubevec::cli {

namespace {

struct EncodeImageFlags {
  std::string model, image, out, dtype = "f32";
};

// The encoder's folder and the processor's config file in --model.
struct ImageEncoderFiles {
  std::string encoder_dir, processor_config;
};

ImageEncoderFiles find_image_encoder(const std::string& model) {
  if (!folder_exists(model, " (--model)")) throw Error("--model " + model + " does not exist");
  if (std::filesystem::exists(model + "/config.json")) return {model, model + "/preprocessor_config.json"};
  const std::string encoder = model + "/image_encoder";
  if (folder_exists(encoder, " (--model's image_encoder)")) return {encoder, model + "/image_processor/preprocessor_config.json"};
  throw Error("--model " + model +
              " holds neither config.json (a CLIPVisionModel folder) nor image_encoder/ (a diffusers pipeline folder with "
              "image_encoder/ and image_processor/)");
}

int run(const EncodeImageFlags& f, const DeviceFlags& device_flags) {
  if (f.dtype != "f32" && f.dtype != "bf16") throw Error("--dtype must be f32 or bf16, got '" + f.dtype + "'");
  const DType dtype = parse_dtype(f.dtype);
  const ImageEncoderFiles files = find_image_encoder(f.model);
  if (!std::filesystem::exists(files.processor_config))
    throw Error(files.processor_config + " does not exist (--model needs CLIPImageProcessor's preprocessor_config.json)");
  // Everything that can be checked without the weights first: the configs and the picture.
  const models::ClipImageProcessorConfig processor = models::ClipImageProcessorConfig::load(files.processor_config);
  const models::ClipVisionConfig config = models::ClipVisionConfig::load(files.encoder_dir + "/config.json");
  const media::RgbImage image = media::read_input_image(f.image, "--image");
  const Tensor pixel_values = models::clip_pixel_values(image, processor);
  if (pixel_values.size(2) != config.image_size || pixel_values.size(3) != config.image_size)
    throw Error(files.processor_config + " makes " + std::to_string(pixel_values.size(3)) + "x" + std::to_string(pixel_values.size(2)) +
                " pixel_values of the " + std::to_string(image.width) + "x" + std::to_string(image.height) + " --image, but " +
                files.encoder_dir + "/config.json's image_size is " + std::to_string(config.image_size) +
                " (the encoder takes image_size x image_size pictures)");
  Device device(device_flags.resolve());
  const DType weights = models::encoder_weight_dtype(files.encoder_dir, dtype);
  const auto model = models::ClipVisionModel::load(files.encoder_dir, weights, device.default_stream());
  models::compute_in_run_dtype(model->parameters(), dtype);
  const Tensor hidden = model->penultimate_hidden_state(pixel_values).contiguous();
  require_finite(hidden, "CLIPVisionModel: output 'penultimate_hidden_state' (a weight gives NaN or inf); nothing was written");
  write_safetensors(f.out, {{"pixel_values", pixel_values}, {"penultimate_hidden_state", hidden}},
                    {{"class", "CLIPVisionModel"}, {"weights", std::string(dtype_name(weights))}});
  std::fprintf(
      stderr,
      "encode-image: %dx%d picture -> pixel_values %s -> penultimate_hidden_state %s (CLIPVisionModel, %s weights), written to %s\n",
      image.width, image.height, shape_to_string(pixel_values.shape()).c_str(), shape_to_string(hidden.shape()).c_str(),
      dtype_name(weights).data(), f.out.c_str());
  return 0;
}

}  // namespace

CommandRunner add_encode_image_command(CLI::App& app) {
  auto* command = app.add_subcommand("encode-image",
                                     "Run a CLIP image encoder (CLIPImageProcessor + CLIPVisionModel, Wan2.1 I2V's) on a picture; writes "
                                     "pixel_values and penultimate_hidden_state to compare with transformers");
  auto flags = std::make_shared<EncodeImageFlags>();
  auto device_flags = add_device_flags(*command);
  command
      ->add_option("--model", flags->model,
                   "A CLIPVisionModel folder (config.json, model.safetensors, preprocessor_config.json) or a diffusers folder "
                   "(image_encoder/ + image_processor/)")
      ->required();
  command->add_option("--image", flags->image, "The picture (PNG or JPEG)")->required();
  command->add_option("--dtype", flags->dtype, "f32 (default) or bf16 weights (weights stored bf16 stay bf16)");
  command->add_option("--out", flags->out, "Output safetensors")->check(output_file_path())->required();
  return [flags, device_flags] { return run(*flags, *device_flags); };
}

}  // namespace cubevec::cli
