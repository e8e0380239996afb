// MindIE SD's quantization files: the description and weight files written by quant::Writer read
// back exactly (F32 and I64 deq_scale, SmoothQuant's ".div.mul_scale" layout, [out, 1] scales),
// the weight file's name from the description's (with the rank suffix), module matching as MindIE
// SD does it, and the errors for malformed descriptions and layer tensors (file, module, key).
#include <gtest/gtest.h>

#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>

#include "pipelines/quant_export.h"
#include "quant/calibration.h"
#include "quant/files.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace files_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using quant::Algorithm;

constexpr int64_t kIn = 12, kOut = 5;

// A layer of `algorithm` as msModelSlim's parameter math makes it (W8A8_TIMESTEP: `steps` rows).
quant::QuantTensors layer_of(Algorithm algorithm, unsigned seed, bool smooth, int steps) {
  if (algorithm == Algorithm::w8a8) steps = 1;
  const Tensor w = random_tensor({kOut, kIn}, seed, DType::f32, 1.0f), b = random_tensor({kOut}, seed + 1, DType::f32, 1.0f);
  std::vector<quant::ActivationRange> ranges;
  for (int s = 0; s < steps; ++s) ranges.push_back({-1.0f - 0.25f * static_cast<float>(s), 2.0f + 0.5f * static_cast<float>(s)});
  quant::QuantTensors t = quant::quantize_layer(
      w, b, algorithm,
      algorithm == Algorithm::w8a8 || algorithm == Algorithm::w8a8_timestep ? ranges : std::vector<quant::ActivationRange>{});
  if (smooth) {
    std::vector<float> mul;
    for (int64_t i = 0; i < kIn; ++i) mul.push_back(0.5f + 0.125f * static_cast<float>(i));
    t.mul_scale = Tensor::from_vector(mul, {kIn});
  }
  return t;
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const Tensor g = got.contiguous(), w = want.contiguous();  // bit for bit
  EXPECT_EQ(std::memcmp(g.data_ptr(), w.data_ptr(), g.nbytes()), 0) << what;
}

void expect_same_layer(const quant::QuantTensors& got, const quant::QuantTensors& want, const std::string& what) {
  expect_same(got.weight, want.weight, what + " weight");
  expect_same(got.weight_scale, want.weight_scale, what + " weight_scale");
  expect_same(got.bias, want.bias, what + " bias");
  expect_same(got.input_scale, want.input_scale, what + " input_scale");
  expect_same(got.input_offset, want.input_offset, what + " input_offset");
  expect_same(got.deq_scale, want.deq_scale, what + " deq_scale");
  expect_same(got.quant_bias, want.quant_bias, what + " quant_bias");
  expect_same(got.mul_scale, want.mul_scale, what + " mul_scale");
}

