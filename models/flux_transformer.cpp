#include "models/flux_transformer.h"

#include <algorithm>
#include <cmath>

#include "models/component.h"
#include "models/dit_ops.h"
#include "models/input_checks.h"
#include "base/error.h"
#include "tensor/half.h"
#include "base/config_reader.h"
#include "base/strict_json.h"

namespace cubevec::models {

namespace {

using ops::Activation;

using dit::chunk;
using dit::gated_linear;
using dit::rope;

// The image tokens' grid (1, rows, cols) when img_ids are (0, row, col) over a full rows x cols
// grid, else (1, 1, N).
std::array<int64_t, 3> image_grid(const Tensor& img_ids) {
  const std::vector<float> key = rope_key(img_ids);  // shape first, then the values
  const int64_t n = img_ids.size(0);
  float rows = 0, cols = 0;
  for (int64_t i = 0; i < n; ++i) {
    rows = std::max(rows, key[static_cast<std::size_t>(2 + 3 * i + 1)]);
    cols = std::max(cols, key[static_cast<std::size_t>(2 + 3 * i + 2)]);
  }
  const auto r = static_cast<int64_t>(rows) + 1, c = static_cast<int64_t>(cols) + 1;
  return r * c == n ? std::array<int64_t, 3>{1, r, c} : std::array<int64_t, 3>{1, 1, n};
}

// [text; image] as one [B, L, D] tensor: a view when the two streams are adjacent views of one
// tensor (the previous single block's output), else a concatenation.
Tensor joint_tokens(const Tensor& text, const Tensor& image, const Stream& s) {
  const bool adjacent = text.shares_storage_with(image) && text.dtype() == image.dtype() && text.dim() == 3 && image.dim() == 3 &&
                        text.strides() == image.strides() && text.size(0) == image.size(0) && text.size(2) == image.size(2) &&
                        text.stride(2) == 1 && text.stride(1) == text.size(2) &&
                        text.stride(0) == (text.size(1) + image.size(1)) * text.stride(1) &&
                        image.offset() == text.offset() + text.size(1) * text.stride(1);
  if (!adjacent) return ops::concat({text, image}, 1, s);
  return Tensor::from_storage(text.storage(), {text.size(0), text.size(1) + image.size(1), text.size(2)}, text.strides(), text.offset(),
                              text.dtype());
}

// [B, S, D] -> per-head RMS-normed [B, S, heads, head_dim].
Tensor heads_rms(const Tensor& x, const Vector1d& weight, int64_t head_dim, const Stream& stream) {
  return ops::rms_norm(dit::split_heads(x, head_dim), weight.value, 1e-6f, stream);
}

}  // namespace

// --- config -------------------------------------------------------------------------------------

FluxConfig FluxConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "FluxTransformer2DModel");
  r.expect_class({"FluxTransformer2DModel"});
  FluxConfig c;
  c.out_channels = 0;  // null or absent: in_channels
  r.integer("patch_size", c.patch_size, 1, 1)
      .integer("in_channels", c.in_channels, 1)
      .integer("out_channels", c.out_channels, 1)
      .integer("num_layers", c.num_layers, 0, 1024)
      .integer("num_single_layers", c.num_single_layers, 0, 1024)
      .integer("attention_head_dim", c.attention_head_dim, 2, 1024)
      .integer("num_attention_heads", c.num_attention_heads, 1, 1024)
      .integer("joint_attention_dim", c.joint_attention_dim, 1)
      .integer("pooled_projection_dim", c.pooled_projection_dim, 1)
      .boolean("guidance_embeds", c.guidance_embeds)
      .integers("axes_dims_rope", c.axes_dims_rope, 2, 3, 1024);
  r.reject_unknown();
  if (c.out_channels == 0) c.out_channels = c.in_channels;
  int64_t rope_dims = 0;
  for (int64_t d : c.axes_dims_rope) {
    if (d % 2 != 0) r.fail("axes_dims_rope", "entries must be even, got " + json["axes_dims_rope"].dump());
    rope_dims += d;
  }
  if (rope_dims != c.attention_head_dim)
    r.fail("axes_dims_rope",
           "must sum to attention_head_dim " + std::to_string(c.attention_head_dim) + ", sums to " + std::to_string(rope_dims));
  return c;
}

