// Whether AMX tiles can run in this process: the CPU's own (CPUID and Linux's grant of the tile
// state), or the tile model (ops/gemm/amx_model.h) switched on by CUBEVEC_AMX_MODEL or a test.
#include <atomic>
#include <cpuid.h>
#include <cstdlib>
#include <string>
#include <string_view>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/error.h"
#include "ops/gemm/driver.h"

namespace cubevec::ops::gemm {

bool amx_native() {
  static const bool ready = [] {
    // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (read directly: clang 14 has no
    // __builtin_cpu_supports names for them).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!isa_supported(Isa::avx512) || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!(edx >> 22 & 1) || !(edx >> 24 & 1)) return false;
    // Linux hands out the tile state (8 KiB per thread) only on request, once per process.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ready;
}

namespace {

constexpr const char* kModelNeeds = "the AMX tile model needs AVX512-BF16 (the AMX kernels' other instructions), which this CPU lacks";
constexpr int kModelUnread = -1;
std::atomic<int> amx_model_state{kModelUnread};  // 0 off, 1 on

int amx_model_from_environment() {
  const char* env = std::getenv("CUBEVEC_AMX_MODEL");
  if (!env || !*env || std::string_view(env) == "0") return 0;
  if (std::string_view(env) != "1")
    throw Error("CUBEVEC_AMX_MODEL=" + text_for_message(env) + ": expected 1 (run AMX kernels on the tile model) or 0");
  if (!has_bf16_dot()) throw Error(std::string("CUBEVEC_AMX_MODEL=1: ") + kModelNeeds);
  return 1;
}

}  // namespace

bool amx_model_on() {
  int state = amx_model_state.load(std::memory_order_acquire);
  if (state == kModelUnread) {
    int expected = kModelUnread;
    amx_model_state.compare_exchange_strong(expected, amx_model_from_environment(), std::memory_order_acq_rel);
    state = amx_model_state.load(std::memory_order_acquire);
  }
  return state == 1;
}

void use_amx_model(bool on) {
  if (on && !has_bf16_dot()) throw Error(kModelNeeds);
  amx_model_state.store(on ? 1 : 0, std::memory_order_release);
}

bool amx_ready() { return amx_model_on() || amx_native(); }

}  // namespace cubevec::ops::gemm
