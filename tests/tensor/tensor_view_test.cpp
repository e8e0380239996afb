// Views are checked element by element: each test states, with its own index arithmetic, which
// element of the base tensor every view element must be, and reads the view two ways (at() and
// the linear order of contiguous()).
#include <gtest/gtest.h>

#include <functional>

#include "tensor/tensor.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace tensor_view_test {  // named after the file: unity batches never mix two files' helpers

using testing::message_of;

// A contiguous f32 tensor whose element at linear position p holds p.
Tensor arange(const Shape& shape) {
  std::vector<float> values(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  return Tensor::from_vector(values, shape);
}

void for_each_index(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& visit) {
  if (shape_numel(shape) == 0) return;
  std::vector<int64_t> index(shape.size(), 0);
  while (true) {
    visit(index);
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// `expected_linear(index)` is the base tensor's linear position that view[index] must hold.
void expect_view(const Tensor& view, const Shape& shape, const std::function<int64_t(const std::vector<int64_t>&)>& expected_linear) {
  ASSERT_EQ(view.shape(), shape);
  const Tensor packed = view.contiguous();
  ASSERT_TRUE(packed.is_contiguous());
  const float* linear = packed.data<float>();
  int64_t position = 0;
  for_each_index(shape, [&](const std::vector<int64_t>& index) {
    const auto want = static_cast<float>(expected_linear(index));
    EXPECT_EQ(view.at<float>(index), want) << "at " << shape_to_string(index);
    EXPECT_EQ(linear[position], want) << "contiguous() at " << shape_to_string(index);
    ++position;
  });
  EXPECT_EQ(position, shape_numel(shape));
}

TEST(TensorView, ContiguousLayoutAndNumel) {
  const Tensor t = arange({2, 3, 4});
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 64, 0u) << "allocations are 64-byte aligned";
}

TEST(TensorView, PermuteAndTranspose) {
  const Tensor t = arange({2, 3, 4});  // base[i][j][k] = 12 i + 4 j + k
  const Tensor p = t.permute({2, 0, 1});
  EXPECT_TRUE(p.shares_storage_with(t));
  EXPECT_FALSE(p.is_contiguous());
  expect_view(p, {4, 2, 3}, [](const auto& x) { return 12 * x[1] + 4 * x[2] + x[0]; });
  expect_view(t.transpose(0, 2), {4, 3, 2}, [](const auto& x) { return 12 * x[2] + 4 * x[1] + x[0]; });
  expect_view(t.transpose(-1, 1), {2, 4, 3}, [](const auto& x) { return 12 * x[0] + 4 * x[2] + x[1]; });
}

TEST(TensorView, NarrowSliceSelect) {
  const Tensor t = arange({5, 6});  // base[i][j] = 6 i + j
  expect_view(t.narrow(1, 2, 3), {5, 3}, [](const auto& x) { return 6 * x[0] + x[1] + 2; });
  expect_view(t.slice(0, 1, 5, 2), {2, 6}, [](const auto& x) { return 6 * (1 + 2 * x[0]) + x[1]; });
  expect_view(t.slice(1, -4, 6, 3), {5, 2}, [](const auto& x) { return 6 * x[0] + 2 + 3 * x[1]; });
  expect_view(t.select(1, 4), {5}, [](const auto& x) { return 6 * x[0] + 4; });
  expect_view(t.select(0, -1), {6}, [](const auto& x) { return 24 + x[0]; });
  // Views of views compose.
  expect_view(t.transpose(0, 1).narrow(1, 1, 3).slice(0, 0, 6, 4), {2, 3}, [](const auto& x) { return 6 * (1 + x[1]) + 4 * x[0]; });
}

TEST(TensorView, ViewAndReshape) {
  const Tensor t = arange({2, 3, 4});
  const Tensor v = t.view({6, -1});
  EXPECT_TRUE(v.shares_storage_with(t));
  expect_view(v, {6, 4}, [](const auto& x) { return 4 * x[0] + x[1]; });
  expect_view(t.view({24}), {24}, [](const auto& x) { return x[0]; });
  // Splitting a dim of a permuted tensor is still a view when each run stays intact.
  const Tensor p = t.permute({1, 2, 0});  // [3, 4, 2]
  const Tensor split = p.view({3, 2, 2, 2});
  EXPECT_TRUE(split.shares_storage_with(t));
  expect_view(split, {3, 2, 2, 2}, [](const auto& x) { return 12 * x[3] + 4 * x[0] + 2 * x[1] + x[2]; });
  // Merging dims that are not contiguous with each other cannot be a view; reshape copies instead.
  const Tensor merged = p.view({12, 2});  // j and k stay one contiguous run: still a view
  EXPECT_TRUE(merged.shares_storage_with(t));
  expect_view(merged, {12, 2}, [](const auto& x) { return 12 * x[1] + 4 * (x[0] / 4) + x[0] % 4; });
  EXPECT_NE(message_of([&] { p.view({6, 4}); }).find("cannot view"), std::string::npos);
  const Tensor r = p.reshape({6, 4});
  EXPECT_FALSE(r.shares_storage_with(t));
  expect_view(r, {6, 4}, [](const auto& x) {
    const int64_t linear = 4 * x[0] + x[1];  // row-major position in p = (j, k, i) -> 8 j + 2 k + i
    return 12 * (linear % 2) + 4 * (linear / 8) + (linear % 8) / 2;
  });
  // A size-1 dim with any stride does not break viewability.
  expect_view(t.narrow(0, 1, 1).view({3, 4}), {3, 4}, [](const auto& x) { return 12 + 4 * x[0] + x[1]; });
}

TEST(TensorView, ViewOfSlicedRowsKeepsRowStride) {
  const Tensor t = arange({4, 8});
  const Tensor rows = t.narrow(1, 0, 4);  // [4, 4] with row stride 8
  const Tensor v = rows.view({4, 2, 2});
  EXPECT_TRUE(v.shares_storage_with(t));
  expect_view(v, {4, 2, 2}, [](const auto& x) { return 8 * x[0] + 2 * x[1] + x[2]; });
  EXPECT_NE(message_of([&] { rows.view({16}); }).find("[4, 4]"), std::string::npos);
}

TEST(TensorView, ExpandBroadcasts) {
  const Tensor t = arange({3, 1});
  const Tensor e = t.expand({2, 3, 4});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  expect_view(e, {2, 3, 4}, [](const auto& x) { return x[1]; });
  expect_view(t.expand({-1, 5}), {3, 5}, [](const auto& x) { return x[0]; });
  EXPECT_NE(message_of([&] { t.expand({4, 4}); }).find("cannot expand shape [3, 1] to [4, 4]"), std::string::npos);
  EXPECT_NE(message_of([&] { t.expand({4}); }).find("fewer dimensions"), std::string::npos);
}

TEST(TensorView, UnsqueezeSqueeze) {
  const Tensor t = arange({2, 3});
  expect_view(t.unsqueeze(0), {1, 2, 3}, [](const auto& x) { return 3 * x[1] + x[2]; });
  expect_view(t.unsqueeze(-1), {2, 3, 1}, [](const auto& x) { return 3 * x[0] + x[1]; });
  EXPECT_TRUE(t.unsqueeze(1).is_contiguous());
  expect_view(t.unsqueeze(1).squeeze(1), {2, 3}, [](const auto& x) { return 3 * x[0] + x[1]; });
  EXPECT_NE(message_of([&] { t.squeeze(0); }).find("has size 2, expected 1"), std::string::npos);
}

TEST(TensorView, ZeroSizeAndScalar) {
  const Tensor empty = Tensor::empty({3, 0, 2}, DType::f32);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.view({0, 5}).shape(), (Shape{0, 5}));
  EXPECT_EQ(empty.permute({2, 1, 0}).contiguous().numel(), 0);
  EXPECT_NE(message_of([&] { empty.view({-1, 0}); }).find("ambiguous"), std::string::npos);
  const Tensor scalar = Tensor::from_vector(std::vector<float>{7.5f}, {});
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.at<float>({}), 7.5f);
  EXPECT_EQ(scalar.view({1, 1}).at<float>({0, 0}), 7.5f);
  EXPECT_EQ(scalar.unsqueeze(0).shape(), (Shape{1}));
}

