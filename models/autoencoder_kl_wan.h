// diffusers' AutoencoderKLWan (the Wan2.1 and Wan2.2 video VAEs), its decoder (the encoder is
// models/autoencoder_kl_wan_encoder.h), written from docs/models.md, "AutoencoderKLWan decoder" and
// "Wan2.2 VAE". Weights keep diffusers' names (`decoder.up_blocks.1.upsamplers.0.time_conv.weight`,
// `post_quant_conv.weight`, ...); each block is a plain sequence of op calls (normalize_channels,
// activation, conv3d, conv2d, matmul, attention_forward, upsample_nearest2d, add).
//
// Decoding is causal in time and runs chunk by chunk as diffusers' _decode does: one latent frame
// at a time, each causal conv keeping the last two frames of its input from the previous chunk
// (its feature cache), so the activations held at any moment are those of one chunk plus the
// caches, whatever the frame count. The first latent frame gives 1 video frame, every later one 4
// (Wan2.1: T latent frames -> 1 + 4 (T - 1) video frames, 8x spatially; Wan2.2 16x).
//
// Wan2.2 (is_residual, patch_size 2): each upsampling up block adds a parameter-free shortcut of its
// input (DupUp3D, models/wan_vae_regroup.h), its upsampler keeps the width, and the decoder's 12
// output channels are unpatchified into 3 channels at twice the height and width.
//
// Memory (f32, batch B, decoder output h' x w' = 2^(levels - 1) x the latent, decoder width d = 96
// for Wan2.1, 256 for Wan2.2) is independent of the frame count and linear in B h' w':
//  * the feature caches, feature_cache_bytes(): 2 frames per causal conv at that conv's width and
//    resolution, 8 bytes x batch x (7 d h' w' + 6 (2d) (h'/2) (w'/2) + ...), dominated by the
//    full-resolution convs: 3.78 GB for Wan2.1 at 832 x 480;
//  * one chunk's working set: about 6 activations of 4 frames x d x h' x w' x 4 B (613 MB for
//    Wan2.1 at 832 x 480) at the full-resolution residual blocks (the host waits for the device after
//    each conv step, see FeatureCache), plus the GEMM's packing workspace; with is_residual also the
//    block input each shortcut keeps until the block's end.
// estimate_peak_bytes() adds these up (7.5 GB for Wan2.1 at 832 x 480, printed by
// FeatureCacheAtWan21Size in tests/models/autoencoder_kl_wan_test.cpp; a one-off decode at those
// widths peaked at 7.14 GB); MemoryIsBoundedByOneChunk in the same file checks the bound at a third
// of the width, and tests/models/wan22_vae_golden_test.cpp for the residual layout.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/layers.h"
#include "models/vae_split.h"

