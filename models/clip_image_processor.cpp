#include "models/clip_image_processor.h"

#include <cmath>

#include <algorithm>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/strict_json.h"
#include "media/image_input.h"

namespace cubevec::models {

namespace {

// A side length in a size / crop_size entry: an integer from 1 to the largest picture side read.
int64_t side_length(const ConfigReader& r, const std::string& key, const std::string& field, const nlohmann::json& value) {
  if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > media::kMaxInputSide)
    r.fail(key, field + " must be an integer from 1 to " + std::to_string(media::kMaxInputSide) + ", got " + json_for_message(value));
  return value.get<int64_t>();
}

// {height, width} (or, with `shortest`, {shortest_edge}), or an int: the same for both sides
// (crop_size) or the shortest edge (size), as transformers' get_size_dict reads them.
void read_size(ConfigReader& r, const std::string& key, bool shortest, int64_t& edge, int64_t& height, int64_t& width) {
  if (!r.has(key)) return;
  const nlohmann::json& v = r.raw(key);
  const std::string forms =
      shortest ? "{\"shortest_edge\": N}, {\"height\": H, \"width\": W} or an integer" : "{\"height\": H, \"width\": W} or an integer";
  if (v.is_number_integer()) {
    const int64_t n = side_length(r, key, "the value", v);
    if (shortest) {
      edge = n, height = width = 0;
    } else {
      height = width = n;
    }
    return;
  }
  if (!v.is_object()) r.fail(key, "must be " + forms + ", got " + json_for_message(v));
  if (shortest && v.size() == 1 && v.contains("shortest_edge")) {
    edge = side_length(r, key, "shortest_edge", v["shortest_edge"]), height = width = 0;
    return;
  }
  if (v.size() != 2 || !v.contains("height") || !v.contains("width")) r.fail(key, "must be " + forms + ", got " + json_for_message(v));
  height = side_length(r, key, "height", v["height"]);
  width = side_length(r, key, "width", v["width"]);
  if (shortest) edge = 0;
}

// image_mean / image_std: three numbers, or one for every channel.
void read_channels(ConfigReader& r, const std::string& key, std::array<double, 3>& out, bool nonzero) {
  if (!r.has(key)) return;
  const nlohmann::json& v = r.raw(key);
  std::vector<double> values;
  if (v.is_number()) {
    double one = 0;
    r.number(key, one);
    values.assign(3, one);
  } else {
    r.numbers(key, values);
    if (values.size() != 3) r.fail(key, "must be 3 numbers (one per RGB channel) or one number, got " + json_for_message(v));
  }
  // Pixels are O(1) after the rescale: values far outside that make inf or NaN, not a picture.
  for (double x : values) {
    if (nonzero && x == 0.0) r.fail(key, "must not hold 0 (the pixels are divided by it), got " + json_for_message(v));
    if (!(std::fabs(x) <= 1e3) || (nonzero && std::fabs(x) < 1e-6))
      r.fail(key, std::string("must hold numbers ") + (nonzero ? "of magnitude 1e-6 to 1000" : "within +-1000") + ", got " +
                      json_for_message(v));
  }
  std::copy(values.begin(), values.end(), out.begin());
}

}  // namespace

ClipImageProcessorConfig ClipImageProcessorConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "CLIPImageProcessor");
  std::string type;
  r.text("image_processor_type", type, {"CLIPImageProcessor"})
      .text("feature_extractor_type", type, {"CLIPFeatureExtractor"})
      .text("processor_class", type, {"CLIPProcessor"});
  ClipImageProcessorConfig c;
  r.boolean("do_resize", c.do_resize)
      .boolean("do_center_crop", c.do_center_crop)
      .boolean("do_rescale", c.do_rescale)
      .boolean("do_normalize", c.do_normalize)
      .boolean("do_convert_rgb", c.do_convert_rgb)
      .number("rescale_factor", c.rescale_factor);
  if (!(std::fabs(c.rescale_factor) <= 1e3))
    r.fail("rescale_factor", "must be a number within +-1000 (1/255 for 8-bit pictures), got " + std::to_string(c.rescale_factor));
  read_size(r, "size", true, c.shortest_edge, c.resize_height, c.resize_width);
  int64_t unused_edge = 0;
  read_size(r, "crop_size", false, unused_edge, c.crop_height, c.crop_width);
  if (r.has("resample")) {
    const nlohmann::json& v = r.raw("resample");
    if (!v.is_number_integer() || v.get<int64_t>() != 3)
      r.fail("resample", json_for_message(v) +
                             " is not supported: cubevec's CLIPImageProcessor resizes with PIL's BICUBIC (3) only, as CLIP's "
                             "and Wan2.1's configs ask");
  }
  read_channels(r, "image_mean", c.image_mean, false);
  read_channels(r, "image_std", c.image_std, true);
  return c;
}

