// CLIPTextModel, T5EncoderModel and UMT5EncoderModel against float64 goldens from
// tests/reference/make_text_encoder_goldens.py (torch 1.13, the forwards written from
// transformers' sources) on tiny random configs in transformers' format: CLIP with bf16 matrices,
// T5 sharded f32 with both embedding names, umT5 f32 with shared.weight only.
//
// Tolerances (M = max |golden|): f32 compute |got - want| <= 1e-4 * M. Loading in bf16 rounds the
// activations entering each GEMM to bf16 (layers.h): 3e-2 * M. The checkpoints' weights are
// bf16-representable, so loading the bf16 CLIP file as f32 is exact and meets 1e-4.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "models/clip_text_model.h"
#include "models/pipeline_text_encoders.h"
#include "models/t5_encoder.h"
#include "ops/op_stream.h"
#include "ops/vector_ops.h"
#include "base/error.h"
#include "tensor/safetensors.h"
#include "base/strict_json.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace text_encoder_models_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using models::ClipTextModel;
using models::T5EncoderModel;

std::string data_dir() { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/text_encoders/"; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_dir() + "goldens.safetensors");
  return file;
}

std::vector<int32_t> ints(const std::string& name) {
  const Tensor t = goldens().tensor(name);
  const int32_t* p = t.data<int32_t>();
  return {p, p + t.numel()};
}

void expect_near_scaled(const Tensor& got, const std::string& golden, double rel, const std::string& what) {
  const Tensor want_t = goldens().tensor(golden);
  const std::vector<double> want = values(want_t), have = values(got);
  ASSERT_EQ(have.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(have[i] - want[i]));
  EXPECT_LE(worst, rel * scale) << what << ": max error " << worst << " against max |golden| " << scale;
}

TEST(ClipTextModel, MatchesTheTorchReferenceInF32AndBf16) {
  const Stream stream = ops::default_op_stream();
  const auto f32 = ClipTextModel::load(data_dir() + "clip", DType::f32, stream);
  const auto bf16 = ClipTextModel::load(data_dir() + "clip", DType::bf16, stream);
  for (const std::string name : {"clip_cat", "clip_pad0", "clip_short"}) {
    const std::vector<int32_t> ids = ints(name + ".input_ids");
    const models::ClipTextOutput a = f32->forward(ids);
    ASSERT_EQ(a.last_hidden_state.shape(), (Shape{1, static_cast<int64_t>(ids.size()), 24}));
    ASSERT_EQ(a.pooler_output.shape(), (Shape{1, 24}));
    expect_near_scaled(a.last_hidden_state.reshape({static_cast<int64_t>(ids.size()), 24}), name + ".last_hidden_state", 1e-4,
                       name + " f32");
    expect_near_scaled(a.pooler_output.reshape({24}), name + ".pooler_output", 1e-4, name + " f32 pooled");
    const models::ClipTextOutput b = bf16->forward(ids);
    expect_near_scaled(b.last_hidden_state.reshape({static_cast<int64_t>(ids.size()), 24}), name + ".last_hidden_state", 3e-2,
                       name + " bf16");
    expect_near_scaled(b.pooler_output.reshape({24}), name + ".pooler_output", 3e-2, name + " bf16 pooled");
  }
}

TEST(ClipTextModel, PoolingFollowsTransformersRuleForEachEosTokenId) {
  const Stream stream = ops::default_op_stream();
  const auto model = ClipTextModel::load(data_dir() + "clip", DType::f32, stream);
  ASSERT_EQ(model->config().eos_token_id, 2);  // the legacy rule: argmax of the ids, the first maximum
  EXPECT_EQ(model->eos_position({49406, 320, 49407, 49407}), 2);
  EXPECT_EQ(model->eos_position({49406, 5, 7}), 0);
  // Any other eos_token_id: the first id equal to it (the legacy rule would pick 49407 at 2).
  nlohmann::json config = read_json_file(data_dir() + "clip/config.json");
  config["eos_token_id"] = 320;
  const auto other = ClipTextModel::with_random_weights(models::ClipTextConfig::from_json(config, "test"), DType::f32, stream, 1);
  EXPECT_EQ(other->eos_position({49406, 320, 49407, 320}), 1);
  EXPECT_EQ(other->eos_position({49406, 5, 49407}), 0);  // none: position 0, as torch's argmax of zeros
}

