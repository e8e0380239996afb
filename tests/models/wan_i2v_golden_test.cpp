// The Wan image branch (image-to-video and first-last-frame) against PyTorch goldens
// (tests/data/goldens_wan_i2v.safetensors, tests/data/wan_i2v_tiny and wan_flf2v_tiny, written by
// tests/reference/make_wan_i2v_reference.py from diffusers' WanTransformer3DModel): the image
// embedder (with FLF2V's position table), the whole transformer with the image tokens' added
// keys and values, in f32 and with bf16 weights; plus the config and input errors.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 * max |expected| in f32; bf16 weights 2e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "models/wan_transformer.h"
#include "ops/vector_ops.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace wan_i2v_golden_test {

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_wan_i2v.safetensors"));
  return file;
}
Tensor golden(const std::string& name) { return goldens().tensor(name); }

const models::WanTransformer3DModel& model(const std::string& folder, DType dtype = DType::f32) {
  static std::map<std::pair<std::string, DType>, std::unique_ptr<models::WanTransformer3DModel>> cache;
  auto& slot = cache[{folder, dtype}];
  if (!slot) slot = models::WanTransformer3DModel::load(data_path(folder + "/transformer"), dtype);
  return *slot;
}

models::WanInputs inputs(const std::string& c) {
  return {golden(c + ".hidden_states"), golden(c + ".timestep"), golden(c + ".encoder_hidden_states"),
          golden(c + ".encoder_hidden_states_image")};
}

std::string error_of(const std::function<void()>& f) { return message_of(f); }

TEST(WanI2VGolden, ImageEmbedder) {
  const Stream s = ops::default_op_stream();
  const models::WanTransformer3DModel& i2v = model("wan_i2v_tiny");
  EXPECT_TRUE(i2v.config().has_image_branch());
  EXPECT_EQ(i2v.config().in_channels, 12);
  expect_close_rel(i2v.image_embedding(golden("transformer_i2v.encoder_hidden_states_image"), s),
                   golden("transformer_i2v.intermediate.image_context"), 1e-5, "image embedder");
  // FLF2V: diffusers' [2 pictures, 10, C] viewed as one sample of 20 rows plus the position table.
  expect_close_rel(model("wan_flf2v_tiny").image_embedding(golden("transformer_flf2v.encoder_hidden_states_image"), s),
                   golden("transformer_flf2v.intermediate.image_context"), 1e-5, "FLF2V image embedder");
}

TEST(WanI2VGolden, TransformerForward) {
  const Stream s = ops::default_op_stream();
  for (const char* c : {"transformer_i2v", "transformer_flf2v"}) {
    const std::string folder = std::string(c) == "transformer_i2v" ? "wan_i2v_tiny" : "wan_flf2v_tiny";
    const Tensor expected = golden(std::string(c) + ".sample");
    expect_close_rel(model(folder).forward(inputs(c), s), expected, 1e-4, c);
    expect_close_rel(model(folder, DType::bf16).forward(inputs(c), s), expected, 2e-2, std::string(c) + " bf16 weights");
  }
}

TEST(WanI2VGolden, TheImageTokensChangeTheSample) {
  // A test that can fail: other image states give another sample (so the branch is not ignored).
  const Stream s = ops::default_op_stream();
  models::WanInputs in = inputs("transformer_i2v");
  in.encoder_hidden_states_image = ops::muls_add(in.encoder_hidden_states_image, in.encoder_hidden_states_image, -2.0f, s);
  const Tensor moved = model("wan_i2v_tiny").forward(in, s);
  const std::vector<double> a = values(moved), b = values(golden("transformer_i2v.sample"));
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  EXPECT_GT(diff, 1e-2);
}

TEST(WanI2VGolden, InputErrorsNameTheInput) {
  const Stream s = ops::default_op_stream();
  models::WanInputs in = inputs("transformer_i2v");
  in.encoder_hidden_states_image = Tensor();
  EXPECT_NE(error_of([&] { model("wan_i2v_tiny").forward(in, s); }).find("encoder_hidden_states_image must be [2, L >= 1, 32]"),
            std::string::npos);
  in = inputs("transformer_i2v");
  in.encoder_hidden_states_image = in.encoder_hidden_states_image.slice(0, 0, 1);
  EXPECT_NE(error_of([&] { model("wan_i2v_tiny").forward(in, s); }).find("got [1, 10, 32]"), std::string::npos);
  // FLF2V: 20 rows per sample (pos_embed_seq_len); one picture of 10 rows does not fit.
  in = inputs("transformer_flf2v");
  in.encoder_hidden_states_image = in.encoder_hidden_states_image.slice(0, 0, 1);
  EXPECT_NE(error_of([&] { model("wan_flf2v_tiny").forward(in, s); }).find("pos_embed_seq_len 20"), std::string::npos);
  // A text-to-video transformer refuses image states.
  in = inputs("transformer_i2v");
  const auto t2v = models::WanTransformer3DModel::load(data_path("wan_tiny/transformer"));
  in.hidden_states = in.hidden_states.slice(1, 0, 4);
  EXPECT_NE(error_of([&] { t2v->forward(in, s); }).find("has no image branch"), std::string::npos);
}

TEST(WanI2VGolden, ConfigNeedsBothImageKeys) {
  nlohmann::json j = nlohmann::json::parse(R"({"_class_name": "WanTransformer3DModel", "image_dim": 32, "added_kv_proj_dim": null,
      "num_attention_heads": 2, "attention_head_dim": 16})");
  EXPECT_NE(error_of([&] { models::WanConfig::from_json(j, "cfg.json"); }).find("added_kv_proj_dim"), std::string::npos);
  j["added_kv_proj_dim"] = 48;
  EXPECT_NE(error_of([&] { models::WanConfig::from_json(j, "cfg.json"); }).find("32 wide"), std::string::npos);
  j["added_kv_proj_dim"] = 32;
  EXPECT_TRUE(models::WanConfig::from_json(j, "cfg.json").has_image_branch());
  j["image_dim"] = nullptr;
  j["pos_embed_seq_len"] = 514;
  EXPECT_NE(error_of([&] { models::WanConfig::from_json(j, "cfg.json"); }).find("image_dim"), std::string::npos);
}

}  // namespace wan_i2v_golden_test
}  // namespace cubevec
