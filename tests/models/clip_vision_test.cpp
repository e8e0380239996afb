// CLIPImageProcessor and CLIPVisionModel (Wan2.1 I2V's image_processor and image_encoder) against
// tests/data/goldens_clip_vision.safetensors, written by tests/reference/make_clip_vision_reference.py
// from transformers' sources with Pillow's own BICUBIC:
//   - the processor's pixels, bit for bit (f32 equality), for four pictures through the tiny config
//     (42), the real Wan2.1 config (224, compared at the sampled rows and columns, and the whole
//     tensor by its float64 sum) and a crop larger than the resized picture (zero padding);
//   - the tiny models (gelu, and quick_gelu) in f32 at 1e-4 of max |expected| (the goldens are
//     float64 runs of bf16-representable weights), and with bf16 weights at 2e-2;
//   - config and input errors naming the file, the key or the argument; a WithProjection
//     checkpoint and an old one holding position_ids load; simulate mode at Wan's size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/strict_json.h"
#include "device/device.h"
#include "device/device_profile.h"
#include "media/image_input.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision_model.h"
#include "ops/op_stream.h"
#include "tensor/safetensors.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace clip_vision_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using models::ClipImageProcessorConfig;
using models::ClipVisionConfig;
using models::ClipVisionModel;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_clip_vision.safetensors"));
  return file;
}

nlohmann::json case_meta(const std::string& name) { return nlohmann::json::parse(goldens().metadata().at(name)); }

// Wan2.1's preprocessor_config.json with other sizes (the generator's preprocessor_config).
nlohmann::json processor_json(int64_t shortest_edge, int64_t crop_h, int64_t crop_w) {
  nlohmann::json j = read_json_file(data_path("clip_vision_tiny/preprocessor_config.json"));
  j["size"] = {{"shortest_edge", shortest_edge}};
  j["crop_size"] = {{"height", crop_h}, {"width", crop_w}};
  return j;
}

// Every f32 equal, bit for bit (reports how many differ and by how many ulps at most).
void expect_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), DType::f32) << what;
  const Tensor g = got.contiguous(), w = want.contiguous();
  int64_t differing = 0, worst_ulps = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    int32_t a = 0, b = 0;
    std::memcpy(&a, g.data<float>() + i, 4);
    std::memcpy(&b, w.data<float>() + i, 4);
    if (a != b) ++differing, worst_ulps = std::max<int64_t>(worst_ulps, std::abs(int64_t{a} - int64_t{b}));
  }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << g.numel() << " values differ (at most " << worst_ulps << " ulps)";
}

// t[:, :, idx][:, :, :, idx] of a [1, 3, H, W] tensor.
Tensor sampled(const Tensor& t, const std::vector<int64_t>& idx) {
  const auto n = static_cast<int64_t>(idx.size());
  Tensor out = Tensor::empty({1, 3, n, n}, DType::f32);
  const Tensor c = t.contiguous();
  const int64_t h = t.size(2), w = t.size(3);
  for (int64_t ch = 0; ch < 3; ++ch)
    for (int64_t y = 0; y < n; ++y)
      for (int64_t x = 0; x < n; ++x)
        out.mutable_data<float>()[(ch * n + y) * n + x] =
            c.data<float>()[(ch * h + idx[static_cast<std::size_t>(y)]) * w + idx[static_cast<std::size_t>(x)]];
  return out;
}

const struct {
  const char* name;
  const char* file;
  bool pad;
} kPictures[] = {
    {"rgb", "rgb.png", true}, {"portrait", "portrait.png", true}, {"photo", "photo.jpg", false}, {"rotated", "rotated.jpg", false}};

// --- CLIPImageProcessor ------------------------------------------------------------------------------

