#include "models/wan_transformer.h"

#include <algorithm>

#include "models/component.h"
#include "models/dit_ops.h"
#include "models/input_checks.h"
#include "ops/conv.h"
#include "base/error.h"
#include "base/config_reader.h"
#include "base/strict_json.h"

namespace cubevec::models {

namespace {

using dit::gated_linear;
using dit::rope;
using dit::split_heads;

// Row k of a [B, n, D] modulation tensor: a [B, D] view.
Tensor row(const Tensor& mod, int64_t k) { return mod.select(1, k); }

// The largest number of distinct values per-token timesteps may take (TI2V uses 2).
constexpr std::size_t kMaxTokenTimesteps = 16;

}  // namespace

// --- config -------------------------------------------------------------------------------------

std::array<int64_t, 3> WanConfig::rope_axes() const {
  const int64_t hw = 2 * (attention_head_dim / 6);
  return {attention_head_dim - 2 * hw, hw, hw};
}

WanConfig WanConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "WanTransformer3DModel");
  r.expect_class({"WanTransformer3DModel"});
  WanConfig c;
  c.out_channels = 0;  // null or absent: in_channels
  std::vector<int64_t> patch{c.patch_size.begin(), c.patch_size.end()};
  std::string qk_norm = "rms_norm_across_heads";
  r.integers("patch_size", patch, 1, 3, 64)
      .integer("num_attention_heads", c.num_attention_heads, 1, 1024)
      .integer("attention_head_dim", c.attention_head_dim, 6, 1024)
      .integer("in_channels", c.in_channels, 1)
      .integer("out_channels", c.out_channels, 1)
      .integer("text_dim", c.text_dim, 1)
      .integer("freq_dim", c.freq_dim, 2)
      .integer("ffn_dim", c.ffn_dim, 1)
      .integer("num_layers", c.num_layers, 0, 1024)
      .boolean("cross_attn_norm", c.cross_attn_norm)
      .text("qk_norm", qk_norm, {"rms_norm_across_heads"})  // null below: diffusers' "no norm", not the default
      .positive_number("eps", c.eps)
      .integer("rope_max_seq_len", c.rope_max_seq_len, 1);
  if (r.contains("qk_norm") && r.raw("qk_norm").is_null())
    r.fail("qk_norm",
           "is null (no query/key norm), which cubevec's WanTransformer3DModel does not run; it supports \"rms_norm_across_heads\"");
  r.integer("image_dim", c.image_dim, 1)
      .integer("added_kv_proj_dim", c.added_kv_proj_dim, 1)
      .integer("pos_embed_seq_len", c.pos_embed_seq_len, 1);
  r.reject_unknown();
  for (std::size_t i = 0; i < 3; ++i) c.patch_size[i] = patch[i];
  if (c.out_channels == 0) c.out_channels = c.in_channels;
  if (c.freq_dim % 2 != 0) r.fail("freq_dim", "must be even, got " + std::to_string(c.freq_dim));
  if (c.attention_head_dim % 2 != 0)
    r.fail("attention_head_dim", "must be even (RoPE rotates pairs), got " + std::to_string(c.attention_head_dim));
  // diffusers' image branch needs both: image_dim embeds the image tokens, added_kv_proj_dim attends
  // to them (one without the other mixes image rows into the text or splits a context with none).
  if ((c.image_dim > 0) != (c.added_kv_proj_dim > 0))
    r.fail(c.image_dim > 0 ? "added_kv_proj_dim" : "image_dim", "is null while " +
                                                                    std::string(c.image_dim > 0 ? "image_dim" : "added_kv_proj_dim") +
                                                                    " is set; the image branch (Wan2.1 image-to-video) needs both");
  if (c.added_kv_proj_dim > 0 && c.added_kv_proj_dim != c.inner_dim())
    r.fail("added_kv_proj_dim", "is " + std::to_string(c.added_kv_proj_dim) +
                                    "; the added keys and values read the embedded image tokens, " + std::to_string(c.inner_dim()) +
                                    " wide (num_attention_heads x attention_head_dim)");
  if (c.pos_embed_seq_len > 0 && c.image_dim == 0)
    r.fail("pos_embed_seq_len", "is set but image_dim is null (no image branch to add it to)");
  return c;
}

