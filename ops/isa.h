// The instruction sets cubevec's kernels are built for, and the run-time choice between them.
// Each kernel family (GEMM micro-kernels, vector inner loops) keeps one copy per ISA, compiled
// with that ISA's flags and called only on CPUs that have it.
#pragma once

#include <string_view>

namespace cubevec::ops {

// avx512: AVX-512 F, BW, VL, DQ and FMA; avx2: AVX2 and FMA; portable: the x86-64 baseline.
enum class Isa { avx512, avx2, portable };

bool isa_supported(Isa isa);
std::string_view isa_name(Isa isa);
// The widest ISA this CPU runs, unless the environment variable `env_name` names another
// ("avx512", "avx2", "portable"); read on every call. Throws on an unknown or unsupported value.
Isa select_isa(const char* env_name);

}  // namespace cubevec::ops
