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

// A model of FLUX.1's width that a server can run from a prompt, for the `serve-flux` suite:
// FLUX.1-dev's transformer config with 2 double and 2 single blocks (3072 wide, 24 heads of 128,
// 0.9 B parameters, bf16), an 8x VAE with FLUX's 16 latent channels but narrow layers (so 512x512
// gives FLUX's 1,024 image tokens and the decode stays small), and tinyflux's text encoder and
// tokenizer (16 tokens, 64 wide: the context projection is 64 -> 3072 instead of 4096 -> 3072).
// Random weights; written once (about 2 GB) unless `dir` has its COMPLETE marker.
void ensure_flux_width_served(const std::string& dir);
// Where the suites keep that model: $CUBEVEC_FLUX_WIDTH_DIR, else cubevec_flux_width in the
// temporary directory; written there first if it is not complete. Returns the folder.
std::string flux_width_served_folder();

}  // namespace cubevec::bench