TEST(QuantFiles, EveryAlgorithmRoundTripsThroughTheMindieFiles) {
  for (const bool int64_deq : {false, true})
    for (const Algorithm algorithm : {Algorithm::w8a16, Algorithm::w8a8_dynamic, Algorithm::w8a8, Algorithm::w8a8_timestep}) {
      const std::string name(quant::algorithm_name(algorithm));
      SCOPED_TRACE(name + (int64_deq ? " i64 deq_scale" : " f32 deq_scale"));
      TempDir dir;
      quant::Writer writer;
      writer.algo = name;
      writer.deq_scale_int64 = int64_deq;
      const bool smooth_ok = algorithm != Algorithm::w8a16;  // MindIE's W8A16 has no mul_scale
      const quant::QuantTensors plain = layer_of(algorithm, 3, false, 4), smooth = layer_of(algorithm, 7, smooth_ok, 4);
      writer.add_layer("blocks.0.attn1.to_q", algorithm, plain);
      writer.add_layer("blocks.0.ffn.net.0.proj", algorithm, smooth);
      writer.add_float("norm_out.linear.weight", Tensor::zeros({kOut, kIn}, DType::f32));
      writer.save(dir.path.string());

      std::string lower = name;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const quant::Description d = quant::Description::load((dir.path / ("quant_model_description_" + lower + ".json")).string());
      EXPECT_EQ(d.model_quant_type, name);
      EXPECT_EQ(d.weight_path(), (dir.path / ("quant_model_weight_" + lower + ".safetensors")).string());
      EXPECT_EQ(d.quantized_modules(), (std::vector<std::string>{"blocks.0.attn1.to_q", "blocks.0.ffn.net.0.proj"}));
      EXPECT_EQ(d.algorithm_value("blocks.0.attn1.to_q"), name);
      EXPECT_EQ(d.algorithm_value("blocks.0.ffn.net.0.proj"), name);
      EXPECT_EQ(d.algorithm_value("norm_out.linear"), std::nullopt);      // FLOAT
      EXPECT_EQ(d.algorithm_value("blocks.1.attn1.to_q"), std::nullopt);  // not listed
      const SafetensorsFile weights = SafetensorsFile::open(d.weight_path());
      // The file holds MindIE's keys, dtypes and shapes.
      EXPECT_EQ(weights.tensor("blocks.0.attn1.to_q.weight").dtype(), DType::i8);
      if (algorithm != Algorithm::w8a8) {
        EXPECT_EQ(weights.tensor("blocks.0.attn1.to_q.weight_scale").shape(), (Shape{kOut, 1}));
      }
      if (algorithm == Algorithm::w8a8 || algorithm == Algorithm::w8a8_timestep) {
        EXPECT_EQ(weights.tensor("blocks.0.attn1.to_q.deq_scale").dtype(), int64_deq ? DType::i64 : DType::f32);
        EXPECT_EQ(weights.tensor("blocks.0.attn1.to_q.quant_bias").dtype(), DType::i32);
        EXPECT_FALSE(algorithm == Algorithm::w8a8 && weights.contains("blocks.0.attn1.to_q.bias"));  // folded into quant_bias
      }
      if (smooth_ok) {
        EXPECT_TRUE(weights.contains("blocks.0.ffn.net.0.proj.div.mul_scale"));
        EXPECT_TRUE(weights.contains("blocks.0.ffn.net.0.proj.linear.weight"));
      }
      // Static W8A8 files hold no weight scale (it is inside deq_scale), as msModelSlim writes them.
      const auto as_written = [&](quant::QuantTensors t) {
        if (algorithm == Algorithm::w8a8) t.weight_scale = Tensor();
        return t;
      };
      expect_same_layer(quant::read_layer_tensors(weights, "blocks.0.attn1.to_q", algorithm, true), as_written(plain), "plain layer");
      expect_same_layer(quant::read_layer_tensors(weights, "blocks.0.ffn.net.0.proj", algorithm, true), as_written(smooth),
                        "smoothed layer");
    }
}

TEST(QuantFiles, Int64DeqScaleHoldsTheFloatBitPattern) {
  // msModelSlim writes deq_scale for fp16 models as int64 holding the float32 bits (sign-extended).
  TempDir dir;
  const std::vector<float> deq = {0.5f, 3.0e-5f, 1.25f};
  std::vector<int64_t> bits;
  for (float v : deq) {
    int32_t b;
    std::memcpy(&b, &v, 4);
    bits.push_back(b);
  }
  const std::string path = (dir.path / "w.safetensors").string();
  write_safetensors(path, {{"l.weight", Tensor::zeros({3, 4}, DType::i8)},
                           {"l.input_scale", Tensor::from_vector(std::vector<float>{0.1f}, {1})},
                           {"l.input_offset", Tensor::from_vector(std::vector<float>{-3.0f}, {1})},
                           {"l.deq_scale", Tensor::from_vector(bits, {3})},
                           {"l.quant_bias", Tensor::zeros({3}, DType::i32)}});
  const quant::QuantTensors t = quant::read_layer_tensors(SafetensorsFile::open(path), "l", Algorithm::w8a8, false);
  const std::vector<double> got = values(t.deq_scale);
  for (std::size_t i = 0; i < deq.size(); ++i) EXPECT_EQ(got[i], static_cast<double>(deq[i])) << i;
}

TEST(QuantFiles, WeightFileNameFollowsTheDescriptionAndItsRank) {
  TempDir dir;
  const auto weight_of = [&](const std::string& file, const std::string& type) {
    dir.write(file, R"({"model_quant_type": ")" + type + R"("})");
    return std::filesystem::path(quant::Description::load((dir.path / file).string()).weight_path()).filename().string();
  };
  EXPECT_EQ(weight_of("quant_model_description_w8a8.json", "W8A8"), "quant_model_weight_w8a8.safetensors");
  EXPECT_EQ(weight_of("quant_model_description_w8a8_dynamic_3.json", "W8A8_DYNAMIC"), "quant_model_weight_w8a8_dynamic_3.safetensors");
  // "_dynamic" is not a rank: only trailing digits are.
  EXPECT_EQ(weight_of("quant_model_description_w8a8_dynamic.json", "W8A8_DYNAMIC"), "quant_model_weight_w8a8_dynamic.safetensors");
  EXPECT_EQ(weight_of("desc.json", "W8A16"), "quant_model_weight_w8a16.safetensors");
}

