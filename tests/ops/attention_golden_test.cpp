// ops::attention_forward and ops::attention_forward_varlen against PyTorch goldens:
// tests/data/goldens_attention.safetensors, written by tests/reference/make_goldens.py (see
// tests/reference/README.md). Each case's metadata is JSON with "op" ("attention" or
// "attention_varlen"), "dtype", and the parameters; its tensors are "<case>.q", ".k", ".v", ".mask"
// (bool, optional), ".cu_seqlens_q" / ".cu_seqlens_k" (int32, varlen) and ".expected".
//
// Every attention case runs through every implementation: opt_mode manual with op_type math,
// flash and cv_pipelined, each with kernel_layout BNSD and BSND, then opt_mode runtime and static.
// Every varlen case runs with impl math, flash and cv_pipelined.
//
// Tolerances, per element, with M = max(|e|) over the case's non-NaN expected values:
//   f32:  |got - e| <= 1e-5 * sqrt(Sk + D) * max(1, M)
//         (the goldens are float64 rounded to f32; an f32 implementation's error grows with the
//         two reductions, D terms in q k^T and Sk terms in P v, like the GEMM goldens' 1e-5 sqrt(K);
//         varlen uses the longest key sequence for Sk)
//   bf16, math:  |got - e| <= 2^-6 * M + 1e-3
//         (the golden rounds q*scale, the scores and the probabilities to bf16 as MindIE's
//         attention_math does, so the math path differs only where an f32 sum lands on the other
//         side of a bf16 rounding boundary)
//   bf16, flash / cv_pipelined / runtime / static:  |got - e| <= 2^-5 * M + 1e-3
//         (these keep the scores and probabilities in f32, so they differ from the rounded path
//         by up to half a bf16 ulp of every score and probability)
//   flash_bf16 (where the CPU has AMX-BF16 or AVX512-BF16; on AMX tiles through the tile model too
//         where it has only the latter), f32 or bf16 cases: the bf16 flash bound (it rounds q, k, v
//         and the probabilities to bf16 and sums in f32)
// A NaN expected value (a row whose mask is false everywhere) must be NaN; a NaN result where the
// golden is finite is a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/attention.h"
#include "tensor/half.h"
#include "tensor/safetensors.h"

#include "common/amx_model_scope.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace attention_golden_test {  // named after the file: unity batches never mix two files' helpers

using nlohmann::json;

std::string attention_golden_path() { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/goldens_attention.safetensors"; }

struct AttentionCase {
  std::string name;
  json params;
};

// Opens the golden file; a missing or unreadable file is a test failure, never a skip.
std::optional<SafetensorsFile> open_attention_golden() {
  try {
    return SafetensorsFile::open(attention_golden_path());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "golden file " << attention_golden_path() << " is missing or unreadable: " << e.what()
                  << "\n(regenerate with: /usr/bin/python3 tests/reference/make_goldens.py)";
    return std::nullopt;
  }
}

// The cases whose "op" is `op`, in name order (metadata keys starting with '_' describe the file).
std::vector<AttentionCase> cases_of(const SafetensorsFile& file, const std::string& op) {
  std::vector<AttentionCase> out;
  for (const auto& [key, value] : file.metadata()) {
    if (key.empty() || key[0] == '_') continue;
    json params = json::parse(value);
    if (params.value("op", "") == op) out.push_back({key, std::move(params)});
  }
  return out;
}

std::optional<double> case_scale(const AttentionCase& c) {
  if (!c.params.contains("scale")) return std::nullopt;
  return c.params.at("scale").get<double>();
}

std::string index_string(const Shape& shape, std::size_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = static_cast<int64_t>(flat) % shape[d];
    flat /= static_cast<std::size_t>(shape[d]);
  }
  std::ostringstream s;
  s << "[";
  for (std::size_t d = 0; d < idx.size(); ++d) s << (d ? ", " : "") << idx[d];
  s << "]";
  return s.str();
}

// The largest |e| over the non-NaN expected values.
double max_abs_finite(const std::vector<double>& e) {
  double m = 0;
  for (double x : e)
    if (!std::isnan(x)) m = std::max(m, std::fabs(x));
  return m;
}

// The per-element bound |got - e| <= bound for one run of one case.
struct Bound {
  double value;
  std::string formula;
};

Bound f32_bound(int64_t sk, int64_t d, double max_e) {
  const double v = 1e-5 * std::sqrt(static_cast<double>(sk + d)) * std::max(1.0, max_e);
  return {v, "1e-5 * sqrt(Sk + D) * max(1, M)"};
}

