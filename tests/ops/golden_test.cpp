// cubevec's operators against PyTorch goldens: tests/data/goldens_*.safetensors, written by
// tests/reference/make_goldens.py (see tests/reference/README.md). Each file's __metadata__ maps a
// case name to its parameters (JSON, with "op"); the case's tensors are "<case>.<input>" and
// "<case>.expected". The goldens are checked in, so this test never needs torch.
//
// Tolerances (e = expected value):
//   f32 results:  |got - e| <= 1e-5 * max(1, |e|)          (elementwise ops, norms, RoPE, softmax)
//                 |got - e| <= 1e-5 * sqrt(K) * max(1, |e|)  (GEMM, K the reduction length)
//   bf16 results: within one bf16 ulp: |got - e| <= 2^-7 * |e| + 1e-6
//   casts:        bit-exact (NaN matches NaN)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/gemm.h"
#include "ops/vector_ops.h"
#include "tensor/half.h"
#include "tensor/safetensors.h"

namespace cubevec {
namespace golden_test {  // named after the file: unity batches never mix two files' helpers

using nlohmann::json;

const char* const kFamilies[] = {"gemm", "norms", "rope", "activations", "softmax", "group_norm", "elementwise"};

std::string golden_path(const std::string& family) {
  return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/goldens_" + family + ".safetensors";
}

struct GoldenCase {
  std::string name;
  json params;
};

class GoldenFile {
 public:
  explicit GoldenFile(const std::string& family) : file_(SafetensorsFile::open(golden_path(family))) {}

  const SafetensorsFile& file() const { return file_; }

  // The cases whose "op" is `op`, in name order (metadata keys starting with '_' describe the file).
  std::vector<GoldenCase> cases(const std::string& op) const {
    std::vector<GoldenCase> out;
    for (const auto& [key, value] : file_.metadata()) {
      if (key.empty() || key[0] == '_') continue;
      json params = json::parse(value);
      if (params.value("op", "") == op) out.push_back({key, std::move(params)});
    }
    return out;
  }

  bool has(const GoldenCase& c, const std::string& what) const { return file_.contains(c.name + "." + what); }

  // The stored tensor "<case>.<what>"; the case's "view" applies to its first input (x or a).
  Tensor input(const GoldenCase& c, const std::string& what) const {
    Tensor t = file_.tensor(c.name + "." + what);
    if ((what == "x" || what == "a") && c.params.contains("view")) {
      const auto view = c.params.at("view").get<std::string>();
      if (view != "transpose_last2") throw Error("golden case " + c.name + ": unknown view '" + view + "'");
      t = t.transpose(t.dim() - 2, t.dim() - 1);
    }
    return t;
  }
  Tensor optional_input(const GoldenCase& c, const std::string& what) const { return has(c, what) ? input(c, what) : Tensor(); }