TEST(QuantFiles, ModuleMatchingAsMindie) {
  TempDir dir;
  const std::string path = dir.write("quant_model_description_w8a8.json", R"({
    "model_quant_type": "W8A8",
    "a.linear.weight": "W8A8", "a.div.mul_scale": "FLOAT",
    "norm_out.linear.weight": "w8a8_dynamic",
    "b.weight": "W8A8", "b.bias": "FLOAT",
    "c.weight": "FLOAT",
    "d.weight": "W8A8", "d": "FLOAT",
    "e.weight": "W4A4_MXFP4",
    "version": 3, "producer": "msmodelslim"})");
  const quant::Description d = quant::Description::load(path);
  // ".linear" is SmoothQuant's layout only beside a ".div.mul_scale"; per-layer values are case-insensitive.
  EXPECT_EQ(d.quantized_modules(), (std::vector<std::string>{"a", "b", "d", "e", "norm_out.linear"}));
  EXPECT_EQ(d.algorithm_value("a"), "W8A8");
  EXPECT_EQ(d.algorithm_value("norm_out.linear"), "w8a8_dynamic");
  EXPECT_EQ(d.algorithm_value("b"), "W8A8");  // a FLOAT bias does not exclude the layer
  EXPECT_EQ(d.algorithm_value("c"), std::nullopt);
  EXPECT_EQ(d.algorithm_value("d"), std::nullopt);        // an exclusion wins over the weight's entry
  EXPECT_EQ(d.algorithm_value("e"), "W4A4_MXFP4");        // MindIE's name: the stage says cubevec does not run it
  EXPECT_EQ(d.algorithm_value("version"), std::nullopt);  // metadata keys are not read
}

TEST(QuantFiles, MalformedDescriptionsNameTheFileAndTheProblem) {
  TempDir dir;
  const auto error = [&](const std::string& text) {
    const std::string path = dir.write("quant_model_description_x.json", text);
    return message_of([&] { quant::Description::load(path); });
  };
  EXPECT_NE(error("[1, 2]").find("quant_model_description_x.json: expected a JSON object"), std::string::npos);
  EXPECT_NE(error(R"({"a.weight": "W8A8"})").find("quant_model_description_x.json: missing 'model_quant_type'"), std::string::npos);
  EXPECT_NE(error(R"({"model_quant_type": 8})")
                .find("'model_quant_type' must be a string naming the file's algorithm (e.g. \"W8A8_DYNAMIC\"), got 8"),
            std::string::npos);
  // A tensor's entry must be FLOAT or an algorithm name (a typo would otherwise leave the layer float).
  EXPECT_NE(error(R"({"model_quant_type": "W8A8", "proj_out.weight": "W8A9"})")
                .find("'proj_out.weight' is \"W8A9\", neither FLOAT nor one of MindIE SD's algorithm names"),
            std::string::npos);
  EXPECT_NE(error(R"({"model_quant_type": "W8A8", "proj_out.weight": 5})")
                .find("'proj_out.weight' must be a string (FLOAT or an algorithm name), got 5"),
            std::string::npos);
  EXPECT_NE(error(R"({"model_quant_type": "W8A8", "proj_out.bias": null})").find("'proj_out.bias' must be a string"), std::string::npos);
  // Long names are shortened in messages.
  const std::string long_value(5000, 'W');
  const std::string long_error = error(R"({"model_quant_type": "W8A8", "x.weight": ")" + long_value + R"("})");
  EXPECT_LT(long_error.size(), 400u) << long_error.size();
  EXPECT_NE(
      error(R"({"model_quant_type": "w8a8"})").find("'model_quant_type' \"w8a8\" is not one of MindIE SD's algorithm names (exact case"),
      std::string::npos);
  EXPECT_NE(error(R"({"model_quant_type": "INT4"})").find("\"INT4\" is not one of MindIE SD's algorithm names"), std::string::npos);
  EXPECT_NE(error(R"({"model_quant_type": "W8A8",)").find("quant_model_description_x.json"), std::string::npos);
  EXPECT_NE(error("").find("quant_model_description_x.json"), std::string::npos);
  EXPECT_NE(message_of([&] { quant::Description::load((dir.path / "missing.json").string()); }).find("missing.json"), std::string::npos);
}

