// Parameters by name: loading fills every declared slot (converting bf16/f16 checkpoints), and a
// checkpoint that does not match lists every missing, unexpected, mis-shaped and non-float tensor.
#include <gtest/gtest.h>

#include <filesystem>

#include "models/layers.h"
#include "models/parameters.h"
#include "tensor/half.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace parameters_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

class ParametersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("cubevec_params_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

struct TinyModel {
  models::Linear proj;
  models::Vector1d norm;
  models::ParameterTable table;
  TinyModel() {
    proj.declare(table, "block.proj", 3, 2);
    norm.declare(table, "block.norm.weight", 4);
  }
};

TEST_F(ParametersTest, LoadsEveryTensorAndConvertsHalfCheckpoints) {
  const Tensor w = random_tensor({2, 3}, 1), b = random_tensor({2}, 2), n = random_tensor({4}, 3);
  write_safetensors(path("f32.safetensors"), {{"block.proj.weight", w}, {"block.proj.bias", b}, {"block.norm.weight", n}});
  TinyModel m;
  models::load_parameters(m.table, Checkpoint::open(path("f32.safetensors")));
  EXPECT_EQ(values(m.proj.weight), values(w));
  EXPECT_EQ(values(m.proj.bias), values(b));
  EXPECT_EQ(values(m.norm.value), values(n));
  // A bf16 checkpoint loads exactly into f32 (bf16 values are f32 values), or stays bf16.
  const Tensor w16 = random_tensor({2, 3}, 4, DType::bf16), b16 = random_tensor({2}, 5, DType::bf16),
               n16 = random_tensor({4}, 6, DType::f16);
  write_safetensors(path("half.safetensors"), {{"block.proj.weight", w16}, {"block.proj.bias", b16}, {"block.norm.weight", n16}});
  models::load_parameters(m.table, Checkpoint::open(path("half.safetensors")), DType::f32);
  EXPECT_EQ(m.proj.weight.dtype(), DType::f32);
  EXPECT_EQ(values(m.proj.weight), values(w16));
  EXPECT_EQ(values(m.norm.value), values(n16));
  models::load_parameters(m.table, Checkpoint::open(path("half.safetensors")), DType::bf16);
  EXPECT_EQ(m.proj.weight.dtype(), DType::bf16);
  EXPECT_EQ(m.proj.bias.dtype(), DType::f32) << "vectors stay f32";
  EXPECT_EQ(values(m.proj.weight), values(w16));
  // A Linear with a bf16 weight still computes x W^T + b (inputs rounded to bf16).
  const Tensor x = random_tensor({5, 3}, 7, DType::f32, 1.0f);
  const auto y = values(m.proj(x, ops::default_op_stream()));
  const auto xv = values(x), wv = values(w16), bv = values(b16);
  for (int r = 0; r < 5; ++r)
    for (int o = 0; o < 2; ++o) {
      double acc = bv[o];
      for (int i = 0; i < 3; ++i) acc += bf16_to_f32(f32_to_bf16(static_cast<float>(xv[r * 3 + i]))) * wv[o * 3 + i];
      EXPECT_NEAR(y[r * 2 + o], acc, 1e-5) << r << "," << o;
    }
}

TEST_F(ParametersTest, MismatchListsEveryProblemByName) {
  write_safetensors(path("bad.safetensors"), {{"block.proj.weight", random_tensor({3, 2}, 1)},
                                              {"block.extra", random_tensor({1}, 2)},
                                              {"block.norm.weight", Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4}, {4})},
                                              {"other.weight", random_tensor({2}, 3)}});
  TinyModel m;
  const std::string msg = message_of([&] { models::load_parameters(m.table, Checkpoint::open(path("bad.safetensors"))); });
  for (const char* expected :
       {"does not match the model (3 parameters expected)", "1 missing:\n    block.proj.bias [2]",
        "1 mis-shaped:\n    block.proj.weight: expected [2, 3], found [3, 2]",
        "not a float dtype (f32, bf16 or f16):\n    block.norm.weight: I32", "2 unexpected:\n    block.extra\n    other.weight"})
    EXPECT_NE(msg.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << msg;
  EXPECT_NE(msg.find(path("bad.safetensors")), std::string::npos) << msg;
  EXPECT_FALSE(m.proj.weight.defined()) << "nothing is loaded from a mismatching checkpoint";
}

TEST_F(ParametersTest, DuplicateDeclarationsAndBadDtypesAreErrors) {
  models::ParameterTable table;
  Tensor a, b;
  table.add("x", {1, 1}, &a);
  EXPECT_NE(message_of([&] { table.add("x", {2}, &b); }).find("parameter 'x' declared twice"), std::string::npos);
  EXPECT_NE(message_of([&] { models::make_random_parameters(table, DType::i8, 1); }).find("can be stored as f32 or bf16"),
            std::string::npos);
  models::make_meta_parameters(table, DType::bf16);
  EXPECT_FALSE(a.has_storage());
  EXPECT_EQ(a.dtype(), DType::bf16);
  models::make_random_parameters(table, DType::f32, 7, 0.5f);
  EXPECT_LE(std::abs(values(a)[0]), 0.5);
  EXPECT_EQ(table.numel(), 1);
  Tensor vec;
  table.add("v", {3}, &vec);
  models::make_meta_parameters(table, DType::bf16);
  EXPECT_EQ(vec.dtype(), DType::f32) << "vectors stay f32 under bf16";
}

}  // namespace parameters_test
}  // namespace cubevec
