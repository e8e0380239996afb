// add, sub, mul, div with NumPy broadcasting, and muls_add; any strides in, contiguous out.
#include "ops/vector/common.h"

namespace cubevec::ops {

namespace {

Shape broadcast_shape(const char* op, const Tensor& a, const Tensor& b) {
  const std::size_t rank = std::max(a.shape().size(), b.shape().size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.shape().size() ? 1 : a.shape()[i - (rank - a.shape().size())];
    const int64_t db = i < rank - b.shape().size() ? 1 : b.shape()[i - (rank - b.shape().size())];
    if (da != db && da != 1 && db != 1)
      throw Error(std::string(op) + ": shapes " + shape_to_string(a.shape()) + " and " + shape_to_string(b.shape()) +
                  " do not broadcast (expected each trailing size to match or be 1; dimension " + std::to_string(i) + " has " +
                  std::to_string(da) + " and " + std::to_string(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// t's element strides over `shape` (t's dims aligned right), 0 where t broadcasts.
Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  Strides s(shape.size(), 0);
  const std::size_t lead = shape.size() - t.shape().size();
  for (std::size_t i = lead; i < shape.size(); ++i)
    if (t.shape()[i - lead] == shape[i] && shape[i] != 1) s[i] = t.strides()[i - lead];
  return s;
}

Tensor binary(const char* op, const Tensor& a, const Tensor& b, vk::BinaryOp kind, float scale, const Stream& stream,
              const char* a_name = "a", const char* b_name = "b") {
  const vk::Elem type = detail::float_elem(a, op, a_name);
  detail::float_elem(b, op, b_name);
  if (a.dtype() != b.dtype())
    throw Error(std::string(op) + ": " + a_name + " and " + b_name + " must have the same dtype, got " + a_name + " " + a.brief() +
                " and " + b_name + " " + b.brief());
  const Shape shape = broadcast_shape(op, a, b);
  Tensor out = stream.device().empty(shape, a.dtype(), stream);
  const detail::CollapsedLayout layout = detail::collapse(shape, {broadcast_strides(a, shape), broadcast_strides(b, shape)});
  const auto outer_rank = static_cast<int>(layout.shape.size()) - 1;
  if (outer_rank > vk::kMaxDims)
    throw Error(std::string(op) + ": the broadcast layout of " + a.brief() + " and " + b.brief() + " has too many dimensions (at most " +
                std::to_string(vk::kMaxDims + 1) + " after merging)");
  vk::BinaryArgs args;
  args.type = type;
  args.op = kind;
  args.scale = scale;
  args.rank = outer_rank;
  for (int d = 0; d < outer_rank; ++d) {
    args.outer_shape[d] = layout.shape[d];
    args.a_stride[d] = layout.strides[0][d];
    args.b_stride[d] = layout.strides[1][d];
  }
  args.inner = layout.shape.back();
  args.a_inner_stride = layout.strides[0].back();
  args.b_inner_stride = layout.strides[1].back();
  const int64_t numel = shape_numel(shape);
  const int64_t rows = args.inner == 0 ? 0 : numel / args.inner;
  const double bytes = detail::bytes_of(a) + detail::bytes_of(b) + detail::bytes_of(out);
  const vk::Kernels* k = &vk::kernels();
  stream.launch({op, Unit::vector, (kind == vk::BinaryOp::muls_add ? 2.0 : 1.0) * static_cast<double>(numel), bytes, DType::f32}, {a, b},
                {out}, [=]() mutable {
                  if (numel == 0) return;
                  args.a = detail::in_ptr(a);
                  args.b = detail::in_ptr(b);
                  args.out = detail::out_ptr(out);
                  detail::parallel_chunks(rows, args.inner, [&](int64_t r0, int64_t r1) { k->binary(args, r0, r1); });
                });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, const Stream& stream) { return binary("add", a, b, vk::BinaryOp::add, 1.0f, stream); }
Tensor sub(const Tensor& a, const Tensor& b, const Stream& stream) { return binary("sub", a, b, vk::BinaryOp::sub, 1.0f, stream); }
Tensor mul(const Tensor& a, const Tensor& b, const Stream& stream) { return binary("mul", a, b, vk::BinaryOp::mul, 1.0f, stream); }
Tensor div(const Tensor& a, const Tensor& b, const Stream& stream) { return binary("div", a, b, vk::BinaryOp::div, 1.0f, stream); }

Tensor muls_add(const Tensor& x, const Tensor& y, float scale, const Stream& stream) {
  detail::float_elem(x, "muls_add", "x");
  detail::float_elem(y, "muls_add", "y");
  if (x.shape() != y.shape())
    throw Error("muls_add: x and y must have the same shape, got x " + shape_to_string(x.shape()) + " and y " + shape_to_string(y.shape()));
  return binary("muls_add", x, y, vk::BinaryOp::muls_add, scale, stream, "x", "y");
}

}  // namespace cubevec::ops
