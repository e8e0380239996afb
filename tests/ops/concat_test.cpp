// concat against index arithmetic: every dim, strided parts, bf16, and the shape errors.
#include <gtest/gtest.h>

#include "ops/vector_ops.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace concat_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

TEST(Concat, EveryDimMatchesIndexArithmetic) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      Shape sa{2, 3, 5}, sb{2, 3, 5};
      sa[static_cast<std::size_t>(dim)] = 4;
      sb[static_cast<std::size_t>(dim)] = 1;
      const Tensor a = random_tensor(sa, 1, dtype), b = strided_copy_of(random_tensor(sb, 2, dtype));
      const Tensor out = ops::concat({a, b}, dim);
      Shape want_shape{2, 3, 5};
      want_shape[static_cast<std::size_t>(dim)] = 5;
      ASSERT_EQ(out.shape(), want_shape);
      const auto av = values(a), bv = values(b), ov = values(out);
      for (int64_t i = 0; i < want_shape[0]; ++i)
        for (int64_t j = 0; j < want_shape[1]; ++j)
          for (int64_t k = 0; k < want_shape[2]; ++k) {
            int64_t idx[3] = {i, j, k};
            const bool from_a = idx[dim] < sa[static_cast<std::size_t>(dim)];
            if (!from_a) idx[dim] -= sa[static_cast<std::size_t>(dim)];
            const Shape& s = from_a ? sa : sb;
            const double want = (from_a ? av : bv)[static_cast<std::size_t>((idx[0] * s[1] + idx[1]) * s[2] + idx[2])];
            ASSERT_EQ(ov[static_cast<std::size_t>((i * want_shape[1] + j) * want_shape[2] + k)], want) << dim;
          }
    }
  }
}

TEST(Concat, MismatchedPartsAreErrors) {
  const Tensor a = random_tensor({2, 3}, 1), b = random_tensor({3, 3}, 2);
  EXPECT_NE(message_of([&] {
              ops::concat({a, b}, 1);
            }).find("concat: part 1 (f32 [3, 3]) must match part 0 (f32 [2, 3]) in dtype and every dim but 1"),
            std::string::npos);
  EXPECT_NE(message_of([&] { ops::concat({}, 0); }).find("needs at least one tensor"), std::string::npos);
  EXPECT_NE(message_of([&] { ops::concat({a}, 2); }).find("dim out of range"), std::string::npos);
  EXPECT_NE(message_of([&] { ops::concat({a, random_tensor({2, 3}, 3, DType::bf16)}, 0); }).find("must match part 0"), std::string::npos);
}

}  // namespace concat_test
}  // namespace cubevec
