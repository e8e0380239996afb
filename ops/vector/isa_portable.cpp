// The vector kernels compiled for the x86-64 baseline (SSE2) (flags in ops/CMakeLists.txt); reached only
// through ops/vector/dispatch.cpp on CPUs that run them.
#include "ops/vector/impl/table.h"

namespace cubevec::ops::vk {

const Kernels& kernels_portable() { return kTable; }

}  // namespace cubevec::ops::vk