FluxConfig FluxConfig::load(const std::string& config_path) {
  const nlohmann::json json = read_json_file(config_path);
  return from_json(json, config_path);
}

FluxConfig FluxConfig::flux1_dev() {
  FluxConfig c;
  c.guidance_embeds = true;
  return c;
}

// --- embeddings ---------------------------------------------------------------------------------

// --- blocks -------------------------------------------------------------------------------------

void FluxDoubleBlock::declare(ParameterTable& t, int block_index, const FluxConfig& c) {
  const int64_t d = c.inner_dim(), hd = c.attention_head_dim;
  head_dim = hd;
  index = block_index;
  blocks = static_cast<int>(c.num_layers + c.num_single_layers);
  prefix = "transformer_blocks." + std::to_string(block_index);
  const std::string p = prefix + ".";
  norm1.declare(t, p + "norm1.linear", d, 6 * d);
  norm1_context.declare(t, p + "norm1_context.linear", d, 6 * d);
  to_q.declare(t, p + "attn.to_q", d, d);
  to_k.declare(t, p + "attn.to_k", d, d);
  to_v.declare(t, p + "attn.to_v", d, d);
  norm_q.declare(t, p + "attn.norm_q.weight", hd);
  norm_k.declare(t, p + "attn.norm_k.weight", hd);
  add_q.declare(t, p + "attn.add_q_proj", d, d);
  add_k.declare(t, p + "attn.add_k_proj", d, d);
  add_v.declare(t, p + "attn.add_v_proj", d, d);
  norm_added_q.declare(t, p + "attn.norm_added_q.weight", hd);
  norm_added_k.declare(t, p + "attn.norm_added_k.weight", hd);
  to_out.declare(t, p + "attn.to_out.0", d, d);
  to_add_out.declare(t, p + "attn.to_add_out", d, d);
  ff_in.declare(t, p + "ff.net.0.proj", d, 4 * d);
  ff_out.declare(t, p + "ff.net.2", 4 * d, d);
  ff_context_in.declare(t, p + "ff_context.net.0.proj", d, 4 * d);
  ff_context_out.declare(t, p + "ff_context.net.2", 4 * d, d);
}

