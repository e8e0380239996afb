// rotary_position_embedding: MindIE's RoPE for the BSND, BNSD and SBND layouts.
#include <cctype>

#include "ops/vector/common.h"
#include "base/enum_names.h"

namespace cubevec::ops {

RotatedMode parse_rotated_mode(std::string_view name) {
  static constexpr auto kNames = enum_names<RotatedMode>(
      "rotated_mode", {{RotatedMode::rotated_half, "rotated_half"}, {RotatedMode::rotated_interleaved, "rotated_interleaved"}});
  return kNames.parse(name);
}

Tensor rotary_position_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, RotatedMode mode, RopeLayout layout,
                                 const Stream& stream) {
  constexpr const char* op = "rotary_position_embedding";
  detail::float_elem(x, op, "x");
  const char* layout_name = layout == RopeLayout::BSND ? "BSND" : layout == RopeLayout::BNSD ? "BNSD" : "SBND";
  if (x.dim() != 4) throw Error(std::string(op) + ": x must be 4-D in layout " + layout_name + ", got " + x.brief());
  int64_t b = 0, s = 0, n = 0;
  const int64_t d = x.size(3);
  switch (layout) {
    case RopeLayout::BSND: b = x.size(0), s = x.size(1), n = x.size(2); break;
    case RopeLayout::BNSD: b = x.size(0), n = x.size(1), s = x.size(2); break;
    case RopeLayout::SBND: s = x.size(0), b = x.size(1), n = x.size(2); break;
  }
  if (d % 2 != 0)
    throw Error(std::string(op) + ": the head dim D = " + std::to_string(d) + " of x " + shape_to_string(x.shape()) + " must be even");
  const Shape two_d{s, d};
  const Shape four_d = layout == RopeLayout::BSND ? Shape{1, s, 1, d} : layout == RopeLayout::BNSD ? Shape{1, 1, s, d} : Shape{s, 1, 1, d};
  for (const auto& [t, what] : {std::pair{cos, "cos"}, std::pair{sin, "sin"}}) {
    detail::float_elem(t, op, what);
    if (t.shape() != two_d && t.shape() != four_d)
      throw Error(std::string(op) + ": " + what + " must have shape [S, D] = " + shape_to_string(two_d) + " or " + shape_to_string(four_d) +
                  " for x " + shape_to_string(x.shape()) + " in layout " + layout_name + ", got " + shape_to_string(t.shape()));
  }
  // cos and sin are read in their own dtype when they share it, else both as f32.
  const bool same = cos.dtype() == sin.dtype();
  const Tensor c = same ? detail::contiguous_on(cos, stream) : cast(cos, DType::f32, stream);
  const Tensor sn = same ? detail::contiguous_on(sin, stream) : cast(sin, DType::f32, stream);
  const Tensor xc = detail::contiguous_on(x, stream);
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  int64_t s_div = 1;
  if (layout == RopeLayout::BSND) s_div = n;
  if (layout == RopeLayout::SBND) s_div = b * n;
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  const double bytes = 2.0 * detail::bytes_of(xc) + detail::bytes_of(c) + detail::bytes_of(sn);
  const vk::Kernels* k = &vk::kernels();
  const bool interleaved = mode == RotatedMode::rotated_interleaved;
  const std::string name = std::string(op) + (interleaved ? "_interleaved" : "_half");
  stream.launch({name, Unit::vector, 3.0 * static_cast<double>(x.numel()), bytes, DType::f32}, {xc, c, sn}, {out}, [=] {
    vk::RopeArgs a;
    a.x = detail::in_ptr(xc);
    a.out = detail::out_ptr(out);
    a.type = detail::elem_of(xc.dtype());
    a.cos = detail::in_ptr(c);
    a.sin = detail::in_ptr(sn);
    a.cs_type = detail::elem_of(c.dtype());
    a.d = d;
    a.s_div = std::max<int64_t>(s_div, 1);
    a.s_mod = std::max<int64_t>(s, 1);
    a.interleaved = interleaved;
    detail::parallel_chunks(rows, d, [&](int64_t r0, int64_t r1) { k->rope(a, r0, r1); });
  });
  return out;
}

}  // namespace cubevec::ops
