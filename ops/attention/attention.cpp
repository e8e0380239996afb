// attention_forward and attention_forward_varlen: argument checks with MindIE-style messages,
// layouts turned into per-head problems (ops/attention/problem.h), the choice of implementation
// (opt_mode, the autotuner) and the launches on the device.
#include "ops/attention.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <memory>
#include <mutex>
#include <sstream>

#include "ops/attention/cv_pipeline.h"
#include "ops/attention/problem.h"
#include "ops/attention_tuner.h"
#include "ops/vector_ops.h"
#include "base/enum_names.h"
#include "base/error.h"

namespace cubevec::ops {

namespace {

// q, k, v as 4-D views in BSND or BNSD (BSH viewed as BSND), checked.
struct Inputs {
  Tensor q, k, v;
  AttentionLayout layout = AttentionLayout::bsnd;  // bsnd or bnsd
  int64_t batch = 0, heads = 0, d = 0, sq = 0, sk = 0;
  Tensor mask;  // undefined, or boolean (attend) or f32 (additive bias) [B|1, N|1, Sq, Sk], unit stride in the last dim
  AttentionMaskKind mask_kind = AttentionMaskKind::none;
  float scale = 1.0f;
  Tensor block_mask;     // block_sparse_attention: [B|1, N|1, Lq, Lk] bytes with unit stride in the last dim
  double density = 1.0;  // the kept fraction of the work, for the cost model
};

Inputs check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Stream& stream,
                    const char* op = "attention_forward") {
  auto fail = [&](const std::string& what) { throw Error(std::string(op) + ": " + what); };
  for (const auto& [t, name] : {std::pair{&q, "query"}, {&k, "key"}, {&v, "value"}}) {
    if (!t->defined()) fail(std::string(name) + " is undefined");
    if (t->dtype() != DType::f32 && t->dtype() != DType::bf16) fail(std::string(name) + " must be f32 or bf16, got " + t->brief());
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    fail("query, key and value must share a dtype, got " + q.brief() + ", " + k.brief() + ", " + v.brief());
  Inputs in;
  const std::string layout_name(attention_layout_name(o.layout));
  if (o.layout == AttentionLayout::bsh) {
    for (const auto& [t, name] : {std::pair{&q, "query"}, {&k, "key"}, {&v, "value"}})
      if (t->dim() != 3) fail(std::string(name) + " must be 3-D [B, S, H] for layout BSH, got " + t->brief());
    if (o.num_heads <= 0) fail("layout BSH needs num_heads > 0, got " + std::to_string(o.num_heads));
    if (q.size(2) % o.num_heads != 0)
      fail("query's hidden size " + std::to_string(q.size(2)) + " is not divisible by num_heads " + std::to_string(o.num_heads));
    auto split = [&](const Tensor& t) {
      const Shape shape{t.size(0), t.size(1), o.num_heads, t.size(2) / o.num_heads};
      return t.stride(2) == 1 ? t.reshape(shape) : contiguous(t, stream).reshape(shape);
    };
    if (k.size(2) != q.size(2) || v.size(2) != q.size(2))
      fail("query, key and value must have the same hidden size, got " + q.brief() + ", " + k.brief() + ", " + v.brief());
    in.q = split(q);
    in.k = split(k);
    in.v = split(v);
    in.layout = AttentionLayout::bsnd;
  } else {
    for (const auto& [t, name] : {std::pair{&q, "query"}, {&k, "key"}, {&v, "value"}})
      if (t->dim() != 4)
        fail(std::string(name) + " must be 4-D [" + (o.layout == AttentionLayout::bnsd ? "B, N, S, D" : "B, S, N, D") + "] for layout " +
             layout_name + ", got " + t->brief());
    in.q = q;
    in.k = k;
    in.v = v;
    in.layout = o.layout;
  }
  const int64_t s = seq_dim(in.layout), n = head_dim_index(in.layout);
  in.batch = in.q.size(0);
  in.heads = in.q.size(n);
  in.d = in.q.size(3);
  in.sq = in.q.size(s);
  in.sk = in.k.size(s);
  if (in.k.shape() != in.v.shape()) fail("key and value must have the same shape, got " + k.brief() + " and " + v.brief());
  if (in.k.size(0) != in.batch || in.k.size(n) != in.heads || in.k.size(3) != in.d)
    fail("key must match query in batch, heads and head dim (layout " + layout_name + "), got query " + q.brief() + " and key " +
         k.brief());
  if (in.d == 0) fail("the head dim must be at least 1, got query " + q.brief());
  if (in.sk == 0 && in.sq > 0) fail("key and value must hold at least one position, got " + k.brief());
  // Kernels read rows with unit stride in the head dim.
  for (Tensor* t : {&in.q, &in.k, &in.v})
    if (t->stride(3) != 1 && t->numel() > 0) *t = contiguous(*t, stream);

  double scale = 1.0 / std::sqrt(static_cast<double>(in.d));
  if (o.scale) {
    if (!std::isfinite(*o.scale)) fail("scale must be a finite number, got " + std::to_string(*o.scale));
    scale = *o.scale;
  }
  in.scale = static_cast<float>(scale);

  if (o.mask.defined()) {
    const Tensor& m = o.mask;
    if (m.dtype() != DType::boolean && m.dtype() != DType::f32)
      fail("attn_mask must be bool (true = attend) or f32 (added to the scaled scores), got " + m.brief());
    const bool bias = m.dtype() == DType::f32;
    Tensor m4;
    if (m.dim() == 2) {
      if (m.size(0) != in.sq || m.size(1) != in.sk)
        fail("a 2-D attn_mask must be [Sq, Sk] = [" + std::to_string(in.sq) + ", " + std::to_string(in.sk) + "], got " + m.brief());
      m4 = m.unsqueeze(0).unsqueeze(0);
      in.mask_kind = bias ? AttentionMaskKind::bias_2d : AttentionMaskKind::mask_2d;
    } else if (m.dim() == 4) {
      const bool ok = (m.size(0) == in.batch || m.size(0) == 1) && (m.size(1) == in.heads || m.size(1) == 1) && m.size(2) == in.sq &&
                      m.size(3) == in.sk;
      if (!ok)
        fail("a 4-D attn_mask must be [B, N, Sq, Sk] = [" + std::to_string(in.batch) + ", " + std::to_string(in.heads) + ", " +
             std::to_string(in.sq) + ", " + std::to_string(in.sk) + "] (B and N may be 1), got " + m.brief());
      m4 = m;
      in.mask_kind = bias ? AttentionMaskKind::bias_4d : AttentionMaskKind::mask_4d;
    } else {
      fail("attn_mask must be 2-D [Sq, Sk] or 4-D [B, N, Sq, Sk], got " + m.brief());
    }
    if (m4.stride(3) != 1 && m4.numel() > 0) m4 = m4.contiguous();
    in.mask = m4;
  }
  return in;
}

// The per-head problems of 4-D q, k, v, out in `layout` (bsnd or bnsd), all with unit stride in D.
attn::AttentionBatch make_batch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& mask,
                                const Tensor& block_mask, const Tensor& lse, AttentionLayout layout, float scale) {
  attn::AttentionBatch batch;
  batch.d = q.size(3);
  batch.dtype = q.dtype();
  batch.scale = scale;
  const int64_t s = seq_dim(layout), n = head_dim_index(layout);
  const int64_t item = static_cast<int64_t>(q.itemsize());
  auto at = [&](const Tensor& t, int64_t b, int64_t h) { return t.unsynchronized_data_ptr() + (b * t.stride(0) + h * t.stride(n)) * item; };
  for (int64_t b = 0; b < q.size(0); ++b) {
    for (int64_t h = 0; h < q.size(n); ++h) {
      attn::HeadProblem p;
      p.q = at(q, b, h);
      p.k = at(k, b, h);
      p.v = at(v, b, h);
      p.out = at(out, b, h);
      p.q_ld = q.stride(s);
      p.k_ld = k.stride(s);
      p.v_ld = v.stride(s);
      p.out_ld = out.stride(s);
      p.sq = q.size(s);
      p.sk = k.size(s);
      if (mask.defined()) {
        const int64_t mb = mask.size(0) == 1 ? 0 : b, mh = mask.size(1) == 1 ? 0 : h;
        const int64_t offset = mb * mask.stride(0) + mh * mask.stride(1);
        if (mask.dtype() == DType::f32) {
          p.bias = reinterpret_cast<const float*>(mask.unsynchronized_data_ptr()) + offset;
          p.bias_ld = mask.stride(2);
        } else {
          p.mask = reinterpret_cast<const uint8_t*>(mask.unsynchronized_data_ptr()) + offset;
          p.mask_ld = mask.stride(2);
        }
      }
      if (block_mask.defined()) {
        const int64_t mb = block_mask.size(0) == 1 ? 0 : b, mh = block_mask.size(1) == 1 ? 0 : h;
        p.block_keep =
            reinterpret_cast<const uint8_t*>(block_mask.unsynchronized_data_ptr()) + mb * block_mask.stride(0) + mh * block_mask.stride(1);
        p.block_ld = block_mask.stride(2);
      }
      if (lse.defined()) p.lse = reinterpret_cast<float*>(lse.unsynchronized_data_ptr()) + (b * q.size(n) + h) * p.sq;
      batch.heads.push_back(p);
    }
  }
  return batch;
}

// The Cube kernel's cost: the matmuls, and the bytes of q, k, v, out (math adds the scores).
KernelDesc cube_desc(const Inputs& in, double flops, bool materialized) {
  const double elems = static_cast<double>(in.batch * in.heads * in.d);
  double bytes = static_cast<double>(dtype_size(in.q.dtype())) * elems * static_cast<double>(2 * in.sq + 2 * in.sk);
  if (materialized) bytes += 3.0 * 4.0 * static_cast<double>(in.batch * in.heads) * static_cast<double>(in.sq * in.sk);
  KernelDesc desc{"", Unit::cube, flops, bytes, in.q.dtype()};  // priced at the activation dtype
  desc.cube_work = {in.batch * in.heads, in.sq, 0};             // tiled by query blocks
  desc.key_length = in.sk;
  return desc;
}

// Launches `impl` on the heads batch_of() builds (called inside the kernel, when the tensors are
// ready). `cube` carries the Cube kernel's cost; `scores` counts the score elements (the Vector
// half's work in the CV pipeline). Kernels are named "<prefix>_<impl>".
void launch_batch(AttentionImpl impl, const std::string& prefix, const std::function<attn::AttentionBatch()>& batch_of, KernelDesc cube,
                  double scores, const std::vector<Tensor>& reads, const std::vector<Tensor>& outs, const Stream& stream) {
  // The modelled NPU runs attention as one mixed kernel: its softmax on the Vector cores.
  cube.scores = scores;
  switch (impl) {
    case AttentionImpl::math:
      cube.name = prefix + "_math";
      stream.launch(cube, reads, outs, [batch_of] { attn::run_math(batch_of()); });
      return;
    case AttentionImpl::flash:
      cube.name = prefix + "_flash";
      stream.launch(cube, reads, outs, [batch_of] { attn::run_flash(batch_of()); });
      return;
    case AttentionImpl::flash_bf16:
      if (!attn::flash_amx_available() && !stream.device().simulate())
        throw Error("attention: op_type flash_bf16 needs AMX-BF16 or AVX512-BF16, which this CPU (or its kernel) does not offer");
      cube.name = prefix + "_flash_bf16";
      cube.dtype = DType::bf16;  // its products are bf16 whatever the activations
      stream.launch(cube, reads, outs, [batch_of] { attn::run_flash_amx(batch_of()); });
      return;
    case AttentionImpl::flash_int8:
      if (!attn::flash_int8_available() && !stream.device().simulate())
        throw Error(
            "attention: op_type flash_int8 needs AMX-INT8 (or AVX512-VNNI with AVX512-BF16), which this CPU (or its kernel) does not "
            "offer");
      cube.name = prefix + "_flash_int8";
      cube.dtype = DType::bf16;  // priced as bf16: its P V product is
      stream.launch(cube, reads, outs, [batch_of] { attn::run_flash_int8(batch_of()); });
      return;
    case AttentionImpl::cv_pipelined: {
      // Both halves share one pipeline, made by whichever starts first (their tensors are ready by then).
      struct Shared {
        std::once_flag once;
        std::unique_ptr<attn::CvPipeline> pipeline;
      };
      auto shared = std::make_shared<Shared>();
      const int lanes = stream.device().profile().cube_threads;
      auto get = [shared, batch_of, lanes]() -> attn::CvPipeline& {
        std::call_once(shared->once, [&] { shared->pipeline = std::make_unique<attn::CvPipeline>(batch_of(), lanes); });
        return *shared->pipeline;
      };
      // The Vector half waits for everything the caller queued before, so it never holds the
      // Vector unit while the Cube half still waits for earlier work.
      Stream vector_stream = stream.device().named_stream("attention.cv_vector");
      vector_stream.wait(stream.record());
      vector_stream.launch({prefix + "_cv_softmax", Unit::vector, 6.0 * scores, 2.0 * 4.0 * scores, DType::f32}, reads, {},
                           [get] { get().run_vector(); });
      cube.name = prefix + "_cv_matmul";
      stream.launch(cube, reads, outs, [get] { get().run_cube(); });
      return;
    }
  }
}

// Runs `impl` with q, k, v handed over in `kernel_layout`; returns the result in in.layout. With
// `lse` (f32 [B, N, Sq], contiguous) the kernel also writes each row's log-sum-exp there.
Tensor run_impl(const Inputs& in, AttentionImpl impl, AttentionLayout kernel_layout, const Stream& stream, const Tensor& lse = {}) {
  if (impl == AttentionImpl::flash_int8 && in.d > attn::kFlashInt8MaxHeadDim)
    throw Error("attention: op_type flash_int8 sums its int8 products in int32, so head dims up to " +
                std::to_string(attn::kFlashInt8MaxHeadDim) + "; got " + std::to_string(in.d));
  if (kernel_layout == AttentionLayout::bsh) kernel_layout = AttentionLayout::bsnd;
  const bool transposed = kernel_layout != in.layout;
  auto to_kernel = [&](const Tensor& t) { return transposed ? contiguous(t.permute({0, 2, 1, 3}), stream) : t; };
  const Tensor q = to_kernel(in.q), k = to_kernel(in.k), v = to_kernel(in.v), mask = in.mask, block_mask = in.block_mask;
  Tensor out = stream.device().empty(q.shape(), q.dtype(), stream);
  const double flops = in.density * 4.0 * static_cast<double>(in.batch * in.heads) * static_cast<double>(in.sq) *
                       static_cast<double>(in.sk) * static_cast<double>(in.d);
  const float scale = in.scale;
  std::vector<Tensor> reads{q, k, v};
  if (mask.defined()) reads.push_back(mask);
  if (block_mask.defined()) reads.push_back(block_mask);
  auto batch_of = [=] { return make_batch(q, k, v, out, mask, block_mask, lse, kernel_layout, scale); };
  const double scores = in.density * static_cast<double>(in.batch * in.heads) * static_cast<double>(in.sq * in.sk);
  std::vector<Tensor> outs{out};
  if (lse.defined()) outs.push_back(lse);
  launch_batch(impl, block_mask.defined() ? "block_sparse_attention" : "attention", batch_of,
               cube_desc(in, flops, impl == AttentionImpl::math), scores, reads, outs, stream);
  return transposed ? contiguous(out.permute({0, 2, 1, 3}), stream) : out;
}

struct Candidate {
  AttentionImpl impl;
  AttentionLayout kernel_layout;
};

// bf16 activations are offered the bf16 products (AMX tiles or AVX512-BF16 dot products) where the
// CPU has them: the rounding is the activations' own.
bool bf16_flash_for(const Inputs& in) { return in.q.dtype() == DType::bf16 && attn::flash_amx_available(); }

// The fixed table takes the AMX tiles only: AVX512-BF16 dot products run at half the FMA rate on
// some CPUs (Intel's) and at twice it on others (AMD's), which only the runtime tuner can tell.
AttentionTuneChoice static_choice(const Inputs& in) { return {attention_static_impl(in.q.dtype()), in.layout, 0.0}; }

// MindIE's runtime mode: time each candidate (one warm-up call, then the best of two timed
// calls, each synchronized), keep the fastest. A candidate that throws is skipped; if all do, the
// math path is the answer, cached like any other.
AttentionTuneChoice tune(const Inputs& in, const Stream& stream) {
  std::vector<Candidate> candidates = {{AttentionImpl::flash, AttentionLayout::bnsd},
                                       {AttentionImpl::flash, AttentionLayout::bsnd},
                                       {AttentionImpl::cv_pipelined, AttentionLayout::bnsd},
                                       {AttentionImpl::cv_pipelined, AttentionLayout::bsnd}};
  if (bf16_flash_for(in))
    candidates.insert(candidates.end(),
                      {{AttentionImpl::flash_bf16, AttentionLayout::bnsd}, {AttentionImpl::flash_bf16, AttentionLayout::bsnd}});
  stream.synchronize();
  AttentionTuneChoice best{in.block_mask.defined() ? AttentionImpl::flash : AttentionImpl::math, in.layout, 0.0};
  double best_s = 0;
  for (const Candidate& c : candidates) {
    try {
      double fastest = 0;
      for (int run = 0; run < 3; ++run) {
        const auto t0 = std::chrono::steady_clock::now();
        run_impl(in, c.impl, c.kernel_layout, stream);
        stream.synchronize();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (run == 1 || (run > 1 && s < fastest)) fastest = s;
      }
      if (best_s == 0 || fastest < best_s) {
        best_s = fastest;
        best = {c.impl, c.kernel_layout, fastest};
      }
    } catch (const std::exception&) {
      // As MindIE: a candidate that fails is not a candidate.
    }
  }
  return best;
}

}  // namespace