namespace cubevec::models {

struct AutoencoderKLWanConfig {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 0;  // 0 (null in config.json): base_dim
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult{1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<double> attn_scales{};  // the encoder's (the decoder has no attention there)
  // diffusers' spelling; the decoder upsamples in time where the reversed list says so.
  std::vector<bool> temperal_downsample{false, true, true};
  double dropout = 0.0;  // inactive at inference
  std::vector<double> latents_mean{-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                                   0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
  std::vector<double> latents_std{2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                  3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};
  // Channels of the encoder's input and the decoder's output, after patchify: video channels x
  // patch_size^2 (Wan2.2: 12).
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  // Wan2.2's layout: residual down / up blocks with parameter-free shortcuts, upsamplers keeping
  // the width; and the video folded into patch_size x patch_size pixel cells around the model.
  bool is_residual = false;
  int64_t patch_size = 1;  // null in config.json: 1
  int64_t scale_factor_temporal = 4;
  int64_t scale_factor_spatial = 8;

  // The decoder's base width: decoder_base_dim, or base_dim when that is 0.
  int64_t decoder_dim() const { return decoder_base_dim > 0 ? decoder_base_dim : base_dim; }
  // temperal_downsample reversed: up block i upsamples in time when entry i is true.
  std::vector<bool> temperal_upsample() const { return {temperal_downsample.rbegin(), temperal_downsample.rend()}; }
  // Video pixels per latent pixel: 2^(len(dim_mult) - 1) x patch_size (8 for Wan2.1, 16 for Wan2.2).
  int64_t spatial_upscale() const { return (int64_t{1} << (dim_mult.size() - 1)) * patch_size; }
  // The video's channels: the decoder's output and the encoder's input unpatchified (3 for both).
  int64_t video_channels() const { return out_channels / (patch_size * patch_size); }
  int64_t encoder_video_channels() const { return in_channels / (patch_size * patch_size); }
  // Video frames per latent frame after the first: 2^(number of temporal upsamples) (4 for Wan2.1).
  int64_t temporal_upscale() const;
  // 1 + temporal_upscale() (latent_frames - 1): 21 latent frames -> 81 video frames.
  int64_t num_frames(int64_t latent_frames) const { return 1 + temporal_upscale() * (latent_frames - 1); }

  // From a diffusers vae/config.json (every key optional, defaulting to diffusers' code defaults,
  // which are Wan2.1's). Keys starting with '_' are ignored except _class_name, which must be
  // "AutoencoderKLWan" when present; clip_output (an older diffusers key) must be a boolean and is
  // ignored (diffusers always clamps). is_residual is a boolean, patch_size null or a positive
  // integer dividing the channels' cells; scale_factor_temporal / scale_factor_spatial must agree
  // with the architecture; latents_mean / latents_std must list z_dim numbers. An unknown key, a
  // wrong type or an unsupported value is an error naming `source` and the key.
  static AutoencoderKLWanConfig from_json(const nlohmann::json& json, const std::string& source);
  static AutoencoderKLWanConfig load(const std::string& config_path);
  // Wan2.1's VAE (diffusers' defaults): base_dim 96, z_dim 16, dim_mult [1, 2, 4, 4], 2 res blocks,
  // temperal_downsample [false, true, true], the 16 latents_mean / latents_std of Wan2.1's VAE config.
  static AutoencoderKLWanConfig wan21();
};

// What the encoder and decoder need of any config, however it was made: an error naming `source`
// and the key otherwise.
void validate_autoencoder_kl_wan_config(const AutoencoderKLWanConfig& config, const std::string& source);

namespace wan_vae {

// The state of one chunked decode: per causal conv with a time kernel (a "slot"), the last frames
// of its input so far (up to 2 p_t), and per temporal upsampler whether its first chunk has passed.
//
// It also paces the host. A queued kernel keeps its tensors alive until it has run, and tensors
// are allocated when their kernel is queued, so a host that queued a whole chunk ahead would hold
// every intermediate of the chunk at once. The blocks call pace() after each norm, conv and
// residual add, which waits for the stream, so only the tensors of the step being queued and
// those still referenced coexist (as in eager PyTorch). A step is a whole conv over a chunk, so
// the waits cost nothing measurable.
//
// With a RowSplit (patch parallel), every activation is this rank's band of rows; the cached frames
// of a 3x3 conv include its halo rows.
struct FeatureCache {
  std::vector<Tensor> frames;
  std::vector<bool> started;
  bool pacing = true;
  const RowSplit* rows = nullptr;  // null: one device holds every row
  FeatureCache(int slots, int upsamplers) : frames(static_cast<std::size_t>(slots)), started(static_cast<std::size_t>(upsamplers), false) {}
  // Bytes held by the cached frames.
  int64_t bytes() const;
  // Waits for the work queued on `stream` so far (when pacing).
  void pace(const Stream& stream) const {
    if (pacing) stream.synchronize();
  }
};

// WanCausalConv3d: Conv3d weight [out, in, kt, kh, kw], bias [out]; the spatial padding is
// symmetric (p_h, p_w), the time padding 2 p_t frames in front and none behind. A bf16 weight is
// widened to f32 at each call (conv3d is f32).
struct CausalConv3d {
  Tensor weight, bias;
  int64_t in = 0, out = 0;
  std::array<int64_t, 3> kernel{1, 1, 1}, padding{0, 0, 0};  // (t, h, w)
  int slot = -1;                                             // feature-cache slot when p_t > 0

  // Declares `<name>.weight` and `<name>.bias`; takes the next cache slot (counted in `slots`)
  // when the conv has time padding.
  void declare(ParameterTable& table, const std::string& name, int64_t in_channels, int64_t out_channels,
               std::array<int64_t, 3> kernel_size, std::array<int64_t, 3> conv_padding, int& slots);
  // Frames of left context: 2 p_t.
  int64_t context() const { return 2 * padding[0]; }
  // x [B, in, T, H, W] f32 -> [B, out, T, H, W]: the conv over [zeros, cache, x] along time, where
  // `cache` (undefined or [B, in, t_c, H, W] with t_c <= context()) holds the frames before x and
  // the zeros make up the rest of the context.
  Tensor operator()(const Tensor& x, const Tensor& cache, const Stream& stream) const;
  // The same with `row_padding` zero rows instead of p_h (0: x already carries its halo rows), plus
  // `residual` (the output's shape, f32 contiguous) when defined, added as the output is stored.
  Tensor convolve(const Tensor& x, const Tensor& cache, int64_t row_padding, const Stream& stream, const Tensor& residual = {}) const;
  // The same with the conv's slot of `cache` as the frames before x; the slot then holds the last
  // context() frames of [slot, x] (diffusers' cache_x). Convs without time padding ignore the cache.
  Tensor operator()(const Tensor& x, FeatureCache& cache, const Stream& stream, const Tensor& residual = {}) const;
};

// WanRMS_norm: F.normalize(x, dim=1) * sqrt(C) * gamma over the channels; `<name>.gamma` is
// [C, 1, 1, 1] (5-D activations) or [C, 1, 1] (images = true, the attention block's), kept f32.
struct RMSNorm {
  Tensor gamma;
  int64_t channels = 0;
  void declare(ParameterTable& table, const std::string& name, int64_t num_channels, bool images);
  Tensor operator()(const Tensor& x, const Stream& stream, bool silu = false) const;
};

// WanResidualBlock(in, out): shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))), both convs
// 3x3x3 causal with padding 1, the shortcut a 1x1x1 conv when in != out.
struct ResidualBlock {
  RMSNorm norm1, norm2;
  CausalConv3d conv1, conv2, conv_shortcut;
  bool has_shortcut = false;

  void declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int& slots);
  Tensor operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const;
};

// WanAttentionBlock(C): per frame, single-head attention over the H W positions of RMS-normed x:
// q, k, v = channels [0, C), [C, 2C), [2C, 3C) of the 1x1 `to_qkv` (C -> 3C), softmax(q k^T /
// sqrt(C)) v, then the 1x1 `proj`, plus x. The 1x1 convs run as f32 GEMMs over the tokens.
// With `rows` (patch parallel), x is this rank's band: keys and values come from every rank's rows,
// queries from the band's.
struct AttentionBlock {
  RMSNorm norm;
  Tensor qkv_weight, qkv_bias, proj_weight, proj_bias;  // [3C, C, 1, 1], [3C], [C, C, 1, 1], [C]
  int64_t channels = 0;

  void declare(ParameterTable& table, const std::string& prefix, int64_t num_channels);
  Tensor operator()(const Tensor& x, const Stream& stream, const RowSplit* rows = nullptr) const;  // [B, C, T, H, W] -> same
};

// WanResample in its decoder modes. upsample2d: per frame, nearest 2x then `resample.1`
// (Conv2d C -> C/2, 3x3 pad 1; C -> C in the residual layout, diffusers' upsample_out_dim).
// upsample3d: first the causal `time_conv` (C -> 2C, kernel (3, 1, 1), 2 zero frames in front)
// turning each frame into two (channels [0, C) the earlier, [C, 2C) the later), except that the
// very first frame of the video passes through alone and is never context; then the upsample2d
// path.
struct Resample {
  enum class Mode { upsample2d, upsample3d };
  Mode mode = Mode::upsample2d;
  Conv2d resample;            // `resample.1`
  CausalConv3d time_conv;     // upsample3d only
  int first_chunk_slot = -1;  // upsample3d: index into FeatureCache::started

  // out_channels: resample.1's width (0: channels / 2, Wan2.1's).
  void declare(ParameterTable& table, const std::string& prefix, int64_t channels, Mode resample_mode, int& slots, int& upsamplers,
               int64_t out_channels = 0);
  // Whether the next call is the decode's first chunk (upsample3d; false for upsample2d).
  bool first_chunk(const FeatureCache& cache) const;
  Tensor operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const;  // -> [B, out, T', 2H, 2W]
};

// WanMidBlock: resnets.0 -> attentions.0 -> resnets.1.
struct MidBlock {
  ResidualBlock resnet0, resnet1;
  AttentionBlock attention;
  void declare(ParameterTable& table, const std::string& prefix, int64_t channels, int& slots);
  // x by value: a caller that moves it in lets the block drop it as soon as it is used.
  Tensor operator()(Tensor x, FeatureCache& cache, const Stream& stream) const;
};

// WanUpBlock: num_res_blocks + 1 residual blocks, then (all but the last block) `upsamplers.0`.
struct UpBlock {
  std::vector<ResidualBlock> resnets;
  Resample upsampler;
  bool has_upsampler = false;
  void declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t num_resnets, bool upsample, bool temporal,
               int& slots, int& upsamplers);
  Tensor operator()(Tensor x, FeatureCache& cache, const Stream& stream) const;  // x by value, as MidBlock's
};

// WanResidualUpBlock (is_residual): the same residual blocks, then (all but the last block)
// `upsampler`, keeping the width, plus the parameter-free shortcut DupUp3D(in, out, 2 when temporal
// else 1, 2) of the block's input. diffusers' first_chunk (the chunk holding latent frame 0) is
// when the temporal upsampler has not started: the shortcut then drops its first frame, as the
// upsampler passes that frame alone.
struct ResidualUpBlock {
  UpBlock body;  // its upsampler is named `upsampler`
  int64_t out = 0, time_factor = 1;

