// require_finite names the tensor, the first bad element's index (in logical order, also for
// strided views) and its value, for f32, bf16 and f16.
#include "tensor/finite_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "base/error.h"
#include "tensor/half.h"

namespace finite_check_test {  // named after the file: unity batches never mix two files' helpers

using cubevec::DType;
using cubevec::Tensor;

std::string message_of(const Tensor& t) {
  try {
    cubevec::require_finite(t, "embeds.safetensors: tensor 'prompt_embeds'");
  } catch (const cubevec::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FiniteCheck, NamesTheFirstBadElementForEachFloatType) {
  Tensor f = Tensor::zeros({2, 3, 4}, DType::f32);
  EXPECT_EQ(message_of(f), "(no error)");
  static_cast<float*>(f.mutable_data_ptr())[1 * 12 + 0 * 4 + 1] = std::numeric_limits<float>::quiet_NaN();
  static_cast<float*>(f.mutable_data_ptr())[20] = std::numeric_limits<float>::infinity();  // later: not the first
  EXPECT_EQ(message_of(f), "embeds.safetensors: tensor 'prompt_embeds': element [1, 0, 1] is nan (expected finite values)");
  EXPECT_EQ(cubevec::first_non_finite(f), 1 * 12 + 0 * 4 + 1);

  Tensor b = Tensor::zeros({5}, DType::bf16);
  static_cast<uint16_t*>(b.mutable_data_ptr())[4] = cubevec::f32_to_bf16(-std::numeric_limits<float>::infinity());
  EXPECT_EQ(message_of(b), "embeds.safetensors: tensor 'prompt_embeds': element [4] is -inf (expected finite values)");

  Tensor h = Tensor::zeros({1, 2}, DType::f16);
  static_cast<uint16_t*>(h.mutable_data_ptr())[0] = 0x7C00;  // +inf
  EXPECT_EQ(message_of(h), "embeds.safetensors: tensor 'prompt_embeds': element [0, 0] is inf (expected finite values)");

  EXPECT_EQ(cubevec::first_non_finite(Tensor::zeros({3}, DType::i32)), std::nullopt) << "integers are always finite";
}

TEST(FiniteCheck, StridedViewsReportTheLogicalIndex) {
  Tensor f = Tensor::zeros({2, 3}, DType::f32);
  static_cast<float*>(f.mutable_data_ptr())[0 * 3 + 2] = std::numeric_limits<float>::quiet_NaN();  // [0, 2]
  const Tensor t = f.transpose(0, 1);                                                              // [3, 2]: the NaN is at [2, 0]
  EXPECT_EQ(message_of(t), "embeds.safetensors: tensor 'prompt_embeds': element [2, 0] is nan (expected finite values)");
}

}  // namespace finite_check_test