namespace {
constexpr auto kLayoutNames = enum_names<AttentionLayout>(
    "attention layout", {{AttentionLayout::bsnd, "BSND"}, {AttentionLayout::bnsd, "BNSD"}, {AttentionLayout::bsh, "BSH"}},
    /*ignore_case=*/true);
constexpr auto kImplNames = enum_names<AttentionImpl>("attention op_type",
                                                      {{AttentionImpl::math, "math"},
                                                       {AttentionImpl::flash, "flash"},
                                                       {AttentionImpl::cv_pipelined, "cv_pipelined"},
                                                       {AttentionImpl::flash_bf16, "flash_bf16"},
                                                       {AttentionImpl::flash_int8, "flash_int8"}},
                                                      /*ignore_case=*/true);
constexpr auto kOptModeNames = enum_names<AttentionOptMode>(
    "attention opt_mode",
    {{AttentionOptMode::runtime, "runtime"}, {AttentionOptMode::static_table, "static"}, {AttentionOptMode::manual, "manual"}},
    /*ignore_case=*/true);
}  // namespace

AttentionLayout parse_attention_layout(std::string_view name) { return kLayoutNames.parse(name); }
std::string_view attention_layout_name(AttentionLayout layout) { return kLayoutNames.name(layout); }
AttentionImpl parse_attention_impl(std::string_view name) { return kImplNames.parse(name); }
std::string_view attention_impl_name(AttentionImpl impl) { return kImplNames.name(impl); }
AttentionImpl attention_static_impl(DType activations) {
  const bool amx = activations == DType::bf16 && attn::bf16_tiles_available(attn::Bf16Tiles::amx);
  return amx ? AttentionImpl::flash_bf16 : AttentionImpl::flash;
}

