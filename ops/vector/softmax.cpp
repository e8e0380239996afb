// Softmax over the last dimension, shifted by each row's max.
#include "ops/vector/common.h"

namespace cubevec::ops {

Tensor softmax(const Tensor& x, const Stream& stream) {
  detail::float_elem(x, "softmax", "x");
  if (x.dim() == 0) throw Error("softmax: x must have at least one dimension, got a scalar");
  const Tensor xc = detail::contiguous_on(x, stream);
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  const int64_t width = x.size(-1);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;
  const vk::Kernels* k = &vk::kernels();
  stream.launch({"softmax", Unit::vector, 5.0 * static_cast<double>(x.numel()), 2.0 * detail::bytes_of(xc), DType::f32}, {xc}, {out}, [=] {
    vk::RowArgs a;
    a.x = detail::in_ptr(xc);
    a.out = detail::out_ptr(out);
    a.type = detail::elem_of(xc.dtype());
    a.width = width;
    detail::parallel_chunks(rows, width, [&](int64_t r0, int64_t r1) { k->softmax(a, r0, r1); });
  });
  return out;
}

}  // namespace cubevec::ops
