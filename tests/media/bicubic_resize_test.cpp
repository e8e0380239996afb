// media::resize_bicubic against Pillow's BICUBIC (Image.resize(..., resample=3) on 8-bit RGB). The
// CLIP goldens (tests/reference/make_clip_vision_reference.py) hold the processor's pixels, not the
// resized bytes: each pixel value there is one of 256 per channel (rescale and normalize are
// monotonic), so the bytes PIL's resize gave are read back from them and compared, byte for byte,
// with resize_bicubic's inside the crop window the generator recorded. The cases shrink (portrait
// 61x97 -> 42x66, 20x31; rgb 37x23 -> 32x20) and enlarge (every picture to 224 on the short side;
// rgb to 67x42), with a black / white checker block whose overshoot Pillow clips.
#include <gtest/gtest.h>

#include <array>
#include <map>

#include "base/error.h"
#include "base/strict_json.h"
#include "media/image_input.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace bicubic_resize_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_clip_vision.safetensors"));
  return file;
}

// The byte a processed value came from: CLIPImageProcessor's rescale (f32(f64(v) / 255-ish)) and
// normalize (f32 (x - mean) / std) of each of the 256 bytes, looked up exactly.
int byte_of(float value, int channel) {
  static const std::array<std::map<float, int>, 3> tables = [] {
    const double mean[3] = {0.48145466, 0.4578275, 0.40821073}, std_dev[3] = {0.26862954, 0.26130258, 0.27577711};
    std::array<std::map<float, int>, 3> t;
    for (int c = 0; c < 3; ++c)
      for (int v = 0; v < 256; ++v) {
        const auto x = static_cast<float>(static_cast<double>(v) * 0.00392156862745098);
        t[static_cast<std::size_t>(c)][(x - static_cast<float>(mean[c])) / static_cast<float>(std_dev[c])] = v;
      }
    return t;
  }();
  const auto& table = tables[static_cast<std::size_t>(channel)];
  const auto it = table.find(value);
  return it == table.end() ? -1 : it->second;
}

// Compares resize_bicubic(image) with the bytes behind golden `name` ([1, 3, n, m]): golden row i,
// column j is the resized picture's row top + rows[i], column left + cols[j] (outside it: padding).
void expect_resize(const media::RgbImage& image, const nlohmann::json& info, const std::string& name, const std::vector<int64_t>& rows,
                   const std::vector<int64_t>& cols, const std::string& what) {
  const std::vector<int64_t> hw = info.at("resized_hw").get<std::vector<int64_t>>(),
                             tl = info.at("crop_top_left").get<std::vector<int64_t>>();
  const media::RgbImage resized = media::resize_bicubic(image, static_cast<int>(hw[1]), static_cast<int>(hw[0]));
  ASSERT_EQ(resized.height, hw[0]) << what;
  ASSERT_EQ(resized.width, hw[1]) << what;
  const Tensor golden = goldens().tensor(name);
  const std::vector<double> g = values(golden);
  const auto n = static_cast<int64_t>(rows.size()), m = static_cast<int64_t>(cols.size());
  ASSERT_EQ(golden.shape(), (Shape{1, 3, n, m})) << what;
  int64_t compared = 0, differing = 0;
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const int64_t y = tl[0] + rows[static_cast<std::size_t>(i)], x = tl[1] + cols[static_cast<std::size_t>(j)];
        if (y < 0 || y >= hw[0] || x < 0 || x >= hw[1]) continue;  // a padding pixel
        const int want = byte_of(static_cast<float>(g[static_cast<std::size_t>((c * n + i) * m + j)]), static_cast<int>(c));
        ASSERT_GE(want, 0) << what << ": golden value at " << c << ", " << i << ", " << j << " is no byte's";
        ++compared;
        differing += resized.pixels[static_cast<std::size_t>((y * hw[1] + x) * 3 + c)] != want;
      }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << compared << " bytes differ from Pillow's";
  EXPECT_GT(compared, 0) << what;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

TEST(BicubicResize, IsPillowsBitForBit) {
  for (const std::string p : {"rgb", "portrait", "photo", "rotated"}) {
    const std::string c = "processor_" + p;
    const nlohmann::json meta = nlohmann::json::parse(goldens().metadata().at(c));
    const media::RgbImage image = media::read_input_image(data_path(meta.at("image").get<std::string>()));
    expect_resize(image, meta.at("pixel_values"), c + ".pixel_values", iota(42), iota(42), c + " (42)");
    std::vector<int64_t> idx;
    for (double v : values(goldens().tensor(c + ".sample_index_224"))) idx.push_back(static_cast<int64_t>(v));
    expect_resize(image, meta.at("pixel_values_224_sampled"), c + ".pixel_values_224_sampled", idx, idx, c + " (224)");
    if (meta.contains("pixel_values_pad"))
      expect_resize(image, meta.at("pixel_values_pad"), c + ".pixel_values_pad", iota(23), iota(25), c + " (20)");
  }
}

TEST(BicubicResize, KeepsFlatPicturesAndSkipsUnchangedAxes) {
  media::RgbImage flat;
  flat.width = 13;
  flat.height = 7;
  flat.pixels.assign(13 * 7 * 3, 0);
  for (std::size_t i = 0; i < flat.pixels.size(); ++i) flat.pixels[i] = static_cast<uint8_t>(i % 3 == 0 ? 200 : i % 3 == 1 ? 17 : 255);
  for (const auto& [w, h] : {std::pair{5, 3}, std::pair{40, 29}, std::pair{13, 20}, std::pair{4, 7}}) {
    const media::RgbImage r = media::resize_bicubic(flat, w, h);
    ASSERT_EQ(r.width, w);
    ASSERT_EQ(r.height, h);
    for (std::size_t i = 0; i < r.pixels.size(); ++i) ASSERT_EQ(r.pixels[i], flat.pixels[i % 3]) << w << "x" << h << " at " << i;
  }
  // Same size: the picture itself. Only the height changes: each column resized on its own, so a
  // picture whose columns differ keeps them apart.
  media::RgbImage stripes = flat;
  for (int y = 0; y < 7; ++y)
    for (int x = 0; x < 13; ++x)
      for (int c = 0; c < 3; ++c) stripes.pixels[static_cast<std::size_t>((y * 13 + x) * 3 + c)] = static_cast<uint8_t>(x * 19);
  EXPECT_EQ(media::resize_bicubic(stripes, 13, 7).pixels, stripes.pixels);
  const media::RgbImage taller = media::resize_bicubic(stripes, 13, 11);
  for (int y = 0; y < 11; ++y)
    for (int x = 0; x < 13; ++x) ASSERT_EQ(taller.pixels[static_cast<std::size_t>((y * 13 + x) * 3)], x * 19) << y << ", " << x;
  EXPECT_NE(message_of([&] { media::resize_bicubic(flat, 0, 3); }).find("resize_bicubic: sizes must be positive"), std::string::npos);
}

}  // namespace bicubic_resize_test
}  // namespace cubevec