BlockState FluxDoubleBlock::forward(const BlockState& in, const FluxBlockInputs& shared, const ForwardContext& ctx, const Stream& s) const {
  const Tensor &h = in.hidden, &c = in.encoder;
  // Modulation, order shift, scale, gate (attention), then shift, scale, gate (MLP).
  const Tensor mod = shared.modulation ? shared.modulation->blocks[static_cast<std::size_t>(index)] : norm1(shared.silu_temb, s);
  const Tensor cmod = shared.modulation ? shared.modulation->context[static_cast<std::size_t>(index)] : norm1_context(shared.silu_temb, s);
  const Tensor xn = ops::layernorm_scale_shift(h, chunk(mod, 6, 1), chunk(mod, 6, 0), {}, {}, 1e-6f, s);
  const Tensor cn = ops::layernorm_scale_shift(c, chunk(cmod, 6, 1), chunk(cmod, 6, 0), {}, {}, 1e-6f, s);
  const int64_t txt = c.size(1), img = h.size(1);
  // Joint attention over [text; image] with RoPE on q and k.
  const AttentionIdentity id{index, blocks, AttentionKind::joint, txt, shared.grid, prefix + ".attn"};
  const Tensor o = ctx.attend(
      id,
      [&] {
        const Tensor q =
            ops::concat({heads_rms(add_q(cn, s), norm_added_q, head_dim, s), heads_rms(to_q(xn, s), norm_q, head_dim, s)}, 1, s);
        const Tensor k =
            ops::concat({heads_rms(add_k(cn, s), norm_added_k, head_dim, s), heads_rms(to_k(xn, s), norm_k, head_dim, s)}, 1, s);
        const Tensor v = ops::concat({dit::split_heads(add_v(cn, s), head_dim), dit::split_heads(to_v(xn, s), head_dim)}, 1, s);
        return AttentionQkv{rope(q, shared.rope, s), rope(k, shared.rope, s), v};
      },
      s);
  // Image stream: attention output, then the MLP, each added through its gate.
  Tensor h2 = gated_linear(to_out, o.narrow(1, txt, img), h, chunk(mod, 6, 2), s);
  const Tensor hn = ops::layernorm_scale_shift(h2, chunk(mod, 6, 4), chunk(mod, 6, 3), {}, {}, 1e-6f, s);
  h2 = gated_linear(ff_out, ff_in(hn, s, {.activation = ops::GemmActivation::gelu_tanh}), h2, chunk(mod, 6, 5), s);
  // Text stream, the same with its own weights.
  Tensor c2 = gated_linear(to_add_out, o.narrow(1, 0, txt), c, chunk(cmod, 6, 2), s);
  const Tensor cn2 = ops::layernorm_scale_shift(c2, chunk(cmod, 6, 4), chunk(cmod, 6, 3), {}, {}, 1e-6f, s);
  c2 = gated_linear(ff_context_out, ff_context_in(cn2, s, {.activation = ops::GemmActivation::gelu_tanh}), c2, chunk(cmod, 6, 5), s);
  return {h2, c2};
}

void FluxSingleBlock::declare(ParameterTable& t, int single_index, const FluxConfig& c) {
  const int64_t d = c.inner_dim(), hd = c.attention_head_dim;
  head_dim = hd;
  index = static_cast<int>(c.num_layers) + single_index;
  blocks = static_cast<int>(c.num_layers + c.num_single_layers);
  prefix = "single_transformer_blocks." + std::to_string(single_index);
  const std::string p = prefix + ".";
  norm.declare(t, p + "norm.linear", d, 3 * d);
  proj_mlp.declare(t, p + "proj_mlp", d, 4 * d);
  proj_out.declare(t, p + "proj_out", 5 * d, d);
  to_q.declare(t, p + "attn.to_q", d, d);
  to_k.declare(t, p + "attn.to_k", d, d);
  to_v.declare(t, p + "attn.to_v", d, d);
  norm_q.declare(t, p + "attn.norm_q.weight", hd);
  norm_k.declare(t, p + "attn.norm_k.weight", hd);
}

BlockState FluxSingleBlock::forward(const BlockState& in, const FluxBlockInputs& shared, const ForwardContext& ctx, const Stream& s) const {
  const int64_t txt = in.encoder.size(1), img = in.hidden.size(1);
  const Tensor x = joint_tokens(in.encoder, in.hidden, s);  // [text; image]
  // shift, scale, gate
  const Tensor mod = shared.modulation ? shared.modulation->blocks[static_cast<std::size_t>(index)] : norm(shared.silu_temb, s);
  const Tensor xn = ops::layernorm_scale_shift(x, chunk(mod, 3, 1), chunk(mod, 3, 0), {}, {}, 1e-6f, s);
  const Tensor mlp = proj_mlp(xn, s, {.activation = ops::GemmActivation::gelu_tanh});
  const AttentionIdentity id{index, blocks, AttentionKind::joint, txt, shared.grid, prefix + ".attn"};
  const Tensor a = ctx.attend(
      id,
      [&] {
        return AttentionQkv{rope(heads_rms(to_q(xn, s), norm_q, head_dim, s), shared.rope, s),
                            rope(heads_rms(to_k(xn, s), norm_k, head_dim, s), shared.rope, s), dit::split_heads(to_v(xn, s), head_dim)};
      },
      s);
  // proj_out over [attention; MLP] channels (attention's first).
  const Tensor out = gated_linear(proj_out, ops::concat({a, mlp}, 2, s), x, chunk(mod, 3, 2), s);
  return {out.narrow(1, txt, img), out.narrow(1, 0, txt)};
}