 private:
  SafetensorsFile file_;
};

// Opens a golden file; a missing or unreadable file is a test failure, never a skip.
std::optional<GoldenFile> open_golden(const std::string& family) {
  try {
    return GoldenFile(family);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "golden file " << golden_path(family) << " is missing or unreadable: " << e.what()
                  << "\n(regenerate with: /usr/bin/python3 tests/reference/make_goldens.py)";
    return std::nullopt;
  }
}

// Runs `body` on every case of `op`, naming the case in any failure (an exception included), and
// fails if the file has no case for the op.
void for_each_case(const GoldenFile& golden, const std::string& op, const std::function<void(const GoldenCase&)>& body) {
  const auto cases = golden.cases(op);
  EXPECT_FALSE(cases.empty()) << golden.file().path() << " holds no case for op '" << op << "'";
  std::printf("[ golden   ] %s: %zu cases from %s\n", op.c_str(), cases.size(),
              std::filesystem::path(golden.file().path()).filename().c_str());
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE("golden case " + c.name + " " + c.params.dump());
    try {
      body(c);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << c.name << " (" << op << "): threw: " << e.what();
    }
  }
}

std::vector<double> to_doubles(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto n = static_cast<std::size_t>(c.numel());
  std::vector<double> out(n);
  switch (c.dtype()) {
    case DType::f32: {
      const float* p = c.data<float>();
      for (std::size_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    }
    case DType::bf16: {
      const uint16_t* p = c.data<uint16_t>();
      for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::f16: {
      const uint16_t* p = c.data<uint16_t>();
      for (std::size_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      break;
    }
    default: throw Error("golden_test: cannot compare a " + std::string(dtype_name(c.dtype())) + " tensor");
  }
  return out;
}

// A contiguous f32 copy of a float tensor (for feeding bf16 goldens to an f32 path).
Tensor to_f32(const Tensor& t) {
  const auto values = to_doubles(t);
  return Tensor::from_vector(std::vector<float>(values.begin(), values.end()), t.shape());
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

struct Tolerance {
  double f32_rel = 1e-5;  // the f32 bound: f32_rel * max(1, |e|)
  bool exact = false;     // bit-exact (casts)
};

// bf16 results: one ulp (2^-7 |e| is at least one bf16 ulp of e) plus this absolute slack, for
// results that are zero or tiny after cancellation (relu, masked softmax, a centred norm).
constexpr double kBf16Tiny = 1e-6;

Tolerance gemm_tolerance(int64_t k) { return {1e-5 * std::max(1.0, std::sqrt(static_cast<double>(k))), false}; }

// Compares `got` with the golden "<case>.<what>" and reports every way it differs, naming the case.
void expect_matches(const GoldenFile& golden, const GoldenCase& c, const std::string& what, const Tensor& got, Tolerance tol = {}) {
  const Tensor want = golden.file().tensor(c.name + "." + what);
  const std::string where = c.name + "." + what;
  if (got.dtype() != want.dtype()) {
    ADD_FAILURE() << where << ": dtype " << dtype_name(got.dtype()) << ", expected " << dtype_name(want.dtype());
    return;
  }
  if (got.shape() != want.shape()) {
    ADD_FAILURE() << where << ": shape " << shape_to_string(got.shape()) << ", expected " << shape_to_string(want.shape());
    return;
  }
  const auto g = to_doubles(got), e = to_doubles(want);
  const bool bf16 = want.dtype() == DType::bf16;
  std::size_t bad = 0, worst = 0;
  double worst_ratio = -1;
  std::ostringstream first;
  for (std::size_t i = 0; i < e.size(); ++i) {
    bool ok;
    double ratio = 0;
    if (tol.exact || !std::isfinite(e[i])) {
      ok = (std::isnan(e[i]) && std::isnan(g[i])) || (g[i] == e[i] && std::signbit(g[i]) == std::signbit(e[i]));
      ratio = ok ? 0 : INFINITY;
    } else {
      const double bound = bf16 ? std::ldexp(std::fabs(e[i]), -7) + kBf16Tiny : tol.f32_rel * std::max(1.0, std::fabs(e[i]));
      const double err = std::fabs(g[i] - e[i]);
      ok = err <= bound;  // false for a NaN got
      ratio = std::isnan(err) ? INFINITY : err / bound;
    }
    if (!ok) {
      if (bad < 3) first << "\n  at " << index_string(want.shape(), i) << ": got " << g[i] << ", expected " << e[i];
      ++bad;
    }
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  if (bad)
    ADD_FAILURE() << where << " (" << dtype_name(want.dtype()) << " " << shape_to_string(want.shape()) << "): " << bad << " of " << e.size()
                  << " elements out of tolerance" << (tol.exact ? " (bit-exact)" : "") << "; worst at " << index_string(want.shape(), worst)
                  << ": got " << g[worst] << ", expected " << e[worst] << " (error/bound " << worst_ratio << ")" << first.str();
}

// Checks that a case's inputs have the dtype its metadata names (a malformed golden, not cubevec).
void expect_input_dtype(const GoldenCase& c, const Tensor& t, const std::string& what) {
  const auto dt = c.params.at("dtype").get<std::string>();
  EXPECT_EQ(dtype_name(t.dtype()), dt) << c.name << "." << what << " is stored with the wrong dtype";
}

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

TEST(GoldenFiles, EveryFileIsPresentAndWellFormed) {
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    auto golden = open_golden(family);
    if (!golden) continue;
    int cases = 0;
    for (const auto& [key, value] : golden->file().metadata()) {
      if (key.empty() || key[0] == '_') continue;
      ++cases;
      json params;
      ASSERT_NO_THROW(params = json::parse(value)) << family << ": case " << key << " has bad metadata " << value;
      EXPECT_TRUE(params.contains("op") && params.contains("dtype")) << family << ": case " << key << ": " << value;
      EXPECT_TRUE(golden->file().contains(key + ".expected")) << family << ": case " << key << " has no .expected";
    }
    EXPECT_GT(cases, 0) << golden_path(family) << " holds no cases";
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM: every backend (bf16 inputs: the backends that take them), f32 and bf16-compute paths
// ---------------------------------------------------------------------------------------------

ops::GemmActivation gemm_activation(const std::string& name) {
  if (name == "none") return ops::GemmActivation::none;
  if (name == "gelu_tanh") return ops::GemmActivation::gelu_tanh;
  if (name == "silu") return ops::GemmActivation::silu;
  throw Error("golden_test: unknown GEMM activation '" + name + "'");
}

ops::MatmulOptions gemm_options(const GoldenFile& golden, const GoldenCase& c) {
  ops::MatmulOptions options;
  options.bias = golden.optional_input(c, "bias");
  options.residual = golden.optional_input(c, "residual");
  options.gate = golden.optional_input(c, "gate");
  options.activation = gemm_activation(c.params.at("activation").get<std::string>());
  options.b_is_weight = c.params.at("b_is_weight").get<bool>();
  return options;
}

// The runs one GEMM case gets: (label, a, b, compute, backend).
struct GemmRun {
  std::string label;
  Tensor a, b;
  DType compute;
  ops::GemmBackend backend;
};

std::vector<GemmRun> gemm_runs(const GoldenFile& golden, const GoldenCase& c) {
  const Tensor a = golden.input(c, "a"), b = golden.input(c, "b");
  std::vector<GemmRun> runs;
  if (c.params.at("dtype") == "f32") {
    for (auto backend : {ops::GemmBackend::cubevec, ops::GemmBackend::openblas, ops::GemmBackend::eigen, ops::GemmBackend::reference})
      runs.push_back({"f32", a, b, DType::f32, backend});
  } else {
    // bf16 tensors in (as stored), and their f32 copies computed in bf16: the same products.
    for (auto backend : {ops::GemmBackend::cubevec, ops::GemmBackend::reference}) {
      runs.push_back({"bf16 tensors, compute f32", a, b, DType::f32, backend});
      runs.push_back({"bf16 tensors, compute bf16", a, b, DType::bf16, backend});
      runs.push_back({"f32 tensors, compute bf16", to_f32(a), to_f32(b), DType::bf16, backend});
    }
  }
  return runs;
}

// Runs every matmul-like case of the gemm goldens through `op` with each dtype/backend run.
template <class Op>
void check_gemm_cases(const char* op_name, Op op) {
  auto golden = open_golden("gemm");
  ASSERT_TRUE(golden);
  for_each_case(*golden, op_name, [&](const GoldenCase& c) {
    for (const GemmRun& run : gemm_runs(*golden, c)) {
      SCOPED_TRACE(run.label + ", backend " + std::string(ops::gemm_backend_name(run.backend)));
      ops::MatmulOptions options = gemm_options(*golden, c);
      options.compute = run.compute;
      options.backend = run.backend;
      try {
        expect_matches(*golden, c, "expected", op(run.a, run.b, options), gemm_tolerance(c.params.at("k").get<int64_t>()));
      } catch (const std::exception& e) {
        ADD_FAILURE() << c.name << " (" << run.label << ", " << ops::gemm_backend_name(run.backend) << "): threw: " << e.what();
      }
    }
  });
}

TEST(GoldenGemm, Matmul) {
  check_gemm_cases("matmul", [](const Tensor& a, const Tensor& b, const ops::MatmulOptions& o) { return ops::matmul(a, b, o); });
}

TEST(GoldenGemm, BatchedMatmul) {
  check_gemm_cases("bmm", [](const Tensor& a, const Tensor& b, const ops::MatmulOptions& o) { return ops::bmm(a, b, o); });
}

TEST(GoldenGemm, Linear) {
  auto golden = open_golden("gemm");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "linear", [&](const GoldenCase& c) {
    const Tensor y = ops::linear(golden->input(c, "x"), golden->input(c, "weight"), golden->optional_input(c, "bias"));
    expect_matches(*golden, c, "expected", y, gemm_tolerance(c.params.at("k").get<int64_t>()));
  });
}

// ---------------------------------------------------------------------------------------------
// Norms
// ---------------------------------------------------------------------------------------------

TEST(GoldenNorms, RmsNorm) {
  auto golden = open_golden("norms");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "rms_norm", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const auto eps = c.params.at("eps").get<float>();
    expect_matches(*golden, c, "expected", ops::rms_norm(x, golden->optional_input(c, "weight"), eps));
  });
}

TEST(GoldenNorms, LayerNormWithMeanAndRstd) {
  auto golden = open_golden("norms");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "layer_norm", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const auto eps = c.params.at("eps").get<float>();
    const ops::LayerNormResult r = ops::fast_layernorm(x, golden->optional_input(c, "weight"), golden->optional_input(c, "bias"), eps);
    expect_matches(*golden, c, "expected", r.out);
    expect_matches(*golden, c, "mean", r.mean);
    expect_matches(*golden, c, "rstd", r.rstd);
  });
}

TEST(GoldenNorms, LayerNormScaleShift) {
  auto golden = open_golden("norms");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "layernorm_scale_shift", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const auto eps = c.params.at("eps").get<float>();
    const Tensor y = ops::layernorm_scale_shift(x, golden->input(c, "scale"), golden->input(c, "shift"),
                                                golden->optional_input(c, "weight"), golden->optional_input(c, "bias"), eps);
    expect_matches(*golden, c, "expected", y);
  });
}

