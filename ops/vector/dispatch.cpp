// Picks the vector kernels' ISA: the widest the CPU runs, or CUBEVEC_VECTOR_ISA.
#include <cstdlib>
#include <string>

#include "ops/vector/kernels.h"
#include "tensor/error.h"

namespace cubevec::ops::vk {

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::portable: return true;
  }
  return false;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::portable: return "portable";
  }
  return "?";
}

Isa best_isa() {
  if (const char* env = std::getenv("CUBEVEC_VECTOR_ISA"); env && *env) {
    for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable})
      if (isa_name(isa) == env) {
        if (!isa_supported(isa))
          throw Error("CUBEVEC_VECTOR_ISA=" + std::string(env) + ": this CPU does not support that ISA");
        return isa;
      }
    throw Error("CUBEVEC_VECTOR_ISA=" + std::string(env) + ": unknown ISA (expected one of: avx512, avx2, portable)");
  }
  static const Isa widest = isa_supported(Isa::avx512) ? Isa::avx512
                            : isa_supported(Isa::avx2) ? Isa::avx2
                                                       : Isa::portable;
  return widest;
}

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