// --- the model ----------------------------------------------------------------------------------

FluxTransformer2DModel::FluxTransformer2DModel(FluxConfig config) : config_(std::move(config)) {
  const FluxConfig& c = config_;
  const int64_t d = c.inner_dim();
  x_embedder_.declare(table_, "x_embedder", c.in_channels, d);
  context_embedder_.declare(table_, "context_embedder", c.joint_attention_dim, d);
  time_1_.declare(table_, "time_text_embed.timestep_embedder.linear_1", 256, d);
  time_2_.declare(table_, "time_text_embed.timestep_embedder.linear_2", d, d);
  if (c.guidance_embeds) {
    guidance_1_.declare(table_, "time_text_embed.guidance_embedder.linear_1", 256, d);
    guidance_2_.declare(table_, "time_text_embed.guidance_embedder.linear_2", d, d);
  }
  text_1_.declare(table_, "time_text_embed.text_embedder.linear_1", c.pooled_projection_dim, d);
  text_2_.declare(table_, "time_text_embed.text_embedder.linear_2", d, d);
  double_blocks_.resize(static_cast<std::size_t>(c.num_layers));
  for (std::size_t i = 0; i < double_blocks_.size(); ++i) double_blocks_[i].declare(table_, static_cast<int>(i), c);
  single_blocks_.resize(static_cast<std::size_t>(c.num_single_layers));
  for (std::size_t i = 0; i < single_blocks_.size(); ++i) single_blocks_[i].declare(table_, static_cast<int>(i), c);
  norm_out_.declare(table_, "norm_out.linear", d, 2 * d);
  proj_out_.declare(table_, "proj_out", d, c.out_channels);
}

std::unique_ptr<FluxTransformer2DModel> FluxTransformer2DModel::load(const std::string& dir, DType dtype, const std::string& variant) {
  auto model = std::make_unique<FluxTransformer2DModel>(FluxConfig::load(dir + "/config.json"));
  load_parameters(model->table_, open_component_weights(dir, variant), dtype);
  return model;
}

Tensor FluxTransformer2DModel::time_text_embedding(const Tensor& timestep, const Tensor& guidance, const Tensor& pooled, const Stream& s,
                                                   DType act) const {
  const auto silu = ops::MatmulOptions{.activation = ops::GemmActivation::silu};
  auto embed = [&](const Linear& l1, const Linear& l2, const Tensor& x) { return l2(l1(x, s, silu), s); };
  // The model multiplies sigma (and the guidance scale) by 1000 before the sinusoid: in f32, or, in
  // bf16, as diffusers' bf16 run does it (the value rounded to bf16, times 1000 rounded again).
  auto sinusoid = [&](const Tensor& values) {
    if (act == DType::f32) return timestep_sinusoid(values, 256, 1000.0f);
    const Tensor v = values.contiguous();
    std::vector<float> scaled(static_cast<std::size_t>(v.numel()));
    for (std::size_t i = 0; i < scaled.size(); ++i) {
      const float t = v.dtype() == DType::bf16  ? bf16_to_f32(v.data<uint16_t>()[i])
                      : v.dtype() == DType::i64 ? static_cast<float>(v.data<int64_t>()[i])
                                                : v.data<float>()[i];
      scaled[i] = bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(t)) * 1000.0f));
    }
    return ops::cast(timestep_sinusoid(Tensor::from_vector(scaled, {v.numel()}), 256, 1.0f), act, s);
  };
  Tensor temb = embed(time_1_, time_2_, sinusoid(timestep));
  if (config_.guidance_embeds) temb = ops::add(temb, embed(guidance_1_, guidance_2_, sinusoid(guidance)), s);
  return ops::add(temb, embed(text_1_, text_2_, ops::cast(pooled, act, s)), s);
}