WanConfig WanConfig::load(const std::string& config_path) { return from_json(read_json_file(config_path), config_path); }

WanConfig WanConfig::wan21_1_3b() {
  WanConfig c;
  c.num_attention_heads = 12;
  c.ffn_dim = 8960;
  c.num_layers = 30;
  return c;
}

WanConfig WanConfig::wan21_14b() { return WanConfig{}; }

WanConfig WanConfig::wan22_5b() {
  WanConfig c;
  c.num_attention_heads = 24;
  c.ffn_dim = 14336;
  c.num_layers = 30;
  c.in_channels = c.out_channels = 48;
  return c;
}  // diffusers' code defaults are the 14B model

// --- RoPE ---------------------------------------------------------------------------------------

RopeTable wan_rope(int64_t frames, int64_t height, int64_t width, const WanConfig& config) {
  const int64_t limit = config.rope_max_seq_len;
  if (frames > limit || height > limit || width > limit)
    throw Error("wan_rope: the patch grid " + std::to_string(frames) + "x" + std::to_string(height) + "x" + std::to_string(width) +
                " exceeds rope_max_seq_len " + std::to_string(limit) + " on an axis");
  // Token (f, i, j) in (t, h, w) row-major order; the per-axis frequencies are Flux's formula.
  std::vector<float> ids;
  ids.reserve(static_cast<std::size_t>(frames * height * width * 3));
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t i = 0; i < height; ++i)
      for (int64_t j = 0; j < width; ++j)
        for (int64_t v : {f, i, j}) ids.push_back(static_cast<float>(v));
  const auto axes = config.rope_axes();
  return axial_rope(Tensor::from_vector(ids, {frames * height * width, 3}), {axes[0], axes[1], axes[2]});
}

// --- per-token timesteps -------------------------------------------------------------------------

Tensor WanTokenTimesteps::per_token(const Tensor& rows, const Stream& s) const {
  Tensor sum;
  for (std::size_t u = 0; u < masks.size(); ++u) {
    const int64_t i = static_cast<int64_t>(u);
    const Tensor term = ops::mul(masks[u], ops::contiguous(rows.slice(0, i, i + 1), s), s);  // [B, L, 1] x [1, D]
    sum = sum.defined() ? ops::add(sum, term, s) : term;
  }
  return sum;
}

// --- block --------------------------------------------------------------------------------------

void WanBlock::declare(ParameterTable& t, int block_index, const WanConfig& c) {
  const int64_t d = c.inner_dim();
  head_dim = c.attention_head_dim;
  eps = static_cast<float>(c.eps);
  cross_attn_norm = c.cross_attn_norm;
  index = block_index;
  blocks = static_cast<int>(c.num_layers);
  prefix = "blocks." + std::to_string(block_index);
  const std::string p = prefix + ".";
  t.add(p + "scale_shift_table", {1, 6, d}, &scale_shift_table, /*keep_f32=*/true);
  to_q.declare(t, p + "attn1.to_q", d, d);
  to_k.declare(t, p + "attn1.to_k", d, d);
  to_v.declare(t, p + "attn1.to_v", d, d);
  to_out.declare(t, p + "attn1.to_out.0", d, d);
  norm_q.declare(t, p + "attn1.norm_q.weight", d);
  norm_k.declare(t, p + "attn1.norm_k.weight", d);
  if (cross_attn_norm) {
    norm2_weight.declare(t, p + "norm2.weight", d);
    norm2_bias.declare(t, p + "norm2.bias", d);
  }
  cross_q.declare(t, p + "attn2.to_q", d, d);
  cross_k.declare(t, p + "attn2.to_k", d, d);
  cross_v.declare(t, p + "attn2.to_v", d, d);
  cross_out.declare(t, p + "attn2.to_out.0", d, d);
  cross_norm_q.declare(t, p + "attn2.norm_q.weight", d);
  cross_norm_k.declare(t, p + "attn2.norm_k.weight", d);
  image_branch = c.has_image_branch();
  if (image_branch) {
    add_k.declare(t, p + "attn2.add_k_proj", c.added_kv_proj_dim, d);
    add_v.declare(t, p + "attn2.add_v_proj", c.added_kv_proj_dim, d);
    norm_added_k.declare(t, p + "attn2.norm_added_k.weight", d);
  }
  ffn_in.declare(t, p + "ffn.net.0.proj", d, c.ffn_dim);
  ffn_out.declare(t, p + "ffn.net.2", c.ffn_dim, d);
}

