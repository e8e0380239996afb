// Bounded busy-waiting for the device's hand-offs, where a futex sleep and wake-up would cost far
// more than the wait itself.
#pragma once

#include <immintrin.h>

#include <chrono>

namespace cubevec {

// How long a waiter spins before it sleeps.
inline constexpr double kSpinSeconds = 50e-6;

// Spins until `ready()` or `seconds` have passed; returns ready().
template <class Ready>
bool spin_until(Ready ready, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!ready()) {
    for (int i = 0; i < 32; ++i) _mm_pause();
    if (std::chrono::steady_clock::now() > deadline) return ready();
  }
  return true;
}

}  // namespace cubevec