FluxModulation FluxModulation::slice(int64_t first, int64_t count) const {
  if (!out.defined()) throw Error("flux modulation: the table is empty (no norm_out rows)");
  if (first < 0 || count < 0 || first > rows() - count)
    throw Error("flux modulation: " + std::to_string(count) + " row(s) from row " + std::to_string(first) + " are outside its " +
                std::to_string(rows()) + " rows");  // first + count may overflow: not computed
  FluxModulation part;
  for (const Tensor& t : blocks) part.blocks.push_back(t.narrow(0, first, count));
  for (const Tensor& t : context) part.context.push_back(t.narrow(0, first, count));
  part.out = out.narrow(0, first, count);
  return part;
}

FluxModulation FluxTransformer2DModel::modulation(const Tensor& timestep, const Tensor& guidance, const Tensor& pooled, const Stream& s,
                                                  DType act) const {
  const FluxConfig& c = config_;
  check_activation_dtype(act);
  const char* where = "flux modulation";
  require_input_dtype(pooled, where, "pooled_projections", kFloatInputs);
  for (const auto& [t, name] : {std::pair{&timestep, "timestep"}, std::pair{&guidance, "guidance"}})
    require_input_dtype(*t, where, name, {DType::f32, DType::bf16, DType::i64});
  if (!timestep.defined() || timestep.dim() != 1 || timestep.size(0) < 1)
    throw Error(std::string(where) + ": timestep must be [R] with R >= 1, got " +
                (timestep.defined() ? shape_to_string(timestep.shape()) : std::string("nothing")));
  const int64_t rows = timestep.size(0);
  if (!pooled.defined() || pooled.dim() != 2 || pooled.size(0) != rows || pooled.size(1) != c.pooled_projection_dim)
    throw Error(std::string(where) + ": pooled_projections must be [" + std::to_string(rows) + ", " +
                std::to_string(c.pooled_projection_dim) + "] (a row per timestep), got " +
                (pooled.defined() ? shape_to_string(pooled.shape()) : std::string("nothing")));
  if (c.guidance_embeds && (!guidance.defined() || guidance.dim() != 1 || guidance.size(0) != rows))
    throw Error(std::string(where) + ": guidance must be [" + std::to_string(rows) + "] (a row per timestep), got " +
                (guidance.defined() ? shape_to_string(guidance.shape()) : std::string("nothing")));
  if (!c.guidance_embeds && guidance.defined())
    throw Error(std::string(where) + ": guidance given, but this model has no guidance embedder (guidance_embeds false)");
  require_finite_values(timestep, where, "timestep", 1000.0);
  require_finite_values(guidance, where, "guidance", 1000.0);
  const Tensor silu = ops::activation(time_text_embedding(timestep, guidance, pooled, s, act), ops::Activation::silu, s);
  FluxModulation m;
  for (const FluxDoubleBlock& b : double_blocks_) {
    m.blocks.push_back(b.norm1(silu, s));
    m.context.push_back(b.norm1_context(silu, s));
  }
  for (const FluxSingleBlock& b : single_blocks_) m.blocks.push_back(b.norm(silu, s));
  m.out = norm_out_(silu, s);
  return m;
}

bool FluxTransformer2DModel::modulation_is_plain() const {
  std::vector<const Linear*> layers{&time_1_, &time_2_, &text_1_, &text_2_, &norm_out_};
  if (config_.guidance_embeds) layers.insert(layers.end(), {&guidance_1_, &guidance_2_});
  for (const FluxDoubleBlock& b : double_blocks_) layers.insert(layers.end(), {&b.norm1, &b.norm1_context});
  for (const FluxSingleBlock& b : single_blocks_) layers.push_back(&b.norm);
  return std::none_of(layers.begin(), layers.end(), [](const Linear* l) { return l->kernel != nullptr; });
}

