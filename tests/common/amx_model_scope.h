// A test's AMX kernels on ops::gemm's tile model (ops/gemm/amx_model.h) where the CPU has no AMX of
// its own but has what the model's kernels need besides tiles (AVX512-BF16: AMD Zen 4 and 5): the
// same kernel code then runs, and is checked, on those machines too, not only on Xeons with AMX.
// Restores the previous state at the end of the scope.
#pragma once

#include <cstdio>

#include "ops/gemm/driver.h"

namespace cubevec::testing {

class AmxModelWhereNoAmx {
 public:
  AmxModelWhereNoAmx() : was_on_(ops::gemm::amx_model_on()) {
    if (!ops::gemm::amx_native() && ops::gemm::has_bf16_dot()) ops::gemm::use_amx_model(true);
    static bool said = false;  // once per test process
    if (ops::gemm::amx_model_on() && !was_on_ && !said) said = true, std::printf("AMX kernels: on the tile model (this CPU has no AMX)\n");
  }
  ~AmxModelWhereNoAmx() { ops::gemm::use_amx_model(was_on_); }
  AmxModelWhereNoAmx(const AmxModelWhereNoAmx&) = delete;
  AmxModelWhereNoAmx& operator=(const AmxModelWhereNoAmx&) = delete;

 private:
  bool was_on_;
};

}  // namespace cubevec::testing
