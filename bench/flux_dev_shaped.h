// A FLUX.1-dev-shaped model folder with random weights, for the `memory` suite's weight-streaming
// runs: the transformer of assets/configs/flux1-dev (19 + 38 blocks, 3072 wide, 11.9 B parameters)
// in bf16, sharded as diffusers shards it (about 24 GB), its VAE in f32, and a prompt-embeddings
// file of FLUX.1's shapes (T5 512 x 4096, CLIP pooled 768).
#pragma once

#include <string>

namespace cubevec::bench {

// Writes the folder at `dir` unless a previous call finished it (it leaves a COMPLETE marker), with
// progress on stderr. Returns the prompt-embeddings file's path.
std::string ensure_flux_dev_shaped(const std::string& dir);

}  // namespace cubevec::bench