FluxPrologue FluxTransformer2DModel::prologue(const FluxInputs& in, const ForwardContext& ctx, const Stream& s) const {
  const FluxConfig& c = config_;
  check_activation_dtype(ctx.activations);
  // `from`: where the expected sizes come from, so a mismatch names both tensors.
  auto require = [&](const Tensor& t, const char* name, const Shape& shape, const std::string& from = "", const Tensor* given = nullptr) {
    const Tensor& shown = given ? *given : t;  // the ids as given, before a 3-d one's first row is taken
    if (!t.defined()) throw Error(std::string("flux forward: ") + name + " is missing (expected " + shape_to_string(shape) + ")");
    bool ok = t.dim() == static_cast<int64_t>(shape.size());
    for (std::size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || t.size(static_cast<int64_t>(i)) == shape[i];
    if (!ok)
      throw Error(std::string("flux forward: ") + name + " must be " + shape_to_string(shape) + " (-1: any" +
                  (from.empty() ? "" : "; " + from) + "), got " + shape_to_string(shown.shape()));
  };
  const char* where = "flux forward";
  require_input_dtype(in.hidden_states, where, "hidden_states", kFloatInputs);
  require_input_dtype(in.encoder_hidden_states, where, "encoder_hidden_states", kFloatInputs);
  require_input_dtype(in.pooled_projections, where, "pooled_projections", kFloatInputs);
  for (const auto& [t, name] : {std::pair{&in.timestep, "timestep"}, std::pair{&in.guidance, "guidance"}})
    require_input_dtype(*t, where, name, {DType::f32, DType::bf16, DType::i64});
  for (const auto& [t, name] : {std::pair{&in.img_ids, "img_ids"}, std::pair{&in.txt_ids, "txt_ids"}})
    require_input_dtype(*t, where, name, {DType::f32, DType::bf16, DType::i32, DType::i64});
  require(in.hidden_states, "hidden_states", {-1, -1, c.in_channels});
  const int64_t batch = in.hidden_states.size(0), img = in.hidden_states.size(1);
  if (batch < 1 || img < 1)
    throw Error("flux forward: hidden_states " + shape_to_string(in.hidden_states.shape()) +
                " must hold at least one sample and one image token");
  const std::string from_hidden = "the batch from hidden_states " + shape_to_string(in.hidden_states.shape());
  require(in.encoder_hidden_states, "encoder_hidden_states", {batch, -1, c.joint_attention_dim}, from_hidden);
  const int64_t txt = in.encoder_hidden_states.size(1);
  require(in.pooled_projections, "pooled_projections", {batch, c.pooled_projection_dim}, from_hidden);
  require(in.timestep, "timestep", {batch}, from_hidden);
  require_finite_values(in.timestep, where, "timestep", 1000.0);
  require_finite_values(in.guidance, where, "guidance", 1000.0);
  // diffusers takes the first row of 3-d ids (deprecated): so does cubevec.
  const Tensor img_ids = in.img_ids.dim() == 3 && in.img_ids.size(0) > 0 ? in.img_ids.select(0, 0) : in.img_ids;
  const Tensor txt_ids = in.txt_ids.dim() == 3 && in.txt_ids.size(0) > 0 ? in.txt_ids.select(0, 0) : in.txt_ids;
  require(img_ids, "img_ids", {img, 3}, "one row per image token of hidden_states " + shape_to_string(in.hidden_states.shape()),
          &in.img_ids);
  require(txt_ids, "txt_ids", {txt, 3},
          "one row per text token of encoder_hidden_states " + shape_to_string(in.encoder_hidden_states.shape()), &in.txt_ids);
  if (c.guidance_embeds) require(in.guidance, "guidance", {batch}, from_hidden);
  else if (in.guidance.defined())
    throw Error("flux forward: guidance given, but this model has no guidance embedder (guidance_embeds false)");

  const DType act = ctx.activations;
  FluxPrologue p;
  if (in.modulation) {
    const FluxModulation& m = *in.modulation;
    if (m.blocks.size() != static_cast<std::size_t>(block_count()) || m.context.size() != double_blocks_.size())
      throw Error("flux forward: the precomputed modulation has " + std::to_string(m.blocks.size()) + " block and " +
                  std::to_string(m.context.size()) + " context entries; this model has " + std::to_string(block_count()) + " blocks, " +
                  std::to_string(double_blocks_.size()) + " of them double");
    // Each tensor as modulation() makes it for this model and these activations.
    const int64_t d = c.inner_dim();
    const auto expect = [&](const Tensor& t, const std::string& name, int64_t width) {
      if (!t.defined() || t.dtype() != act || t.dim() != 2 || t.size(0) != batch || t.size(1) != width)
        throw Error("flux forward: the precomputed modulation's " + name + " must be " + std::string(dtype_name(act)) + " [" +
                    std::to_string(batch) + ", " + std::to_string(width) + "] (this model's modulation in the activations' dtype), got " +
                    (t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape()) : std::string("nothing")));
    };
    for (std::size_t i = 0; i < m.blocks.size(); ++i)
      expect(m.blocks[i], "blocks[" + std::to_string(i) + "]", i < double_blocks_.size() ? 6 * d : 3 * d);
    for (std::size_t i = 0; i < m.context.size(); ++i) expect(m.context[i], "context[" + std::to_string(i) + "]", 6 * d);
    expect(m.out, "out", 2 * d);
    p.shared.modulation = in.modulation;
  } else {
    p.temb = time_text_embedding(in.timestep, in.guidance, in.pooled_projections, s, act);
    p.shared.silu_temb = ops::activation(p.temb, ops::Activation::silu, s);
  }
  // The joint [text; image] RoPE table, built once per pair of id sets.
  std::vector<float> key = rope_key(txt_ids);
  const std::vector<float> img_key = rope_key(img_ids);
  key.insert(key.end(), img_key.begin(), img_key.end());
  p.shared.rope = rope_cache_.get(key, [&] {
    const RopeTable t = axial_rope(txt_ids, c.axes_dims_rope), i = axial_rope(img_ids, c.axes_dims_rope);
    return RopeTable{ops::concat({t.cos, i.cos}, 0, s).contiguous(), ops::concat({t.sin, i.sin}, 0, s).contiguous()};
  });
  p.shared.grid = image_grid(img_ids);
  p.state.hidden = x_embedder_(ops::cast(in.hidden_states, act, s), s);
  p.state.encoder = context_embedder_(ops::cast(in.encoder_hidden_states, act, s), s);
  return p;
}

