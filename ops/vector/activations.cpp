// Activations by MindIE name (get_activation_layer), their kernels and their double definitions.
#include <cctype>
#include <cmath>

#include "ops/vector/common.h"

namespace cubevec::ops {

namespace {

struct NamedActivation {
  const char* name;
  Activation kind;
};
constexpr NamedActivation kNames[] = {{"relu", Activation::relu},          {"silu", Activation::silu}, {"swish", Activation::silu},
                                      {"mish", Activation::mish},          {"gelu", Activation::gelu}, {"gelu-tanh", Activation::gelu_tanh},
                                      {"gelu-fast", Activation::gelu_fast}};

const char* kernel_name(Activation kind) {
  switch (kind) {
    case Activation::relu: return "relu";
    case Activation::silu: return "silu";
    case Activation::mish: return "mish";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::gelu_fast: return "gelu_fast";
  }
  return "activation";
}

}  // namespace

Activation get_activation_layer(std::string_view name) {
  std::string lower(name);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string known;
  for (const NamedActivation& n : kNames) {
    if (lower == n.name) return n.kind;
    known += (known.empty() ? "" : ", ") + std::string(n.name);
  }
  throw Error("get_activation_layer: unknown activation '" + std::string(name) + "' (expected one of: " + known + ")");
}

double activation_reference(Activation kind, double x) {
  switch (kind) {
    case Activation::relu: return x < 0 ? 0.0 : x;
    case Activation::silu: return x / (1.0 + std::exp(-x));
    case Activation::mish: return x * std::tanh(std::log1p(std::exp(x)));
    case Activation::gelu: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Activation::gelu_tanh: return 0.5 * x * (1.0 + std::tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
    case Activation::gelu_fast: return x / (1.0 + std::exp(-1.702 * std::fabs(x))) * std::exp(0.851 * (x - std::fabs(x)));
  }
  return x;
}

Tensor activation(const Tensor& x, Activation kind, const Stream& stream) {
  const char* name = kernel_name(kind);
  detail::float_elem(x, name, "x");
  const Tensor xc = detail::contiguous_on(x, stream);
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  const vk::Kernels* k = &vk::kernels();
  const auto n = static_cast<double>(x.numel());
  stream.launch({name, Unit::vector, 10.0 * n, 2.0 * detail::bytes_of(xc), DType::f32}, {xc}, {out}, [=] {
    vk::UnaryArgs a;
    a.x = detail::in_ptr(xc);
    a.out = detail::out_ptr(out);
    a.type = detail::elem_of(xc.dtype());
    a.kind = static_cast<vk::ActKind>(static_cast<int>(kind));
    detail::parallel_chunks(xc.numel(), 1, [&](int64_t i0, int64_t i1) { k->unary(a, i0, i1); });
  });
  return out;
}

}  // namespace cubevec::ops
