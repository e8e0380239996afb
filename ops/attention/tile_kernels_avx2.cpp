// Compiled with -mavx2 -mfma (see ops/CMakeLists.txt); called only on CPUs with AVX2.
#include "ops/attention/tile_kernels_generic.h"

namespace cubevec::ops::attn {

void pv_avx2_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_generic<gemm::kMrAvx2, 16>(kc, p, v, o, ldo, alpha);
}
void pv_avx2_w8(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_generic<gemm::kMrAvx2, 8>(kc, p, v, o, ldo, alpha);
}
void softmax_tile_avx2(const SoftmaxTile& tile) { softmax_generic(tile); }

}  // namespace cubevec::ops::attn