  void declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out_channels, int64_t num_resnets, bool upsample,
               bool temporal, int& slots, int& upsamplers);
  // x by value, as UpBlock's; the blocks with a shortcut keep it to the end.
  Tensor operator()(Tensor x, FeatureCache& cache, const Stream& stream) const;
};

// Every module of the decoder path, named as the checkpoint names them.
struct DecoderModules {
  CausalConv3d post_quant_conv;                     // `post_quant_conv` (1x1x1, z_dim -> z_dim)
  CausalConv3d conv_in;                             // `decoder.conv_in`
  MidBlock mid_block;                               // `decoder.mid_block`
  std::vector<UpBlock> up_blocks;                   // `decoder.up_blocks.i` (Wan2.1; empty with is_residual)
  std::vector<ResidualUpBlock> residual_up_blocks;  // `decoder.up_blocks.i` (is_residual)
  RMSNorm norm_out;                                 // `decoder.norm_out`, then SiLU
  CausalConv3d conv_out;                            // `decoder.conv_out`
  int cache_slots = 0;                              // causal convs with a feature cache
  int temporal_upsamplers = 0;
  // Each up block's residual blocks and upsampler, in either layout.
  std::vector<const UpBlock*> up_block_bodies() const;
};

}  // namespace wan_vae