Tensor WanBlock::attend_cross(const std::function<Tensor()>& query, const Tensor& tokens, const Linear& k, const Linear& v,
                              const Vector1d& k_norm, const std::string& module, const WanBlockInputs& shared, const ForwardContext& ctx,
                              const Stream& s) const {
  // No RoPE, no mask; k RMS-normed across all heads.
  const AttentionIdentity id{index, blocks, AttentionKind::cross, tokens.size(1), shared.grid, prefix + module};
  return ctx.attend(
      id,
      [&] {
        return AttentionQkv{query(), split_heads(ctx.rms_norm_across_heads(k(tokens, s), k_norm.value, eps, s), head_dim),
                            split_heads(v(tokens, s), head_dim)};
      },
      s);
}

BlockState WanBlock::forward(const BlockState& in, const WanBlockInputs& shared, const ForwardContext& ctx, const Stream& s) const {
  const Tensor& h = in.hidden;
  // M = scale_shift_table + timestep_proj in f32: shift, scale, gate (self-attention), then the FFN's;
  // per-token timesteps: each distinct value's rows, spread over its tokens ([B, L, D] each).
  const WanTokenTimesteps& tokens = shared.tokens;
  const Tensor mod =
      ops::add(ops::cast(tokens.defined() ? tokens.timestep_proj : shared.timestep_proj, DType::f32, s), scale_shift_table, s);
  const auto m = [&](int64_t k) { return tokens.defined() ? tokens.per_token(ops::contiguous(row(mod, k), s), s) : row(mod, k); };
  // h + gate * linear(x), in f32 and rounded once.
  const auto gated = [&](const Linear& linear, const Tensor& x, const Tensor& residual, int64_t k) {
    if (!tokens.defined()) return gated_linear(linear, x, residual, row(mod, k), s);
    const Tensor sum = ops::add(ops::cast(residual, DType::f32, s), ops::mul(ops::cast(linear(x, s), DType::f32, s), m(k), s), s);
    return ops::cast(sum, residual.dtype(), s);
  };
  // Self-attention: q and k RMS-normed over all D channels (before the head split), RoPE, no mask.
  const Tensor xn = ops::layernorm_scale_shift(h, m(1), m(0), {}, {}, eps, s);
  const AttentionIdentity self_id{index, blocks, AttentionKind::self, 0, shared.grid, prefix + ".attn1"};
  const Tensor o = ctx.attend(
      self_id,
      [&] {
        const Tensor q = ctx.rms_norm_across_heads(to_q(xn, s), norm_q.value, eps, s);
        const Tensor k = ctx.rms_norm_across_heads(to_k(xn, s), norm_k.value, eps, s);
        return AttentionQkv{rope(split_heads(q, head_dim), shared.rope, s), rope(split_heads(k, head_dim), shared.rope, s),
                            split_heads(to_v(xn, s), head_dim)};
      },
      s);
  Tensor h2 = gated(to_out, o, h, 2);
  // Cross-attention to the text: affine LayerNorm, no RoPE, no mask, no gate.
  const Tensor cn =
      cross_attn_norm ? ops::fast_layernorm(h2, norm2_weight.value, norm2_bias.value, eps, ops::LayerNormImpl::high_precision, s).out : h2;
  // The queries attend to the text and, with the image branch (image-to-video), to the image tokens
  // through their own keys and values; the two outputs are summed before the output projection.
  // The queries (RMS-normed across all heads) are computed once, when the first attention that is
  // not replayed from a cache needs them.
  Tensor q;
  const auto query = [&] {
    if (!q.defined()) q = split_heads(ctx.rms_norm_across_heads(cross_q(cn, s), cross_norm_q.value, eps, s), head_dim);
    return q;
  };
  const Tensor co = attend_cross(query, shared.context, cross_k, cross_v, cross_norm_k, ".attn2", shared, ctx, s);
  h2 = cross_out(
      image_branch ? ops::add(co, attend_cross(query, shared.image_context, add_k, add_v, norm_added_k, ".attn2.image", shared, ctx, s), s)
                   : co,
      s, {.residual = h2});
  // Feed-forward: GELU-tanh MLP through the FFN's gate.
  const Tensor fn = ops::layernorm_scale_shift(h2, m(4), m(3), {}, {}, eps, s);
  return {gated(ffn_out, ffn_in(fn, s, {.activation = ops::GemmActivation::gelu_tanh}), h2, 5), {}};
}