ClipImageProcessorConfig ClipImageProcessorConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

std::pair<int64_t, int64_t> clip_resize_output_size(int64_t height, int64_t width, const ClipImageProcessorConfig& config) {
  if (!config.do_resize) return {height, width};
  if (config.shortest_edge == 0) return {config.resize_height, config.resize_width};
  // get_resize_output_image_size(default_to_square=False): int(S * long / short), a float division
  // (correctly rounded: the integers are far below 2^53) truncated toward zero.
  const int64_t s = config.shortest_edge;
  const bool portrait = width <= height;
  const int64_t short_side = portrait ? width : height, long_side = portrait ? height : width;
  const auto new_long = static_cast<int64_t>(static_cast<double>(s * long_side) / static_cast<double>(short_side));
  return portrait ? std::pair{new_long, s} : std::pair{s, new_long};
}

Tensor clip_pixel_values(const media::RgbImage& image, const ClipImageProcessorConfig& config) {
  if (image.width < 1 || image.height < 1 ||
      image.pixels.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3)
    throw Error("clip_pixel_values: an empty or inconsistent image");
  media::RgbImage resized;
  const media::RgbImage* picture = &image;
  if (config.do_resize) {
    const auto [h, w] = clip_resize_output_size(image.height, image.width, config);
    if (h * w > media::kMaxInputPixels)
      throw Error("CLIPImageProcessor: resizing the " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                  " picture would make it " + std::to_string(w) + "x" + std::to_string(h) + " pixels (at most " +
                  std::to_string(media::kMaxInputPixels) + " in all are made)");
    resized = media::resize_bicubic(image, static_cast<int>(w), static_cast<int>(h));
    picture = &resized;
  }
  const int64_t in_h = picture->height, in_w = picture->width;
  const int64_t out_h = config.do_center_crop ? config.crop_height : in_h, out_w = config.do_center_crop ? config.crop_width : in_w;
  // center_crop: the window's first row and column in the picture; negative where zeros pad it.
  const auto floor_half = [](int64_t d) { return d >= 0 ? d / 2 : -((-d + 1) / 2); };  // Python's d // 2
  const auto ceil_half = [](int64_t d) { return (d + 1) / 2; };                        // ceil(d / 2), d >= 0
  int64_t top = 0, left = 0;
  if (config.do_center_crop) {
    top = floor_half(in_h - out_h);
    left = floor_half(in_w - out_w);
    const bool fits = top >= 0 && left >= 0 && top + out_h <= in_h && left + out_w <= in_w;
    if (!fits) {  // the picture at (ceil(d / 2), ...) of a zero canvas, the window from max(0, ...) there
      const int64_t top_pad = ceil_half(std::max(out_h, in_h) - in_h), left_pad = ceil_half(std::max(out_w, in_w) - in_w);
      top = std::max<int64_t>(0, top + top_pad) - top_pad;
      left = std::max<int64_t>(0, left + left_pad) - left_pad;
    }
  }
  std::array<float, 3> mean{}, std_dev{};
  for (std::size_t c = 0; c < 3; ++c) {
    mean[c] = static_cast<float>(config.image_mean[c]);  // np.array(mean, dtype=float32)
    std_dev[c] = static_cast<float>(config.image_std[c]);
  }
  Tensor out = Tensor::empty({1, 3, out_h, out_w}, DType::f32);
  float* p = out.mutable_data<float>();
  for (int64_t y = 0; y < out_h; ++y)
    for (int64_t x = 0; x < out_w; ++x) {
      const int64_t sy = y + top, sx = x + left;
      const bool inside = sy >= 0 && sy < in_h && sx >= 0 && sx < in_w;
      for (std::size_t c = 0; c < 3; ++c) {
        const uint8_t v = inside ? picture->pixels[static_cast<std::size_t>((sy * in_w + sx) * 3) + c] : 0;
        float f = static_cast<float>(v);
        if (config.do_rescale) f = static_cast<float>(static_cast<double>(v) * config.rescale_factor);  // in float64, one rounding
        if (config.do_normalize) f = (f - mean[c]) / std_dev[c];                                        // two float32 roundings
        p[(static_cast<int64_t>(c) * out_h + y) * out_w + x] = f;
      }
    }
  return out;
}

}  // namespace cubevec::models
