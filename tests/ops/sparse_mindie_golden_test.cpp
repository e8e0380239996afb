// ops::sparse_attention with sparse_type ada_bsa against MindIE SD's block estimate and
// block-sparse attention as tests/reference/make_sparse_reference.py transcribes them (its
// docstring lists the upstream files and rules): tests/data/goldens_sparse_mindie.safetensors.
//
// One input set, q, k, v bf16 [2, 1300, 2, 16] BSND; each case takes its first `batch` elements
// and first `seq` tokens, permuted to BNSD when its layout says so, and passes them as f32 (the
// same values). Per case the kept blocks [B, N, L, L] must equal the golden's exactly (every
// decision of the goldens has at least 1e-4 of room, so f32 rounding cannot flip one), and the
// output rows listed in rows_<seq> must lie within 1e-4 * max|expected| of the float64 golden.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/sparse_attention.h"
#include "ops/vector_ops.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace sparse_mindie_golden_test {  // named after the file: unity batches never mix two files' helpers

using nlohmann::json;

std::string golden_path() { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/goldens_sparse_mindie.safetensors"; }

// A missing or unreadable file is a failure, never a skip.
std::optional<SafetensorsFile> open_golden() {
  try {
    return SafetensorsFile::open(golden_path());
  } catch (const std::exception& e) {
    ADD_FAILURE() << golden_path() << " is missing or unreadable: " << e.what()
                  << "\n(regenerate with: /usr/bin/python3 tests/reference/make_sparse_reference.py)";
    return std::nullopt;
  }
}

// The case's inputs: the first `batch` elements and `seq` tokens, f32, in the case's layout.
Tensor input(const SafetensorsFile& file, const char* name, int64_t batch, int64_t seq, bool bnsd) {
  const Tensor x = ops::cast(file.tensor(name), DType::f32).narrow(0, 0, batch).narrow(1, 0, seq);
  return bnsd ? x.permute({0, 2, 1, 3}).contiguous() : x.contiguous();
}

// A u8 or bool tensor's bytes, row-major.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.numel()};
}

std::vector<int64_t> ints_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return {c.data<int32_t>(), c.data<int32_t>() + c.numel()};
}

TEST(SparseMindieGolden, AdaBsaKeptBlocksAndOutputs) {
  const auto file = open_golden();
  if (!file) return;
  int cases = 0, capped_at_two = 0;
  for (const auto& [name, text] : file->metadata()) {
    if (name.empty() || name[0] == '_') continue;
    SCOPED_TRACE(name);
    const json params = json::parse(text);
    const int64_t seq = params.at("seq").get<int64_t>(), batch = params.at("batch").get<int64_t>();
    const bool bnsd = params.at("layout").get<std::string>() == "BNSD";
    ops::SparseAttentionOptions o;
    o.sparse_type = ops::SparseType::ada_bsa;
    o.sparsity = params.at("sparsity").get<double>();
    o.cdf_threshold = params.at("cdf_threshold").get<double>();
    o.keep_sink = params.at("keep_sink").get<bool>();
    o.keep_recent = params.at("keep_recent").get<bool>();
    o.input_layout = bnsd ? ops::AttentionLayout::bnsd : ops::AttentionLayout::bsnd;
    const Tensor q = input(*file, "q", batch, seq, bnsd), k = input(*file, "k", batch, seq, bnsd), v = input(*file, "v", batch, seq, bnsd);
    const ops::SparseAttentionResult r = ops::sparse_attention(q, k, v, o);

    const Tensor want_kept = file->tensor(name + ".kept");
    ASSERT_EQ(r.kept_blocks.shape(), want_kept.shape());
    const std::vector<uint8_t> got_kept = bytes_of(r.kept_blocks), expected_kept = bytes_of(want_kept);
    const int64_t l = want_kept.size(3);
    for (std::size_t i = 0; i < got_kept.size(); ++i)
      ASSERT_EQ(int{got_kept[i]}, int{expected_kept[i]})
          << "batch " << i / static_cast<std::size_t>(q.size(bnsd ? 1 : 2) * l * l) << ", row "
          << (i / static_cast<std::size_t>(l)) % static_cast<std::size_t>(l) << ", key block " << i % static_cast<std::size_t>(l);
    // A row at L = 10, sparsity 0.8 keeping exactly 2 ranked blocks is the float32 cap at work.
    if (seq == 1280 && o.sparsity == 0.8 && o.keep_sink && o.cdf_threshold == 1.0) {
      for (std::size_t row = 0; row < got_kept.size(); row += static_cast<std::size_t>(l))
        capped_at_two += std::count(got_kept.begin() + static_cast<std::ptrdiff_t>(row) + 1,
                                    got_kept.begin() + static_cast<std::ptrdiff_t>(row) + l - 1, uint8_t{1}) == 2;
    }

    // Expected rows are [B, N, R, D]; the output is in the case's layout.
    const Tensor want_out = file->tensor(name + ".out");
    const std::vector<double> expected = testing::values(want_out);
    const std::vector<int64_t> rows = ints_of(file->tensor("rows_" + std::to_string(seq)));
    const Tensor out = r.out.contiguous();
    const std::vector<double> got = testing::values(out);
    const int64_t n = want_out.size(1), d = want_out.size(3), nr = want_out.size(2);
    double scale = 0, worst = 0;
    for (double e : expected) scale = std::max(scale, std::abs(e));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < n; ++h)
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t row = rows[static_cast<std::size_t>(i)];
          for (int64_t c = 0; c < d; ++c) {
            const int64_t at = bnsd ? ((b * n + h) * seq + row) * d + c : ((b * seq + row) * n + h) * d + c;
            const double diff =
                std::abs(got[static_cast<std::size_t>(at)] - expected[static_cast<std::size_t>(((b * n + h) * nr + i) * d + c)]);
            worst = std::max(worst, diff);
          }
        }
    EXPECT_LE(worst, 1e-4 * scale) << "output max error " << worst << " against scale " << scale;
    ++cases;
  }
  EXPECT_EQ(cases, 108) << "every case of the file ran";
  EXPECT_GT(capped_at_two, 0) << "some rows must show the float32 cap of 2 at L = 10, sparsity 0.8";
}

}  // namespace sparse_mindie_golden_test
}  // namespace cubevec
