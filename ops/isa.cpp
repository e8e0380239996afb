#include "ops/isa.h"

#include <cstdlib>
#include <string>

#include "base/enum_names.h"
#include "base/error.h"

namespace cubevec::ops {

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::portable: return true;
  }
  return false;
}

namespace {
constexpr auto kIsaNames = enum_names<Isa>("ISA", {{Isa::avx512, "avx512"}, {Isa::avx2, "avx2"}, {Isa::portable, "portable"}});
}  // namespace

std::string_view isa_name(Isa isa) { return kIsaNames.name(isa); }

Isa select_isa(const char* env_name) {
  if (const char* env = std::getenv(env_name); env && *env) {
    if (!kIsaNames.contains(env))
      throw Error(std::string(env_name) + "=" + text_for_message(env) + ": unknown ISA (expected one of: " + kIsaNames.list() + ")");
    const Isa isa = kIsaNames.parse(env);
    if (!isa_supported(isa)) throw Error(std::string(env_name) + "=" + text_for_message(env) + ": this CPU does not support that ISA");
    return isa;
  }
  static const Isa widest = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::portable;
  return widest;
}

}  // namespace cubevec::ops