TEST(ClipImageProcessor, PixelsAreTransformersBitForBit) {
  const ClipImageProcessorConfig tiny = ClipImageProcessorConfig::load(data_path("clip_vision_tiny/preprocessor_config.json"));
  const ClipImageProcessorConfig real = ClipImageProcessorConfig::from_json(processor_json(224, 224, 224), "wan");
  const ClipImageProcessorConfig pad = ClipImageProcessorConfig::from_json(processor_json(20, 23, 25), "pad");
  for (const auto& p : kPictures) {
    const std::string c = std::string("processor_") + p.name;
    const media::RgbImage image = media::read_input_image(data_path(std::string("images/") + p.file));
    const nlohmann::json meta = case_meta(c);
    const auto resized = models::clip_resize_output_size(image.height, image.width, tiny);
    EXPECT_EQ((std::vector<int64_t>{resized.first, resized.second}), meta["pixel_values"]["resized_hw"].get<std::vector<int64_t>>()) << c;
    expect_bits(models::clip_pixel_values(image, tiny), goldens().tensor(c + ".pixel_values"), c + " (42)");

    const Tensor full = models::clip_pixel_values(image, real);
    ASSERT_EQ(full.shape(), (Shape{1, 3, 224, 224})) << c;
    std::vector<int64_t> idx;
    for (double v : values(goldens().tensor(c + ".sample_index_224"))) idx.push_back(static_cast<int64_t>(v));
    expect_bits(sampled(full, idx), goldens().tensor(c + ".pixel_values_224_sampled"), c + " (224, sampled)");
    // The whole tensor: its float64 sum and max |value| as the generator recorded them.
    double sum = 0, max_abs = 0;
    for (double v : values(full)) sum += v, max_abs = std::max(max_abs, std::fabs(v));
    const nlohmann::json& m224 = meta["pixel_values_224_sampled"];
    EXPECT_NEAR(sum, m224["full_sum_f64"].get<double>(), 1e-9 * std::fabs(m224["full_sum_f64"].get<double>())) << c;
    EXPECT_EQ(max_abs, m224["full_max_abs"].get<double>()) << c;
    const auto resized_224 = models::clip_resize_output_size(image.height, image.width, real);
    EXPECT_EQ((std::vector<int64_t>{resized_224.first, resized_224.second}), m224["resized_hw"].get<std::vector<int64_t>>()) << c;

    if (p.pad) expect_bits(models::clip_pixel_values(image, pad), goldens().tensor(c + ".pixel_values_pad"), c + " (padded crop)");
  }
}

TEST(ClipImageProcessor, PaddedCropPutsZerosCeilHalfBefore) {
  // A 1 x 2 picture (after no resize), cropped to 4 x 5: rows padded 2 before and 1 after (d = 3),
  // columns 2 before and 1 after (d = 3). Without rescale and normalize the pixels are the bytes.
  media::RgbImage image;
  image.width = 2;
  image.height = 1;
  image.pixels = {10, 20, 30, 40, 50, 60};
  ClipImageProcessorConfig c;
  c.do_resize = c.do_rescale = c.do_normalize = false;
  c.crop_height = 4;
  c.crop_width = 5;
  const std::vector<double> got = values(models::clip_pixel_values(image, c));
  ASSERT_EQ(got.size(), 3u * 4u * 5u);
  for (int64_t ch = 0; ch < 3; ++ch)
    for (int64_t y = 0; y < 4; ++y)
      for (int64_t x = 0; x < 5; ++x) {
        const double want = y == 2 && (x == 2 || x == 3) ? image.pixels[static_cast<std::size_t>((x - 2) * 3 + ch)] : 0.0;
        EXPECT_EQ(got[static_cast<std::size_t>((ch * 4 + y) * 5 + x)], want) << ch << " " << y << " " << x;
      }
  // A crop smaller than the picture: floor offsets. 5 wide to 2: left = 3 // 2 = 1.
  image.width = 5;
  image.pixels = {0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4};
  c.crop_height = 1;
  c.crop_width = 2;
  EXPECT_EQ(values(models::clip_pixel_values(image, c)), (std::vector<double>{1, 2, 1, 2, 1, 2}));
}

TEST(ClipImageProcessor, RescaleInFloat64AndNormalizeInFloat32) {
  media::RgbImage image;
  image.width = 1;
  image.height = 1;
  image.pixels = {0, 128, 255};
  ClipImageProcessorConfig c;
  c.do_resize = c.do_center_crop = false;
  const std::vector<double> got = values(models::clip_pixel_values(image, c));
  for (std::size_t ch = 0; ch < 3; ++ch) {
    const auto x = static_cast<float>(static_cast<double>(image.pixels[ch]) * 0.00392156862745098);
    const float want = (x - static_cast<float>(c.image_mean[ch])) / static_cast<float>(c.image_std[ch]);
    EXPECT_EQ(got[ch], static_cast<double>(want)) << ch;
  }
  c.do_normalize = false;
  EXPECT_EQ(values(models::clip_pixel_values(image, c))[2], static_cast<double>(static_cast<float>(255 * 0.00392156862745098)));
  c.do_rescale = false;
  c.do_normalize = true;  // normalize of the bytes as float32
  EXPECT_EQ(values(models::clip_pixel_values(image, c))[1],
            static_cast<double>((128.0f - static_cast<float>(c.image_mean[1])) / static_cast<float>(c.image_std[1])));
}