TEST(QuantFiles, MalformedLayerTensorsNameTheFileModuleAndKey) {
  TempDir dir;
  const std::string path = (dir.path / "quant_model_weight_w8a8.safetensors").string();
  const auto error = [&](NamedTensors tensors, Algorithm algorithm, bool has_bias = false) {
    write_safetensors(path, tensors);
    return message_of([&] { quant::read_layer_tensors(SafetensorsFile::open(path), "blocks.0.to_q", algorithm, has_bias); });
  };
  const Tensor w = Tensor::zeros({3, 4}, DType::i8), s3 = Tensor::from_vector(std::vector<float>{1, 1, 1}, {3, 1});
  EXPECT_NE(error({{"blocks.0.to_k.weight", w}}, Algorithm::w8a8_dynamic)
                .find("quant_model_weight_w8a8.safetensors: layer 'blocks.0.to_q' (W8A8_DYNAMIC) has no tensor 'blocks.0.to_q.weight'"),
            std::string::npos);
  EXPECT_NE(error({{"blocks.0.to_q.weight", Tensor::zeros({3, 4}, DType::f32)}}, Algorithm::w8a16)
                .find("'blocks.0.to_q.weight' must be i8 [out, in], got f32 [3, 4]"),
            std::string::npos);
  EXPECT_NE(error({{"blocks.0.to_q.weight", w}}, Algorithm::w8a16).find("has no tensor 'blocks.0.to_q.weight_scale'"), std::string::npos);
  EXPECT_NE(error({{"blocks.0.to_q.weight", w}, {"blocks.0.to_q.weight_scale", Tensor::zeros({4}, DType::f32)}}, Algorithm::w8a16)
                .find("'blocks.0.to_q.weight_scale' must have 3 values ([3]), got [4]"),
            std::string::npos);
  EXPECT_NE(error({{"blocks.0.to_q.weight", w}, {"blocks.0.to_q.weight_scale", Tensor::zeros({3}, DType::i32)}}, Algorithm::w8a16)
                .find("'blocks.0.to_q.weight_scale' must be f32, bf16 or f16, got i32"),
            std::string::npos);
  EXPECT_NE(error({{"blocks.0.to_q.weight", w}, {"blocks.0.to_q.weight_scale", s3}}, Algorithm::w8a8_dynamic, true)
                .find("has no tensor 'blocks.0.to_q.bias'"),
            std::string::npos);
  const NamedTensors statics = {{"blocks.0.to_q.weight", w},
                                {"blocks.0.to_q.input_scale", Tensor::from_vector(std::vector<float>{0.1f}, {1})},
                                {"blocks.0.to_q.input_offset", Tensor::from_vector(std::vector<float>{0.0f}, {1})},
                                {"blocks.0.to_q.deq_scale", Tensor::from_vector(std::vector<float>{1, 1, 1}, {3})}};
  EXPECT_NE(error(statics, Algorithm::w8a8).find("has no tensor 'blocks.0.to_q.quant_bias'"), std::string::npos);
  NamedTensors i64_bias = statics;
  i64_bias.push_back({"blocks.0.to_q.quant_bias", Tensor::zeros({3}, DType::i64)});
  EXPECT_NE(error(i64_bias, Algorithm::w8a8).find("'blocks.0.to_q.quant_bias' must be i32 [3], got i64 [3]"), std::string::npos);
  NamedTensors huge_bias = statics;
  huge_bias.push_back({"blocks.0.to_q.quant_bias", Tensor::from_vector(std::vector<int32_t>{0, INT32_MAX, 0}, {3})});
  EXPECT_NE(error(huge_bias, Algorithm::w8a8)
                .find("'blocks.0.to_q.quant_bias' element 1 is 2147483647: beyond +-2147418111 it would overflow the int32 sums of a "
                      "4-input layer"),
            std::string::npos);
  EXPECT_NE(
      error({{"blocks.0.to_q.weight", w},
             {"blocks.0.to_q.weight_scale", s3},
             {"blocks.0.to_q.weight_offset", Tensor::from_vector(std::vector<float>{0, 0.5f, 0}, {3, 1})}},
            Algorithm::w8a8_dynamic)
          .find("'blocks.0.to_q.weight_offset' must be zero (symmetric int8 weights; no weight offset is applied), channel 1 holds 0.5"),
      std::string::npos);
  NamedTensors i64_scale = statics;
  i64_scale[1] = {"blocks.0.to_q.input_scale", Tensor::zeros({1}, DType::i64)};
  i64_scale.push_back({"blocks.0.to_q.quant_bias", Tensor::zeros({3}, DType::i32)});
  EXPECT_NE(error(i64_scale, Algorithm::w8a8).find("'blocks.0.to_q.input_scale' must be a float tensor, got i64"), std::string::npos);
}

TEST(QuantFiles, ExcludeGlobs) {
  using pipelines::glob_match;
  EXPECT_TRUE(glob_match("proj_out", "proj_out"));
  EXPECT_FALSE(glob_match("proj_out", "proj_out2"));
  EXPECT_TRUE(glob_match("*proj_out", "single_transformer_blocks.3.proj_out"));
  EXPECT_TRUE(glob_match("transformer_blocks.?.attn.*", "transformer_blocks.7.attn.to_q"));
  EXPECT_FALSE(glob_match("transformer_blocks.?.attn.*", "transformer_blocks.17.attn.to_q"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYY"));
  EXPECT_TRUE(glob_match("**x", "abx"));
}

}  // namespace files_test
}  // namespace cubevec