Bound bf16_bound(bool math, double max_e) {
  return math ? Bound{std::ldexp(max_e, -6) + 1e-3, "2^-6 * M + 1e-3"} : Bound{std::ldexp(max_e, -5) + 1e-3, "2^-5 * M + 1e-3"};
}

// Compares `got` with "<case>.expected" element by element; names the case, the run, the index,
// the value and the expected value of every kind of mismatch.
void expect_matches_golden(const SafetensorsFile& file, const AttentionCase& c, const std::string& run, const Tensor& got,
                           const std::function<Bound(double)>& bound_for_max) {
  const Tensor want = file.tensor(c.name + ".expected");
  const std::string where = c.name + " [" + run + "]";
  if (got.dtype() != want.dtype()) {
    ADD_FAILURE() << where << ": dtype " << dtype_name(got.dtype()) << ", expected " << dtype_name(want.dtype());
    return;
  }
  if (got.shape() != want.shape()) {
    ADD_FAILURE() << where << ": shape " << shape_to_string(got.shape()) << ", expected " << shape_to_string(want.shape());
    return;
  }
  const std::vector<double> g = testing::values(got), e = testing::values(want);
  const double max_e = max_abs_finite(e);
  const Bound bound = bound_for_max(max_e);
  std::size_t bad = 0, worst = 0;
  double worst_ratio = -1;
  std::ostringstream first;
  for (std::size_t i = 0; i < e.size(); ++i) {
    bool ok;
    double ratio;
    if (std::isnan(e[i])) {
      ok = std::isnan(g[i]);
      ratio = ok ? 0 : INFINITY;
    } else {
      const double err = std::fabs(g[i] - e[i]);
      ok = err <= bound.value;  // false for a NaN or infinite result
      ratio = ok ? err / bound.value : (std::isfinite(err) ? err / bound.value : INFINITY);
    }
    if (!ok) {
      if (bad < 5) first << "\n  at " << index_string(want.shape(), i) << ": got " << g[i] << ", expected " << e[i];
      ++bad;
    }
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  if (bad)
    ADD_FAILURE() << where << " (" << dtype_name(want.dtype()) << " " << shape_to_string(want.shape()) << "): " << bad << " of " << e.size()
                  << " elements out of tolerance |got - e| <= " << bound.formula << " = " << bound.value << " (M = " << max_e
                  << "); worst at " << index_string(want.shape(), worst) << ": got " << g[worst] << ", expected " << e[worst]
                  << " (error/bound " << worst_ratio << ")" << first.str();
}

void expect_dtype(const AttentionCase& c, const Tensor& t, const std::string& what, const std::string& dtype) {
  EXPECT_EQ(std::string(dtype_name(t.dtype())), dtype) << c.name << "." << what << " is stored with the wrong dtype";
}

// ---------------------------------------------------------------------------------------------
// The file
// ---------------------------------------------------------------------------------------------

TEST(GoldenAttention, FileIsWellFormedAndHoldsBothOps) {
  auto file = open_attention_golden();
  ASSERT_TRUE(file);
  std::map<std::string, int> per_op;
  for (const auto& [key, value] : file->metadata()) {
    if (key.empty() || key[0] == '_') continue;
    json params;
    ASSERT_NO_THROW(params = json::parse(value)) << "case " << key << " has bad metadata " << value;
    ASSERT_TRUE(params.contains("op") && params.contains("dtype")) << "case " << key << ": " << value;
    const auto op = params.at("op").get<std::string>();
    ++per_op[op];
    std::vector<std::string> tensors = {"q", "k", "v", "expected"};
    if (op == "attention_varlen") {
      tensors.push_back("cu_seqlens_q");
      tensors.push_back("cu_seqlens_k");
    } else {
      EXPECT_EQ(op, "attention") << "case " << key << " has an unknown op";
      if (params.value("mask", "none") != "none") tensors.push_back("mask");
    }
    for (const auto& t : tensors) EXPECT_TRUE(file->contains(key + "." + t)) << "case " << key << " has no ." << t;
  }
  EXPECT_GT(per_op["attention"], 0) << attention_golden_path() << " holds no attention case";
  EXPECT_GT(per_op["attention_varlen"], 0) << attention_golden_path() << " holds no attention_varlen case";
}

// ---------------------------------------------------------------------------------------------
// attention_forward: every implementation, every kernel layout, and the two automatic modes
// ---------------------------------------------------------------------------------------------

struct AttentionRun {
  std::string label;
  ops::AttentionOptMode mode;
  ops::AttentionImpl impl;
  ops::AttentionLayout kernel_layout;
  bool math;                  // rounds like MindIE's attention_math (bf16 tolerance)
  bool on_amx_model = false;  // flash_bf16's AMX tiles on the tile model (a CPU without AMX)
};

// Whether flash_bf16 also runs a second time on AMX tiles through the tile model: on CPUs that have
// AVX512-BF16 but no AMX, where its automatic choice takes the dot products.
bool amx_model_pass() { return !ops::gemm::amx_native() && ops::gemm::has_bf16_dot(); }

std::vector<AttentionRun> attention_runs() {
  std::vector<AttentionRun> runs;
  for (auto impl : {ops::AttentionImpl::math, ops::AttentionImpl::flash, ops::AttentionImpl::cv_pipelined, ops::AttentionImpl::flash_bf16})
    for (auto kernel_layout : {ops::AttentionLayout::bnsd, ops::AttentionLayout::bsnd})
      if (ops::attention_impl_available(impl))
        runs.push_back({"manual " + std::string(ops::attention_impl_name(impl)) + ", kernel layout " +
                            std::string(ops::attention_layout_name(kernel_layout)),
                        ops::AttentionOptMode::manual, impl, kernel_layout, impl == ops::AttentionImpl::math});
  if (amx_model_pass())
    for (auto kernel_layout : {ops::AttentionLayout::bnsd, ops::AttentionLayout::bsnd})
      runs.push_back({"manual flash_bf16 on the AMX tile model, kernel layout " + std::string(ops::attention_layout_name(kernel_layout)),
                      ops::AttentionOptMode::manual, ops::AttentionImpl::flash_bf16, kernel_layout, false, true});
  // The automatic modes may choose any implementation: the looser (flash) bf16 bound.
  runs.push_back({"runtime", ops::AttentionOptMode::runtime, ops::AttentionImpl::flash, ops::AttentionLayout::bnsd, false});
  runs.push_back({"static", ops::AttentionOptMode::static_table, ops::AttentionImpl::flash, ops::AttentionLayout::bnsd, false});
  return runs;
}

TEST(GoldenAttention, AttentionForwardEveryImplementation) {
  auto file = open_attention_golden();
  ASSERT_TRUE(file);
  const auto cases = cases_of(*file, "attention");
  const auto runs = attention_runs();
  std::printf("[ golden   ] attention: %zu cases x %zu runs from %s\n", cases.size(), runs.size(),
              std::filesystem::path(attention_golden_path()).filename().c_str());
  int cases_run = 0, runs_done = 0;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE("golden case " + c.name + " " + c.params.dump());
    try {
      const auto dtype = c.params.at("dtype").get<std::string>();
      const Tensor q = file->tensor(c.name + ".q"), k = file->tensor(c.name + ".k"), v = file->tensor(c.name + ".v");
      for (const auto& [what, t] : {std::pair{"q", q}, std::pair{"k", k}, std::pair{"v", v}}) expect_dtype(c, t, what, dtype);
      ops::AttentionOptions base;
      base.layout = ops::parse_attention_layout(c.params.at("layout").get<std::string>());
      // num_heads is documented as "BSH only": set it there alone.
      if (base.layout == ops::AttentionLayout::bsh) base.num_heads = c.params.at("num_heads").get<int64_t>();
      base.scale = case_scale(c);
      if (file->contains(c.name + ".mask")) {
        base.mask = file->tensor(c.name + ".mask");
        expect_dtype(c, base.mask, "mask", "bool");
      }
      const int64_t sk = c.params.at("seq_k").get<int64_t>(), d = c.params.at("head_dim").get<int64_t>();
      for (const AttentionRun& run : runs) {
        ops::AttentionOptions options = base;
        options.opt_mode = run.mode;
        options.op_type = run.impl;
        options.kernel_layout = run.kernel_layout;
        try {
          std::optional<cubevec::testing::AmxModelWhereNoAmx> amx_tiles;
          if (run.on_amx_model) amx_tiles.emplace();
          const Tensor out = ops::attention_forward(q, k, v, options);
          // flash_bf16 rounds q, k, v and P to bf16 whatever they come in: the bf16 bound.
          const bool f32_sums = dtype == "f32" && run.impl != ops::AttentionImpl::flash_bf16;
          expect_matches_golden(*file, c, run.label, out,
                                [&](double max_e) { return f32_sums ? f32_bound(sk, d, max_e) : bf16_bound(run.math, max_e); });
          ++runs_done;
        } catch (const std::exception& e) {
          ADD_FAILURE() << c.name << " [" << run.label << "]: threw: " << e.what();
        }
      }
      ++cases_run;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << c.name << ": threw: " << e.what();
    }
  }
  EXPECT_GT(cases_run, 0) << attention_golden_path() << " holds no attention case";
  EXPECT_EQ(runs_done, cases_run * static_cast<int>(runs.size())) << "some attention runs did not complete";
}