TEST(T5EncoderModel, ShardedT5MatchesTheTorchReferenceWithAndWithoutMask) {
  const Stream stream = ops::default_op_stream();
  const auto model = T5EncoderModel::load(data_dir() + "t5", DType::f32, stream);
  EXPECT_EQ(model->class_name(), "T5EncoderModel");
  const std::vector<int32_t> ids = ints("t5_nomask.input_ids");
  const auto length = static_cast<int64_t>(ids.size());
  // FluxPipeline passes no mask.
  expect_near_scaled(model->forward(ids).reshape({length, 40}), "t5_nomask.last_hidden_state", 1e-4, "t5 no mask");
  expect_near_scaled(model->forward(ids, ints("t5_mask.attention_mask")).reshape({length, 40}), "t5_mask.last_hidden_state", 1e-4,
                     "t5 mask");
  const auto bf16 = T5EncoderModel::load(data_dir() + "t5", DType::bf16, stream);
  expect_near_scaled(bf16->forward(ids).reshape({length, 40}), "t5_nomask.last_hidden_state", 3e-2, "t5 bf16");
}

TEST(T5EncoderModel, Umt5HasABiasPerLayerAndMatchesTheTorchReference) {
  const Stream stream = ops::default_op_stream();
  const auto model = T5EncoderModel::load(data_dir() + "umt5", DType::f32, stream);
  EXPECT_EQ(model->class_name(), "UMT5EncoderModel");
  const std::vector<int32_t> ids = ints("umt5_mask.input_ids");
  const auto length = static_cast<int64_t>(ids.size());
  expect_near_scaled(model->forward(ids, ints("umt5_mask.attention_mask")).reshape({length, 24}), "umt5_mask.last_hidden_state", 1e-4,
                     "umt5");
}

// --dtype f32 on a bf16-stored encoder means f32 arithmetic (issue 42): the matrices stay bf16 in
// memory (encoder_weight_dtype keeps them) and are widened exactly while packed, so the states meet
// the f32 tolerance; left to the bf16 GEMM (activations rounded to bf16) they would not.
TEST(TextEncoders, Bf16StoredWeightsComputeInF32UnderAnF32Run) {
  const Stream stream = ops::default_op_stream();
  // CLIP: the test checkpoint stores its matrices in bf16.
  ASSERT_EQ(models::encoder_weight_dtype(data_dir() + "clip", DType::f32), DType::bf16);
  const auto clip = ClipTextModel::load(data_dir() + "clip", DType::bf16, stream);
  const std::vector<int32_t> cat = ints("clip_cat.input_ids");
  const auto rows = static_cast<int64_t>(cat.size());
  const Tensor rounded = clip->forward(cat).last_hidden_state.reshape({rows, 24});
  models::compute_in_run_dtype(clip->parameters(), DType::f32);
  expect_near_scaled(clip->forward(cat).last_hidden_state.reshape({rows, 24}), "clip_cat.last_hidden_state", 1e-4, "clip widened");
  // The test has power: the bf16 GEMM's rounding is far outside 1e-4 of the scale.
  const std::vector<double> got = values(rounded), want = values(goldens().tensor("clip_cat.last_hidden_state"));
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i])), scale = std::max(scale, std::fabs(want[i]));
  EXPECT_GT(worst, 1e-4 * scale);
  // umT5 stored in bf16 (a copy written here; the weights are bf16-representable).
  cubevec::testing::TempDir dir("umt5_bf16");
  const SafetensorsFile f32 = SafetensorsFile::open(data_dir() + "umt5/model.safetensors");
  NamedTensors stored;
  for (const SafetensorsEntry& e : f32.entries()) {
    const Tensor t = f32.tensor(e.name);
    stored.push_back({e.name, t.dim() >= 2 ? ops::cast(t, DType::bf16, stream) : t});
  }
  write_safetensors((dir.path / "model.safetensors").string(), stored);
  std::filesystem::copy_file(data_dir() + "umt5/config.json", dir.path / "config.json");
  ASSERT_EQ(models::encoder_weight_dtype(dir.path.string(), DType::f32), DType::bf16);
  const auto umt5 = T5EncoderModel::load(dir.path.string(), DType::bf16, stream);
  models::compute_in_run_dtype(umt5->parameters(), DType::f32);
  const std::vector<int32_t> ids = ints("umt5_mask.input_ids");
  expect_near_scaled(umt5->forward(ids, ints("umt5_mask.attention_mask")).reshape({static_cast<int64_t>(ids.size()), 24}),
                     "umt5_mask.last_hidden_state", 1e-4, "umt5 stored bf16, widened");
}

