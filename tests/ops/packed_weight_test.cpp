// Weights packed once (ops::pack_weight, models::Linear's cache) give exactly the result of packing
// on every call, at shapes with partial panels and several K blocks, f32 and bf16; a packed weight
// used with another shape is an error, and a Linear whose weight is replaced repacks.
#include <gtest/gtest.h>

#include "models/layers.h"
#include "ops/gemm.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace packed_weight_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

TEST(PackedWeight, SameResultAsPackingEveryCall) {
  const int64_t shapes[][3] = {{5, 33, 17}, {70, 100, 800}, {3, 40, 1600}, {130, 64, 3100}};
  for (const auto& s : shapes) {
    for (DType wtype : {DType::f32, DType::bf16}) {
      for (DType compute : {DType::f32, DType::bf16}) {
        if (wtype == DType::bf16 && compute == DType::f32) continue;
        const Tensor a = random_tensor({s[0], s[2]}, 1), w = random_tensor({s[1], s[2]}, 2, wtype), bias = random_tensor({s[1]}, 3);
        const ops::MatmulOptions plain{.bias = bias, .b_is_weight = true, .compute = compute};
        ops::MatmulOptions packed = plain;
        packed.packed_weight = ops::pack_weight(w, compute);
        EXPECT_EQ(values(ops::matmul(a, w, packed)), values(ops::matmul(a, w, plain)))
            << s[0] << "x" << s[1] << "x" << s[2] << " " << dtype_name(wtype) << " compute " << dtype_name(compute);
      }
    }
  }
}

TEST(PackedWeight, MismatchIsAnErrorAndLinearRepacksAReplacedWeight) {
  const Tensor a = random_tensor({4, 16}, 1), w = random_tensor({8, 16}, 2);
  ops::MatmulOptions o{.b_is_weight = true};
  o.packed_weight = ops::pack_weight(random_tensor({9, 16}, 3));
  EXPECT_NE(message_of([&] { ops::matmul(a, w, o); }).find("packed_weight was made for another weight"), std::string::npos);
  o.packed_weight = ops::pack_weight(w, DType::bf16);
  EXPECT_NE(message_of([&] { ops::matmul(a, w, o); }).find("packed_weight was made for another weight"), std::string::npos);
  models::Linear linear;
  models::ParameterTable table;
  linear.declare(table, "l", 16, 8, false);
  linear.weight = w;
  const auto first = values(linear(a, ops::default_op_stream()));
  EXPECT_EQ(first, values(ops::matmul(a, w, {.b_is_weight = true})));
  linear.weight = random_tensor({8, 16}, 4);
  EXPECT_EQ(values(linear(a, ops::default_op_stream())), values(ops::matmul(a, linear.weight, {.b_is_weight = true})));
}

}  // namespace packed_weight_test
}  // namespace cubevec