// ---------------------------------------------------------------------------------------------
// attention_forward_varlen: packed sequences, causal and not, every implementation
// ---------------------------------------------------------------------------------------------

TEST(GoldenAttention, VarlenEveryImplementation) {
  auto file = open_attention_golden();
  ASSERT_TRUE(file);
  const auto cases = cases_of(*file, "attention_varlen");
  std::vector<ops::AttentionImpl> impls = {ops::AttentionImpl::math, ops::AttentionImpl::flash, ops::AttentionImpl::cv_pipelined};
  if (ops::attention_impl_available(ops::AttentionImpl::flash_bf16)) impls.push_back(ops::AttentionImpl::flash_bf16);
  const std::size_t runs_per_case = impls.size() + (amx_model_pass() ? 1 : 0);  // flash_bf16 once more, on the AMX tile model
  std::printf("[ golden   ] attention_varlen: %zu cases x %zu runs from %s\n", cases.size(), runs_per_case,
              std::filesystem::path(attention_golden_path()).filename().c_str());
  int cases_run = 0, runs_done = 0;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE("golden case " + c.name + " " + c.params.dump());
    try {
      const auto dtype = c.params.at("dtype").get<std::string>();
      const Tensor q = file->tensor(c.name + ".q"), k = file->tensor(c.name + ".k"), v = file->tensor(c.name + ".v");
      for (const auto& [what, t] : {std::pair{"q", q}, std::pair{"k", k}, std::pair{"v", v}}) expect_dtype(c, t, what, dtype);
      const Tensor cu_q = file->tensor(c.name + ".cu_seqlens_q"), cu_k = file->tensor(c.name + ".cu_seqlens_k");
      expect_dtype(c, cu_q, "cu_seqlens_q", "i32");
      expect_dtype(c, cu_k, "cu_seqlens_k", "i32");
      int64_t max_sk = 0;
      for (int64_t b = 0; b + 1 < cu_k.numel(); ++b) max_sk = std::max<int64_t>(max_sk, cu_k.at<int32_t>({b + 1}) - cu_k.at<int32_t>({b}));
      const int64_t d = q.size(2);
      for (std::size_t r = 0; r < runs_per_case; ++r) {
        const bool on_model = r == impls.size();
        const ops::AttentionImpl impl = on_model ? ops::AttentionImpl::flash_bf16 : impls[r];
        ops::VarlenOptions options;
        options.scale = case_scale(c);
        options.causal = c.params.at("causal").get<bool>();
        options.impl = impl;
        const std::string label =
            std::string(ops::attention_impl_name(impl)) + (on_model ? " on the AMX tile model" : "") + (options.causal ? ", causal" : "");
        try {
          std::optional<cubevec::testing::AmxModelWhereNoAmx> amx_tiles;
          if (on_model) amx_tiles.emplace();
          const Tensor out = ops::attention_forward_varlen(q, k, v, cu_q, cu_k, options);
          expect_matches_golden(*file, c, label, out, [&](double max_e) {
            const bool f32_sums = dtype == "f32" && impl != ops::AttentionImpl::flash_bf16;
            return f32_sums ? f32_bound(max_sk, d, max_e) : bf16_bound(impl == ops::AttentionImpl::math, max_e);
          });
          ++runs_done;
        } catch (const std::exception& e) {
          ADD_FAILURE() << c.name << " [" << label << "]: threw: " << e.what();
        }
      }
      ++cases_run;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << c.name << ": threw: " << e.what();
    }
  }
  EXPECT_GT(cases_run, 0) << attention_golden_path() << " holds no attention_varlen case";
  EXPECT_EQ(runs_done, cases_run * static_cast<int>(runs_per_case)) << "some varlen runs did not complete";
}

}  // namespace attention_golden_test
}  // namespace cubevec
