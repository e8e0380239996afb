#include "ops/conv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "ops/conv_direct.h"
#include "ops/conv_direct_kernels.h"
#include "ops/gemm/cpu_caches.h"
#include "tensor/allocated_array.h"

namespace cubevec::ops {

namespace {

// Output positions per im2col block: at most kBlock, and few enough that the block's columns
// (C x kernel volume rows), written into the GEMM's packed panels, stay within half the L3 (at least
// 4 MiB) until the GEMM has read them. Deep columns (the Wan VAE's 384 channels x 27 taps) then get
// more positions per block, and the GEMM packs the weights once per block fewer times: the Wan2.1
// decode ran 7% faster at 16 MiB than at 4 MiB on a 32 MiB L3, and slower at 64 MiB.
constexpr int64_t kBlock = 4096;
int64_t block_positions(int64_t kdim) {
  static const int64_t block_bytes = std::max<int64_t>(gemm::this_cpu_caches().l3 / 2, int64_t{4} << 20);
  const int64_t fit = block_bytes / (static_cast<int64_t>(sizeof(float)) * std::max<int64_t>(kdim, 1));
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

// The output index of position `first` of one image.
template <int D>
std::array<int64_t, D> output_index(const Geometry<D>& g, int64_t first) {
  std::array<int64_t, D> index{};
  for (int64_t d = D - 1, pos = first; d >= 0; --d) {
    index[d] = pos % g.out[d];
    pos /= g.out[d];
  }
  return index;
}

// Fills one row of the im2col matrix (input channel and kernel offset `row`) for output positions
// [first, first + count) of one image (`start`: the index of `first`) into dst[0, count). The row is
// filled in runs along the last output dim: within a run the outer coordinates are fixed, so the run
// is one bounds check and a copy (a memcpy with zero edges for unit stride).
template <int D>
void im2col_row(const float* image, const Geometry<D>& g, const ConvOptions<D>& o, const std::array<int64_t, D>& start, int64_t row,
                int64_t count, float* dst) {
  const int64_t kvol = g.kernel_volume();
  constexpr int L = D - 1;  // the last (contiguous) dim
  const int64_t out_last = g.out[L], in_last = g.in[L], stride_last = o.stride[L];
  const int64_t channel = row / kvol;
  int64_t kidx = row % kvol;
  std::array<int64_t, D> k{};
  for (int d = L; d >= 0; --d) {
    k[d] = kidx % g.kernel[d];
    kidx /= g.kernel[d];
  }
  const float* plane = image + channel * g.in_volume();
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
}

// cols [C x kernel volume, count]: the im2col matrix for output positions [first, first + count).
template <int D>
void im2col(const float* image, const Geometry<D>& g, const ConvOptions<D>& o, int64_t first, int64_t count, float* cols) {
  const std::array<int64_t, D> start = output_index<D>(g, first);
  tbb::parallel_for(int64_t{0}, g.c * g.kernel_volume(),
                    [&](int64_t row) { im2col_row<D>(image, g, o, start, row, count, cols + row * count); });
}

// The same matrix written straight into the GEMM's packed B panels (`panels`, for [C x kernel
// volume, count]), so the columns are written once instead of written by im2col and copied again by
// the GEMM's packing. Rows are made kRowGroup at a time in a buffer and copied out panel by panel:
// a panel holds its NR columns of consecutive rows adjacent, so each copy is one run of
// kRowGroup x NR floats (row by row, each 64-byte piece landed KC x NR floats from the last, a new
// page each: the copy took a fifth of the Wan VAE's decode). The last panel's columns past `count`
// are zeroed.
constexpr int64_t kRowGroup = 8;
template <int D>
void im2col_panels(const float* image, const Geometry<D>& g, const ConvOptions<D>& o, int64_t first, int64_t count,
                   const gemm::F32PanelLayout& panels, float* out) {
  const std::array<int64_t, D> start = output_index<D>(g, first);
  const int64_t nr = panels.nr, width = (count + nr - 1) / nr * nr, rows = g.c * g.kernel_volume();
  // Groups never straddle a K block (KC is a multiple of kRowGroup), so a group's rows are adjacent in every panel.
  const int64_t groups = (rows + kRowGroup - 1) / kRowGroup;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, groups), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<float> values(static_cast<std::size_t>(kRowGroup * width), 0.0f);  // zero past count
    for (int64_t group = range.begin(); group < range.end(); ++group) {
      const int64_t row0 = group * kRowGroup, in_group = std::min(kRowGroup, rows - row0);
      for (int64_t r = 0; r < in_group; ++r) im2col_row<D>(image, g, o, start, row0 + r, count, values.data() + r * width);
      // NR as a constant where it is the kernels' 16 or 32, so that each piece is a few vector
      // moves rather than a call to memcpy.
      const auto copy_out = [&]<int64_t NR>(std::integral_constant<int64_t, NR>, int64_t step) {
        for (int64_t col = 0; col < count; col += step) {
          float* dst = out + panels.offset(row0, col);
          for (int64_t r = 0; r < in_group; ++r)
            std::memcpy(dst + r * step, values.data() + r * width + col, (NR ? NR : step) * sizeof(float));
        }
      };
      if (nr == 16) copy_out(std::integral_constant<int64_t, 16>{}, nr);
      else if (nr == 32) copy_out(std::integral_constant<int64_t, 32>{}, nr);
      else copy_out(std::integral_constant<int64_t, 0>{}, nr);
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
// dilation, a kernel wider than 1x1 (a 1x1 conv is already a plain GEMM), on AVX-512 or AVX2.
template <int D>
bool use_direct(const Geometry<D>& g, const ConvOptions<D>& o) {
  if (!o.direct || o.backend != GemmBackend::cubevec || g.o > conv_direct::max_output_channels(gemm::best_isa()) ||
      !conv_direct::available())
    return false;
  for (int d = 0; d < D; ++d)
    if (o.stride[d] != 1 || o.dilation[d] != 1) return false;
  return !is_pointwise(g, o) && g.kernel[D - 1] <= conv_direct::kMaxKernelWidth;
}

template <int D>
Tensor conv(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, const ConvOptions<D>& o, const Stream& stream,
            const Tensor& residual = {}) {
  const Geometry<D> g = check(op, x, w, bias, o);
  Shape out_shape = {g.n, g.o};
  for (int64_t s : g.out) out_shape.push_back(s);
  if (residual.defined()) {
    require_contiguous_f32(residual, op, "residual");
    if (residual.shape() != out_shape)
      throw Error(std::string(op) + ": residual must have the output's shape " + shape_to_string(out_shape) + ", got " +
                  shape_to_string(residual.shape()));
  }
  Tensor out = stream.device().empty(out_shape, DType::f32, stream);
  std::vector<Tensor> reads = {x, w};
  if (bias.defined()) reads.push_back(bias);
  if (residual.defined()) reads.push_back(residual);
  const int64_t kdim = g.c * g.kernel_volume(), positions = g.out_volume();
  const double flops = 2.0 * static_cast<double>(g.n * g.o) * static_cast<double>(kdim) * static_cast<double>(positions);
  const double bytes = static_cast<double>(x.nbytes() + w.nbytes() + out.nbytes() + (residual.defined() ? residual.nbytes() : 0));
  KernelDesc desc{op, Unit::cube, flops, bytes, o.priced_as};
  desc.cube_work = {g.n, positions, g.o};  // per image, positions x output channels
  stream.launch(desc, reads, {out}, [x, w, bias, residual, out, g, o, kdim, positions] {
    const auto* px = reinterpret_cast<const float*>(x.unsynchronized_data_ptr());
    const auto* pw = reinterpret_cast<const float*>(w.unsynchronized_data_ptr());
    const float* pbias = bias.defined() ? reinterpret_cast<const float*>(bias.unsynchronized_data_ptr()) : nullptr;
    const float* pres = residual.defined() ? reinterpret_cast<const float*>(residual.unsynchronized_data_ptr()) : nullptr;
    auto* py = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
    if (use_direct(g, o)) {
      const conv_direct::Shape<D> shape{g.c, g.o, g.in, g.kernel, g.out, o.padding};
      for (int64_t image = 0; image < g.n; ++image)
        conv_direct::convolve<D>(px + image * g.c * g.in_volume(), pw, pbias, py + image * g.o * positions, shape,
                                 pres ? pres + image * g.o * positions : nullptr);
      return;
    }
    const int threads = tbb::this_task_arena::max_concurrency();
    const bool pointwise = is_pointwise(g, o);
    const int64_t block = std::min(pointwise ? kBlock : block_positions(kdim), positions);
    // The cubevec backend's columns go straight into the GEMM's panels (64-byte aligned); the
    // reference backend's into a plain matrix.
    const bool panels = !pointwise && o.backend == GemmBackend::cubevec;
    const gemm::Isa isa = gemm::best_isa();
    // In the caching allocator (64-byte aligned): counted in its peak and limit like the tensors,
    // and the same block comes back call after call. im2col writes every element it holds.
    AllocatedArray<float> cols;
    cols.assign_for_overwrite(pointwise ? 0
                              : panels  ? gemm::f32_panel_layout(block, kdim, isa).floats()
                                        : static_cast<std::size_t>(kdim * block));
    float* const cols_data = cols.data();
    for (int64_t image = 0; image < g.n; ++image) {
      const float* src = px + image * g.c * g.in_volume();
      float* dst = py + image * g.o * positions;
      for (int64_t first = 0; first < positions; first += block) {
        const int64_t count = std::min(block, positions - first);
        gemm::Problem p;
        p.m = g.o, p.n = count, p.k = kdim;
        p.a = pw, p.lda = kdim;
        std::shared_ptr<const gemm::PackedB> packed;
        if (pointwise) {
          p.b = src + first, p.ldb = positions;
        } else if (panels) {
          const gemm::F32PanelLayout layout = gemm::f32_panel_layout(count, kdim, isa);
          im2col_panels(src, g, o, first, count, layout, cols_data);
          packed = gemm::adopt_packed_b(count, kdim, gemm::Element::f32, isa, layout.layout, cols_data, nullptr);
          p.packed_b = packed.get();
        } else {
          im2col(src, g, o, first, count, cols_data);
          p.b = cols_data, p.ldb = count;
        }
        p.c = dst + first, p.ldc = positions;
        if (o.backend == GemmBackend::reference) gemm_reference(p);
        else gemm::sgemm(p, isa, threads);
      }
      // Bias per output channel, i.e. per row of this image's [O, positions] result, and the residual.
      const float* res = pres ? pres + image * g.o * positions : nullptr;
      if (pbias || res)
        tbb::parallel_for(int64_t{0}, g.o, [&](int64_t ch) {
          float* row = dst + ch * positions;
          const float* r = res ? res + ch * positions : nullptr;
          // The order of conv2d's bias pass and then add(residual, out), bit for bit (signed zeros too).
          if (pbias && r)
            for (int64_t j = 0; j < positions; ++j) row[j] = (row[j] + pbias[ch]) + r[j];
          else if (r)
            for (int64_t j = 0; j < positions; ++j) row[j] += r[j];
          else
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

Tensor conv2d_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, const Conv2dOptions& options,
                  const Stream& stream) {
  if (options.backend != GemmBackend::cubevec && options.backend != GemmBackend::reference)
    throw Error("conv2d_add: backend must be cubevec or reference");
  if (!residual.defined()) throw Error("conv2d_add: residual must be a tensor, got none");
  return conv<2>("conv2d_add", x, weight, bias, options, stream, residual);
}

Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv3dOptions& options, const Stream& stream) {
  if (options.backend != GemmBackend::cubevec && options.backend != GemmBackend::reference)
    throw Error("conv3d: backend must be cubevec or reference");
  return conv<3>("conv3d", x, weight, bias, options, stream);
}

Tensor conv3d_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, const Conv3dOptions& options,
                  const Stream& stream) {
  if (options.backend != GemmBackend::cubevec && options.backend != GemmBackend::reference)
    throw Error("conv3d_add: backend must be cubevec or reference");
  if (!residual.defined()) throw Error("conv3d_add: residual must be a tensor, got none");
  return conv<3>("conv3d_add", x, weight, bias, options, stream, residual);
}

}  // namespace cubevec::ops
