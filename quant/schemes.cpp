#include "quant/schemes.h"

#include <cmath>

#include "ops/vector_ops.h"
#include "base/error.h"

namespace cubevec::quant {

namespace {

void require(const Tensor& t, DType dtype, const Shape& shape, const std::string& what, const char* name) {
  if (!t.defined())
    throw Error(what + ": missing '" + name + "' (expected " + std::string(dtype_name(dtype)) + " " + shape_to_string(shape) + ")");
  if (t.dtype() != dtype || t.shape() != shape)
    throw Error(what + ": '" + name + "' must be " + std::string(dtype_name(dtype)) + " " + shape_to_string(shape) + ", got " +
                std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape()));
}

std::size_t bytes_of(const Tensor& t) { return t.defined() ? t.nbytes() : 0; }

// The weight packed for the int8 GEMM; shape-only (simulate) weights get a packing without data.
ops::PackedInt8Weight pack(const Tensor& weight) {
  if (weight.has_storage()) return ops::pack_int8_weight(weight);
  auto meta = std::make_shared<ops::gemm::PackedInt8>();
  meta->isa = ops::gemm::best_int8_isa();
  meta->n = weight.size(0), meta->k = weight.size(1), meta->k_quads = ops::gemm::int8_k_quads(meta->k, meta->isa);
  return meta;
}

// The finite-value checks a file's numbers need before they can be used.
void require_finite_positive(const Tensor& t, const std::string& what, const char* name) {
  if (!t.has_storage()) return;
  const Tensor c = t.contiguous();
  const float* p = c.data<float>();
  for (int64_t i = 0; i < c.numel(); ++i)
    if (!std::isfinite(p[i]) || !(p[i] > 0))
      throw Error(what + ": '" + name + "' must hold positive finite numbers, element " + std::to_string(i) + " is " +
                  std::to_string(p[i]));
}

ops::Int8MatmulOptions int8_epilogue(const ops::MatmulOptions& e) {
  ops::Int8MatmulOptions o;
  o.activation = e.activation;
  o.residual = e.residual;
  o.gate = e.gate;
  o.out = e.out;
  return o;
}

class W8A16 : public QuantizedLinear {
 public:
  W8A16(int64_t in, int64_t out, const QuantTensors& t)
      : QuantizedLinear(in, out), weight_(t.weight), scale_(t.weight_scale), bias_(t.bias) {}
  Algorithm algorithm() const override { return Algorithm::w8a16; }
  Tensor forward(const Tensor& x, const ops::MatmulOptions& e, int, const Stream& s) const override {
    ops::MatmulOptions o = e;
    o.bias = bias_;
    o.b_is_weight = true;
    o.b_scale = scale_;
    o.compute = x.dtype() == DType::bf16 ? DType::bf16 : DType::f32;
    o.packed_weight = nullptr;
    return ops::matmul(x, weight_, o, s);
  }
  std::size_t weight_bytes() const override { return bytes_of(weight_) + bytes_of(scale_) + bytes_of(bias_); }

 private:
  Tensor weight_, scale_, bias_;
};

// The dynamic per-token path (W8A8_DYNAMIC, and W8A8_TIMESTEP's dynamic steps).
struct DynamicPath {
  ops::PackedInt8Weight packed;
  Tensor weight_scale, bias, mul_scale;
  Tensor run(const Tensor& x, const ops::MatmulOptions& e, const Stream& s) const {
    ops::Int8MatmulOptions o = int8_epilogue(e);
    o.col_scale = weight_scale;
    o.bias = bias;
    return ops::matmul_int8_quantizing(x, {true, 1, 0, mul_scale}, packed, o, s);  // quantized as A is packed
  }
};

class W8A8Dynamic : public QuantizedLinear {
 public:
  W8A8Dynamic(int64_t in, int64_t out, const QuantTensors& t)
      : QuantizedLinear(in, out), path_{pack(t.weight), t.weight_scale, t.bias, t.mul_scale} {}
  Algorithm algorithm() const override { return Algorithm::w8a8_dynamic; }
  Tensor forward(const Tensor& x, const ops::MatmulOptions& e, int, const Stream& s) const override { return path_.run(x, e, s); }
  std::size_t weight_bytes() const override {
    return path_.packed->bytes() + bytes_of(path_.weight_scale) + bytes_of(path_.bias) + bytes_of(path_.mul_scale);
  }

