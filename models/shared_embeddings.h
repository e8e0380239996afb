// Embeddings that Flux, Wan and later models share: rotary position tables from token position ids
// (Flux's FluxPosEmbed; Wan's 3-D RoPE is the same per-axis formula over a (t, h, w) grid) and the
// timestep sinusoid (diffusers' Timesteps); and a cache so a table is built once per shape, not per
// forward.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace cubevec::models {

// cos and sin [L, head_dim] f32, for the interleaved rotation (each frequency repeated twice).
struct RopeTable {
  Tensor cos, sin;
};

// The table for token ids [L, n_axes] (or [B, L, n_axes]: batch 0 is used; f32, bf16, i32 or i64,
// read as f32 positions as diffusers casts them): axis a takes axes_dims[a] columns with frequencies
// theta^(-2j / axes_dims[a]), each repeated twice; computed in double, rounded to f32.
RopeTable axial_rope(const Tensor& ids, const std::vector<int64_t>& axes_dims, double theta = 10000.0);

// The sinusoidal embedding [B, channels] of diffusers' Timesteps(channels, flip_sin_to_cos=True,
// shift 0) of values [B] * multiplier (cosines first), computed in f32 as diffusers does. `values`
// is a host tensor (f32, bf16 or i64).
Tensor timestep_sinusoid(const Tensor& values, int64_t channels = 256, float multiplier = 1.0f);

// RoPE tables by key (the ids' values, or a grid's sizes), built on first use; the last
// `capacity` keys are kept. Thread-safe (a model may run on several streams at once).
class RopeCache {
 public:
  explicit RopeCache(std::size_t capacity = 8) : capacity_(capacity) {}
  RopeCache(const RopeCache&) = delete;
  RopeCache& operator=(const RopeCache&) = delete;
  RopeTable get(const std::vector<float>& key, const std::function<RopeTable()>& make) const;
  std::size_t builds() const;  // how many tables were built (tests: once per shape)

 private:
  std::size_t capacity_;
  mutable std::mutex mutex_;
  mutable std::list<std::pair<std::vector<float>, RopeTable>> entries_;  // most recent first
  mutable std::size_t builds_ = 0;
};

// The values of a small host tensor (ids) as floats: the key of its RoPE table.
std::vector<float> rope_key(const Tensor& ids);

}  // namespace cubevec::models