TEST(ClipImageProcessor, ResizeSizeTruncatesTheLongSide) {
  ClipImageProcessorConfig c;
  c.shortest_edge = 224;
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(models::clip_resize_output_size(23, 37, c), (P{224, 360}));    // 224 * 37 / 23 = 360.3
  EXPECT_EQ(models::clip_resize_output_size(97, 61, c), (P{356, 224}));    // 356.2
  EXPECT_EQ(models::clip_resize_output_size(20, 12, c), (P{373, 224}));    // 373.3
  EXPECT_EQ(models::clip_resize_output_size(50, 50, c), (P{224, 224}));    // ties: both sides
  EXPECT_EQ(models::clip_resize_output_size(224, 300, c), (P{224, 300}));  // already there
  c = ClipImageProcessorConfig::from_json({{"size", {{"height", 30}, {"width", 40}}}}, "t");
  EXPECT_EQ(models::clip_resize_output_size(97, 61, c), (P{30, 40}));
  c.do_resize = false;
  EXPECT_EQ(models::clip_resize_output_size(97, 61, c), (P{97, 61}));
}

TEST(ClipImageProcessor, ConfigFormsAndErrors) {
  // Older configs: ints for size and crop_size, feature_extractor_type, one number for every channel.
  const ClipImageProcessorConfig old = ClipImageProcessorConfig::from_json(
      {{"size", 224}, {"crop_size", 200}, {"feature_extractor_type", "CLIPFeatureExtractor"}, {"image_mean", 0.5}, {"some_key", 1}}, "old");
  EXPECT_EQ(old.shortest_edge, 224);
  EXPECT_EQ(old.crop_height, 200);
  EXPECT_EQ(old.crop_width, 200);
  EXPECT_EQ(old.image_mean[2], 0.5);
  const ClipImageProcessorConfig defaults = ClipImageProcessorConfig::from_json(nlohmann::json::object(), "empty");
  EXPECT_EQ(defaults.shortest_edge, 224);
  EXPECT_EQ(defaults.rescale_factor, 1.0 / 255);
  const auto error = [](const nlohmann::json& j) { return message_of([&] { ClipImageProcessorConfig::from_json(j, "pp.json"); }); };
  EXPECT_NE(error({{"resample", 2}}).find("pp.json: 'resample' 2 is not supported"), std::string::npos) << error({{"resample", 2}});
  EXPECT_NE(error({{"image_processor_type", "CLIPImageProcessorFast"}}).find("'image_processor_type'"), std::string::npos);
  EXPECT_NE(error({{"feature_extractor_type", "ViTFeatureExtractor"}}).find("'feature_extractor_type'"), std::string::npos);
  EXPECT_NE(error({{"size", {{"longest_edge", 5}}}}).find("'size' must be"), std::string::npos) << error({{"size", {{"longest_edge", 5}}}});
  EXPECT_NE(error({{"size", {{"shortest_edge", 0}}}}).find("'size' shortest_edge must be an integer from 1"), std::string::npos);
  EXPECT_NE(error({{"crop_size", "x"}}).find("'crop_size' must be"), std::string::npos);
  EXPECT_NE(error({{"crop_size", {{"shortest_edge", 5}}}}).find("'crop_size' must be"), std::string::npos);
  EXPECT_NE(error({{"image_mean", {0.5, 0.5}}}).find("'image_mean' must be 3 numbers"), std::string::npos);
  EXPECT_NE(error({{"image_std", {0.5, 0.0, 0.5}}}).find("'image_std' must not hold 0"), std::string::npos);
  EXPECT_NE(error({{"do_resize", "yes"}}).find("'do_resize'"), std::string::npos);
  EXPECT_NE(error({{"rescale_factor", "1/255"}}).find("'rescale_factor'"), std::string::npos);
  // A resize that would make a huge picture is refused before it allocates.
  media::RgbImage thin;
  thin.width = 16384;
  thin.height = 1;
  thin.pixels.assign(16384 * 3, 7);
  EXPECT_NE(message_of([&] { models::clip_pixel_values(thin, defaults); }).find("would make it 3670016x224 pixels"), std::string::npos);
}

