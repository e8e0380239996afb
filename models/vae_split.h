// The plug points of a patch-parallel VAE decode (implemented over MPI in
// pipelines/patch_parallel_vae.h; null everywhere means one device decodes everything).
//
//  * RowSplit (Wan's causal decoder): each rank holds a band of rows of every activation, the
//    latent's rows split as parallel::split_sizes does and scaled with the resolution. A 3x3 conv
//    takes one halo row from each neighbouring band; the mid block's attention sees every row.
//  * TileSharing (AutoencoderKL's tiled decode): the tiles are dealt round-robin over the ranks,
//    and each decoded tile reaches every rank before the tiles are blended.
#pragma once

#include <cstdint>

#include "device/stream.h"
#include "tensor/tensor.h"

namespace cubevec::models {

class RowSplit {
 public:
  virtual ~RowSplit() = default;
  // Where this rank's band lies in an activation whose band has `local_rows` rows: its first row
  // and the rows of the whole image.
  struct Band {
    int64_t first = 0, total = 0;
  };
  virtual Band band(int64_t local_rows) const = 0;
  // This rank's rows of a whole latent z [..., h, w].
  virtual Tensor own_rows(const Tensor& z, const Stream& stream) const = 0;
  // x [..., rows, W] (this rank's band) with `halo` rows of the bands above and below around it:
  // zeros beyond the image's top and bottom edges, as a conv's zero padding.
  virtual Tensor with_halo(const Tensor& x, int64_t halo, const Stream& stream) const = 0;
  // Every rank's band of x concatenated along the rows: the whole image, on every rank.
  virtual Tensor gather(const Tensor& x, const Stream& stream) const = 0;
};

class TileSharing {
 public:
  virtual ~TileSharing() = default;
  virtual int ranks() const = 0;
  virtual int rank() const = 0;
  // Tile `index` as decoded by its owner, on every rank. `decoded` is the tile on its owner and
  // undefined elsewhere; `shape` is the decoded tile's.
  virtual Tensor share(const Tensor& decoded, int64_t index, int owner, const Shape& shape, const Stream& stream) const = 0;
};

}  // namespace cubevec::models