struct WanDecodeOptions {
  // Latent frames decoded per chunk: 1 is diffusers' frame-by-frame decode; 0 decodes the whole
  // sequence at once. Every choice gives the same video (up to float rounding).
  int64_t latent_frames_per_chunk = 1;
  bool clamp = true;  // clamp the video to [-1, 1], as diffusers' _decode does
  // Patch parallel: this rank decodes its band of rows and each chunk's frames are gathered, so
  // every rank's sink gets the whole frames. Null: one device decodes every row.
  const RowSplit* rows = nullptr;
};

class AutoencoderKLWan {
 public:
  // Declares every decoder weight and post_quant_conv; the tensors stay undefined until
  // load_parameters / make_random_parameters / make_meta_parameters fills parameters(). Throws
  // for a config the decoder cannot be built from.
  explicit AutoencoderKLWan(AutoencoderKLWanConfig config);

  const AutoencoderKLWanConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  ParameterTable& mutable_parameters() { return table_; }
  const wan_vae::DecoderModules& modules() const { return *modules_; }

  // The pipeline's un-normalization, as diffusers' WanPipeline computes it in f32:
  // z = latents / (1 / latents_std) + latents_mean per channel. latents [B, z_dim, T, h, w].
  Tensor unnormalize(const Tensor& latents, const Stream& stream = ops::default_op_stream()) const;