 private:
  DynamicPath path_;
};

// The static per-tensor path for one row of (input_scale, input_offset, deq_scale, quant_bias).
struct StaticRow {
  float input_scale = 1, input_offset = 0;
  Tensor deq_scale, quant_bias;  // [out]
};

Tensor run_static(const ops::PackedInt8Weight& packed, const StaticRow& row, const Tensor& mul_scale, const Tensor& x,
                  const ops::MatmulOptions& e, const Stream& s) {
  ops::Int8MatmulOptions o = int8_epilogue(e);
  o.int_bias = row.quant_bias;
  o.col_scale = row.deq_scale;
  return ops::matmul_int8_quantizing(x, {false, row.input_scale, row.input_offset, mul_scale}, packed, o, s);
}

// Row `i` of the static tensors (1-D input_scale / offset, 2-D deq_scale / quant_bias for timestep).
StaticRow static_row(const QuantTensors& t, int64_t i, bool stacked) {
  StaticRow r;
  if (t.input_scale.has_storage()) {
    r.input_scale = t.input_scale.contiguous().data<float>()[i];
    r.input_offset = t.input_offset.contiguous().data<float>()[i];
  }
  r.deq_scale = stacked ? t.deq_scale.select(0, i).contiguous() : t.deq_scale;
  r.quant_bias = stacked ? t.quant_bias.select(0, i).contiguous() : t.quant_bias;
  return r;
}

class W8A8Static : public QuantizedLinear {
 public:
  W8A8Static(int64_t in, int64_t out, const QuantTensors& t)
      : QuantizedLinear(in, out), packed_(pack(t.weight)), row_(static_row(t, 0, false)), mul_scale_(t.mul_scale) {}
  Algorithm algorithm() const override { return Algorithm::w8a8; }
  Tensor forward(const Tensor& x, const ops::MatmulOptions& e, int, const Stream& s) const override {
    return run_static(packed_, row_, mul_scale_, x, e, s);
  }
  std::size_t weight_bytes() const override {
    return packed_->bytes() + bytes_of(row_.deq_scale) + bytes_of(row_.quant_bias) + bytes_of(mul_scale_) + 8;
  }

 private:
  ops::PackedInt8Weight packed_;
  StaticRow row_;
  Tensor mul_scale_;
};

class W8A8Timestep : public QuantizedLinear {
 public:
  W8A8Timestep(int64_t in, int64_t out, const QuantTensors& t, std::shared_ptr<const TimestepPolicy> policy, std::string what)
      : QuantizedLinear(in, out),
        dynamic_{pack(t.weight), t.weight_scale, t.bias, t.mul_scale},
        policy_(std::move(policy)),
        what_(std::move(what)) {
    for (int64_t i = 0; i < t.input_scale.size(0); ++i) rows_.push_back(static_row(t, i, true));
  }
  Algorithm algorithm() const override { return Algorithm::w8a8_timestep; }
  int static_steps() const override { return static_cast<int>(rows_.size()); }
  Tensor forward(const Tensor& x, const ops::MatmulOptions& e, int step, const Stream& s) const override {
    if (policy_->strategy(step) == Strategy::dynamic) return dynamic_.run(x, e, s);
    if (step < 0 || step >= static_cast<int>(rows_.size()))
      throw Error(what_ + ": the timestep policy makes step " + std::to_string(step) + " static, but the file has static scales for " +
                  std::to_string(rows_.size()) + " steps (0 to " + std::to_string(rows_.size() - 1) + ")");
    return run_static(dynamic_.packed, rows_[static_cast<std::size_t>(step)], dynamic_.mul_scale, x, e, s);
  }
  std::size_t weight_bytes() const override {
    std::size_t b = dynamic_.packed->bytes() + bytes_of(dynamic_.weight_scale) + bytes_of(dynamic_.bias) + bytes_of(dynamic_.mul_scale);
    for (const StaticRow& r : rows_) b += bytes_of(r.deq_scale) + bytes_of(r.quant_bias) + 8;
    return b;
  }

