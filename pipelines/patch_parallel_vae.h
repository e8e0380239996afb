// Patch-parallel VAE decode over the ranks of one communicator (`--vae-parallel`), the two plug
// points of models/vae_split.h:
//   - PatchParallelRows for Wan's causal decoder: rank r decodes rows [o_r, o_r + n_r) of the
//     latent (parallel::split_sizes) and, at every resolution, the same band scaled. Before each
//     3x3 conv a rank sends its edge rows to the bands above and below and receives theirs (the
//     halo), two send/recv kernels on the communication unit; the mid block's attention gathers
//     every row for its keys and values; each chunk's frames are gathered at the end.
//   - PatchParallelTiles for AutoencoderKL's tiled decode: tile k is decoded by rank k mod P and
//     all-gathered to every rank, which then blends them as one device would.
// Both give the single-device result (the same convs on the same pixels), up to float rounding.
#pragma once

#include <vector>

#include "models/vae_split.h"
#include "parallel/communicator.h"

namespace cubevec::pipelines {

// Throws unless `ranks` can share `latent_rows` (each needs at least one row): checked before any work.
void check_row_split(int ranks, int64_t latent_rows);

class PatchParallelRows : public models::RowSplit {
 public:
  // The latent's `latent_rows` rows shared by the ranks of `comm`; each needs at least one.
  PatchParallelRows(parallel::Communicator comm, int64_t latent_rows);

  Band band(int64_t local_rows) const override;
  Tensor own_rows(const Tensor& z, const Stream& stream) const override;
  Tensor with_halo(const Tensor& x, int64_t halo, const Stream& stream) const override;
  Tensor gather(const Tensor& x, const Stream& stream) const override;

  const std::vector<int64_t>& latent_bands() const { return rows_; }

 private:
  // Every rank's band at the resolution where this rank's has `local_rows` rows.
  std::vector<int64_t> scaled_bands(int64_t local_rows) const;

  parallel::Communicator comm_;
  std::vector<int64_t> rows_;  // latent rows per rank
};

class PatchParallelTiles : public models::TileSharing {
 public:
  explicit PatchParallelTiles(parallel::Communicator comm) : comm_(std::move(comm)) {}

  int ranks() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  Tensor share(const Tensor& decoded, int64_t index, int owner, const Shape& shape, const Stream& stream) const override;

 private:
  parallel::Communicator comm_;
};

}  // namespace cubevec::pipelines
