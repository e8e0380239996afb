// The x86-64 baseline build of the tile kernels, for CPUs without AVX2.
#include "ops/attention/tile_kernels_generic.h"

namespace cubevec::ops::attn {

void pv_portable_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_generic<gemm::kMrPortable, 16>(kc, p, v, o, ldo, alpha);
}
void pv_portable_w8(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_generic<gemm::kMrPortable, 8>(kc, p, v, o, ldo, alpha);
}
void softmax_tile_portable(const SoftmaxTile& tile) { softmax_generic(tile); }

}  // namespace cubevec::ops::attn