bool attention_impl_available(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::flash_bf16: return attn::flash_amx_available();
    case AttentionImpl::flash_int8: return attn::flash_int8_available();
    case AttentionImpl::math:
    case AttentionImpl::flash:
    case AttentionImpl::cv_pipelined: return true;
  }
  return false;
}
AttentionOptMode parse_attention_opt_mode(std::string_view name) { return kOptModeNames.parse(name); }
std::string_view attention_opt_mode_name(AttentionOptMode mode) { return kOptModeNames.name(mode); }

// The static table's pick, or in runtime mode the tuner's (tuned once per key; the static pick
// in simulate mode, where nothing can be timed).
AttentionTuneChoice automatic_choice(const Inputs& in, AttentionOptMode mode, AttentionLayout layout, const Stream& stream) {
  // Simulate mode models the NPU's kernel, not this CPU's: the same pick on every host.
  if (stream.device().simulate()) return {AttentionImpl::flash, in.layout, 0.0};
  if (mode == AttentionOptMode::static_table) return static_choice(in);
  const AttentionTuneKey key{in.batch, in.heads, in.d, in.sq, in.sk, in.q.dtype(), layout, in.mask_kind};
  if (auto found = AttentionTuner::global().find(key)) return *found;
  const std::shared_ptr<AttentionPicksFile> file = AttentionTuner::global().picks_file();
  if (file) {
    file->reload();  // another process may have tuned this key since the run began
    if (auto found = AttentionTuner::global().find(key)) return *found;
  }
  const AttentionTuneChoice choice = tune(in, stream);
  AttentionTuner::global().store(key, choice);
  if (file) file->save();
  return choice;
}

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, const Stream& stream) {
  const Inputs in = check_inputs(q, k, v, options, stream);
  AttentionTuneChoice choice;
  switch (options.opt_mode) {
    case AttentionOptMode::manual:
      if (options.kernel_layout == AttentionLayout::bsh && options.layout != AttentionLayout::bsh)
        throw Error("attention_forward: kernel_layout BSH needs BSH input (layout " + std::string(attention_layout_name(options.layout)) +
                    " given)");
      choice = {options.op_type, options.kernel_layout, 0.0};
      break;
    case AttentionOptMode::static_table:
    case AttentionOptMode::runtime: choice = automatic_choice(in, options.opt_mode, options.layout, stream); break;
  }
  Tensor out = run_impl(in, choice.op_type, choice.kernel_layout, stream);
  return options.layout == AttentionLayout::bsh ? out.reshape(q.shape()) : out;
}

