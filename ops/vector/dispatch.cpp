// Picks the vector kernels' ISA: the widest the CPU runs, or CUBEVEC_VECTOR_ISA.
#include "ops/vector/kernels.h"

namespace cubevec::ops::vk {

Isa best_isa() { return select_isa("CUBEVEC_VECTOR_ISA"); }

const Kernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::avx512: return kernels_avx512();
    case Isa::avx2: return kernels_avx2();
    case Isa::portable: return kernels_portable();
  }
  return kernels_portable();
}

const Kernels& kernels() { return kernels(best_isa()); }

}  // namespace cubevec::ops::vk