TEST(T5EncoderModel, RelativePositionBucketsMatchTransformersBoundaries) {
  // Bidirectional, 32 buckets, max distance 128: exact below 8, then 8-11 -> 8, 12-15 -> 9,
  // 16-22 -> 10, 23-31 -> 11, 32-45 -> 12, 46-63 -> 13, 64-90 -> 14, >= 91 -> 15; keys after the
  // query add 16 (spec worked out from transformers' formula in torch 1.13).
  const struct {
    int64_t n, bucket;
  } cases[] = {{0, 0},   {7, 7},   {8, 8},   {11, 8},  {12, 9},  {15, 9},  {16, 10}, {22, 10}, {23, 11},
               {31, 11}, {32, 12}, {45, 12}, {46, 13}, {63, 13}, {64, 14}, {90, 14}, {91, 15}, {500, 15}};
  for (const auto& c : cases) {
    EXPECT_EQ(models::t5_relative_position_bucket(-c.n, 32, 128), c.bucket) << "key " << c.n << " before the query";
    if (c.n > 0) {
      EXPECT_EQ(models::t5_relative_position_bucket(c.n, 32, 128), c.bucket + 16) << "key " << c.n << " after";
    }
  }
}

TEST(TextEncoderModels, BadFoldersAndInputsAreClearErrors) {
  const Stream stream = ops::default_op_stream();
  TempDir dir;
  const auto folder = [&](const std::string& name, const nlohmann::json& config) {
    std::filesystem::create_directories(dir.path / name);
    std::ofstream(dir.path / name / "config.json") << config.dump();
    return (dir.path / name).string();
  };
  nlohmann::json clip = read_json_file(data_dir() + "clip/config.json");
  clip["architectures"] = {"BertModel"};
  EXPECT_NE(message_of([&] {
              ClipTextModel::load(folder("bert", clip), DType::f32, stream);
            }).find("config.json: 'architectures' [BertModel] is not an architecture cubevec runs here (expected CLIPTextModel"),
            std::string::npos)
      << message_of([&] { ClipTextModel::load(folder("bert", clip), DType::f32, stream); });
  nlohmann::json t5 = read_json_file(data_dir() + "t5/config.json");
  t5["feed_forward_proj"] = "gated-silu";
  EXPECT_NE(message_of([&] { T5EncoderModel::load(folder("silu", t5), DType::f32, stream); }).find("feed_forward_proj"), std::string::npos);
  // A valid config without weights names the folder and the file expected.
  const std::string no_weights = folder("noweights", read_json_file(data_dir() + "umt5/config.json"));
  EXPECT_NE(message_of([&] { T5EncoderModel::load(no_weights, DType::f32, stream); }).find("model.safetensors"), std::string::npos);
  const auto model = T5EncoderModel::load(data_dir() + "umt5", DType::f32, stream);
  EXPECT_NE(message_of([&] {
              model->forward({5, 704});
            }).find("token id 704 at position 1 is outside the vocabulary [0, 704)"),
            std::string::npos);
  EXPECT_NE(message_of([&] { model->forward({5, 6}, {1}); }).find("attention_mask has 1 values for 2 ids"), std::string::npos);
  EXPECT_NE(message_of([&] { model->forward({5, 6}, {1, 2}); }).find("attention_mask values must be 0 or 1"), std::string::npos);
  const auto clip_model = ClipTextModel::load(data_dir() + "clip", DType::f32, stream);
  EXPECT_NE(message_of([&] { clip_model->forward(std::vector<int32_t>(78, 1)); }).find("78 token ids, expected 1 to 77"),
            std::string::npos);
}

}  // namespace text_encoder_models_test
}  // namespace cubevec