AttentionPartial attention_forward_with_lse(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                            const Stream& stream) {
  const char* op = "attention_forward_with_lse";
  if (options.layout == AttentionLayout::bsh) throw Error(std::string(op) + ": layout must be BSND or BNSD, got BSH");
  const Inputs in = check_inputs(q, k, v, options, stream, op);
  AttentionTuneChoice choice;
  if (options.opt_mode == AttentionOptMode::manual) {
    if (options.op_type == AttentionImpl::math)
      throw Error(std::string(op) + ": op_type must be flash or cv_pipelined (the math path has no log-sum-exp)");
    if (options.kernel_layout == AttentionLayout::bsh) throw Error(std::string(op) + ": kernel_layout must be BSND or BNSD");
    choice = {options.op_type, options.kernel_layout, 0.0};
  } else {
    choice = automatic_choice(in, options.opt_mode, options.layout, stream);
    if (choice.op_type == AttentionImpl::math) choice = {AttentionImpl::flash, in.layout, 0.0};
  }
  Tensor lse = stream.device().empty({in.batch, in.heads, in.sq}, DType::f32, stream);
  Tensor out = run_impl(in, choice.op_type, choice.kernel_layout, stream, lse);
  return {out, lse};
}

Tensor block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& block_mask,
                              const BlockSparseOptions& options, const Stream& stream) {
  const char* op = "block_sparse_attention";
  auto fail = [&](const std::string& what) { throw Error(std::string(op) + ": " + what); };
  if (options.layout == AttentionLayout::bsh) fail("layout must be BSND or BNSD, got BSH");
  AttentionOptions base;
  base.scale = options.scale;
  base.layout = options.layout;
  Inputs in = check_inputs(q, k, v, base, stream, op);
  const int64_t lq = (in.sq + attn::kSparseBlock - 1) / attn::kSparseBlock, lk = (in.sk + attn::kSparseBlock - 1) / attn::kSparseBlock;
  const Tensor& m = block_mask;
  if (!m.defined() || (m.dtype() != DType::boolean && m.dtype() != DType::u8) || m.dim() != 4 ||
      (m.size(0) != in.batch && m.size(0) != 1) || (m.size(1) != in.heads && m.size(1) != 1) || m.size(2) != lq || m.size(3) != lk)
    fail("block_mask must be bool or u8 [B, N, ceil(Sq/128), ceil(Sk/128)] = [" + std::to_string(in.batch) + ", " +
         std::to_string(in.heads) + ", " + std::to_string(lq) + ", " + std::to_string(lk) + "] (B and N may be 1), got " + m.brief());
  in.block_mask = m.stride(3) == 1 || m.numel() == 0 ? m : m.contiguous();
  in.mask_kind = AttentionMaskKind::block_sparse;
  if (options.density) {
    if (!(*options.density >= 0.0 && *options.density <= 1.0)) fail("density must be in [0, 1], got " + std::to_string(*options.density));
    in.density = *options.density;
  } else if (m.has_storage() && m.numel() > 0) {
    const Tensor c = m.contiguous();
    const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
    const int64_t kept = std::count_if(bytes, bytes + c.numel(), [](uint8_t b) { return b != 0; });
    in.density = static_cast<double>(kept) / static_cast<double>(c.numel());
  }
  AttentionTuneChoice choice;
  switch (options.opt_mode) {
    case AttentionOptMode::manual:
      if (options.op_type == AttentionImpl::math) fail("op_type must be flash or cv_pipelined (the math path has no block sparsity)");
      if (options.kernel_layout == AttentionLayout::bsh) fail("kernel_layout must be BSND or BNSD");
      choice = {options.op_type, options.kernel_layout, 0.0};
      break;
    case AttentionOptMode::static_table:
    case AttentionOptMode::runtime: choice = automatic_choice(in, options.opt_mode, options.layout, stream); break;
  }
  return run_impl(in, choice.op_type, choice.kernel_layout, stream);
}

