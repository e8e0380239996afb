#include "models/flux_transformer.h"

#include <cmath>

#include "models/dit_ops.h"
#include "tensor/error.h"
#include "tensor/half.h"
#include "tensor/config_reader.h"
#include "tensor/strict_json.h"

namespace cubevec::models {

namespace {

using ops::Activation;

using dit::attention;
using dit::chunk;
using dit::gated_linear;
using dit::rope;

// [B, S, D] -> per-head RMS-normed [B, S, heads, head_dim].
Tensor heads_rms(const Tensor& x, const Vector1d& weight, int64_t heads, int64_t head_dim, const Stream& stream) {
  return ops::rms_norm(dit::split_heads(x, heads, head_dim), weight.value, 1e-6f, stream);
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
    r.fail("axes_dims_rope", "must sum to attention_head_dim " + std::to_string(c.attention_head_dim) + ", sums to " +
                                 std::to_string(rope_dims));
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

RopeTable flux_rope(const Tensor& ids, const std::vector<int64_t>& axes_dims, double theta) {
  const Tensor ids2 = ids.dim() == 3 ? ids.select(0, 0) : ids;
  if (ids2.dim() != 2 || ids2.size(1) != static_cast<int64_t>(axes_dims.size()))
    throw Error("flux_rope: ids must be [L, " + std::to_string(axes_dims.size()) + "], got " + shape_to_string(ids.shape()));
  // Positions as f32 (diffusers casts the ids to float), whatever integer or float type they came in.
  const Tensor idc = ids2.contiguous();
  std::vector<float> positions(static_cast<std::size_t>(idc.numel()));
  for (std::size_t i = 0; i < positions.size(); ++i) {
    switch (idc.dtype()) {
      case DType::f32: positions[i] = idc.data<float>()[i]; break;
      case DType::i64: positions[i] = static_cast<float>(idc.data<int64_t>()[i]); break;
      case DType::i32: positions[i] = static_cast<float>(idc.data<int32_t>()[i]); break;
      case DType::bf16: positions[i] = bf16_to_f32(idc.data<uint16_t>()[i]); break;
      default: throw Error("flux_rope: ids must be f32, bf16, i32 or i64, got " + std::string(dtype_name(idc.dtype())));
    }
  }
  int64_t head_dim = 0;
  for (int64_t d : axes_dims) head_dim += d;
  const int64_t len = ids2.size(0);
  std::vector<float> cos(static_cast<std::size_t>(len * head_dim)), sin(cos.size());
  const float* pos = positions.data();
  for (int64_t i = 0; i < len; ++i) {
    int64_t col = 0;
    for (std::size_t axis = 0; axis < axes_dims.size(); ++axis) {
      const int64_t d = axes_dims[axis];
      for (int64_t j = 0; j < d / 2; ++j) {
        const double omega = 1.0 / std::pow(theta, static_cast<double>(2 * j) / static_cast<double>(d));
        const double angle = static_cast<double>(pos[i * static_cast<int64_t>(axes_dims.size()) + static_cast<int64_t>(axis)]) * omega;
        for (int r = 0; r < 2; ++r) {
          cos[static_cast<std::size_t>(i * head_dim + col + 2 * j + r)] = static_cast<float>(std::cos(angle));
          sin[static_cast<std::size_t>(i * head_dim + col + 2 * j + r)] = static_cast<float>(std::sin(angle));
        }
      }
      col += d;
    }
  }
  return {Tensor::from_vector(cos, {len, head_dim}), Tensor::from_vector(sin, {len, head_dim})};
}

Tensor timestep_sinusoid(const Tensor& values, int64_t channels, float multiplier) {
  if (values.dim() != 1) throw Error("timestep_sinusoid: expected a 1-D tensor of values, got " + shape_to_string(values.shape()));
  // A small host tensor even in simulate mode: the pipeline makes it, nothing on the device writes it.
  const Tensor v = values.contiguous();
  const int64_t batch = v.size(0), half = channels / 2;
  std::vector<float> out(static_cast<std::size_t>(batch * channels), 0.0f);
  const auto log_period = static_cast<float>(std::log(10000.0));
  for (int64_t b = 0; b < batch; ++b) {
    float t = 0;
    switch (v.dtype()) {
      case DType::f32: t = v.data<float>()[b]; break;
      case DType::bf16: t = bf16_to_f32(v.data<uint16_t>()[b]); break;
      case DType::i64: t = static_cast<float>(v.data<int64_t>()[b]); break;
      default: throw Error("timestep_sinusoid: values must be f32, bf16 or i64, got " + std::string(dtype_name(v.dtype())));
    }
    t *= multiplier;
    for (int64_t j = 0; j < half; ++j) {
      // f32 exponent and argument as diffusers computes them; exp, cos and sin correctly rounded
      // (through double), where torch's own f32 exp can be an ulp off.
      const float exponent = (-log_period * static_cast<float>(j)) / static_cast<float>(half);
      const auto freq = static_cast<float>(std::exp(static_cast<double>(exponent)));
      const float a = t * freq;
      out[static_cast<std::size_t>(b * channels + j)] = static_cast<float>(std::cos(static_cast<double>(a)));
      out[static_cast<std::size_t>(b * channels + half + j)] = static_cast<float>(std::sin(static_cast<double>(a)));
    }
  }
  return Tensor::from_vector(out, {batch, channels});
}

// --- blocks -------------------------------------------------------------------------------------

void FluxDoubleBlock::declare(ParameterTable& t, const std::string& p, const FluxConfig& c) {
  const int64_t d = c.inner_dim(), hd = c.attention_head_dim;
  heads = c.num_attention_heads;
  head_dim = hd;
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

std::pair<Tensor, Tensor> FluxDoubleBlock::forward(const Tensor& h, const Tensor& c, const Tensor& silu_temb,
                                                   const RopeTable& table, const Stream& s) const {
  // Modulation, order shift, scale, gate (attention), then shift, scale, gate (MLP).
  const Tensor mod = norm1(silu_temb, s), cmod = norm1_context(silu_temb, s);
  const Tensor xn = ops::layernorm_scale_shift(h, chunk(mod, 6, 1), chunk(mod, 6, 0), {}, {}, 1e-6f, s);
  const Tensor cn = ops::layernorm_scale_shift(c, chunk(cmod, 6, 1), chunk(cmod, 6, 0), {}, {}, 1e-6f, s);
  // Joint attention over [text; image] with RoPE on q and k.
  const Tensor q = ops::concat({heads_rms(add_q(cn, s), norm_added_q, heads, head_dim, s),
                                heads_rms(to_q(xn, s), norm_q, heads, head_dim, s)}, 1, s);
  const Tensor k = ops::concat({heads_rms(add_k(cn, s), norm_added_k, heads, head_dim, s),
                                heads_rms(to_k(xn, s), norm_k, heads, head_dim, s)}, 1, s);
  const Tensor v = ops::concat({add_v(cn, s).reshape({c.size(0), c.size(1), heads, head_dim}),
                                to_v(xn, s).reshape({h.size(0), h.size(1), heads, head_dim})}, 1, s);
  const Tensor o = attention(rope(q, table, s), rope(k, table, s), v, s);
  const int64_t txt = c.size(1), img = h.size(1);
  // Image stream: attention output, then the MLP, each added through its gate.
  Tensor h2 = gated_linear(to_out, o.narrow(1, txt, img), h, chunk(mod, 6, 2), s);
  const Tensor hn = ops::layernorm_scale_shift(h2, chunk(mod, 6, 4), chunk(mod, 6, 3), {}, {}, 1e-6f, s);
  h2 = gated_linear(ff_out, ff_in(hn, s, {.activation = ops::GemmActivation::gelu_tanh}), h2, chunk(mod, 6, 5), s);
  // Text stream, the same with its own weights.
  Tensor c2 = gated_linear(to_add_out, o.narrow(1, 0, txt), c, chunk(cmod, 6, 2), s);
  const Tensor cn2 = ops::layernorm_scale_shift(c2, chunk(cmod, 6, 4), chunk(cmod, 6, 3), {}, {}, 1e-6f, s);
  c2 = gated_linear(ff_context_out, ff_context_in(cn2, s, {.activation = ops::GemmActivation::gelu_tanh}), c2,
                    chunk(cmod, 6, 5), s);
  return {h2, c2};
}

void FluxSingleBlock::declare(ParameterTable& t, const std::string& p, const FluxConfig& c) {
  const int64_t d = c.inner_dim(), hd = c.attention_head_dim;
  heads = c.num_attention_heads;
  head_dim = hd;
  norm.declare(t, p + "norm.linear", d, 3 * d);
  proj_mlp.declare(t, p + "proj_mlp", d, 4 * d);
  proj_out.declare(t, p + "proj_out", 5 * d, d);
  to_q.declare(t, p + "attn.to_q", d, d);
  to_k.declare(t, p + "attn.to_k", d, d);
  to_v.declare(t, p + "attn.to_v", d, d);
  norm_q.declare(t, p + "attn.norm_q.weight", hd);
  norm_k.declare(t, p + "attn.norm_k.weight", hd);
}

Tensor FluxSingleBlock::forward(const Tensor& x, const Tensor& silu_temb, const RopeTable& table, const Stream& s) const {
  const Tensor mod = norm(silu_temb, s);  // shift, scale, gate
  const Tensor xn = ops::layernorm_scale_shift(x, chunk(mod, 3, 1), chunk(mod, 3, 0), {}, {}, 1e-6f, s);
  const Tensor mlp = proj_mlp(xn, s, {.activation = ops::GemmActivation::gelu_tanh});
  const Tensor q = rope(heads_rms(to_q(xn, s), norm_q, heads, head_dim, s), table, s);
  const Tensor k = rope(heads_rms(to_k(xn, s), norm_k, heads, head_dim, s), table, s);
  const Tensor v = to_v(xn, s).reshape({x.size(0), x.size(1), heads, head_dim});
  const Tensor a = attention(q, k, v, s);
  // proj_out over [attention; MLP] channels (attention's first).
  return gated_linear(proj_out, ops::concat({a, mlp}, 2, s), x, chunk(mod, 3, 2), s);
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
  for (std::size_t i = 0; i < double_blocks_.size(); ++i)
    double_blocks_[i].declare(table_, "transformer_blocks." + std::to_string(i) + ".", c);
  single_blocks_.resize(static_cast<std::size_t>(c.num_single_layers));
  for (std::size_t i = 0; i < single_blocks_.size(); ++i)
    single_blocks_[i].declare(table_, "single_transformer_blocks." + std::to_string(i) + ".", c);
  norm_out_.declare(table_, "norm_out.linear", d, 2 * d);
  proj_out_.declare(table_, "proj_out", d, c.out_channels);
}

std::unique_ptr<FluxTransformer2DModel> FluxTransformer2DModel::load(const std::string& dir, DType dtype) {
  auto model = std::make_unique<FluxTransformer2DModel>(FluxConfig::load(dir + "/config.json"));
  load_parameters(model->table_, Checkpoint::open(dir), dtype);
  return model;
}

Tensor FluxTransformer2DModel::time_text_embedding(const Tensor& timestep, const Tensor& guidance, const Tensor& pooled,
                                                   const Stream& s) const {
  const auto silu = ops::MatmulOptions{.activation = ops::GemmActivation::silu};
  auto embed = [&](const Linear& l1, const Linear& l2, const Tensor& x) { return l2(l1(x, s, silu), s); };
  // The model multiplies sigma (and the guidance scale) by 1000 before the sinusoid.
  Tensor temb = embed(time_1_, time_2_, timestep_sinusoid(timestep, 256, 1000.0f));
  if (config_.guidance_embeds)
    temb = ops::add(temb, embed(guidance_1_, guidance_2_, timestep_sinusoid(guidance, 256, 1000.0f)), s);
  return ops::add(temb, embed(text_1_, text_2_, ops::cast(pooled, DType::f32)), s);
}

Tensor FluxTransformer2DModel::forward(const FluxInputs& in, const Stream& s) const {
  const FluxConfig& c = config_;
  auto require = [&](const Tensor& t, const char* name, const Shape& shape) {
    if (!t.defined()) throw Error(std::string("flux forward: ") + name + " is missing (expected " + shape_to_string(shape) + ")");
    bool ok = t.dim() == static_cast<int64_t>(shape.size());
    for (std::size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || t.size(static_cast<int64_t>(i)) == shape[i];
    if (!ok)
      throw Error(std::string("flux forward: ") + name + " must be " + shape_to_string(shape) + " (-1: any), got " +
                  shape_to_string(t.shape()));
  };
  require(in.hidden_states, "hidden_states", {-1, -1, c.in_channels});
  const int64_t batch = in.hidden_states.size(0), img = in.hidden_states.size(1);
  require(in.encoder_hidden_states, "encoder_hidden_states", {batch, -1, c.joint_attention_dim});
  const int64_t txt = in.encoder_hidden_states.size(1);
  require(in.pooled_projections, "pooled_projections", {batch, c.pooled_projection_dim});
  require(in.timestep, "timestep", {batch});
  require(in.img_ids.dim() == 3 ? in.img_ids.select(0, 0) : in.img_ids, "img_ids", {img, 3});
  require(in.txt_ids.dim() == 3 ? in.txt_ids.select(0, 0) : in.txt_ids, "txt_ids", {txt, 3});
  if (c.guidance_embeds) require(in.guidance, "guidance", {batch});
  else if (in.guidance.defined()) throw Error("flux forward: guidance given, but this model has no guidance embedder (guidance_embeds false)");

  const Tensor temb = time_text_embedding(in.timestep, in.guidance, in.pooled_projections, s);
  const Tensor silu_temb = ops::activation(temb, Activation::silu, s);
  const RopeTable txt_rope = flux_rope(in.txt_ids, c.axes_dims_rope), img_rope = flux_rope(in.img_ids, c.axes_dims_rope);
  const RopeTable table{ops::concat({txt_rope.cos, img_rope.cos}, 0, s), ops::concat({txt_rope.sin, img_rope.sin}, 0, s)};
  Tensor h = x_embedder_(ops::cast(in.hidden_states, DType::f32), s);
  Tensor ctx = context_embedder_(ops::cast(in.encoder_hidden_states, DType::f32), s);
  for (const FluxDoubleBlock& block : double_blocks_) std::tie(h, ctx) = block.forward(h, ctx, silu_temb, table, s);
  Tensor joint = ops::concat({ctx, h}, 1, s);
  for (const FluxSingleBlock& block : single_blocks_) joint = block.forward(joint, silu_temb, table, s);
  h = joint.narrow(1, txt, img);
  // norm_out: scale first, then shift.
  const Tensor emb = norm_out_(silu_temb, s);
  const Tensor hn = ops::layernorm_scale_shift(h, chunk(emb, 2, 0), chunk(emb, 2, 1), {}, {}, 1e-6f, s);
  return proj_out_(hn, s);
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
    throw Error("unpack_latents: expected [B, " + std::to_string((height / 2) * (width / 2)) + ", 4C] for a " +
                std::to_string(height) + "x" + std::to_string(width) + " latent, got " + shape_to_string(p.shape()));
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
