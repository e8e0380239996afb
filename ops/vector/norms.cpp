// RMSNorm, fast_layernorm, layernorm_scale_shift (AdaLN), GroupNorm and the channel L2 norm
// (normalize_channels).
#include <algorithm>
#include <cmath>

#include "ops/vector/common.h"

namespace cubevec::ops {

namespace {

int64_t last_size(const Tensor& x, const char* op) {
  if (x.dim() == 0) throw Error(std::string(op) + ": x must have at least one dimension, got a scalar");
  return x.size(-1);
}

void check_eps(float eps, const char* op) {
  if (!(eps > 0)) throw Error(std::string(op) + ": eps must be positive, got " + std::to_string(eps));
}

std::string h_text(int64_t h) { return "[H] = [" + std::to_string(h) + "]"; }

// Launches `entry` of the kernel table over the rows of x (contiguous), filling `args` pointers
// in the kernel body.
template <class Fill>
void launch_rows(const char* name, const Tensor& x, std::vector<Tensor> reads, std::vector<Tensor> writes, double flops_per_element,
                 double bytes, const Stream& stream, void (*entry)(const vk::RowArgs&, int64_t, int64_t), Fill fill) {
  const int64_t width = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;
  const DType compute = DType::f32;
  stream.launch({name, Unit::vector, flops_per_element * static_cast<double>(x.numel()), bytes, compute}, reads, writes,
                [rows, width, entry, fill] {
                  vk::RowArgs args;
                  args.width = width;
                  fill(args);
                  detail::parallel_chunks(rows, width, [&](int64_t r0, int64_t r1) { entry(args, r0, r1); });
                });
}

// The layer norm shared by fast_layernorm and layernorm_scale_shift: x contiguous f32/bf16,
// weight/bias contiguous f32 or undefined, scale/shift contiguous with param_div, or undefined.
LayerNormResult layer_norm(const char* name, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& scale,
                           const Tensor& shift, int64_t param_div, float eps, bool want_stats, const Stream& stream) {
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  Shape stat_shape = x.shape();
  stat_shape.pop_back();
  Tensor mean, rstd;
  std::vector<Tensor> writes = {out};
  if (want_stats) {
    mean = stream.device().empty(stat_shape, DType::f32, stream);
    rstd = stream.device().empty(stat_shape, DType::f32, stream);
    writes.push_back(mean);
    writes.push_back(rstd);
  }
  std::vector<Tensor> reads = {x};
  for (const Tensor& t : {weight, bias, scale, shift})
    if (t.defined()) reads.push_back(t);
  double bytes = 2.0 * detail::bytes_of(x) + detail::bytes_of(mean) + detail::bytes_of(rstd);
  for (const Tensor& t : {weight, bias, scale, shift}) bytes += detail::bytes_of(t);
  const vk::Kernels* k = &vk::kernels();
  launch_rows(name, x, reads, writes, scale.defined() ? 10.0 : 8.0, bytes, stream, k->layer_norm, [=](vk::RowArgs& a) {
    a.x = detail::in_ptr(x);
    a.out = detail::out_ptr(out);
    a.type = detail::elem_of(x.dtype());
    a.eps = eps;
    a.weight = detail::f32_ptr(weight);
    a.bias = detail::f32_ptr(bias);
    a.mean = mean.defined() ? reinterpret_cast<float*>(detail::out_ptr(mean)) : nullptr;
    a.rstd = rstd.defined() ? reinterpret_cast<float*>(detail::out_ptr(rstd)) : nullptr;
    a.scale = detail::in_ptr(scale);
    a.shift = detail::in_ptr(shift);
    a.param_type = scale.defined() ? detail::elem_of(scale.dtype()) : vk::Elem::f32;
    a.param_div = param_div;
  });
  return {out, mean, rstd};
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, const Stream& stream) {
  constexpr const char* op = "rms_norm";
  detail::float_elem(x, op, "x");
  const int64_t h = last_size(x, op);
  const Tensor w =
      detail::f32_param(weight, {h}, h_text(h) + " with H the last size of x " + shape_to_string(x.shape()), op, "weight", stream);
  check_eps(eps, op);
  const Tensor xc = detail::contiguous_on(x, stream);
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  std::vector<Tensor> reads = {xc};
  if (w.defined()) reads.push_back(w);
  const double bytes = 2.0 * detail::bytes_of(xc) + detail::bytes_of(w);
  const vk::Kernels* k = &vk::kernels();
  launch_rows(op, xc, reads, {out}, 4.0, bytes, stream, k->rms_norm, [=](vk::RowArgs& a) {
    a.x = detail::in_ptr(xc);
    a.out = detail::out_ptr(out);
    a.type = detail::elem_of(xc.dtype());
    a.eps = eps;
    a.weight = detail::f32_ptr(w);
  });
  return out;
}

LayerNormResult fast_layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, LayerNormImpl impl_mode,
                               const Stream& stream) {
  constexpr const char* op = "fast_layernorm";
  if (!x.defined()) throw Error("fast_layernorm: x is undefined");
  const int64_t h = last_size(x, op);
  const std::string param_shape = h_text(h) + " with H the last size of x " + shape_to_string(x.shape());
  check_eps(eps, op);
  if (impl_mode == LayerNormImpl::fp16) {
    for (const auto& [t, what] : {std::pair{x, "x"}, std::pair{weight, "weight"}, std::pair{bias, "bias"}})
      if (t.defined() && t.dtype() != DType::f16)
        throw Error(std::string("fast_layernorm: impl_mode fp16 needs f16 x, weight and bias, got ") + what + " " + t.brief());
    const Tensor w = detail::f32_param(weight, {h}, param_shape, op, "weight", stream, true);
    const Tensor b = detail::f32_param(bias, {h}, param_shape, op, "bias", stream, true);
    const Tensor x32 = cast(x, DType::f32, stream);
    LayerNormResult r = layer_norm(op, x32, w, b, {}, {}, 1, eps, true, stream);
    r.out = cast(r.out, DType::f16, stream);
    return r;
  }
  if (x.dtype() == DType::f16) throw Error("fast_layernorm: x must be f32 or bf16 (f16 needs impl_mode fp16), got " + x.brief());
  detail::float_elem(x, op, "x");
  // high_precision and high_performance share one kernel: f32 statistics in two passes over the
  // row, which is in L1, so the precise form costs nothing measurable.
  const Tensor w = detail::f32_param(weight, {h}, param_shape, op, "weight", stream);
  const Tensor b = detail::f32_param(bias, {h}, param_shape, op, "bias", stream);
  return layer_norm(op, detail::contiguous_on(x, stream), w, b, {}, {}, 1, eps, true, stream);
}

Tensor layernorm_scale_shift(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& weight, const Tensor& bias, float eps,
                             const Stream& stream) {
  constexpr const char* op = "layernorm_scale_shift";
  detail::float_elem(x, op, "x");
  if (x.dim() != 3) throw Error("layernorm_scale_shift: x must be [B, S, H], got " + x.brief());
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2);
  const Shape per_batch{b, h}, per_batch3{b, 1, h}, per_token{b, s, h};
  const std::string expected = "[B, H], [B, 1, H] or [B, S, H] = " + shape_to_string(per_batch) + ", " + shape_to_string(per_batch3) +
                               " or " + shape_to_string(per_token) + " for x " + shape_to_string(x.shape());
  for (const auto& [t, what] : {std::pair{scale, "scale"}, std::pair{shift, "shift"}}) {
    detail::float_elem(t, op, what);
    if (t.shape() != per_batch && t.shape() != per_batch3 && t.shape() != per_token)
      throw Error(std::string("layernorm_scale_shift: ") + what + " must have shape " + expected + ", got " + shape_to_string(t.shape()));
  }
  if (scale.shape() != shift.shape())
    throw Error("layernorm_scale_shift: scale and shift must have the same shape, got " + shape_to_string(scale.shape()) + " and " +
                shape_to_string(shift.shape()));
  check_eps(eps, op);
  const std::string param_shape = h_text(h) + " with H the last size of x " + shape_to_string(x.shape());
  const Tensor w = detail::f32_param(weight, {h}, param_shape, op, "weight", stream);
  const Tensor bi = detail::f32_param(bias, {h}, param_shape, op, "bias", stream);
  // scale and shift are read in their own dtype when they share it, else both as f32.
  const bool same = scale.dtype() == shift.dtype();
  const Tensor sc = same ? detail::contiguous_on(scale, stream) : cast(scale, DType::f32, stream);
  const Tensor sh = same ? detail::contiguous_on(shift, stream) : cast(shift, DType::f32, stream);
  const bool token_wise = scale.shape() == per_token && s != 1;
  return layer_norm(op, detail::contiguous_on(x, stream), w, bi, sc, sh, token_wise ? 1 : std::max<int64_t>(s, 1), eps, false, stream).out;
}

