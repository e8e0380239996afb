#include "ops/conv.h"

#include <algorithm>
#include <tbb/parallel_for.h>

#include "ops/conv_direct.h"
#include "ops/conv_direct_kernels.h"

namespace cubevec::ops {

namespace {

// Output positions per im2col block: at most kBlock, and few enough that the block's columns
// (C x kernel volume rows) fit in kBlockBytes, so the GEMM packs them from the last-level cache
// right after im2col wrote them.
constexpr int64_t kBlock = 4096;
constexpr int64_t kBlockBytes = int64_t{4} << 20;
int64_t block_positions(int64_t kdim) {
  const int64_t fit = kBlockBytes / (static_cast<int64_t>(sizeof(float)) * std::max<int64_t>(kdim, 1));
  return std::clamp<int64_t>(fit / 64 * 64, 256, kBlock);
}

template <int D>
struct Geometry {
  int64_t n = 0, c = 0, o = 0;
  std::array<int64_t, D> in{}, kernel{}, out{};
  int64_t in_volume() const { return product(in); }
  int64_t kernel_volume() const { return product(kernel); }
  int64_t out_volume() const { return product(out); }
  static int64_t product(const std::array<int64_t, D>& v) {
    int64_t p = 1;
    for (int64_t s : v) p *= s;
    return p;
  }
};

template <int D>
Geometry<D> check(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, const ConvOptions<D>& o) {
  require_contiguous_f32(x, op, "x");
  require_contiguous_f32(w, op, "weight");
  const char* layout = D == 2 ? "[N, C, H, W]" : "[N, C, T, H, W]";
  const char* wlayout = D == 2 ? "[O, C, kh, kw]" : "[O, C, kt, kh, kw]";
  if (x.dim() != D + 2) throw Error(std::string(op) + ": x must be " + layout + ", got " + shape_to_string(x.shape()));
  if (w.dim() != D + 2 || w.size(1) != x.size(1))
    throw Error(std::string(op) + ": weight must be " + wlayout + " with C = " + std::to_string(x.size(1)) + " (groups = 1), got " +
                shape_to_string(w.shape()));
  Geometry<D> g;
  g.n = x.size(0), g.c = x.size(1), g.o = w.size(0);
  if (bias.defined()) {
    require_contiguous_f32(bias, op, "bias");
    if (bias.shape() != Shape{g.o})
      throw Error(std::string(op) + ": bias must have shape [" + std::to_string(g.o) + "], got " + shape_to_string(bias.shape()));
  }
  for (int d = 0; d < D; ++d) {
    if (o.stride[d] < 1 || o.dilation[d] < 1 || o.padding[d] < 0)
      throw Error(std::string(op) + ": stride and dilation must be >= 1 and padding >= 0 in every dimension");
    g.in[d] = x.size(2 + d);
    g.kernel[d] = w.size(2 + d);
    const int64_t span = o.dilation[d] * (g.kernel[d] - 1) + 1;
    const int64_t padded = g.in[d] + 2 * o.padding[d];
    if (span > padded)
      throw Error(std::string(op) + ": the kernel " + shape_to_string(w.shape()) + " (dilated) does not fit input " +
                  shape_to_string(x.shape()) + " with padding in spatial dimension " + std::to_string(d));
    g.out[d] = (padded - span) / o.stride[d] + 1;
  }
  return g;
}

// Fills cols [C x kernel volume, count] for output positions [first, first + count) of one image.
// Each row (one input channel and kernel offset) is filled in runs along the last output dim:
// within a run the outer coordinates are fixed, so the run is one bounds check and a copy (a
// memcpy with zero edges for unit stride).
template <int D>
void im2col(const float* image, const Geometry<D>& g, const ConvOptions<D>& o, int64_t first, int64_t count, float* cols) {
  const int64_t kvol = g.kernel_volume();
  constexpr int L = D - 1;  // the last (contiguous) dim
  const int64_t out_last = g.out[L], in_last = g.in[L], stride_last = o.stride[L];
  std::array<int64_t, D> start{};  // the output index of position `first`
  for (int64_t d = L, pos = first; d >= 0; --d) {
    start[d] = pos % g.out[d];
    pos /= g.out[d];
  }
  tbb::parallel_for(int64_t{0}, g.c * kvol, [&](int64_t row) {
    const int64_t channel = row / kvol;
    int64_t kidx = row % kvol;
    std::array<int64_t, D> k{};
    for (int d = L; d >= 0; --d) {
      k[d] = kidx % g.kernel[d];
      kidx /= g.kernel[d];
    }
    const float* plane = image + channel * g.in_volume();
    float* dst = cols + row * count;
    const int64_t shift = k[L] * o.dilation[L] - o.padding[L];  // input x = out x * stride + shift
    std::array<int64_t, D> index = start;
    for (int64_t j = 0; j < count;) {
      const int64_t run = std::min(count - j, out_last - index[L]);
      float* out = dst + j;
      bool inside = true;
      int64_t offset = 0;  // of the input row the run reads
      for (int d = 0; d < L; ++d) {
        const int64_t coord = index[d] * o.stride[d] - o.padding[d] + k[d] * o.dilation[d];
        inside = inside && coord >= 0 && coord < g.in[d];
        offset = offset * g.in[d] + coord;
      }
      if (!inside) {
        std::fill(out, out + run, 0.0f);
      } else if (stride_last == 1) {
        const int64_t x0 = index[L] + shift;  // out[r] is input x0 + r: inside for r in [lo, hi)
        const int64_t lo = std::clamp<int64_t>(-x0, 0, run), hi = std::clamp<int64_t>(in_last - x0, lo, run);
        const float* src = plane + offset * in_last;
        std::fill(out, out + lo, 0.0f);
        if (hi > lo) std::copy(src + x0 + lo, src + x0 + hi, out + lo);
        std::fill(out + hi, out + run, 0.0f);
      } else {
        const float* src = plane + offset * in_last;
        for (int64_t r = 0; r < run; ++r) {
          const int64_t x = (index[L] + r) * stride_last + shift;
          out[r] = x >= 0 && x < in_last ? src[x] : 0.0f;
        }
      }
      j += run;
      index[L] += run;  // the next run starts a new output row
      for (int d = L; d > 0 && index[d] == g.out[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
      }
    }
  });
}

// A 1x1 (x1) kernel with unit stride and no padding needs no im2col: the image is the matrix.
template <int D>
bool is_pointwise(const Geometry<D>& g, const ConvOptions<D>& o) {
  bool pointwise = true;
  for (int d = 0; d < D; ++d) pointwise = pointwise && g.kernel[d] == 1 && o.stride[d] == 1 && o.padding[d] == 0;
  return pointwise;
}

// The direct kernel (ops/conv_direct.h) where it applies: few output channels, unit stride and
// dilation, a kernel wider than 1x1 (a 1x1 conv is already a plain GEMM), on AVX-512.
template <int D>
bool use_direct(const Geometry<D>& g, const ConvOptions<D>& o) {
  if (!o.direct || o.backend != GemmBackend::cubevec || g.o > conv_direct::kMaxOutputChannels || !conv_direct::available()) return false;
  for (int d = 0; d < D; ++d)
    if (o.stride[d] != 1 || o.dilation[d] != 1) return false;
  return !is_pointwise(g, o) && g.kernel[D - 1] <= conv_direct::kMaxKernelWidth;
}

template <int D>
Tensor conv(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, const ConvOptions<D>& o, const Stream& stream) {
  const Geometry<D> g = check(op, x, w, bias, o);
  Shape out_shape = {g.n, g.o};
  for (int64_t s : g.out) out_shape.push_back(s);
  Tensor out = stream.device().empty(out_shape, DType::f32, stream);
  std::vector<Tensor> reads = {x, w};
  if (bias.defined()) reads.push_back(bias);
  const int64_t kdim = g.c * g.kernel_volume(), positions = g.out_volume();
  const double flops = 2.0 * static_cast<double>(g.n * g.o) * static_cast<double>(kdim) * static_cast<double>(positions);
  const double bytes = static_cast<double>(x.nbytes() + w.nbytes() + out.nbytes());
  KernelDesc desc{op, Unit::cube, flops, bytes, o.priced_as};
  desc.cube_work = {g.n, positions, g.o};  // per image, positions x output channels
  stream.launch(desc, reads, {out}, [x, w, bias, out, g, o, kdim, positions] {
    const auto* px = reinterpret_cast<const float*>(x.unsynchronized_data_ptr());
    const auto* pw = reinterpret_cast<const float*>(w.unsynchronized_data_ptr());
    const float* pbias = bias.defined() ? reinterpret_cast<const float*>(bias.unsynchronized_data_ptr()) : nullptr;
    auto* py = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
    if (use_direct(g, o)) {
      const conv_direct::Shape<D> shape{g.c, g.o, g.in, g.kernel, g.out, o.padding};
      for (int64_t image = 0; image < g.n; ++image)
        conv_direct::convolve<D>(px + image * g.c * g.in_volume(), pw, pbias, py + image * g.o * positions, shape);
      return;
    }
    const int threads = tbb::this_task_arena::max_concurrency();
    const bool pointwise = is_pointwise(g, o);
    const int64_t block = std::min(pointwise ? kBlock : block_positions(kdim), positions);
    std::vector<float> cols(pointwise ? 0 : static_cast<std::size_t>(kdim * block));
    for (int64_t image = 0; image < g.n; ++image) {
      const float* src = px + image * g.c * g.in_volume();
      float* dst = py + image * g.o * positions;
      for (int64_t first = 0; first < positions; first += block) {
        const int64_t count = std::min(block, positions - first);
        gemm::Problem p;
        p.m = g.o, p.n = count, p.k = kdim;
        p.a = pw, p.lda = kdim;
        if (pointwise) {
          p.b = src + first, p.ldb = positions;
        } else {
          im2col(src, g, o, first, count, cols.data());
          p.b = cols.data(), p.ldb = count;
        }
        p.c = dst + first, p.ldc = positions;
        if (o.backend == GemmBackend::reference) gemm_reference(p);
        else gemm::sgemm(p, gemm::best_isa(), threads);
      }
      if (pbias)  // bias per output channel, i.e. per row of this image's [O, positions] result
        tbb::parallel_for(int64_t{0}, g.o, [&](int64_t ch) {
          float* row = dst + ch * positions;
          for (int64_t j = 0; j < positions; ++j) row[j] += pbias[ch];
        });
    }
  });
  return out;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options, const Stream& stream) {
  if (options.backend != GemmBackend::cubevec && options.backend != GemmBackend::reference)
    throw Error("conv2d: backend must be cubevec or reference");
  return conv<2>("conv2d", x, weight, bias, options, stream);
}

Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv3dOptions& options, const Stream& stream) {
  if (options.backend != GemmBackend::cubevec && options.backend != GemmBackend::reference)
    throw Error("conv3d: backend must be cubevec or reference");
  return conv<3>("conv3d", x, weight, bias, options, stream);
}

}  // namespace cubevec::ops
