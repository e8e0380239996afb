// The layers every model here is built from, each a thin holder of its diffusers-named weights
// over one fused op. Activations are f32 or bf16; weights are f32 or bf16 (a bf16 weight makes the
// GEMM round its inputs to bf16 and sum in f32).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "models/parameters.h"
#include "ops/gemm.h"

namespace cubevec::models {

class LinearKernel;
struct Linear;

// A hook on every Linear call of the calling thread (the runtime LoRA of models/lora_runtime.h):
// while one is set, Linear::operator() hands it the call, and it may compute the product itself
// (calling Linear::own_forward for the layer's own part) or return an undefined tensor to leave the
// call alone. Per thread, so concurrent requests on one model each see their own.
class LinearCallHook {
 public:
  virtual ~LinearCallHook() = default;
  virtual Tensor call(const Linear& layer, const Tensor& x, const Stream& stream, const ops::MatmulOptions& epilogue) const = 0;
};
// The calling thread's hook (null: none); set it through a scope that restores the previous one.
const LinearCallHook* current_linear_call_hook();
void set_linear_call_hook(const LinearCallHook* hook);

// PyTorch's Linear: y = x W^T + b, W [out, in]. The first call packs W into the GEMM's panel
// layout and later calls reuse it (repacked if `weight` is replaced by another tensor; the weight's
// values must not be changed in place). The result has x's dtype (f32 or bf16); a bf16 weight
// makes the GEMM round its inputs to bf16 and sum in f32, unless `widen_bf16` is set: then the
// weight is widened to f32 exactly while packed and x stays f32 (--dtype f32 on a bf16 checkpoint
// means f32 arithmetic, as transformers' from_pretrained upcasts). Every Linear is registered in its
// model's ParameterTable under its diffusers module name, and `kernel`, when set, replaces the
// float GEMM (a quantized layer, a tensor-parallel shard).
struct Linear {
 public:
  Tensor weight, bias;
  int64_t in = 0, out = 0;
  std::string name;  // the diffusers module name, e.g. "transformer_blocks.0.attn.to_q"
  std::shared_ptr<const LinearKernel> kernel;
  bool widen_bf16 = false;  // a bf16 weight computed in f32 (f32 panels; the bf16 weight is the only copy)
  struct PackCache;
  std::shared_ptr<PackCache> pack_cache = std::make_shared<PackCache>();

  // Declares `<name>.weight` [out, in] and, with has_bias, `<name>.bias` [out], and registers the
  // layer as `name`. keep_f32: the weight stays f32 when the model is loaded in bf16 (diffusers'
  // _keep_in_fp32_modules).
  void declare(ParameterTable& table, const std::string& name, int64_t in_features, int64_t out_features, bool has_bias = true,
               bool keep_f32 = false);
  // x [..., in] -> [..., out] in x's dtype. `epilogue` may add an activation, a residual and a gate
  // (its bias, b_is_weight, compute and out fields are set here). The thread's LinearCallHook, when
  // set, sees the call first.
  Tensor operator()(const Tensor& x, const Stream& stream, ops::MatmulOptions epilogue = {}) const;
  // The same without the hook: the layer's own product (its kernel, or the float GEMM).
  Tensor own_forward(const Tensor& x, const Stream& stream, ops::MatmulOptions epilogue = {}) const;
  // The float GEMM, whatever `kernel` says (for kernels that fall back to it, and for references).
  Tensor float_forward(const Tensor& x, const Stream& stream, ops::MatmulOptions epilogue = {}) const;
  // What the float GEMM computes in: bf16 for a bf16 weight (unless widen_bf16), else f32.
  DType compute_dtype() const { return weight.dtype() == DType::bf16 && !widen_bf16 ? DType::bf16 : DType::f32; }

  // Weight streaming (pipelines/stages/offload.h): packs the weight now, on the calling thread, for
  // the Cube unit's `threads` (what the first call would do); and lets the packed panels go (the
  // queued GEMMs keep theirs until they run) with the weight's memory-mapped pages, which the OS
  // reads back from the checkpoint on the next use. Return the bytes packed / released. Layers with
  // a `kernel` or without a weight in memory are left alone (0).
  std::size_t prepack(int threads) const;
  std::size_t release_packed() const;
  // The packed panels (packed now, as the first call would, unless already held). For a layer
  // without a `kernel` whose weight is in memory.
  std::shared_ptr<const ops::gemm::PackedB> packed_panels(int threads) const;
  // Uses panels made elsewhere (a packed cache file, models/packed_cache.h) for the current weight
  // from now on; they must be what packed_panels would make (the cache checks the layout and the
  // weight's hash before adopting).
  void adopt_packed(std::shared_ptr<const ops::gemm::PackedB> panels) const;
  // Only the mapped pages (the packed panels stay): for a weight packed and not read again.
  std::size_t release_weight_pages() const;
  // Starts the OS reading the weight's mapped pages ahead of prepack (nothing for other weights).
  void prefetch_weight_pages() const;

 private:
  // The packed weight for the cubevec backend (made on first use or after `weight` changed).
  std::shared_ptr<const ops::gemm::PackedB> packed_weight(DType compute, int threads) const;
};

struct Linear::PackCache {
  std::mutex mutex;
  const void* source = nullptr;  // the weight's storage and offset the packed copy was made from
  DType compute = DType::f32;    // ... and the GEMM's compute dtype (widen_bf16 may change it)
  std::shared_ptr<const ops::gemm::PackedB> packed;
};

// Another implementation of a Linear's product (a quantized scheme, a shard). forward receives the
// layer (its name, shapes, bias), x [rows, in] contiguous and the epilogue to fuse (bias not set:
// the kernel adds layer.bias as its scheme says), and returns [rows, out] in x's dtype.
class LinearKernel {
 public:
  virtual ~LinearKernel() = default;
  virtual std::string name() const = 0;  // "W8A8_DYNAMIC", ...
  virtual Tensor forward(const Linear& layer, const Tensor& x, const Stream& stream, const ops::MatmulOptions& epilogue) const = 0;
  // Bytes of weight data this kernel holds (reports).
  virtual std::size_t weight_bytes() const = 0;
};

// A norm's weight vector (RMSNorm's weight, GroupNorm's weight and bias, ...).
struct Vector1d {
  Tensor value;
  void declare(ParameterTable& table, const std::string& name, int64_t size) { table.add(name, {size}, &value); }
};

// PyTorch's Conv2d (groups 1, square kernel): weight [out, in, k, k], bias [out]; x [N, in, H, W]
// f32 (any strides) -> [N, out, Ho, Wo] f32. conv2d is f32 only, so a bf16 weight (or bias) is
// widened to f32 on the Vector unit at each call.
struct Conv2d {
  Tensor weight, bias;
  int64_t in = 0, out = 0, kernel = 1, stride = 1, padding = 0;

  // Declares `<name>.weight` [out, in, k, k] and, with has_bias, `<name>.bias` [out].
  void declare(ParameterTable& table, const std::string& name, int64_t in_channels, int64_t out_channels, int64_t kernel_size,
               int64_t conv_stride = 1, int64_t conv_padding = 0, bool has_bias = true);
  Tensor operator()(const Tensor& x, const Stream& stream) const;
  // (*this)(x) + residual in one kernel (ops::conv2d_add); residual f32 of the output's shape.
  Tensor with_residual(const Tensor& x, const Tensor& residual, const Stream& stream) const;
  // The same with `pad_rows` / `pad_cols` zeros around x instead of `padding` on both.
  Tensor with_padding(const Tensor& x, int64_t pad_rows, int64_t pad_cols, const Stream& stream) const;
};

}  // namespace cubevec::models
