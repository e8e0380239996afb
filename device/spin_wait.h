// Bounded busy-waiting for the device's hand-offs, where a futex sleep and wake-up would cost far
// more than the wait itself.
#pragma once

#include <immintrin.h>
#include <sched.h>

#include <chrono>

namespace cubevec {

// How long a unit's dispatcher or a host waiting on an event spins before it sleeps.
inline constexpr double kSpinSeconds = 50e-6;
// How long of that it spins on `pause` alone before it yields the core on each round.
inline constexpr double kPauseSeconds = 2e-6;

// Spins until `ready()` or `seconds` have passed; returns ready(). The first `pause_seconds` spin
// on `pause`, the rest call sched_yield each round. Both units run on every core by default, so a
// waiter (an idle unit's dispatcher, the host) usually shares its core with the other unit's
// kernel: 50 us on `pause` after every job took that time from the kernel (tinyflux's 28-step
// denoising on a 2-core Zen 3 ran 20-25% slower). Where the core is free, sched_yield returns at
// once and the waiter still sees its hand-off within a microsecond or two.
template <class Ready>
bool spin_until(Ready ready, double seconds, double pause_seconds = kPauseSeconds) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  const auto pause_end = start + std::chrono::duration<double>(pause_seconds);
  while (!ready()) {
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) return ready();
    if (now < pause_end)
      for (int i = 0; i < 32; ++i) _mm_pause();
    else sched_yield();
  }
  return true;
}

}  // namespace cubevec
