// One generation request, the same for every front end (the command line's flags, the C API's
// JSON, the server, Python). Its JSON keys follow diffusers' pipeline arguments:
//
//   {"prompt": "a red circle", "negative_prompt": "", "width": 64, "height": 64,
//    "num_frames": 17, "num_inference_steps": 20, "guidance_scale": 3.5, "true_cfg_scale": 4.0,
//    "seed": 7, "max_sequence_length": 512, "prompt_embeds": "embeds.safetensors",
//    "cfg": "off" | "fused" | "streams",
//    "image": "in.png", "mask_image": "mask.png", "strength": 0.6,
//    "last_image": "last.png" (Wan first-last-frame), "guidance_scale_2": 3.0 (Wan2.2's low-noise expert),
//    "edit": true, "max_area": 1048576, "auto_resize": true (FLUX.1 Kontext editing),
//    "lora": ["style.safetensors:0.8"] (LoRAs this request applies at run time, models/lora_runtime.h),
//    "cache": "db" or {"cache": "db", "cache-fn": 1, ...} (the --cache-config file's keys),
//    "sparse": "ada_bsa" or {"type": "ada_bsa", "sparsity": 0.5, "step_start": 0, "blocks": "0-3",
//               "mask_refresh": 1, "cdf_threshold": 1.0},
//    "quant_attention": "int8" (Q K^T in int8, SageAttention-style: pipelines/stages/quant_attention.h)}
//
// Every key is optional but the prompt (or prompt_embeds); what is left out takes the model's
// default (its size, steps and guidance: pipelines/model_family.h). guidance_scale is what
// diffusers calls it for each family: Flux's embedded guidance, Wan's CFG scale; Flux's true CFG
// scale is true_cfg_scale. Unknown keys, wrong types and out-of-range values are errors naming the
// key, the value and the allowed range.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "media/jpeg.h"
#include "pipelines/stages/cache_config.h"
#include "pipelines/stages/quant_attention.h"
#include "pipelines/stages/sparse_attention.h"
#include "pipelines/text_conditioning.h"

namespace cubevec::pipelines {

struct Request {
  PromptRequest text;  // prompt, negative_prompt, prompt_embeds, max_sequence_length
  std::optional<int64_t> width, height;
  std::optional<int64_t> num_frames;  // video models only
  std::optional<int> num_inference_steps;
  std::optional<double> guidance_scale;
  std::optional<double> true_cfg_scale;  // Flux's true CFG
  // Two experts (Wan2.2 A14B): the low-noise expert's CFG scale; unset: guidance_scale.
  std::optional<double> guidance_scale_2;
  std::string cfg;  // "off", "fused", "streams"; empty: the model's default
  // Image-to-image (Flux): the picture to start from and, for inpainting, the mask (white: repaint),
  // as files; strength in (0, 1] (diffusers' default 0.6 when an image is given).
  // Image-to-video (Wan): image is the first frame, last_image the last (first-last-frame).
  std::string image, mask_image, last_image;
  std::optional<double> strength;
  // FLUX.1 Kontext editing (FluxKontextPipeline): the picture as a reference to edit rather than a
  // start. Unset: edit when the model is a Kontext one (its model_index.json) and a picture is given.
  // max_area: the output's pixels (width and height rescaled to it at their aspect ratio; 1024^2);
  // auto_resize: the reference resized to the nearest of Kontext's preferred resolutions (true).
  std::optional<bool> edit;
  std::optional<int64_t> max_area;
  std::optional<bool> auto_resize;
  bool size_fitted = false;  // set by the family's defaults once width x height follow max_area; not in the JSON
  // The same pictures in memory (a server's uploads), used instead of the files; not in the JSON.
  std::shared_ptr<const media::RgbImage> image_pixels, mask_pixels, last_image_pixels;
  bool has_image() const { return !image.empty() || image_pixels; }
  bool has_mask() const { return !mask_image.empty() || mask_pixels; }
  bool has_last_image() const { return !last_image.empty() || last_image_pixels; }
  // "FILE" or "FILE:SCALE": LoRAs applied at run time to this request only, over whatever the model
  // loaded with (a resident pipeline switches them per request without reloading).
  std::vector<std::string> lora;
  uint64_t seed = 0;
  CacheConfig cache;  // method none: no step cache
  std::optional<SparseConfig> sparse;
  AttentionQuant quant_attention = AttentionQuant::none;

  // `source` names the request in errors ("request"); unknown keys are errors.
  static Request from_json(const nlohmann::json& json, const std::string& source = "request");
  // Parses text first: malformed JSON is an error naming `source` and the position.
  static Request parse(const std::string& json_text, const std::string& source = "request");
  // The keys set (unset optional ones left out), in the same form from_json reads.
  nlohmann::ordered_json to_json() const;
};

// The library's errors name the command line's flags ("--steps must be ..."); a JSON front end
// shows them in the request's keys ("num_inference_steps must be ..."). The one table of which
// flag is which key is here.
std::string in_request_terms(const std::string& message);

}  // namespace cubevec::pipelines