// ---------------------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------------------

ops::RopeLayout rope_layout(const std::string& name) {
  if (name == "BSND") return ops::RopeLayout::BSND;
  if (name == "BNSD") return ops::RopeLayout::BNSD;
  if (name == "SBND") return ops::RopeLayout::SBND;
  throw Error("golden_test: unknown RoPE layout '" + name + "'");
}

TEST(GoldenRope, RotaryPositionEmbedding) {
  auto golden = open_golden("rope");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "rope", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const Tensor y = ops::rotary_position_embedding(x, golden->input(c, "cos"), golden->input(c, "sin"),
                                                    ops::parse_rotated_mode(c.params.at("mode").get<std::string>()),
                                                    rope_layout(c.params.at("layout").get<std::string>()));
    expect_matches(*golden, c, "expected", y);
  });
}

// ---------------------------------------------------------------------------------------------
// Activations and softmax
// ---------------------------------------------------------------------------------------------

TEST(GoldenActivations, Activation) {
  auto golden = open_golden("activations");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "activation", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const ops::Activation kind = ops::get_activation_layer(c.params.at("name").get<std::string>());
    expect_matches(*golden, c, "expected", ops::activation(x, kind));
  });
}

// activation_reference, the scalar definition in double, against the f32 goldens.
TEST(GoldenActivations, ActivationReference) {
  auto golden = open_golden("activations");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "activation", [&](const GoldenCase& c) {
    if (c.params.at("dtype") != "f32") return;
    const Tensor x = golden->input(c, "x");
    const ops::Activation kind = ops::get_activation_layer(c.params.at("name").get<std::string>());
    const auto xs = to_doubles(x);
    std::vector<float> y(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) y[i] = static_cast<float>(ops::activation_reference(kind, xs[i]));
    expect_matches(*golden, c, "expected", Tensor::from_vector(y, x.shape()));
  });
}