  // z [B, z_dim, T, h, w] f32 or bf16 (any strides), already un-normalized. Calls `sink` with each
  // chunk's video frames in order, f32 [B, video_channels(), f, s h, s w] with s = spatial_upscale()
  // (with one latent frame per chunk: f = 1 for the first chunk, 4 after). Memory is bounded by one
  // chunk: the host waits for the device step by step (see FeatureCache).
  void decode_frames(const Tensor& z, const std::function<void(const Tensor& frames)>& sink, const WanDecodeOptions& options = {},
                     const Stream& stream = ops::default_op_stream()) const;
  // The whole video [B, video_channels(), 1 + 4 (T - 1), s h, s w] f32: decode_frames' chunks concatenated.
  Tensor decode(const Tensor& z, const WanDecodeOptions& options = {}, const Stream& stream = ops::default_op_stream()) const;

  // The pieces of decode_frames: a fresh feature cache, and one chunk z [B, z_dim, t, h, w] (f32,
  // the frames after those already decoded with `cache`) to its video frames, unclamped (and
  // unpatchified when patch_size > 1).
  wan_vae::FeatureCache make_feature_cache() const;
  Tensor decode_chunk(const Tensor& z, wan_vae::FeatureCache& cache, const Stream& stream = ops::default_op_stream()) const;

  // Bytes the feature caches hold between chunks for a latent of `batch` x h x w (exact, f32, from
  // the third latent frame on).
  int64_t feature_cache_bytes(int64_t batch, int64_t latent_h, int64_t latent_w) const;
  // An upper estimate of the allocator's peak during decode_frames with one latent frame per
  // chunk: the caches plus the largest chunk's working set (see the header comment).
  int64_t estimate_peak_bytes(int64_t batch, int64_t latent_h, int64_t latent_w) const;

 private:
  AutoencoderKLWanConfig config_;
  std::unique_ptr<wan_vae::DecoderModules> modules_;  // on the heap: table_'s slots survive a move
  ParameterTable table_;
};

// A diffusers AutoencoderKLWan directory: dir/config.json plus the weights (one .safetensors file
// or a sharded index), stored as `dtype` (f32 or bf16). Only decoder.* and post_quant_conv.* are
// loaded; the encoder's tensors (encoder.*, quant_conv.*) are ignored. A missing, mis-shaped or
// unexpected decoder tensor is an error listing every such name.
AutoencoderKLWan load_autoencoder_kl_wan(const std::string& dir, DType dtype = DType::f32, const std::string& variant = "");

}  // namespace cubevec::models
