#include "models/wan_vae_regroup.h"

#include <string>
#include <vector>

#include "base/error.h"
#include "ops/vector_ops.h"

namespace cubevec::models::wan_vae {

namespace {

// x must be a 5-D f32 activation whose height and width are multiples of `fs`.
void check_regroup_input(const Tensor& x, int64_t fs, const char* op) {
  if (!x.defined() || x.dim() != 5 || x.dtype() != DType::f32 || x.size(3) % fs != 0 || x.size(4) % fs != 0)
    throw Error(std::string(op) + ": expected an f32 [B, C, T, H, W] with H and W multiples of " + std::to_string(fs) + ", got " +
                (x.defined() ? x.describe() : std::string("an undefined tensor")));
}

}  // namespace

Tensor patchify(const Tensor& x_in, int64_t p, const Stream& stream) {
  check_regroup_input(x_in, p, "Wan VAE patchify");
  if (p == 1) return x_in;
  const Tensor x = ops::contiguous(x_in, stream);
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3) / p, w = x.size(4) / p;
  // (b, c, t, i, dy, j, dx) -> (b, c, dx, dy, t, i, j)
  const Tensor cells = x.view({b, c, t, h, p, w, p}).permute({0, 1, 6, 4, 2, 3, 5});
  return ops::contiguous(cells, stream).view({b, c * p * p, t, h, w});
}

Tensor unpatchify(const Tensor& x_in, int64_t p, const Stream& stream) {
  check_regroup_input(x_in, 1, "Wan VAE unpatchify");
  if (p == 1) return x_in;
  if (x_in.size(1) % (p * p) != 0)
    throw Error("Wan VAE unpatchify: the channels (" + std::to_string(x_in.size(1)) +
                ") must be a multiple of patch_size^2 = " + std::to_string(p * p));
  const Tensor x = ops::contiguous(x_in, stream);
  const int64_t b = x.size(0), c = x.size(1) / (p * p), t = x.size(2), h = x.size(3), w = x.size(4);
  // (b, c, dx, dy, t, i, j) -> (b, c, t, i, dy, j, dx)
  const Tensor pixels = x.view({b, c, p, p, t, h, w}).permute({0, 1, 4, 5, 3, 6, 2});
  return ops::contiguous(pixels, stream).view({b, c, t, h * p, w * p});
}

Tensor avg_down_3d(const Tensor& x, int64_t out, int64_t ft, int64_t fs, const Stream& stream) {
  check_regroup_input(x, fs, "Wan VAE AvgDown3D");
  const int64_t c = x.size(1), factor = ft * fs * fs;
  if (out < 1 || c * factor % out != 0)
    throw Error("Wan VAE AvgDown3D: " + std::to_string(c) + " channels x " + std::to_string(factor) + " cell positions do not split into " +
                std::to_string(out) + " equal groups");
  if (factor == 1 && out == c) return x;
  const int64_t pad = (ft - x.size(2) % ft) % ft;
  const Tensor padded = pad > 0 ? ops::pad_frames_front(x, Tensor(), pad, stream) : ops::contiguous(x, stream);
  const int64_t b = x.size(0), t = padded.size(2) / ft, h = x.size(3) / fs, w = x.size(4) / fs, group = c * factor / out;
  // (b, c, t, a, i, dy, j, dx) -> (b, c, a, dy, dx, t, i, j): channel-major runs of `group`.
  const Tensor cells =
      ops::contiguous(padded.view({b, c, t, ft, h, fs, w, fs}).permute({0, 1, 3, 5, 7, 2, 4, 6}), stream).view({b, out, group, t, h, w});
  if (group == 1) return cells.view({b, out, t, h, w});
  Tensor sum = cells.select(2, 0);
  for (int64_t k = 1; k < group; ++k) sum = ops::add(sum, cells.select(2, k), stream);
  return ops::div(sum, Tensor::from_vector(std::vector<float>{static_cast<float>(group)}, {1}), stream);
}

Tensor dup_up_3d(const Tensor& x, int64_t out, int64_t ft, int64_t fs, bool first_chunk, const Stream& stream) {
  check_regroup_input(x, 1, "Wan VAE DupUp3D");
  const int64_t c = x.size(1), factor = ft * fs * fs;
  if (out < 1 || out * factor % c != 0)
    throw Error("Wan VAE DupUp3D: " + std::to_string(out) + " channels x " + std::to_string(factor) +
                " cell positions are not a multiple of " + std::to_string(c) + " input channels");
  const int64_t b = x.size(0), t = x.size(2), h = x.size(3), w = x.size(4), repeats = out * factor / c;
  // Channel n of the repeated x is x's channel n / repeats; n reads as (out channel, a, dy, dx).
  const Tensor repeated = ops::contiguous(x.unsqueeze(2).expand({b, c, repeats, t, h, w}), stream);
  // (b, o, a, dy, dx, t, i, j) -> (b, o, t, a, i, dy, j, dx)
  const Tensor y = ops::contiguous(repeated.view({b, out, ft, fs, fs, t, h, w}).permute({0, 1, 5, 2, 6, 3, 7, 4}), stream)
                       .view({b, out, t * ft, h * fs, w * fs});
  return first_chunk && ft > 1 ? y.narrow(2, ft - 1, t * ft - (ft - 1)) : y;
}

}  // namespace cubevec::models::wan_vae
