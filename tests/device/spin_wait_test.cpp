// The device's bounded busy-wait (device/spin_wait.h), spinning on pause throughout and yielding
// after its first microseconds: both ways see a flag another thread sets, both give up at their
// deadline and say so, and neither waits when the answer is there already.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "device/spin_wait.h"

namespace cubevec {
namespace spin_wait_test {  // named after the file: unity batches never mix two files' helpers

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Runs `test` with each way of waiting.
template <class Test>
void for_each_wait(Test test) {
  test("pause only", [](auto ready, double seconds) { return spin_until(ready, seconds, seconds); });
  test("pause, then yield", [](auto ready, double seconds) { return spin_until(ready, seconds); });
}

TEST(SpinWait, BothWaitsSeeAFlagAnotherThreadSets) {
  for_each_wait([](const char* name, auto wait) {
    std::atomic<bool> flag{false};
    std::thread setter([&] {
      std::this_thread::sleep_for(5ms);
      flag.store(true, std::memory_order_release);
    });
    // A 10 s bound the flag beats by far: a wait that missed it would return false at the deadline.
    const bool seen = wait([&] { return flag.load(std::memory_order_acquire); }, 10.0);
    setter.join();
    EXPECT_TRUE(seen) << name;
  });
}

TEST(SpinWait, BothWaitsGiveUpAtTheirDeadlineAndSaySo) {
  for_each_wait([](const char* name, auto wait) {
    int asked = 0;
    const auto start = Clock::now();
    const bool seen = wait(
        [&] {
          ++asked;
          return false;
        },
        0.003);
    const auto waited = Clock::now() - start;
    EXPECT_FALSE(seen) << name;
    EXPECT_GE(waited, 3ms) << name;  // it waited its whole time
    EXPECT_GT(asked, 1) << name;     // and kept asking
  });
}

TEST(SpinWait, BothWaitsReturnAtOnceWhenAlreadyReady) {
  for_each_wait([](const char* name, auto wait) {
    int asked = 0;
    EXPECT_TRUE(wait(
        [&] {
          ++asked;
          return true;
        },
        10.0))
        << name;
    EXPECT_EQ(asked, 1) << name;
  });
}

}  // namespace spin_wait_test
}  // namespace cubevec
