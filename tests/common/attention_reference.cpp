// The attention tests' double loops (declared in attention_reference.h). A file of its own so that
// a sanitizer tree, which compiles the tests' code at -O0, still runs these loops optimized: at -O0
// they took most of the sanitized run's attention tests (tests/CMakeLists.txt).
#include "common/attention_reference.h"

namespace cubevec::testing {

std::vector<double> reference_head(const RefHead& h, double scale) {
  std::vector<double> out(static_cast<std::size_t>(h.sq * h.d), kNaN);
  for (int64_t i = 0; i < h.sq; ++i) {
    std::vector<double> w(static_cast<std::size_t>(h.sk), 0.0);
    double mx = -INFINITY;
    for (int64_t j = 0; j < h.sk; ++j) {
      const bool attend = (!h.mask || h.mask[i * h.sk + j]) && (!h.causal || j <= i + h.sk - h.sq);
      if (!attend) {
        w[j] = -INFINITY;
        continue;
      }
      double dot = 0;
      for (int64_t c = 0; c < h.d; ++c) dot += h.q[i * h.d + c] * h.k[j * h.d + c];
      w[j] = dot * scale;
      mx = std::max(mx, w[j]);
    }
    if (mx == -INFINITY) continue;  // nothing to attend to: NaN
    double sum = 0;
    for (double& x : w) sum += x = x == -INFINITY ? 0.0 : std::exp(x - mx);
    for (int64_t c = 0; c < h.d; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < h.sk; ++j) acc += w[j] * h.v[j * h.d + c];
      out[i * h.d + c] = acc / sum;
    }
  }
  return out;
}

// Head (bi, ni) of a BSND tensor's values as a contiguous [s, d] block.
std::vector<double> head_of(const std::vector<double>& all, int64_t bi, int64_t ni, int64_t s, int64_t n, int64_t d) {
  std::vector<double> out(static_cast<std::size_t>(s * d));
  for (int64_t i = 0; i < s; ++i)
    for (int64_t c = 0; c < d; ++c) out[i * d + c] = all[((bi * s + i) * n + ni) * d + c];
  return out;
}

// The reference for BSND inputs, with an optional [B|1, N|1, Sq, Sk] mask (as bytes).
std::vector<double> reference_bsnd(const Qkv& x, int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t d, const std::vector<uint8_t>* mask,
                                   int64_t mb, int64_t mn, double scale) {
  std::vector<double> out(static_cast<std::size_t>(b * sq * n * d));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ni = 0; ni < n; ++ni) {
      const auto q = head_of(x.qd, bi, ni, sq, n, d), k = head_of(x.kd, bi, ni, sk, n, d), v = head_of(x.vd, bi, ni, sk, n, d);
      const uint8_t* m = mask ? mask->data() + ((mb == 1 ? 0 : bi) * mn + (mn == 1 ? 0 : ni)) * sq * sk : nullptr;
      const auto o = reference_head({sq, sk, d, q.data(), k.data(), v.data(), m, false}, scale);
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t c = 0; c < d; ++c) out[((bi * sq + i) * n + ni) * d + c] = o[i * d + c];
    }
  return out;
}

}  // namespace cubevec::testing
