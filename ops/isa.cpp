#include "ops/isa.h"

#include <cstdlib>
#include <string>

#include "tensor/error.h"

namespace cubevec::ops {

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

Isa select_isa(const char* env_name) {
  if (const char* env = std::getenv(env_name); env && *env) {
    for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable})
      if (isa_name(isa) == env) {
        if (!isa_supported(isa))
          throw Error(std::string(env_name) + "=" + env + ": this CPU does not support that ISA");
        return isa;
      }
    throw Error(std::string(env_name) + "=" + env + ": unknown ISA (expected one of: avx512, avx2, portable)");
  }
  static const Isa widest = isa_supported(Isa::avx512) ? Isa::avx512
                            : isa_supported(Isa::avx2) ? Isa::avx2
                                                       : Isa::portable;
  return widest;
}

}  // namespace cubevec::ops