 private:
  DynamicPath dynamic_;
  std::vector<StaticRow> rows_;
  std::shared_ptr<const TimestepPolicy> policy_;
  std::string what_;
};

}  // namespace

std::unique_ptr<QuantizedLinear> make_quantized_linear(Algorithm algorithm, int64_t in, int64_t out, const QuantTensors& t,
                                                       std::shared_ptr<const TimestepPolicy> policy, const std::string& what) {
  require(t.weight, DType::i8, {out, in}, what, "weight");
  if (t.mul_scale.defined() && algorithm == Algorithm::w8a16)
    throw Error(what +
                ": a W8A16 layer with a SmoothQuant div.mul_scale: MindIE SD's weight-only layer never applies it, so the "
                "weights were smoothed for nothing and the output would be wrong");
  if (t.mul_scale.defined()) {
    require(t.mul_scale, DType::f32, {in}, what, "div.mul_scale");
    require_finite_positive(t.mul_scale, what, "div.mul_scale");
  }
  if (t.bias.defined()) require(t.bias, DType::f32, {out}, what, "bias");
  const bool dynamic = algorithm == Algorithm::w8a16 || algorithm == Algorithm::w8a8_dynamic || algorithm == Algorithm::w8a8_timestep;
  if (dynamic) {
    require(t.weight_scale, DType::f32, {out}, what, "weight_scale");
    require_finite_positive(t.weight_scale, what, "weight_scale");
  }
  if (algorithm == Algorithm::w8a8 || algorithm == Algorithm::w8a8_timestep) {
    const bool stacked = algorithm == Algorithm::w8a8_timestep;
    const int64_t steps = stacked && t.input_scale.defined() && t.input_scale.dim() == 1 ? t.input_scale.size(0) : 1;
    if (stacked && steps < 1) throw Error(what + ": 'input_scale' must hold one scale per step, got none");
    const Shape vec = stacked ? Shape{steps} : Shape{1}, mat = stacked ? Shape{steps, out} : Shape{out};
    require(t.input_scale, DType::f32, vec, what, "input_scale");
    require(t.input_offset, DType::f32, vec, what, "input_offset");
    require(t.deq_scale, DType::f32, mat, what, "deq_scale");
    require(t.quant_bias, DType::i32, mat, what, "quant_bias");
    require_finite_positive(t.input_scale, what, "input_scale");
    require_finite_positive(t.deq_scale, what, "deq_scale");
    if (t.input_offset.has_storage()) {
      const Tensor c = t.input_offset.contiguous();
      for (int64_t i = 0; i < c.numel(); ++i) {
        const float v = c.data<float>()[i];
        if (!(v >= -128 && v <= 127) || v != std::rint(v))
          throw Error(what + ": 'input_offset' must hold integers in [-128, 127], element " + std::to_string(i) + " is " +
                      std::to_string(v));
      }
    }
  }
  switch (algorithm) {
    case Algorithm::w8a16: return std::make_unique<W8A16>(in, out, t);
    case Algorithm::w8a8_dynamic: return std::make_unique<W8A8Dynamic>(in, out, t);
    case Algorithm::w8a8: return std::make_unique<W8A8Static>(in, out, t);
    case Algorithm::w8a8_timestep:
      if (!policy) throw Error(what + ": W8A8_TIMESTEP needs a timestep policy");
      return std::make_unique<W8A8Timestep>(in, out, t, std::move(policy), what);
  }
  throw Error(what + ": invalid algorithm");
}

}  // namespace cubevec::quant