BlockIdentity FluxTransformer2DModel::block_identity(int index) const {
  const auto doubles = static_cast<int>(double_blocks_.size());
  if (index < 0 || index >= block_count())
    throw Error("flux: block " + std::to_string(index) + " is out of range (the model has " + std::to_string(block_count()) + ")");
  return {index, block_count(),
          index < doubles ? double_blocks_[static_cast<std::size_t>(index)].prefix
                          : single_blocks_[static_cast<std::size_t>(index - doubles)].prefix};
}

BlockState FluxTransformer2DModel::block(int index, const BlockState& in, const FluxBlockInputs& shared, const ForwardContext& ctx,
                                         const Stream& s) const {
  const auto doubles = static_cast<int>(double_blocks_.size());
  if (index < doubles) return double_blocks_[static_cast<std::size_t>(index)].forward(in, shared, ctx, s);
  return single_blocks_[static_cast<std::size_t>(index - doubles)].forward(in, shared, ctx, s);
}

TensorParallelPlan FluxTransformer2DModel::tensor_parallel_plan() const {
  TensorParallelPlan plan;
  plan.heads = config_.num_attention_heads;
  const int64_t d = config_.inner_dim();
  for (const FluxDoubleBlock& b : double_blocks_) {
    for (const char* m : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "ff.net.0.proj",
                          "ff_context.net.0.proj"})
      plan.column.push_back(b.prefix + "." + m);
    for (const char* m : {"attn.to_out.0", "attn.to_add_out", "ff.net.2", "ff_context.net.2"}) plan.row.push_back({b.prefix + "." + m, {}});
  }
  for (const FluxSingleBlock& b : single_blocks_) {
    for (const char* m : {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}) plan.column.push_back(b.prefix + "." + m);
    plan.row.push_back({b.prefix + ".proj_out", {d, 4 * d}});  // [attention; MLP] channels
  }
  return plan;
}