TEST(GoldenSoftmax, Softmax) {
  auto golden = open_golden("softmax");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "softmax", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    expect_matches(*golden, c, "expected", ops::softmax(x));
  });
}

// ---------------------------------------------------------------------------------------------
// GroupNorm
// ---------------------------------------------------------------------------------------------

TEST(GoldenGroupNorm, GroupNorm) {
  auto golden = open_golden("group_norm");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "group_norm", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const auto groups = c.params.at("groups").get<int64_t>();
    const auto eps = c.params.at("eps").get<float>();
    const Tensor y = ops::group_norm(x, groups, golden->optional_input(c, "weight"), golden->optional_input(c, "bias"), eps);
    expect_matches(*golden, c, "expected", y);
  });
}

// ---------------------------------------------------------------------------------------------
// Elementwise arithmetic, muls_add, casts
// ---------------------------------------------------------------------------------------------

TEST(GoldenElementwise, BroadcastingArithmetic) {
  auto golden = open_golden("elementwise");
  ASSERT_TRUE(golden);
  using BinaryOp = Tensor (*)(const Tensor&, const Tensor&, const Stream&);
  const std::pair<const char*, BinaryOp> ops_list[] = {{"add", &ops::add}, {"sub", &ops::sub}, {"mul", &ops::mul}, {"div", &ops::div}};
  for (const auto& [name, op] : ops_list) {
    for_each_case(*golden, name, [&, op = op](const GoldenCase& c) {
      const Tensor a = golden->input(c, "a"), b = golden->input(c, "b");
      expect_input_dtype(c, a, "a");
      expect_matches(*golden, c, "expected", op(a, b, ops::default_op_stream()));
    });
  }
}

TEST(GoldenElementwise, MulsAdd) {
  auto golden = open_golden("elementwise");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "muls_add", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const auto scale = c.params.at("scale").get<float>();
    expect_matches(*golden, c, "expected", ops::muls_add(x, golden->input(c, "y"), scale));
  });
}

TEST(GoldenElementwise, Cast) {
  auto golden = open_golden("elementwise");
  ASSERT_TRUE(golden);
  for_each_case(*golden, "cast", [&](const GoldenCase& c) {
    const Tensor x = golden->input(c, "x");
    expect_input_dtype(c, x, "x");
    const Tensor y = ops::cast(x, parse_dtype(c.params.at("to").get<std::string>()));
    EXPECT_TRUE(y.is_contiguous()) << c.name << ": cast must return a contiguous tensor";
    expect_matches(*golden, c, "expected", y, {.f32_rel = 0, .exact = true});
  });
}

}  // namespace golden_test
}  // namespace cubevec