namespace {

Tensor group_norm_impl(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, float eps, bool silu,
                       const Stream& stream) {
  const char* op = silu ? "group_norm_silu" : "group_norm";
  detail::float_elem(x, op, "x");
  if (x.dim() < 2) throw Error(std::string(op) + ": x must be [N, C, *], got " + x.brief());
  const int64_t n = x.size(0), c = x.size(1);
  if (num_groups <= 0 || c % num_groups != 0)
    throw Error(std::string(op) + ": num_groups must be positive and divide the channel count C = " + std::to_string(c) + " of x " +
                shape_to_string(x.shape()) + ", got " + std::to_string(num_groups));
  check_eps(eps, op);
  const std::string c_text = "[C] = [" + std::to_string(c) + "] with C the channels of x " + shape_to_string(x.shape());
  const Tensor w = detail::f32_param(weight, {c}, c_text, op, "weight", stream);
  const Tensor b = detail::f32_param(bias, {c}, c_text, op, "bias", stream);
  const Tensor xc = detail::contiguous_on(x, stream);
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  const int64_t hw = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  std::vector<Tensor> reads = {xc};
  for (const Tensor& t : {w, b})
    if (t.defined()) reads.push_back(t);
  const double bytes = 2.0 * detail::bytes_of(xc) + detail::bytes_of(w) + detail::bytes_of(b);
  const vk::Kernels* k = &vk::kernels();
  const double flops = (silu ? 11.0 : 7.0) * static_cast<double>(x.numel());
  stream.launch({op, Unit::vector, flops, bytes, DType::f32}, reads, {out}, [=] {
    vk::GroupNormArgs a;
    a.silu = silu;
    a.x = detail::in_ptr(xc);
    a.out = detail::out_ptr(out);
    a.type = detail::elem_of(xc.dtype());
    a.groups = num_groups;
    a.channels_per_group = c / num_groups;
    a.hw = hw;
    a.eps = eps;
    a.weight = detail::f32_ptr(w);
    a.bias = detail::f32_ptr(b);
    const int64_t group_size = a.channels_per_group * hw;
    detail::parallel_chunks(n * num_groups, group_size, [&](int64_t g0, int64_t g1) { k->group_norm(a, g0, g1); });
  });
  return out;
}

Tensor normalize_channels_impl(const Tensor& x, const Tensor& weight, float scale, float eps, bool silu, const Stream& stream) {
  const char* op = silu ? "normalize_channels_silu" : "normalize_channels";
  detail::float_elem(x, op, "x");
  if (x.dim() < 2) throw Error(std::string(op) + ": x must be [N, C, *], got " + x.brief());
  check_eps(eps, op);
  if (!std::isfinite(scale)) throw Error(std::string(op) + ": scale must be finite, got " + std::to_string(scale));
  const int64_t n = x.size(0), c = x.size(1);
  const std::string c_text = "[C] = [" + std::to_string(c) + "] with C the channels of x " + shape_to_string(x.shape());
  const Tensor w = detail::f32_param(weight, {c}, c_text, op, "weight", stream);
  const Tensor xc = detail::contiguous_on(x, stream);
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  const int64_t inner = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  std::vector<Tensor> reads = {xc};
  if (w.defined()) reads.push_back(w);
  const double bytes = 2.0 * detail::bytes_of(xc) + detail::bytes_of(w);
  const vk::Kernels* k = &vk::kernels();
  const double flops = (silu ? 8.0 : 4.0) * static_cast<double>(x.numel());
  stream.launch({op, Unit::vector, flops, bytes, DType::f32}, reads, {out}, [=] {
    if (inner == 0 || c == 0) return;
    vk::ChannelNormArgs a;
    a.silu = silu;
    a.x = detail::in_ptr(xc);
    a.out = detail::out_ptr(out);
    a.type = detail::elem_of(xc.dtype());
    a.channels = c;
    a.inner = inner;
    a.block = std::min(inner, vk::kChannelNormBlock);
    a.eps = eps;
    a.scale = scale;
    a.weight = detail::f32_ptr(w);
    const int64_t blocks = (inner + a.block - 1) / a.block;
    detail::parallel_chunks(n * blocks, c * a.block, [&](int64_t i0, int64_t i1) { k->channel_norm(a, i0, i1); });
  });
  return out;
}

}  // namespace

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, float eps, const Stream& stream) {
  return group_norm_impl(x, num_groups, weight, bias, eps, false, stream);
}

Tensor group_norm_silu(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, float eps, const Stream& stream) {
  return group_norm_impl(x, num_groups, weight, bias, eps, true, stream);
}

Tensor normalize_channels(const Tensor& x, const Tensor& weight, float scale, float eps, const Stream& stream) {
  return normalize_channels_impl(x, weight, scale, eps, false, stream);
}

Tensor normalize_channels_silu(const Tensor& x, const Tensor& weight, float scale, float eps, const Stream& stream) {
  return normalize_channels_impl(x, weight, scale, eps, true, stream);
}

}  // namespace cubevec::ops