// --- CLIPVisionModel ---------------------------------------------------------------------------------

void expect_outputs(const ClipVisionModel::Output& got, const std::string& c, double rel, const std::string& what) {
  expect_close_rel(got.penultimate_hidden_state, goldens().tensor(c + ".expected_penultimate_hidden_state"), rel, what + " penultimate");
  expect_close_rel(got.last_hidden_state, goldens().tensor(c + ".expected_last_hidden_state"), rel, what + " last");
  expect_close_rel(got.pooler_output, goldens().tensor(c + ".expected_pooler_output"), rel, what + " pooler");
}

TEST(ClipVisionModel, TinyModelsMatchTheReferenceInF32AndBf16) {
  const Stream stream = ops::default_op_stream();
  for (const std::string c : {"vision_tiny", "vision_tiny_quick"}) {
    const std::string dir = data_path(c == "vision_tiny" ? "clip_vision_tiny" : "clip_vision_tiny_quick");
    const Tensor pixels = goldens().tensor(c + ".pixel_values");
    const auto f32 = ClipVisionModel::load(dir, DType::f32, stream);
    const ClipVisionModel::Output a = f32->forward(pixels);
    expect_outputs(a, c, 1e-4, c + " f32");
    // Without the last layer, the same penultimate state.
    expect_bits(f32->penultimate_hidden_state(pixels), a.penultimate_hidden_state.contiguous(), c + " penultimate only");
    expect_outputs(ClipVisionModel::load(dir, DType::bf16, stream)->forward(pixels), c, 2e-2, c + " bf16");
  }
  // The processor's own output of the portrait feeds the model as the goldens' batch 0 does.
  const ClipImageProcessorConfig tiny = ClipImageProcessorConfig::load(data_path("clip_vision_tiny/preprocessor_config.json"));
  const Tensor portrait = models::clip_pixel_values(media::read_input_image(data_path("images/portrait.png")), tiny);
  const Tensor all = goldens().tensor("vision_tiny.expected_penultimate_hidden_state");
  expect_close_rel(ClipVisionModel::load(data_path("clip_vision_tiny"), DType::f32, stream)->penultimate_hidden_state(portrait),
                   all.slice(0, 0, 1).contiguous(), 1e-4, "portrait through the processor");
}

TEST(ClipVisionModel, ConfigReadsTransformersKeys) {
  const ClipVisionConfig c = ClipVisionConfig::load(data_path("clip_vision_tiny/config.json"));
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.image_size, 42);
  EXPECT_EQ(c.patch_size, 14);
  EXPECT_EQ(c.num_positions(), 10);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_FALSE(c.with_projection);
  EXPECT_EQ(ClipVisionConfig::load(data_path("clip_vision_tiny_quick/config.json")).hidden_act, "quick_gelu");
  const auto error = [](const nlohmann::json& patch) {
    nlohmann::json j = read_json_file(data_path("clip_vision_tiny/config.json"));
    j.merge_patch(patch);
    return message_of([&] { ClipVisionConfig::from_json(j, "enc/config.json"); });
  };
  EXPECT_NE(error({{"architectures", {"CLIPModel"}}}).find("enc/config.json: 'architectures' [CLIPModel] is not an architecture"),
            std::string::npos);
  EXPECT_NE(error({{"model_type", "clip"}}).find("enc/config.json: 'model_type' 'clip'"), std::string::npos);
  EXPECT_NE(error({{"num_channels", 1}}).find("'num_channels'"), std::string::npos);
  EXPECT_NE(error({{"hidden_act", "relu"}}).find("'hidden_act'"), std::string::npos);
  EXPECT_NE(error({{"num_attention_heads", 5}}).find("'hidden_size' 32 is not a multiple of num_attention_heads 5"), std::string::npos);
  EXPECT_NE(error({{"patch_size", 50}}).find("'patch_size' 50 is larger than image_size 42"), std::string::npos);
  EXPECT_NE(error({{"num_hidden_layers", 0}}).find("'num_hidden_layers'"), std::string::npos);
  EXPECT_NE(error({{"image_size", "224"}}).find("'image_size'"), std::string::npos);
}