TEST(TensorView, ContiguousCopiesOnlyWhenNeeded) {
  const Tensor t = arange({4, 5});
  EXPECT_EQ(t.contiguous().data_ptr(), t.data_ptr());
  EXPECT_EQ(t.narrow(0, 1, 2).contiguous().data_ptr(), t.narrow(0, 1, 2).data_ptr());
  const Tensor c = t.transpose(0, 1).contiguous();
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_TRUE(c.is_contiguous());
  const Tensor k = t.clone();
  EXPECT_FALSE(k.shares_storage_with(t));
}

TEST(TensorView, CopyFromAnyStridesAndEveryItemSize) {
  for (DType dtype : {DType::u8, DType::bf16, DType::i32, DType::i64}) {
    Tensor src = Tensor::empty({3, 4}, dtype);
    auto* bytes = static_cast<uint8_t*>(src.mutable_data_ptr());
    for (std::size_t i = 0; i < src.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
    Tensor dst = Tensor::zeros({4, 3}, dtype);
    dst.transpose(0, 1).copy_from(src);
    const std::size_t item = dtype_size(dtype);
    const auto* out = static_cast<const uint8_t*>(dst.data_ptr());
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j)
        for (std::size_t b = 0; b < item; ++b) EXPECT_EQ(out[(j * 3 + i) * item + b], bytes[(i * 4 + j) * item + b]) << dtype_name(dtype);
  }
}

