// Seeded, reproducible Gaussian noise for the initial latents.
//
// The generator: element i of the tensor (row-major) comes from the pair p = i / 2. Two 64-bit
// words are hashed from (seed, p) with SplitMix64 (Steele, Lea, Flood 2014): w1 = mix(seed + 2p +
// 1), w2 = mix(seed + 2p + 2) after seed itself has been mixed once; u1 = (w1 >> 11 + 1) * 2^-53 in
// (0, 1], u2 = (w2 >> 11) * 2^-53 in [0, 1); Box-Muller gives r = sqrt(-2 ln u1), z_{2p} = r
// cos(2 pi u2), z_{2p+1} = r sin(2 pi u2), computed in double and rounded to f32. So the values
// depend only on (seed, index): the same seed gives the same image on any thread count, and a
// larger tensor extends a smaller one. It is not torch's generator: matching a PyTorch seed is out
// of scope (docs/models.md "Flux latent packing"); parity runs feed the same noise to both.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace cubevec::pipelines {

// Standard normal values of `shape` (f32).
Tensor gaussian_noise(const Shape& shape, uint64_t seed);

}  // namespace cubevec::pipelines
