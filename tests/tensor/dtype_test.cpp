#include <gtest/gtest.h>

#include "tensor/dtype.h"
#include "base/error.h"

namespace cubevec {
namespace dtype_test {  // named after the file: unity batches never mix two files' helpers

TEST(DType, SizesAndNames) {
  const std::pair<DType, std::size_t> sizes[] = {{DType::f32, 4}, {DType::f16, 2}, {DType::bf16, 2}, {DType::i8, 1},
                                                 {DType::u8, 1},  {DType::i32, 4}, {DType::i64, 8},  {DType::boolean, 1}};
  for (auto [dtype, size] : sizes) {
    EXPECT_EQ(dtype_size(dtype), size) << dtype_name(dtype);
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
  }
  EXPECT_EQ(dtype_name(DType::boolean), "bool");
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i32));
}

TEST(DType, UnknownNameListsTheKnownOnes) {
  try {
    parse_dtype("float32");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'float32'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

}  // namespace dtype_test
}  // namespace cubevec