TEST(TensorView, CopyFromOverlappingSourceIsSafe) {
  Tensor t = arange({3, 3});
  t.copy_from(t.transpose(0, 1));  // in-place transpose through the same storage
  expect_view(t, {3, 3}, [](const auto& x) { return 3 * x[1] + x[0]; });
}

TEST(TensorView, InvalidViewsNameTheShapes) {
  const Tensor t = arange({2, 3, 4});
  EXPECT_NE(message_of([&] {
              t.view({5, 5});
            }).find("cannot view a tensor of shape [2, 3, 4] (24 elements) as shape [5, 5]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { t.view({-1, -1}); }).find("more than one -1"), std::string::npos);
  EXPECT_NE(message_of([&] { t.view({5, -1}); }).find("not divisible"), std::string::npos);
  EXPECT_NE(message_of([&] { t.permute({0, 1}); }).find("expected one per dimension of shape [2, 3, 4]"), std::string::npos);
  EXPECT_NE(message_of([&] { t.permute({0, 1, 1}); }).find("repeats dimension 1"), std::string::npos);
  EXPECT_NE(message_of([&] { t.transpose(0, 3); }).find("dimension 3 is out of range for a tensor of rank 3"), std::string::npos);
  EXPECT_NE(message_of([&] { t.narrow(2, 3, 2); }).find("do not fit dimension 2 of size 4 in shape [2, 3, 4]"), std::string::npos);
  EXPECT_NE(message_of([&] { t.slice(1, 2, 7); }).find("out of range for dimension 1 of size 3"), std::string::npos);
  EXPECT_NE(message_of([&] { t.slice(1, 0, 3, 0); }).find("step must be positive"), std::string::npos);
  EXPECT_NE(message_of([&] { t.select(0, 2); }).find("index 2 is out of range for dimension 0 of size 2"), std::string::npos);
  EXPECT_NE(message_of([&] { t.at<float>({0, 3, 0}); }).find("out of bounds"), std::string::npos);
  EXPECT_NE(message_of([&] { t.at<int32_t>({0, 0, 0}); }).find("dtype f32 accessed as i32"), std::string::npos);
  EXPECT_NE(message_of([&] { Tensor::empty({2, -3}, DType::f32); }).find("sizes must be non-negative"), std::string::npos);
  EXPECT_NE(message_of([&] { Tensor::empty({int64_t{1} << 40, int64_t{1} << 40}, DType::f32); }).find("overflows"), std::string::npos);
}

TEST(TensorView, FromStorageChecksBounds) {
  auto storage = Storage::allocate(24 * sizeof(float), default_allocator());
  const Tensor ok = Tensor::from_storage(storage, {2, 3}, {1, 8}, 4, DType::f32);  // reaches element 4 + 1 + 16 = 21
  EXPECT_EQ(ok.numel(), 6);
  EXPECT_NE(message_of([&] {
              Tensor::from_storage(storage, {2, 3}, {1, 8}, 7, DType::f32);
            }).find("reaches element 24 but the storage holds 24 elements"),
            std::string::npos);
  EXPECT_NE(message_of([&] { Tensor::from_storage(storage, {2}, {-1}, 1, DType::f32); }).find("negative stride"), std::string::npos);
  EXPECT_NE(message_of([&] { Tensor::from_storage(storage, {2}, {1, 1}, 0, DType::f32); }).find("rank of strides"), std::string::npos);
}

TEST(TensorView, MetaTensorsHaveNoData) {
  const Tensor m = Tensor::meta({4096, 3072}, DType::bf16);
  EXPECT_FALSE(m.has_storage());
  EXPECT_EQ(m.nbytes(), 4096u * 3072u * 2u);
  const Tensor v = m.transpose(0, 1).reshape({-1});
  EXPECT_EQ(v.shape(), (Shape{4096 * 3072}));
  EXPECT_NE(message_of([&] { m.data_ptr(); }).find("no storage"), std::string::npos);
}

TEST(TensorView, ReadOnlyStorageRefusesWrites) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  auto storage = Storage::borrow(owner->data(), 16, owner, /*read_only=*/true);
  Tensor t = Tensor::from_storage(storage, {4}, {1}, 0, DType::f32);
  EXPECT_EQ(t.at<float>({2}), 3.0f);
  EXPECT_NE(message_of([&] { t.mutable_data<float>(); }).find("read-only"), std::string::npos);
  Tensor copy = t.clone();
  copy.mutable_data<float>()[0] = 9.0f;
  EXPECT_EQ((*owner)[0], 1.0f);
}

}  // namespace tensor_view_test
}  // namespace cubevec
