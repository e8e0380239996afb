#include "pipelines/patch_parallel_vae.h"

#include "ops/vector_ops.h"
#include "parallel/collectives.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

int64_t rows_dim(const Tensor& x, const char* what) {
  if (!x.defined() || x.dim() < 3) throw Error(std::string("patch-parallel VAE: ") + what + " must be [..., rows, W]");
  return x.dim() - 2;
}

// Zeros of `shape`, stored or (simulate mode) shape-only like `like`.
Tensor zeros_like_storage(const Tensor& like, const Shape& shape) {
  return like.has_storage() ? Tensor::zeros(shape, like.dtype()) : Tensor::meta(shape, like.dtype());
}

}  // namespace

void check_row_split(int ranks, int64_t latent_rows) {
  if (latent_rows < ranks)
    throw Error("--vae-parallel: the latent's " + std::to_string(latent_rows) + " rows cannot be shared by " + std::to_string(ranks) +
                " ranks (each decodes at least one)");
}

PatchParallelRows::PatchParallelRows(parallel::Communicator comm, int64_t latent_rows) : comm_(std::move(comm)) {
  check_row_split(comm_.size(), latent_rows);
  rows_ = parallel::split_sizes(latent_rows, comm_.size());
}

std::vector<int64_t> PatchParallelRows::scaled_bands(int64_t local_rows) const {
  const int64_t own = rows_[static_cast<std::size_t>(comm_.rank())];
  if (local_rows % own != 0)
    throw Error("patch-parallel VAE: a band of " + std::to_string(local_rows) + " rows is not a multiple of this rank's " +
                std::to_string(own) + " latent rows");
  std::vector<int64_t> bands = rows_;
  for (int64_t& b : bands) b *= local_rows / own;
  return bands;
}

models::RowSplit::Band PatchParallelRows::band(int64_t local_rows) const {
  const std::vector<int64_t> bands = scaled_bands(local_rows);
  Band b;
  for (int r = 0; r < comm_.size(); ++r) {
    if (r < comm_.rank()) b.first += bands[static_cast<std::size_t>(r)];
    b.total += bands[static_cast<std::size_t>(r)];
  }
  return b;
}

Tensor PatchParallelRows::own_rows(const Tensor& z, const Stream& stream) const {
  const int64_t d = rows_dim(z, "the latent"), own = rows_[static_cast<std::size_t>(comm_.rank())];
  const Band latent = band(own);
  if (z.size(d) != latent.total)
    throw Error("patch-parallel VAE: the latent has " + std::to_string(z.size(d)) + " rows, the split was made for " +
                std::to_string(latent.total));
  return ops::contiguous(z.narrow(d, latent.first, own), stream);
}

Tensor PatchParallelRows::with_halo(const Tensor& x, int64_t halo, const Stream& stream) const {
  const int64_t d = rows_dim(x, "an activation");
  const int64_t rows = x.size(d);
  if (halo < 1 || halo > rows)
    throw Error("patch-parallel VAE: a halo of " + std::to_string(halo) + " row(s) needs bands of at least that many rows, this one has " +
                std::to_string(rows));
  const int P = comm_.size(), me = comm_.rank();
  Shape edge = x.shape();
  edge[static_cast<std::size_t>(d)] = halo;
  Tensor above, below;
  if (P > 1) {
    // Two ring steps: every band's last rows go down, its first rows go up. The steps wrap around
    // (the first band receives the last one's rows): those are dropped for the image's zero edge.
    const int down = (me + 1) % P, up = (me + P - 1) % P;
    above = parallel::send_recv(x.narrow(d, rows - halo, halo), down, up, edge, comm_, stream, "vae.halo.down");
    below = parallel::send_recv(x.narrow(d, 0, halo), up, down, edge, comm_, stream, "vae.halo.up");
  }
  if (me == 0) above = zeros_like_storage(x, edge);
  if (me == P - 1) below = zeros_like_storage(x, edge);
  return ops::concat({above, x, below}, d, stream);
}

Tensor PatchParallelRows::gather(const Tensor& x, const Stream& stream) const {
  const int64_t d = rows_dim(x, "an activation");
  return parallel::all_gather(x, d, comm_, stream, "vae.rows", scaled_bands(x.size(d)));
}

Tensor PatchParallelTiles::share(const Tensor& decoded, int64_t index, int owner, const Shape& shape, const Stream& stream) const {
  if (shape.size() != 4) throw Error("patch-parallel VAE: a decoded tile must be [B, C, h, w]");
  std::vector<int64_t> sizes(static_cast<std::size_t>(comm_.size()), 0);
  sizes[static_cast<std::size_t>(owner)] = shape[2];
  Tensor mine;
  if (owner == comm_.rank()) {
    if (!decoded.defined() || decoded.shape() != shape)
      throw Error("patch-parallel VAE: tile " + std::to_string(index) + " decoded to " +
                  (decoded.defined() ? shape_to_string(decoded.shape()) : std::string("nothing")) + ", expected " + shape_to_string(shape));
    mine = decoded;
  } else {
    Shape none = shape;
    none[2] = 0;
    mine = stream.device().empty(none, DType::f32, stream);
  }
  return parallel::all_gather(mine, 2, comm_, stream, "vae.tile", sizes);
}

}  // namespace cubevec::pipelines
