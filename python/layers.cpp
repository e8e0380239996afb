// MindIE SD's layers on NumPy arrays: the native half of python/cubevec/layers.py, which checks every
// argument's type, shape and value first and names it. Arrays arrive C-contiguous and aligned in
// float32, float16 or bfloat16 (ml_dtypes); they are wrapped without a copy and computed on the
// process's default device. float16 is computed in f32 (cubevec's kernels take f32 and bf16), and
// `bf16` asks for bf16 compute of f32 or f16 arrays. The result is a new array of the input's dtype
// that owns the result tensor's bytes (no copy when no cast is needed).
//
// The layer calls share the default device's streams, so one runs at a time (a mutex, held with the
// GIL released: other Python threads go on meanwhile). A pending Ctrl-C raises KeyboardInterrupt
// before the call launches its kernels.
#include "python/layers.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/device.h"
#include "ops/attention.h"
#include "ops/sparse_attention.h"
#include "ops/vector_ops.h"
#include "python/call_guards.h"

namespace py = pybind11;

namespace cubevec::python {

namespace {

std::mutex& layer_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The cubevec dtype of an array the Python side let through.
DType dtype_of_array(const py::array& a, const char* name) {
  const py::dtype dt = a.dtype();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 2) return DType::f16;
  if (kind == 'b' && size == 1) return DType::boolean;
  if (kind == 'i' && size == 4) return DType::i32;
  const auto dtype_name = dt.attr("name").cast<std::string>();
  if (size == 2 && dtype_name == "bfloat16") return DType::bf16;
  throw BadArgument(std::string(name) + ": unsupported dtype " + dtype_name);
}

// A tensor over the array's bytes (read-only, no copy); the array outlives the call that uses it.
Tensor wrap(const py::array& a, const char* name) {
  if (!(a.flags() & py::array::c_style)) throw BadArgument(std::string(name) + " must be C-contiguous");
  const DType dtype = dtype_of_array(a, name);
  Shape shape(a.shape(), a.shape() + a.ndim());
  const auto nbytes = static_cast<std::size_t>(a.nbytes());
  auto storage = Storage::borrow(a.data(), nbytes, nullptr, /*read_only=*/true);
  return Tensor::from_storage(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

std::optional<Tensor> wrap_optional(const py::object& a, const char* name) {
  if (a.is_none()) return std::nullopt;
  return wrap(a.cast<py::array>(), name);
}

// What the kernels compute in: f32 for f16 arrays (cubevec's kernels take f32 and bf16), bf16 when
// asked.
Tensor to_compute(const Tensor& t, bool bf16) {
  if (bf16 && t.dtype() != DType::bf16) return ops::cast(t, DType::bf16);
  if (t.dtype() == DType::f16) return ops::cast(t, DType::f32);
  return t;
}

// A parameter (weight, bias, cos, sin, scale, shift): f32 unless it is bf16 already.
Tensor param(const std::optional<Tensor>& t) {
  if (!t) return {};
  return t->dtype() == DType::f16 ? ops::cast(*t, DType::f32) : *t;
}

// The result as a new array of `dtype` (`want` in cubevec's terms) that keeps the tensor alive.
py::array to_array(Tensor result, DType want, const py::dtype& dtype) {
  {
    py::gil_scoped_release release;
    if (result.dtype() != want) result = ops::cast(result, want);
    result = result.contiguous();
    (void)result.data_ptr();  // waits for the kernels that write it
  }
  auto* owner = new Tensor(std::move(result));
  py::capsule base(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(owner->shape().begin(), owner->shape().end());
  std::vector<py::ssize_t> strides;
  for (const int64_t s : owner->strides()) strides.push_back(static_cast<py::ssize_t>(s * static_cast<int64_t>(owner->itemsize())));
  return py::array(dtype, shape, strides, owner->data_ptr(), base);
}

// Runs `body` (which launches the op's kernels and returns the result) with the GIL released, one
// layer call at a time; cubevec errors from the op name it and become ValueError.
template <class Body>
Tensor run_layer(const char* op, Body&& body) {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  require_not_forked();
  require_not_exiting();
  Tensor result;
  {
    py::gil_scoped_release release;
    const ActiveCall active;
    const std::lock_guard lock(layer_mutex());
    try {
      result = body();
      default_device().synchronize();
    } catch (const BadArgument&) {
      throw;
    } catch (const Error& e) {
      // Most op errors start with the op's name already, or with its family's ("attention: ..."
      // from attention_forward): those keep their own prefix.
      const std::string what = e.what();
      const std::size_t colon = what.find(':');
      const bool named = what.rfind(op, 0) == 0 || (colon != std::string::npos && colon > 0 && what.find(' ') > colon &&
                                                    std::string_view(op).rfind(std::string_view(what).substr(0, colon), 0) == 0);
      throw BadArgument(named ? what : std::string(op) + ": " + what);
    }
  }
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  return result;
}

py::array attention(const py::array& q, const py::array& k, const py::array& v, const py::object& mask, std::optional<double> scale,
                    const std::string& layout, const std::string& opt_mode, const std::string& op_type, const std::string& kernel_layout,
                    int64_t num_heads, bool bf16) {
  const Tensor tq = wrap(q, "query"), tk = wrap(k, "key"), tv = wrap(v, "value");
  const std::optional<Tensor> tmask = wrap_optional(mask, "attn_mask");
  ops::AttentionOptions o;
  o.scale = scale;
  o.layout = ops::parse_attention_layout(layout);
  o.num_heads = num_heads;
  o.opt_mode = ops::parse_attention_opt_mode(opt_mode);
  o.op_type = ops::parse_attention_impl(op_type);
  o.kernel_layout = ops::parse_attention_layout(kernel_layout);
  Tensor out = run_layer("attention_forward", [&] {
    if (tmask) o.mask = tmask->dtype() == DType::boolean ? *tmask : ops::cast(*tmask, DType::f32);
    return ops::attention_forward(to_compute(tq, bf16), to_compute(tk, bf16), to_compute(tv, bf16), o);
  });
  return to_array(std::move(out), tq.dtype(), q.dtype());
}

py::array attention_varlen(const py::array& q, const py::array& k, const py::array& v, const py::array& cu_q, const py::array& cu_k,
                           std::optional<double> scale, bool causal, bool bf16) {
  const Tensor tq = wrap(q, "q"), tk = wrap(k, "k"), tv = wrap(v, "v");
  const Tensor tcq = wrap(cu_q, "cu_seqlens_q"), tck = wrap(cu_k, "cu_seqlens_k");
  ops::VarlenOptions o;
  o.scale = scale;
  o.causal = causal;
  Tensor out = run_layer("attention_forward_varlen", [&] {
    return ops::attention_forward_varlen(to_compute(tq, bf16), to_compute(tk, bf16), to_compute(tv, bf16), tcq, tck, o);
  });
  return to_array(std::move(out), tq.dtype(), q.dtype());
}

std::optional<ops::LatentShape> latent_shape(const std::optional<std::vector<int64_t>>& shape) {
  if (!shape) return std::nullopt;
  if (shape->size() != 3) throw BadArgument("latent_shape must be (t, h, w)");
  return ops::LatentShape{(*shape)[0], (*shape)[1], (*shape)[2]};
}

py::array sparse_attention(const py::array& q, const py::array& k, const py::array& v, const std::string& sparse_type, double sparsity,
                           int64_t txt_len, const std::optional<std::vector<int64_t>>& latent_shape_q,
                           const std::optional<std::vector<int64_t>>& latent_shape_k, bool keep_sink, bool keep_recent,
                           double cdf_threshold, const std::string& input_layout, std::optional<double> scale, int64_t head_num,
                           int inner_precise, int64_t block_size, bool bf16) {
  const Tensor tq = wrap(q, "q"), tk = wrap(k, "k"), tv = wrap(v, "v");
  ops::SparseAttentionOptions o;
  o.sparse_type = ops::parse_sparse_type(sparse_type);
  o.sparsity = sparsity;
  o.txt_len = txt_len;
  o.latent_shape_q = latent_shape(latent_shape_q);
  o.latent_shape_k = latent_shape(latent_shape_k);
  o.keep_sink = keep_sink;
  o.keep_recent = keep_recent;
  o.cdf_threshold = cdf_threshold;
  o.input_layout = ops::parse_attention_layout(input_layout);
  o.scale = scale;
  o.head_num = head_num;
  o.inner_precise = inner_precise;
  o.block_size = block_size;
  Tensor out = run_layer("sparse_attention", [&] {
    const Tensor cq = to_compute(tq, bf16), ck = to_compute(tk, bf16), cv = to_compute(tv, bf16);
    return ops::sparse_attention(cq, ck, cv, ops::check_sparse_attention(cq, ck, cv, o)).out;
  });
  return to_array(std::move(out), tq.dtype(), q.dtype());
}

py::array rope(const py::array& x, const py::array& cos, const py::array& sin, const std::string& mode, const std::string& layout,
               bool bf16) {
  const Tensor tx = wrap(x, "x"), tcos = wrap(cos, "cos"), tsin = wrap(sin, "sin");
  const ops::RotatedMode m = ops::parse_rotated_mode(mode);
  const ops::RopeLayout l = layout == "BSND" ? ops::RopeLayout::BSND : layout == "BNSD" ? ops::RopeLayout::BNSD : ops::RopeLayout::SBND;
  Tensor out = run_layer("rotary_position_embedding",
                         [&] { return ops::rotary_position_embedding(to_compute(tx, bf16), param(tcos), param(tsin), m, l); });
  return to_array(std::move(out), tx.dtype(), x.dtype());
}

py::array rms_norm(const py::array& x, const py::object& weight, double eps, bool bf16) {
  const Tensor tx = wrap(x, "hidden_states");
  const std::optional<Tensor> tw = wrap_optional(weight, "weight");
  Tensor out = run_layer("RMSNorm", [&] { return ops::rms_norm(to_compute(tx, bf16), param(tw), static_cast<float>(eps)); });
  return to_array(std::move(out), tx.dtype(), x.dtype());
}

py::array layer_norm(const py::array& x, const py::object& weight, const py::object& bias, double eps, int impl_mode, bool bf16) {
  const Tensor tx = wrap(x, "x");
  const std::optional<Tensor> tw = wrap_optional(weight, "weight"), tb = wrap_optional(bias, "bias");
  const auto impl = static_cast<ops::LayerNormImpl>(impl_mode);
  Tensor out = run_layer("fast_layernorm", [&] {
    if (impl == ops::LayerNormImpl::fp16)  // f16 throughout, as MindIE's fp16 mode
      return ops::fast_layernorm(tx, tw.value_or(Tensor{}), tb.value_or(Tensor{}), static_cast<float>(eps), impl).out;
    return ops::fast_layernorm(to_compute(tx, bf16), param(tw), param(tb), static_cast<float>(eps), impl).out;
  });
  return to_array(std::move(out), tx.dtype(), x.dtype());
}

py::array layernorm_scale_shift(const py::array& x, const py::array& scale, const py::array& shift, const py::object& weight,
                                const py::object& bias, double eps, bool bf16) {
  const Tensor tx = wrap(x, "x"), tscale = wrap(scale, "scale"), tshift = wrap(shift, "shift");
  const std::optional<Tensor> tw = wrap_optional(weight, "weight"), tb = wrap_optional(bias, "bias");
  Tensor out = run_layer("layernorm_scale_shift", [&] {
    return ops::layernorm_scale_shift(to_compute(tx, bf16), param(tscale), param(tshift), param(tw), param(tb), static_cast<float>(eps));
  });
  return to_array(std::move(out), tx.dtype(), x.dtype());
}

py::array activation(const py::array& x, const std::string& name, bool bf16) {
  const Tensor tx = wrap(x, "x");
  const ops::Activation kind = ops::get_activation_layer(name);
  Tensor out = run_layer("activation", [&] { return ops::activation(to_compute(tx, bf16), kind); });
  return to_array(std::move(out), tx.dtype(), x.dtype());
}

}  // namespace

void register_layers(py::module_& m) {
  // The checked entry points are python/cubevec/layers.py's; these take what it has checked.
  m.def("_attention", &attention, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("scale"),
        py::arg("layout"), py::arg("opt_mode"), py::arg("op_type"), py::arg("kernel_layout"), py::arg("num_heads"), py::arg("bf16"),
        "ops::attention_forward on checked arrays (cubevec.attention_forward is the API)");
  m.def("_attention_varlen", &attention_varlen, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"),
        py::arg("scale"), py::arg("causal"), py::arg("bf16"),
        "ops::attention_forward_varlen on checked arrays (cubevec.attention_forward_varlen is the API)");
  m.def("_sparse_attention", &sparse_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("sparse_type"), py::arg("sparsity"),
        py::arg("txt_len"), py::arg("latent_shape_q"), py::arg("latent_shape_k"), py::arg("keep_sink"), py::arg("keep_recent"),
        py::arg("cdf_threshold"), py::arg("input_layout"), py::arg("scale"), py::arg("head_num"), py::arg("inner_precise"),
        py::arg("block_size"), py::arg("bf16"), "ops::sparse_attention on checked arrays (cubevec.sparse_attention is the API)");
  m.def("_rope", &rope, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("rotated_mode"), py::arg("layout"), py::arg("bf16"),
        "ops::rotary_position_embedding on checked arrays (cubevec.rotary_position_embedding is the API)");
  m.def("_rms_norm", &rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("bf16"),
        "ops::rms_norm on checked arrays (cubevec.RMSNorm is the API)");
  m.def("_layer_norm", &layer_norm, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("impl_mode"), py::arg("bf16"),
        "ops::fast_layernorm on checked arrays (cubevec.fast_layernorm is the API)");
  m.def("_layernorm_scale_shift", &layernorm_scale_shift, py::arg("x"), py::arg("scale"), py::arg("shift"), py::arg("weight"),
        py::arg("bias"), py::arg("eps"), py::arg("bf16"),
        "ops::layernorm_scale_shift on checked arrays (cubevec.layernorm_scale_shift is the API)");
  m.def("_activation", &activation, py::arg("x"), py::arg("name"), py::arg("bf16"),
        "ops::activation on checked arrays (cubevec.get_activation_layer is the API)");
}

}  // namespace cubevec::python
