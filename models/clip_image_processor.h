// transformers' CLIPImageProcessor (the slow NumPy / PIL one; Wan2.1 I2V's image_processor) on one
// picture, bit for bit: the picture as 8-bit RGB (media::read_input_image gives what diffusers'
// load_image gives), then, each step switched by its do_* key of preprocessor_config.json:
//   resize       size {shortest_edge: S}: the short side becomes S and the long one
//                int(S * long / short) (Python's float division, truncated); {height, width}:
//                exactly that. PIL's BICUBIC on the 8-bit pixels (media::resize_bicubic); a
//                picture already that size is left as it is.
//   center crop  crop_size {height, width} on the 8-bit pixels: top = (h - crop_h) // 2 and
//                left = (w - crop_w) // 2 (floor division); a side shorter than the crop is padded
//                with zeros, ceil(d / 2) before and floor(d / 2) after (d = crop - size).
//   rescale      float32(float64(v) * rescale_factor)
//   normalize    float32 arithmetic with float32 mean and std: (x - mean) / std, a true division
// and the result channels first, [1, 3, H, W] f32. Without rescale the pixels are f32(v); without
// both rescale and normalize they are the 8-bit values as f32 (transformers would return uint8).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "media/jpeg.h"
#include "tensor/tensor.h"

namespace cubevec::models {

struct ClipImageProcessorConfig {
  bool do_resize = true;
  // size: {shortest_edge} (shortest_edge > 0) or {height, width} (shortest_edge 0, both set).
  int64_t shortest_edge = 224;
  int64_t resize_height = 0, resize_width = 0;
  int64_t resample = 3;  // PIL's BICUBIC, the only filter supported
  bool do_center_crop = true;
  int64_t crop_height = 224, crop_width = 224;
  bool do_rescale = true;
  double rescale_factor = 0.00392156862745098;  // the double nearest 1 / 255
  bool do_normalize = true;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
  bool do_convert_rgb = true;                                              // pictures are read as RGB whatever it says

  // transformers' defaults for absent keys. size may also be an int (shortest_edge) and crop_size
  // an int (square), image_mean / image_std one number for every channel. image_processor_type,
  // when present, must be CLIPImageProcessor; feature_extractor_type (older configs)
  // CLIPFeatureExtractor; processor_class CLIPProcessor. Other keys are ignored (processor configs
  // carry many). Errors name `source` and the key.
  static ClipImageProcessorConfig from_json(const nlohmann::json& json, const std::string& source);
  static ClipImageProcessorConfig load(const std::string& path);
};

// The (height, width) the resize step makes of a height x width picture (the input size when
// do_resize is false).
std::pair<int64_t, int64_t> clip_resize_output_size(int64_t height, int64_t width, const ClipImageProcessorConfig& config);

// CLIPImageProcessor.preprocess(image).pixel_values: f32 [1, 3, H, W] (H x W = crop_size with
// do_center_crop).
Tensor clip_pixel_values(const media::RgbImage& image, const ClipImageProcessorConfig& config);

}  // namespace cubevec::models