// --- the model ----------------------------------------------------------------------------------

WanTransformer3DModel::WanTransformer3DModel(WanConfig config) : config_(std::move(config)) {
  const WanConfig& c = config_;
  const int64_t d = c.inner_dim();
  const auto& p = c.patch_size;
  table_.add("patch_embedding.weight", {d, c.in_channels, p[0], p[1], p[2]}, &patch_weight_);
  table_.add("patch_embedding.bias", {d}, &patch_bias_);
  // The time embedder stays f32 in bf16 runs (diffusers' _keep_in_fp32_modules).
  time_1_.declare(table_, "condition_embedder.time_embedder.linear_1", c.freq_dim, d, true, /*keep_f32=*/true);
  time_2_.declare(table_, "condition_embedder.time_embedder.linear_2", d, d, true, /*keep_f32=*/true);
  time_proj_.declare(table_, "condition_embedder.time_proj", d, 6 * d);
  text_1_.declare(table_, "condition_embedder.text_embedder.linear_1", c.text_dim, d);
  text_2_.declare(table_, "condition_embedder.text_embedder.linear_2", d, d);
  if (c.has_image_branch()) {
    const std::string e = "condition_embedder.image_embedder.";
    image_norm1_weight_.declare(table_, e + "norm1.weight", c.image_dim);
    image_norm1_bias_.declare(table_, e + "norm1.bias", c.image_dim);
    image_ff_in_.declare(table_, e + "ff.net.0.proj", c.image_dim, c.image_dim);
    image_ff_out_.declare(table_, e + "ff.net.2", c.image_dim, d);
    image_norm2_weight_.declare(table_, e + "norm2.weight", d);
    image_norm2_bias_.declare(table_, e + "norm2.bias", d);
    if (c.pos_embed_seq_len > 0) table_.add(e + "pos_embed", {1, c.pos_embed_seq_len, c.image_dim}, &image_pos_embed_, /*keep_f32=*/true);
  }
  blocks_.resize(static_cast<std::size_t>(c.num_layers));
  for (std::size_t i = 0; i < blocks_.size(); ++i) blocks_[i].declare(table_, static_cast<int>(i), c);
  table_.add("scale_shift_table", {1, 2, d}, &scale_shift_table_, /*keep_f32=*/true);
  proj_out_.declare(table_, "proj_out", d, c.out_channels * p[0] * p[1] * p[2]);
}

std::unique_ptr<WanTransformer3DModel> WanTransformer3DModel::load(const std::string& dir, DType dtype, const std::string& variant) {
  auto model = std::make_unique<WanTransformer3DModel>(WanConfig::load(dir + "/config.json"));
  // The original I2V checkpoints carry a query norm for the image tokens that nothing uses
  // (diffusers' _keys_to_ignore_on_load_unexpected).
  LoadOptions options;
  for (int64_t i = 0; i < model->config_.num_layers; ++i)
    options.ignored_names.push_back("blocks." + std::to_string(i) + ".attn2.norm_added_q.weight");
  load_parameters(model->table_, open_component_weights(dir, variant), dtype, options);
  return model;
}