Tensor attention_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                const VarlenOptions& options, const Stream& stream) {
  const char* op = "attention_forward_varlen";
  auto fail = [&](const std::string& what) { throw Error(std::string(op) + ": " + what); };
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    if (!t->defined() || t->dim() != 3)
      fail(std::string(name) + " must be 3-D [T, N, D], got " + (t->defined() ? t->brief() : "undefined"));
    if (t->dtype() != DType::f32 && t->dtype() != DType::bf16) fail(std::string(name) + " must be f32 or bf16, got " + t->brief());
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    fail("q, k and v must share a dtype, got " + q.brief() + ", " + k.brief() + ", " + v.brief());
  if (k.shape() != v.shape()) fail("k and v must have the same shape, got " + k.brief() + " and " + v.brief());
  if (k.size(1) != q.size(1) || k.size(2) != q.size(2))
    fail("k must match q in heads and head dim, got q " + q.brief() + " and k " + k.brief());
  if (q.size(2) == 0) fail("the head dim must be at least 1, got q " + q.brief());
  auto read_cu = [&](const Tensor& cu, const char* name, int64_t total) {
    if (!cu.defined() || cu.dtype() != DType::i32 || cu.dim() != 1 || cu.size(0) < 2)
      fail(std::string(name) + " must be int32 [B+1] with B >= 1, got " + (cu.defined() ? cu.brief() : "undefined"));
    std::vector<int64_t> values(static_cast<std::size_t>(cu.size(0)));
    for (int64_t i = 0; i < cu.size(0); ++i) values[static_cast<std::size_t>(i)] = cu.at<int32_t>({i});
    if (values.front() != 0) fail(std::string(name) + " must start at 0, got " + std::to_string(values.front()));
    for (std::size_t i = 1; i < values.size(); ++i)
      if (values[i] < values[i - 1])
        fail(std::string(name) + " must be non-decreasing, but entry " + std::to_string(i) + " (" + std::to_string(values[i]) +
             ") is below entry " + std::to_string(i - 1) + " (" + std::to_string(values[i - 1]) + ")");
    if (values.back() != total)
      fail(std::string(name) + " must end at the token count " + std::to_string(total) + ", got " + std::to_string(values.back()));
    return values;
  };
  const std::vector<int64_t> cu_q = read_cu(cu_seqlens_q, "cu_seqlens_q", q.size(0));
  const std::vector<int64_t> cu_k = read_cu(cu_seqlens_k, "cu_seqlens_k", k.size(0));
  if (cu_q.size() != cu_k.size())
    fail("cu_seqlens_q and cu_seqlens_k must have the same length, got " + std::to_string(cu_q.size()) + " and " +
         std::to_string(cu_k.size()));
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b)
    if (cu_k[b + 1] == cu_k[b] && cu_q[b + 1] > cu_q[b])
      fail("sequence " + std::to_string(b) + " has " + std::to_string(cu_q[b + 1] - cu_q[b]) + " queries but no keys");
  double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  if (options.scale) {
    if (!std::isfinite(*options.scale)) fail("softmax_scale must be a finite number");
    scale = *options.scale;
  }
  Tensor qc = q.stride(2) == 1 ? q : contiguous(q, stream);
  Tensor kc = k.stride(2) == 1 ? k : contiguous(k, stream);
  Tensor vc = v.stride(2) == 1 ? v : contiguous(v, stream);
  Tensor out = stream.device().empty(q.shape(), q.dtype(), stream);
  const bool causal = options.causal;
  const float fscale = static_cast<float>(scale);
  auto batch_of = [=] {
    attn::AttentionBatch batch;
    batch.d = qc.size(2);
    batch.dtype = qc.dtype();
    batch.scale = fscale;
    const int64_t item = static_cast<int64_t>(qc.itemsize());
    for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
      if (cu_q[b + 1] == cu_q[b]) continue;
      for (int64_t h = 0; h < qc.size(1); ++h) {
        attn::HeadProblem p;
        p.q = qc.unsynchronized_data_ptr() + (cu_q[b] * qc.stride(0) + h * qc.stride(1)) * item;
        p.k = kc.unsynchronized_data_ptr() + (cu_k[b] * kc.stride(0) + h * kc.stride(1)) * item;
        p.v = vc.unsynchronized_data_ptr() + (cu_k[b] * vc.stride(0) + h * vc.stride(1)) * item;
        p.out = out.unsynchronized_data_ptr() + (cu_q[b] * out.stride(0) + h * out.stride(1)) * item;
        p.q_ld = qc.stride(0);
        p.k_ld = kc.stride(0);
        p.v_ld = vc.stride(0);
        p.out_ld = out.stride(0);
        p.sq = cu_q[b + 1] - cu_q[b];
        p.sk = cu_k[b + 1] - cu_k[b];
        p.causal = causal;
        batch.heads.push_back(p);
      }
    }
    return batch;
  };
  double flops = 0;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b)
    flops += 4.0 * static_cast<double>((cu_q[b + 1] - cu_q[b]) * (cu_k[b + 1] - cu_k[b])) * static_cast<double>(q.size(1) * q.size(2));
  const double bytes = static_cast<double>(qc.nbytes() + kc.nbytes() + vc.nbytes() + out.nbytes());
  double scores = 0;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b)
    scores += static_cast<double>((cu_q[b + 1] - cu_q[b]) * (cu_k[b + 1] - cu_k[b])) * static_cast<double>(q.size(1));
  launch_batch(options.impl, "attention_varlen", batch_of, {"", Unit::cube, flops, bytes, DType::f32}, scores, {qc, kc, vc}, {out}, stream);
  return out;
}

}  // namespace cubevec::ops
