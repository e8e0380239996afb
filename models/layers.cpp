#include "models/layers.h"

#include <utility>

#include "ops/conv.h"
#include "ops/gemm/driver.h"
#include "ops/vector_ops.h"

namespace cubevec::models {

void Linear::declare(ParameterTable& table, const std::string& module_name, int64_t in_features, int64_t out_features, bool has_bias,
                     bool keep_f32) {
  in = in_features;
  out = out_features;
  name = module_name;
  table.add(name + ".weight", {out, in}, &weight, keep_f32);
  if (has_bias) table.add(name + ".bias", {out}, &bias);
  table.add_linear(name, this);
}

namespace {
thread_local const LinearCallHook* linear_call_hook = nullptr;
}  // namespace

const LinearCallHook* current_linear_call_hook() { return linear_call_hook; }
void set_linear_call_hook(const LinearCallHook* hook) { linear_call_hook = hook; }

Tensor Linear::operator()(const Tensor& x, const Stream& stream, ops::MatmulOptions epilogue) const {
  if (linear_call_hook)
    if (Tensor y = linear_call_hook->call(*this, x, stream, epilogue); y.defined()) return y;
  return own_forward(x, stream, std::move(epilogue));
}

Tensor Linear::own_forward(const Tensor& x, const Stream& stream, ops::MatmulOptions epilogue) const {
  if (kernel && epilogue.low_rank_a.defined())
    throw Error(name + ": the " + kernel->name() + " kernel adds no low-rank update (only the float GEMM does)");
  if (!kernel) return float_forward(x, stream, std::move(epilogue));
  if (x.size(-1) != in) throw Error(name + ": expected inputs [..., " + std::to_string(in) + "], got " + shape_to_string(x.shape()));
  Shape rows_shape = x.shape();
  rows_shape.back() = out;
  const Tensor x2 = (x.is_contiguous() ? x : ops::contiguous(x, stream)).reshape({x.numel() / in, in});
  if (epilogue.residual.defined()) epilogue.residual = epilogue.residual.reshape({x.numel() / in, out});
  epilogue.out = x.dtype();
  return kernel->forward(*this, x2, stream, epilogue).reshape(rows_shape);
}

Tensor Linear::float_forward(const Tensor& x, const Stream& stream, ops::MatmulOptions epilogue) const {
  if (x.size(-1) != in) throw Error(name + ": expected inputs [..., " + std::to_string(in) + "], got " + shape_to_string(x.shape()));
  Shape rows_shape = x.shape();
  rows_shape.back() = out;
  // A strided x (a slice of a joint sequence) is made contiguous on the device, not on the host.
  const Tensor x2 = (x.is_contiguous() ? x : ops::contiguous(x, stream)).reshape({x.numel() / in, in});
  epilogue.bias = bias;
  epilogue.b_is_weight = true;
  epilogue.compute = compute_dtype();
  epilogue.out = x.dtype();
  if (weight.has_storage() && epilogue.backend == ops::GemmBackend::cubevec)
    epilogue.packed_weight = packed_weight(epilogue.compute, stream.device().profile().cube_threads);
  if (epilogue.residual.defined()) epilogue.residual = epilogue.residual.reshape({x.numel() / in, out});
  return ops::matmul(x2, weight, epilogue, stream).reshape(rows_shape);
}

std::shared_ptr<const ops::gemm::PackedB> Linear::packed_weight(DType compute, int threads) const {
  std::lock_guard lock(pack_cache->mutex);
  const void* source = weight.unsynchronized_data_ptr();
  if (!pack_cache->packed || pack_cache->source != source || pack_cache->compute != compute) {
    pack_cache->packed = ops::pack_weight(weight, compute, threads);
    pack_cache->source = source;
    pack_cache->compute = compute;
  }
  return pack_cache->packed;
}

std::size_t Linear::prepack(int threads) const {
  if (kernel || !weight.has_storage()) return 0;
  return packed_panels(threads)->bytes();
}

std::shared_ptr<const ops::gemm::PackedB> Linear::packed_panels(int threads) const {
  if (kernel || !weight.has_storage()) throw Error(name + ": only a float layer with its weight in memory has packed panels");
  return packed_weight(compute_dtype(), threads);
}

void Linear::adopt_packed(std::shared_ptr<const ops::gemm::PackedB> panels) const {
  std::lock_guard lock(pack_cache->mutex);
  pack_cache->packed = std::move(panels);
  pack_cache->source = weight.unsynchronized_data_ptr();
  pack_cache->compute = compute_dtype();
}

std::size_t Linear::release_packed() const {
  if (kernel || !weight.has_storage()) return 0;
  {
    std::lock_guard lock(pack_cache->mutex);
    pack_cache->packed.reset();
    pack_cache->source = nullptr;
  }
  return release_weight_pages();
}

void Linear::prefetch_weight_pages() const {
  if (kernel || !weight.has_storage() || !weight.is_contiguous()) return;
  weight.storage()->prefetch_file_pages(static_cast<std::size_t>(weight.offset()) * weight.itemsize(), weight.nbytes());
}

std::size_t Linear::release_weight_pages() const {
  if (kernel || !weight.has_storage() || !weight.is_contiguous()) return 0;
  return weight.storage()->release_file_pages(static_cast<std::size_t>(weight.offset()) * weight.itemsize(), weight.nbytes());
}

void Conv2d::declare(ParameterTable& table, const std::string& name, int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                     int64_t conv_stride, int64_t conv_padding, bool has_bias) {
  in = in_channels;
  out = out_channels;
  kernel = kernel_size;
  stride = conv_stride;
  padding = conv_padding;
  table.add(name + ".weight", {out, in, kernel, kernel}, &weight);
  if (has_bias) table.add(name + ".bias", {out}, &bias);
}

Tensor Conv2d::operator()(const Tensor& x, const Stream& stream) const { return with_padding(x, padding, padding, stream); }

namespace {

Tensor conv2d_of(const Conv2d& conv, const Tensor& x, int64_t pad_rows, int64_t pad_cols, const Tensor& residual, const Stream& stream) {
  const auto f32 = [&](const Tensor& t) { return !t.defined() || t.dtype() == DType::f32 ? t : ops::cast(t, DType::f32, stream); };
  const auto contiguous = [&](const Tensor& t) { return t.is_contiguous() ? t : ops::contiguous(t, stream); };
  ops::Conv2dOptions options;
  options.stride = {conv.stride, conv.stride};
  options.padding = {pad_rows, pad_cols};
  if (residual.defined())
    return ops::conv2d_add(contiguous(x), f32(conv.weight), f32(conv.bias), contiguous(f32(residual)), options, stream);
  return ops::conv2d(contiguous(x), f32(conv.weight), f32(conv.bias), options, stream);
}

}  // namespace

Tensor Conv2d::with_residual(const Tensor& x, const Tensor& residual, const Stream& stream) const {
  return conv2d_of(*this, x, padding, padding, residual, stream);
}

Tensor Conv2d::with_padding(const Tensor& x, int64_t pad_rows, int64_t pad_cols, const Stream& stream) const {
  return conv2d_of(*this, x, pad_rows, pad_cols, {}, stream);
}

}  // namespace cubevec::models
