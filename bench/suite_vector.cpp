// Suite `vector`: every vector op on a DiT activation, x [4608, 24, 128] (tokens, heads, head dim),
// f32 and bf16, on a Vector unit with one thread per core. Reports GB/s of bytes read plus written
// (x, the output and the op's parameters) and the fraction of the measured triad bandwidth.
#include <functional>
#include <random>

#include "bench/harness.h"
#include "ops/vector/kernels.h"
#include "ops/vector_ops.h"

namespace cubevec::bench {

namespace {

constexpr int64_t kTokens = 4608, kHeads = 24, kHeadDim = 128;

Tensor random_tensor(const Shape& shape, unsigned seed, DType dtype, const Stream& stream) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  const Tensor t = Tensor::from_vector(v, shape);
  return dtype == DType::f32 ? t : ops::cast(t, dtype, stream);
}

double bytes(std::initializer_list<Tensor> tensors) {
  double total = 0;
  for (const Tensor& t : tensors) total += t.defined() ? static_cast<double>(t.nbytes()) : 0.0;
  return total;
}

}  // namespace

void vector_suite(Context& context) {
  DeviceProfile profile = builtin_cpu_profile();
  profile.vector_threads = context.machine.threads;
  Device device(profile);
  const Stream stream = device.new_stream("vector");
  const std::string impl = "cubevec-" + std::string(ops::vk::isa_name(ops::vk::best_isa()));
  const Shape shape{kTokens, kHeads, kHeadDim};
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor x = random_tensor(shape, 1, dtype, stream);
    const Tensor y = random_tensor(shape, 2, dtype, stream);
    const Tensor weight = random_tensor({kHeadDim}, 3, DType::f32, stream);
    const Tensor bias = random_tensor({kHeadDim}, 4, DType::f32, stream);
    const Tensor cos = random_tensor({kTokens, kHeadDim}, 5, dtype, stream);
    const Tensor sin = random_tensor({kTokens, kHeadDim}, 6, dtype, stream);
    const int64_t hidden = kHeads * kHeadDim;
    const Tensor x_bsh = x.view({1, kTokens, hidden});
    const Tensor x_bsnd = x.view({1, kTokens, kHeads, kHeadDim});
    const Tensor scale = random_tensor({1, hidden}, 7, dtype, stream);
    const Tensor shift = random_tensor({1, hidden}, 8, dtype, stream);
    // GroupNorm as in a VAE decoder: [1, 512 channels, 27648 positions], 32 groups; same elements.
    const Tensor x_nchw = x.view({1, 512, kTokens * kHeads * kHeadDim / 512});
    const DType other = dtype == DType::f32 ? DType::bf16 : DType::f32;
    const Tensor out_like = x;
    const Tensor weight_x =
        dtype == DType::f32 ? weight : ops::cast(weight, dtype, stream);  // every op's output has x's size and dtype (cast excepted)

    struct Case {
      std::string name;
      std::function<Tensor()> run;
      double bytes;
    };
    const double io = bytes({x, out_like});
    std::vector<Case> cases = {
        {"rms_norm", [&] { return ops::rms_norm(x, weight, 1e-6f, stream); }, io + bytes({weight})},
        {"fast_layernorm", [&] { return ops::fast_layernorm(x, weight, bias, 1e-5f, ops::LayerNormImpl::high_precision, stream).out; },
         io + bytes({weight, bias}) + 2.0 * 4.0 * kTokens * kHeads},
        {"layernorm_scale_shift[1,4608,3072]", [&] { return ops::layernorm_scale_shift(x_bsh, scale, shift, {}, {}, 1e-6f, stream); },
         io + bytes({scale, shift})},
        {"rope_half_BSND",
         [&] { return ops::rotary_position_embedding(x_bsnd, cos, sin, ops::RotatedMode::rotated_half, ops::RopeLayout::BSND, stream); },
         io + bytes({cos, sin})},
        {"rope_interleaved_BSND",
         [&] {
           return ops::rotary_position_embedding(x_bsnd, cos, sin, ops::RotatedMode::rotated_interleaved, ops::RopeLayout::BSND, stream);
         },
         io + bytes({cos, sin})},
        {"softmax", [&] { return ops::softmax(x, stream); }, io},
        {"group_norm[1,512,27648]g32", [&] { return ops::group_norm(x_nchw, 32, {}, {}, 1e-5f, stream); }, io},
        {"add", [&] { return ops::add(x, y, stream); }, io + bytes({y})},
        {"mul_bcast[128]", [&] { return ops::mul(x, weight_x, stream); }, io + bytes({weight_x})},
        {"muls_add", [&] { return ops::muls_add(x, y, 0.5f, stream); }, io + bytes({y})},
        {"cast_to_" + std::string(dtype_name(other)), [&] { return ops::cast(x, other, stream); },
         static_cast<double>(x.numel()) * static_cast<double>(dtype_size(dtype) + dtype_size(other))},
        {"contiguous(transpose(1,2))", [&] { return ops::contiguous(x.transpose(1, 2), stream); }, io},
    };
    for (const char* act : {"relu", "silu", "mish", "gelu", "gelu-tanh", "gelu-fast"}) {
      const ops::Activation kind = ops::get_activation_layer(act);
      cases.push_back({std::string("act_") + act, [&x, kind, &stream] { return ops::activation(x, kind, stream); }, io});
    }
    for (const Case& c : cases) {
      const Timing t = time_runs([&] { c.run().data_ptr(); }, std::max(3, context.repeats), 2);
      Result r{"vector", c.name, impl};
      r.dtype = std::string(dtype_name(dtype));
      r.timing = t;
      r.gbps = c.bytes / t.median_s / 1e9;
      r.peak_fraction = r.gbps / context.machine.triad_gbps;
      context.add(r);
    }
  }
}

}  // namespace cubevec::bench
