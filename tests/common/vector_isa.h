// Runs a test body once per vector-kernel ISA this CPU supports (through CUBEVEC_VECTOR_ISA, which
// the dispatch reads on every call), restoring the default afterwards.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

#include "ops/vector/kernels.h"

namespace cubevec::testing {

inline void for_each_vector_isa(const std::function<void(const std::string&)>& body) {
  for (auto isa : {ops::vk::Isa::avx512, ops::vk::Isa::avx2, ops::vk::Isa::portable}) {
    if (!ops::vk::isa_supported(isa)) continue;
    const std::string name(ops::vk::isa_name(isa));
    setenv("CUBEVEC_VECTOR_ISA", name.c_str(), 1);
    body(name);
    unsetenv("CUBEVEC_VECTOR_ISA");
  }
}

}  // namespace cubevec::testing
