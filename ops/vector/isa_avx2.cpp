// The vector kernels compiled for AVX2 and FMA (flags in ops/CMakeLists.txt); reached only
// through ops/vector/dispatch.cpp on CPUs that run them.
#include "ops/vector/impl/table.h"

namespace cubevec::ops::vk {

const Kernels& kernels_avx2() { return kTable; }

}  // namespace cubevec::ops::vk