Tensor FluxTransformer2DModel::epilogue(const BlockState& state, const FluxPrologue& p, const Stream& s) const {
  // norm_out: scale first, then shift.
  const Tensor emb = p.shared.modulation ? p.shared.modulation->out : norm_out_(p.shared.silu_temb, s);
  const Tensor hn = ops::layernorm_scale_shift(state.hidden, chunk(emb, 2, 0), chunk(emb, 2, 1), {}, {}, 1e-6f, s);
  return proj_out_(hn, s);
}

Tensor FluxTransformer2DModel::forward(const FluxInputs& in, const Stream& s, const ForwardContext& ctx) const {
  FluxPrologue p = prologue(in, ctx, s);
  BlockState state = p.state;
  ctx.split_sequence(state, p.shared.rope, state.encoder.size(1), s);
  for (int i = 0; i < block_count(); ++i)
    state = ctx.run_block(
        block_identity(i), state, [&](const BlockState& x) { return block(i, x, p.shared, ctx, s); }, s);
  ctx.join_sequence(state, s);
  return epilogue(state, p, s);
}

// --- packing --------------------------------------------------------------------------------------

Tensor pack_latents(const Tensor& x, const Stream& s) {
  if (x.dim() != 4 || x.size(2) % 2 != 0 || x.size(3) % 2 != 0)
    throw Error("pack_latents: expected [B, C, H, W] with even H and W, got " + shape_to_string(x.shape()));
  const int64_t b = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  const Tensor v = x.reshape({b, ch, h / 2, 2, w / 2, 2}).permute({0, 2, 4, 1, 3, 5});
  return ops::contiguous(v, s).reshape({b, (h / 2) * (w / 2), ch * 4});
}

Tensor unpack_latents(const Tensor& p, int64_t height, int64_t width, const Stream& s) {
  if (p.dim() != 3 || height % 2 != 0 || width % 2 != 0 || p.size(1) != (height / 2) * (width / 2) || p.size(2) % 4 != 0)
    throw Error("unpack_latents: expected [B, " + std::to_string((height / 2) * (width / 2)) + ", 4C] for a " + std::to_string(height) +
                "x" + std::to_string(width) + " latent, got " + shape_to_string(p.shape()));
  const int64_t b = p.size(0), ch = p.size(2) / 4;
  const Tensor v = p.reshape({b, height / 2, width / 2, ch, 2, 2}).permute({0, 3, 1, 4, 2, 5});
  return ops::contiguous(v, s).reshape({b, ch, height, width});
}

Tensor flux_image_ids(int64_t latent_height, int64_t latent_width) {
  const int64_t h = latent_height / 2, w = latent_width / 2;
  std::vector<float> ids(static_cast<std::size_t>(h * w * 3), 0.0f);
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < w; ++c) {
      ids[static_cast<std::size_t>((r * w + c) * 3 + 1)] = static_cast<float>(r);
      ids[static_cast<std::size_t>((r * w + c) * 3 + 2)] = static_cast<float>(c);
    }
  return Tensor::from_vector(ids, {h * w, 3});
}

}  // namespace cubevec::models