std::pair<Tensor, Tensor> WanTransformer3DModel::time_embedding(const Tensor& timestep, const Stream& s, DType act) const {
  // The raw timestep (0..1000) goes into the sinusoid, unscaled; the embedder runs in f32 and its
  // output is cast to the activation dtype before time_proj (diffusers' type_as).
  const Tensor temb = ops::cast(
      time_2_(time_1_(timestep_sinusoid(timestep, config_.freq_dim, 1.0f), s, {.activation = ops::GemmActivation::silu}), s), act, s);
  const Tensor proj = time_proj_(ops::activation(temb, ops::Activation::silu, s), s);
  return {temb, proj.reshape({proj.size(0), 6, config_.inner_dim()})};
}

bool WanTransformer3DModel::embedders_are_plain() const {
  const Linear* layers[] = {&time_1_, &time_2_, &time_proj_, &text_1_, &text_2_, &image_ff_in_, &image_ff_out_};
  return std::none_of(std::begin(layers), std::end(layers), [](const Linear* l) { return l->kernel != nullptr; });
}

TensorParallelPlan WanTransformer3DModel::tensor_parallel_plan() const {
  TensorParallelPlan plan;
  plan.heads = config_.num_attention_heads;
  for (const WanBlock& b : blocks_) {
    for (const char* m : {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_q", "attn2.to_k", "attn2.to_v", "ffn.net.0.proj"})
      plan.column.push_back(b.prefix + "." + m);
    if (b.image_branch) {
      for (const char* m : {"attn2.add_k_proj", "attn2.add_v_proj"}) plan.column.push_back(b.prefix + "." + m);
      plan.channel_vectors.push_back(b.prefix + ".attn2.norm_added_k.weight");
    }
    for (const char* m : {"attn1.to_out.0", "attn2.to_out.0", "ffn.net.2"}) plan.row.push_back({b.prefix + "." + m, {}});
    for (const char* m : {"attn1.norm_q.weight", "attn1.norm_k.weight", "attn2.norm_q.weight", "attn2.norm_k.weight"})
      plan.channel_vectors.push_back(b.prefix + "." + m);
  }
  return plan;
}

Tensor WanTransformer3DModel::text_embedding(const Tensor& encoder_hidden_states, const Stream& s, DType act) const {
  return text_2_(text_1_(ops::cast(encoder_hidden_states, act, s), s, {.activation = ops::GemmActivation::gelu_tanh}), s);
}

WanTokenTimesteps WanTransformer3DModel::token_timesteps(const Tensor& timestep, const Stream& s, DType act) const {
  if (!timestep.has_storage()) throw Error("wan forward: per-token timesteps need their values (simulate mode has none)");
  Tensor values;
  if (timestep.dtype() == DType::i64) {  // ops::cast converts between float dtypes only
    const Tensor ints = timestep.contiguous();
    std::vector<float> f(static_cast<std::size_t>(ints.numel()));
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(ints.data<int64_t>()[i]);
    values = Tensor::from_vector(f, ints.shape());
  } else {
    values = ops::contiguous(ops::cast(timestep, DType::f32, s), s);
  }
  const float* v = values.data<float>();
  const int64_t batch = values.size(0), tokens = values.size(1);
  std::vector<float> distinct;
  for (int64_t i = 0; i < values.numel(); ++i)
    if (std::find(distinct.begin(), distinct.end(), v[i]) == distinct.end()) {
      if (distinct.size() == kMaxTokenTimesteps)
        throw Error("wan forward: the per-token timesteps take more than " + std::to_string(kMaxTokenTimesteps) +
                    " distinct values; cubevec embeds each distinct value once and supports up to that many (TI2V uses 2)");
      distinct.push_back(v[i]);
    }
  WanTokenTimesteps out;
  std::tie(out.temb, out.timestep_proj) = time_embedding(Tensor::from_vector(distinct, {static_cast<int64_t>(distinct.size())}), s, act);
  for (const float value : distinct) {
    std::vector<float> mask(static_cast<std::size_t>(values.numel()));
    for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = v[i] == value ? 1.0f : 0.0f;
    out.masks.push_back(Tensor::from_vector(mask, {batch, tokens, 1}));
  }
  return out;
}

Tensor WanTransformer3DModel::image_embedding(const Tensor& image_states, const Stream& s, DType act) const {
  const WanConfig& c = config_;
  if (!c.has_image_branch())
    throw Error("wan image_embedding: this transformer has no image branch (image_dim is null: a text-to-video model)");
  Tensor x = ops::cast(image_states, DType::f32, s);
  if (c.pos_embed_seq_len > 0)
    x = ops::add(x.reshape({x.numel() / (c.pos_embed_seq_len * c.image_dim), c.pos_embed_seq_len, c.image_dim}), image_pos_embed_, s);
  constexpr float kEps = 1e-5f;  // FP32LayerNorm's default
  const Tensor n1 = ops::cast(
      ops::fast_layernorm(x, image_norm1_weight_.value, image_norm1_bias_.value, kEps, ops::LayerNormImpl::high_precision, s).out, act, s);
  const Tensor hidden = ops::activation(image_ff_in_(n1, s), ops::Activation::gelu, s);  // exact GELU
  const Tensor y = ops::cast(image_ff_out_(hidden, s), DType::f32, s);
  return ops::cast(
      ops::fast_layernorm(y, image_norm2_weight_.value, image_norm2_bias_.value, kEps, ops::LayerNormImpl::high_precision, s).out, act, s);
}

Tensor WanTransformer3DModel::patch_embed(const Tensor& x, const Stream& s, DType act) const {
  const auto& p = config_.patch_size;
  ops::Conv3dOptions options;
  options.stride = {p[0], p[1], p[2]};
  options.priced_as = act;  // an NPU would run it at the activations' dtype
  // The Conv3d runs in f32: a bf16 kernel is widened per call (it is small: D x C x 4).
  const Tensor tokens = ops::conv3d(ops::cast(x, DType::f32, s), ops::cast(patch_weight_, DType::f32, s), patch_bias_, options, s);
  const int64_t b = tokens.size(0), d = tokens.size(1);
  // [B, D, T', H', W'] -> [B, L, D] in (t, h, w) row-major token order.
  const Tensor seq = tokens.reshape({b, d, tokens.numel() / (b * d)}).permute({0, 2, 1});
  return act == DType::f32 ? ops::contiguous(seq, s) : ops::cast(seq, act, s);
}

Tensor WanTransformer3DModel::head(const Tensor& h, const Tensor& temb, int64_t frames, int64_t height, int64_t width, const Stream& s,
                                   const WanTokenTimesteps* tokens) const {
  const auto& p = config_.patch_size;
  // [shift, scale] = scale_shift_table + temb (not the 6-way projection) in f32; shift first.
  const bool per_token = tokens && tokens->defined();
  const Tensor mod = ops::add(ops::cast(per_token ? tokens->temb : temb, DType::f32, s).unsqueeze(1), scale_shift_table_, s);
  const auto m = [&](int64_t k) { return per_token ? tokens->per_token(ops::contiguous(row(mod, k), s), s) : row(mod, k); };
  const Tensor y = proj_out_(ops::layernorm_scale_shift(h, m(1), m(0), {}, {}, static_cast<float>(config_.eps), s), s);
  // Unpatchify: each token's outputs are (pt, ph, pw, C) with the channel minor.
  const int64_t b = h.size(0), c = config_.out_channels;
  const int64_t tp = frames / p[0], hp = height / p[1], wp = width / p[2];
  const Tensor v = y.reshape({b, tp, hp, wp, p[0], p[1], p[2], c}).permute({0, 7, 1, 4, 2, 5, 3, 6});
  return ops::contiguous(v, s).reshape({b, c, frames, height, width});
}

WanPrologue WanTransformer3DModel::prologue(const WanInputs& in, const ForwardContext& ctx, const Stream& s) const {
  const WanConfig& c = config_;
  check_activation_dtype(ctx.activations);
  const auto& p = c.patch_size;
  const Tensor& x = in.hidden_states;
  const Tensor& text = in.encoder_hidden_states;
  require_input_dtype(x, "wan forward", "hidden_states", kFloatInputs);
  require_input_dtype(text, "wan forward", "encoder_hidden_states", kFloatInputs);
  require_input_dtype(in.timestep, "wan forward", "timestep", {DType::f32, DType::bf16, DType::i64});
  if (!x.defined() || x.dim() != 5 || x.size(1) != c.in_channels)
    throw Error("wan forward: hidden_states must be [B, " + std::to_string(c.in_channels) + ", T, H, W], got " +
                (x.defined() ? shape_to_string(x.shape()) : std::string("nothing")));
  const int64_t batch = x.size(0), frames = x.size(2), height = x.size(3), width = x.size(4);
  if (batch < 1 || frames < 1 || height < 1 || width < 1)
    throw Error("wan forward: hidden_states " + shape_to_string(x.shape()) + " must have B, T, H, W of at least 1");
  if (frames % p[0] != 0 || height % p[1] != 0 || width % p[2] != 0)
    throw Error("wan forward: hidden_states " + shape_to_string(x.shape()) + ": T, H, W must be multiples of patch_size (" +
                std::to_string(p[0]) + ", " + std::to_string(p[1]) + ", " + std::to_string(p[2]) + ")");
  if (std::max({frames / p[0], height / p[1], width / p[2]}) > c.rope_max_seq_len)
    throw Error("wan forward: hidden_states " + shape_to_string(x.shape()) + " gives a patch grid of " + std::to_string(frames / p[0]) +
                "x" + std::to_string(height / p[1]) + "x" + std::to_string(width / p[2]) + ", above rope_max_seq_len " +
                std::to_string(c.rope_max_seq_len) + " on an axis");
  const std::string from_hidden = " (the batch from hidden_states " + shape_to_string(x.shape()) + ")";
  const int64_t token_count = (frames / p[0]) * (height / p[1]) * (width / p[2]);
  const bool per_token = in.timestep.defined() && in.timestep.dim() == 2;
  if (!in.timestep.defined() || in.timestep.dim() < 1 || in.timestep.dim() > 2 || in.timestep.size(0) != batch ||
      (per_token && in.timestep.size(1) != token_count))
    throw Error("wan forward: timestep must be [" + std::to_string(batch) + "], or [" + std::to_string(batch) + ", " +
                std::to_string(token_count) + "] (one per token)" + from_hidden + ", got " +
                (in.timestep.defined() ? shape_to_string(in.timestep.shape()) : std::string("nothing")));
  if (!text.defined() || text.dim() != 3 || text.size(0) != batch || text.size(1) < 1 || text.size(2) != c.text_dim)
    throw Error("wan forward: encoder_hidden_states must be [" + std::to_string(batch) + ", L >= 1, " + std::to_string(c.text_dim) + "]" +
                from_hidden + ", got " + (text.defined() ? shape_to_string(text.shape()) : std::string("nothing")));

  const Tensor& image = in.encoder_hidden_states_image;
  if (c.has_image_branch()) {
    require_input_dtype(image, "wan forward", "encoder_hidden_states_image", kFloatInputs);
    const int64_t rows = c.pos_embed_seq_len > 0 ? c.pos_embed_seq_len : 0;
    const bool fits = image.defined() && image.dim() == 3 && image.size(2) == c.image_dim && image.size(1) >= 1 &&
                      (rows == 0 ? image.size(0) == batch : (image.size(0) * image.size(1) == batch * rows && rows % image.size(1) == 0));
    if (!fits)
      throw Error("wan forward: encoder_hidden_states_image must be " +
                  (rows == 0
                       ? "[" + std::to_string(batch) + ", L >= 1, " + std::to_string(c.image_dim) + "]"
                       : "[" + std::to_string(batch) + " x k, " + std::to_string(rows) + " / k, " + std::to_string(c.image_dim) +
                             "] (pos_embed_seq_len " + std::to_string(rows) + " rows per sample, e.g. diffusers' first and last picture)") +
                  from_hidden + " for this image-to-video transformer, got " +
                  (image.defined() ? shape_to_string(image.shape()) : std::string("nothing")));
  } else if (image.defined()) {
    throw Error(
        "wan forward: encoder_hidden_states_image was given, but this transformer has no image branch (image_dim is null: a "
        "text-to-video model)");
  }

  const DType act = ctx.activations;
  WanPrologue out;
  out.frames = frames, out.height = height, out.width = width;
  const int64_t tp = frames / p[0], hp = height / p[1], wp = width / p[2];
  out.shared.grid = {tp, hp, wp};
  out.shared.rope =
      rope_cache_.get({static_cast<float>(tp), static_cast<float>(hp), static_cast<float>(wp)}, [&] { return wan_rope(tp, hp, wp, c); });
  const int64_t d = c.inner_dim();
  // -1 in `shape`: any size of at least 1.
  const auto given = [&](const Tensor& t, const std::string& name, const Shape& shape) {
    bool ok = t.defined() && t.dim() == static_cast<int64_t>(shape.size()) && t.dtype() == act;
    for (std::size_t i = 0; ok && i < shape.size(); ++i)
      ok = shape[i] < 0 ? t.size(static_cast<int64_t>(i)) >= 1 : t.size(static_cast<int64_t>(i)) == shape[i];
    if (!ok)
      throw Error("wan forward: the precomputed " + name + " must be " + std::string(dtype_name(act)) + " " + shape_to_string(shape) +
                  from_hidden + ", got " +
                  (t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape()) : std::string("nothing")) +
                  (name == "temb" || name == "timestep_proj" ? " (temb and timestep_proj go together)" : ""));
    return t;
  };
  require_finite_values(in.timestep, "wan forward", "timestep");
  if (per_token) {
    if (in.temb.defined() || in.timestep_proj.defined())
      throw Error("wan forward: a precomputed time embedding needs one timestep per sample, not one per token");
    out.shared.tokens = token_timesteps(in.timestep, s, act);
  } else if (in.temb.defined() || in.timestep_proj.defined()) {
    out.temb = given(in.temb, "temb", {batch, d});
    out.shared.timestep_proj = given(in.timestep_proj, "timestep_proj", {batch, 6, d});
  } else {
    std::tie(out.temb, out.shared.timestep_proj) = time_embedding(in.timestep, s, act);
  }
  out.shared.context = in.context.defined() ? given(in.context, "context", {batch, text.size(1), d}) : text_embedding(text, s, act);
  if (c.has_image_branch())
    out.shared.image_context =
        in.image_context.defined() ? given(in.image_context, "image_context", {batch, -1, d}) : image_embedding(image, s, act);
  else if (in.image_context.defined())
    throw Error("wan forward: a precomputed image_context was given, but this transformer has no image branch");
  out.state.hidden = patch_embed(x, s, act);
  return out;
}

BlockIdentity WanTransformer3DModel::block_identity(int index) const {
  if (index < 0 || index >= block_count())
    throw Error("wan: block " + std::to_string(index) + " is out of range (the model has " + std::to_string(block_count()) + ")");
  return {index, block_count(), blocks_[static_cast<std::size_t>(index)].prefix, model_index_};
}

BlockState WanTransformer3DModel::block(int index, const BlockState& in, const WanBlockInputs& shared, const ForwardContext& ctx,
                                        const Stream& s) const {
  return blocks_[static_cast<std::size_t>(index)].forward(in, shared, ctx, s);
}

Tensor WanTransformer3DModel::epilogue(const BlockState& state, const WanPrologue& p, const Stream& s) const {
  return head(state.hidden, p.temb, p.frames, p.height, p.width, s, &p.shared.tokens);
}

Tensor WanTransformer3DModel::forward(const WanInputs& in, const Stream& s, const ForwardContext& ctx) const {
  WanPrologue p = prologue(in, ctx, s);
  BlockState state = p.state;
  ctx.split_sequence(state, p.shared.rope, 0, s);
  // Split tokens (--ulysses / --ring): the blocks take this rank's rows of the per-token masks, the
  // head (after the join) all of them.
  WanBlockInputs shared = p.shared;
  if (ctx.sequence)
    for (Tensor& mask : shared.tokens.masks) mask = ctx.sequence->keep_tokens(mask, s);
  for (int i = 0; i < block_count(); ++i)
    state = ctx.run_block(
        block_identity(i), state, [&](const BlockState& x) { return block(i, x, shared, ctx, s); }, s);
  ctx.join_sequence(state, s);
  return epilogue(state, p, s);
}

}  // namespace cubevec::models
