// The patch-parallel VAE decode (pipelines/patch_parallel_vae.h) under mpirun with 2 and 4 ranks:
// every rank builds the same random decoder (Wan2.1's and Wan2.2's layouts, AutoencoderKL) and
// latent, decodes it alone (the reference) and shared with the other ranks, and checks the two
// agree within 1e-5 of the output scale. The
// shapes give uneven bands (5 latent rows over 2 or 4 ranks, one row for some) and several tiles
// per rank.
#include <gtest/gtest.h>

#include <vector>

#include "models/autoencoder_kl.h"
#include "models/autoencoder_kl_wan.h"
#include "models/parameters.h"
#include "parallel/communicator.h"
#include "pipelines/patch_parallel_vae.h"

#include "common/tensor_testing.h"

namespace cubevec::pipelines {
namespace patch_parallel_vae_mpi_test {  // named after the file: unity batches never mix two files' helpers

using cubevec::testing::expect_close_rel;
using cubevec::testing::random_tensor;

// Base 4, dim_mult [1, 2, 2]: a temporal upsampler (upsample3d) and a spatial one (upsample2d),
// the mid block's attention, 4x space and 2x time.
models::AutoencoderKLWanConfig small_wan() {
  models::AutoencoderKLWanConfig c;
  c.base_dim = 4;
  c.z_dim = 3;
  c.dim_mult = {1, 2, 2};
  c.num_res_blocks = 1;
  c.temperal_downsample = {true, false};
  c.latents_mean = {0.1, -0.2, 0.3};
  c.latents_std = {1.5, 0.8, 2.0};
  c.scale_factor_temporal = 2;
  c.scale_factor_spatial = 4;
  return c;
}

TEST(PatchParallelVae, WanRowBandsWithHaloExchangeDecodeTheOneDeviceVideo) {
  const parallel::Communicator world = parallel::Communicator::world();
  const Stream stream = default_device().default_stream();
  models::AutoencoderKLWan vae(small_wan());
  models::make_random_parameters(vae.parameters(), DType::f32, 21, 0.3f);
  // 3 latent frames (chunked one by one, so the time caches carry halo rows across chunks), 5 rows.
  const Tensor z = random_tensor({1, 3, 3, 5, 3}, 4, DType::f32, 1.0f);
  const Tensor alone = vae.decode(z, {.clamp = false}, stream);
  const PatchParallelRows rows(world, z.size(3));
  models::WanDecodeOptions shared;
  shared.clamp = false;
  shared.rows = &rows;
  const Tensor together = vae.decode(z, shared, stream);
  ASSERT_EQ(together.shape(), alone.shape());
  expect_close_rel(together, alone, 1e-5, "rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()));
}

// The same in Wan2.2's layout (is_residual, patch_size 2): the DupUp3D shortcuts and the
// unpatchify work on each band's rows; the gathered video is the one-device video.
TEST(PatchParallelVae, Wan22RowBandsDecodeTheOneDeviceVideo) {
  const parallel::Communicator world = parallel::Communicator::world();
  const Stream stream = default_device().default_stream();
  models::AutoencoderKLWanConfig c = small_wan();
  c.is_residual = true;
  c.patch_size = 2;
  c.in_channels = 12;
  c.out_channels = 12;
  c.scale_factor_spatial = 8;
  models::AutoencoderKLWan vae(c);
  models::make_random_parameters(vae.parameters(), DType::f32, 22, 0.3f);
  const Tensor z = random_tensor({1, 3, 3, 5, 3}, 5, DType::f32, 1.0f);
  const Tensor alone = vae.decode(z, {.clamp = false}, stream);
  const PatchParallelRows rows(world, z.size(3));
  models::WanDecodeOptions shared;
  shared.clamp = false;
  shared.rows = &rows;
  const Tensor together = vae.decode(z, shared, stream);
  ASSERT_EQ(together.shape(), (Shape{1, 3, 5, 40, 24}));
  ASSERT_EQ(together.shape(), alone.shape());
  expect_close_rel(together, alone, 1e-5, "rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()));
}

TEST(PatchParallelVae, WanBandsRefuseMoreRanksThanLatentRows) {
  const parallel::Communicator world = parallel::Communicator::world();
  const std::string message = cubevec::testing::message_of([&] { PatchParallelRows(world, world.size() - 1); });
  EXPECT_NE(message.find("--vae-parallel: the latent's " + std::to_string(world.size() - 1) + " rows cannot be shared by " +
                         std::to_string(world.size()) + " ranks"),
            std::string::npos)
      << message;
}

TEST(PatchParallelVae, FluxTilesDealtOverTheRanksBlendToTheOneDeviceImage) {
  const parallel::Communicator world = parallel::Communicator::world();
  const Stream stream = default_device().default_stream();
  models::AutoencoderKLConfig c;
  c.latent_channels = 3;
  c.block_out_channels = {8, 8, 16};
  c.norm_num_groups = 4;
  c.sample_size = 16;  // tiles of 4 latent pixels, overlap 1
  models::AutoencoderKLDecoder decoder(c);
  models::make_random_parameters(decoder.parameters(), DType::f32, 11, 0.3f);
  // 9 x 7 latent: 3 x 3 = 9 tiles of uneven sizes, dealt round-robin.
  const Tensor z = random_tensor({1, 3, 9, 7}, 5, DType::f32, 1.0f);
  const Tensor alone = decoder.decode_tiled(z, {}, stream);
  const PatchParallelTiles tiles(world);
  models::TileOptions shared;
  shared.sharing = &tiles;
  const Tensor together = decoder.decode_tiled(z, shared, stream);
  ASSERT_EQ(together.shape(), alone.shape());
  expect_close_rel(together, alone, 1e-5, "rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()));
}

}  // namespace patch_parallel_vae_mpi_test
}  // namespace cubevec::pipelines
