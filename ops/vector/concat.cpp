// concat: the parts copied side by side along one dim, in one Vector-unit kernel.
#include <cstring>

#include "ops/vector/common.h"

namespace cubevec::ops {

Tensor concat(const std::vector<Tensor>& parts, int64_t dim, const Stream& stream) {
  if (parts.empty()) throw Error("concat: needs at least one tensor");
  const Tensor& first = parts.front();
  if (!first.defined()) throw Error("concat: part 0 is undefined");
  const int64_t rank = first.dim();
  if (dim < 0) dim += rank;
  if (dim < 0 || dim >= rank) throw Error("concat: dim out of range for " + first.brief());
  Shape shape = first.shape();
  shape[static_cast<std::size_t>(dim)] = 0;
  std::vector<Tensor> inputs;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    bool same = p.defined() && p.dim() == rank && p.dtype() == first.dtype();
    for (int64_t d = 0; same && d < rank; ++d) same = d == dim || p.size(d) == first.size(d);
    if (!same)
      throw Error("concat: part " + std::to_string(i) + " (" + (p.defined() ? p.brief() : "undefined") + ") must match part 0 (" +
                  first.brief() + ") in dtype and every dim but " + std::to_string(dim));
    shape[static_cast<std::size_t>(dim)] += p.size(dim);
    inputs.push_back(detail::contiguous_on(p, stream));
  }
  Tensor out = stream.device().empty(shape, first.dtype(), stream);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[static_cast<std::size_t>(d)];
  for (int64_t d = dim + 1; d < rank; ++d) inner *= shape[static_cast<std::size_t>(d)];
  const auto item = static_cast<int64_t>(first.itemsize());
  const int64_t out_row = shape[static_cast<std::size_t>(dim)] * inner * item;
  stream.launch({"concat", Unit::vector, 0.0, 2.0 * static_cast<double>(out.nbytes()), DType::f32}, inputs, {out},
                [inputs, out, outer, inner, item, out_row, dim] {
                  std::byte* dst = out.unsynchronized_data_ptr();
                  detail::parallel_chunks(outer, out_row / item, [&](int64_t o0, int64_t o1) {
                    for (int64_t o = o0; o < o1; ++o) {
                      int64_t offset = 0;
                      for (const Tensor& p : inputs) {
                        const int64_t bytes = p.size(dim) * inner * item;
                        std::memcpy(dst + o * out_row + offset, p.unsynchronized_data_ptr() + o * bytes, static_cast<std::size_t>(bytes));
                        offset += bytes;
                      }
                    }
                  });
                });
  return out;
}

}  // namespace cubevec::ops