TEST(ClipVisionModel, BadInputsNamePixelValuesAndTheShape) {
  const auto model = ClipVisionModel::load(data_path("clip_vision_tiny"), DType::f32, ops::default_op_stream());
  const auto error = [&](const Tensor& t) { return message_of([&] { model->forward(t); }); };
  const std::string expected = "pixel_values must be f32 [B, 3, 42, 42] with B >= 1, got ";
  EXPECT_NE(error(Tensor::zeros({1, 3, 28, 28}, DType::f32)).find(expected + "f32 [1, 3, 28, 28]"), std::string::npos)
      << error(Tensor::zeros({1, 3, 28, 28}, DType::f32));
  EXPECT_NE(error(Tensor::zeros({1, 3, 42, 42}, DType::bf16)).find(expected + "bf16"), std::string::npos);
  EXPECT_NE(error(Tensor::zeros({3, 42, 42}, DType::f32)).find(expected), std::string::npos);
  EXPECT_NE(error(Tensor::zeros({1, 1, 42, 42}, DType::f32)).find(expected), std::string::npos);
  EXPECT_NE(error(Tensor()).find("pixel_values is missing"), std::string::npos);
}

TEST(ClipVisionModel, WithProjectionAndOldCheckpointsLoad) {
  TempDir dir;
  const SafetensorsFile tiny = SafetensorsFile::open(data_path("clip_vision_tiny/model.safetensors"));
  NamedTensors tensors;
  for (const auto& e : tiny.entries()) tensors.emplace_back(e.name, tiny.tensor(e.name));
  tensors.emplace_back("vision_model.embeddings.position_ids", Tensor::from_vector(std::vector<int64_t>(10, 0), {1, 10}));
  tensors.emplace_back("visual_projection.weight", Tensor::zeros({16, 32}, DType::f32));
  write_safetensors((dir.path / "model.safetensors").string(), tensors);
  nlohmann::json config = read_json_file(data_path("clip_vision_tiny/config.json"));
  config["architectures"] = {"CLIPVisionModelWithProjection"};
  dir.write("config.json", config.dump());
  const Stream stream = ops::default_op_stream();
  const auto model = ClipVisionModel::load(dir.path.string(), DType::f32, stream);
  EXPECT_TRUE(model->config().with_projection);
  expect_outputs(model->forward(goldens().tensor("vision_tiny.pixel_values")), "vision_tiny", 1e-4, "with projection");
  // A plain CLIPVisionModel has no projection: the tensor is reported as unexpected.
  config["architectures"] = {"CLIPVisionModel"};
  dir.write("config.json", config.dump());
  const std::string message = message_of([&] { ClipVisionModel::load(dir.path.string(), DType::f32, stream); });
  EXPECT_NE(message.find("visual_projection.weight"), std::string::npos) << message;
  EXPECT_EQ(message.find("position_ids"), std::string::npos) << message;
}

TEST(ClipVisionModel, SimulatesWansImageEncoderAtFullSize) {
  Device device(builtin_cpu_profile(), {.simulate = true});
  const Stream stream = device.default_stream();
  // Wan2.1-I2V's image_encoder/config.json: CLIP ViT-H/14.
  const ClipVisionConfig config = ClipVisionConfig::from_json({{"architectures", {"CLIPVisionModel"}},
                                                               {"hidden_act", "gelu"},
                                                               {"hidden_size", 1280},
                                                               {"image_size", 224},
                                                               {"intermediate_size", 5120},
                                                               {"model_type", "clip_vision_model"},
                                                               {"num_attention_heads", 16},
                                                               {"num_hidden_layers", 32},
                                                               {"patch_size", 14},
                                                               {"projection_dim", 1024}},
                                                              "wan");
  const auto model = ClipVisionModel::with_meta_weights(config, DType::bf16, stream);
  const ClipVisionModel::Output o = model->forward(Tensor::meta({1, 3, 224, 224}, DType::f32));
  EXPECT_EQ(o.penultimate_hidden_state.shape(), (Shape{1, 257, 1280}));
  EXPECT_EQ(o.last_hidden_state.shape(), (Shape{1, 257, 1280}));
  EXPECT_EQ(o.pooler_output.shape(), (Shape{1, 1280}));
  EXPECT_FALSE(o.penultimate_hidden_state.has_storage());
  device.synchronize();
  EXPECT_GT(device.stats().kernels, 0u);
}

}  // namespace clip_vision_test
}  // namespace cubevec
