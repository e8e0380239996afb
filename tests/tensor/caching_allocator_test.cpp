#include "tensor/caching_allocator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <random>
#include <thread>

#include "base/error.h"

namespace cubevec {
namespace caching_allocator_test {  // named after the file: unity batches never mix two files' helpers

// A fence the test opens by hand, standing in for an event recorded on a device stream.
class ManualFence final : public StreamFence {
 public:
  bool passed() const override { return open.load(); }
  void host_wait() const override {}
  StreamTag stream() const override { return tag; }
  StreamTag tag = 1;
  std::atomic<bool> open{false};
};

TEST(CachingAllocator, SizeClassesBoundWaste) {
  EXPECT_EQ(CachingAllocator::size_class(0), 64u);
  EXPECT_EQ(CachingAllocator::size_class(1), 64u);
  EXPECT_EQ(CachingAllocator::size_class(64), 64u);
  EXPECT_EQ(CachingAllocator::size_class(65), 128u);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const std::size_t n = 1 + rng() % (std::size_t{1} << (1 + rng() % 34));
    const std::size_t c = CachingAllocator::size_class(n);
    ASSERT_GE(c, n);
    ASSERT_EQ(c % 64, 0u) << n;
    if (n > 512) {
      ASSERT_LE(c - n, n / 8) << "more than 12.5% waste for " << n;
    }
    ASSERT_EQ(CachingAllocator::size_class(c), c) << "a class is its own class";
  }
}

TEST(CachingAllocator, ReusesFreedBlocksAndCountsHits) {
  CachingAllocator allocator;
  void* a = allocator.allocate(1000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  std::memset(a, 0xab, 1000);
  allocator.deallocate(a);
  void* b = allocator.allocate(1000);
  EXPECT_EQ(a, b) << "the cached block is handed out again";
  void* c = allocator.allocate(1010);  // same class (1024) as 1000
  EXPECT_NE(c, b);
  allocator.deallocate(b);
  allocator.deallocate(c);
  const AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.os_allocations, 2u);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 2048u);
  EXPECT_EQ(s.reserved_bytes, 2048u);
  EXPECT_EQ(s.peak_live_bytes, 2048u);
}

TEST(CachingAllocator, ServesNearbyClassesButNotMuchSmallerRequests) {
  CachingAllocator allocator;
  void* big = allocator.allocate(10000);
  allocator.deallocate(big);
  void* slightly_smaller = allocator.allocate(9000);  // within 25% of the cached block
  EXPECT_EQ(slightly_smaller, big);
  allocator.deallocate(slightly_smaller);
  void* much_smaller = allocator.allocate(4000);
  EXPECT_NE(much_smaller, big) << "a small request must not pin a much larger block";
  allocator.deallocate(much_smaller);
}

// A large request no nearby class serves takes the smallest cached block of up to twice its size
// before it asks the OS (fresh pages cost a fault and zeroing on first touch); never a larger one.
TEST(CachingAllocator, LargeRequestsTakeASpareBlockOfUpToTwiceTheirSize) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  CachingAllocator allocator;
  void* three = allocator.allocate(3 * kMiB);
  void* five = allocator.allocate(5 * kMiB);
  allocator.deallocate(three);
  allocator.deallocate(five);
  void* two = allocator.allocate(2 * kMiB);
  EXPECT_EQ(two, three) << "the 3 MiB block serves a 2 MiB request (the smallest within twice its size)";
  void* two_more = allocator.allocate(2 * kMiB);
  EXPECT_NE(two_more, five) << "a 5 MiB block is more than twice a 2 MiB request";
  const AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 3u);
  allocator.deallocate(two);
  void* half = allocator.allocate(512 * 1024);
  EXPECT_NE(half, three) << "below 1 MiB only blocks within 25% serve a request";
  allocator.deallocate(half);
  allocator.deallocate(two_more);
}

TEST(CachingAllocator, StatisticsTrackLivePeakAndCache) {
  CachingAllocator allocator;
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(allocator.allocate(4096));
  EXPECT_EQ(allocator.stats().live_bytes, 40960u);
  EXPECT_EQ(allocator.stats().live_blocks, 10u);
  for (void* p : blocks) allocator.deallocate(p);
  AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.peak_live_bytes, 40960u);
  EXPECT_EQ(s.cached_bytes, 40960u);
  EXPECT_EQ(s.cached_blocks, 10u);
  allocator.reset_peak_stats();
  EXPECT_EQ(allocator.stats().peak_live_bytes, 0u);
  allocator.empty_cache();
  s = allocator.stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.os_frees, 10u);
  EXPECT_NE(format_stats(s).find("10 misses"), std::string::npos) << format_stats(s);
}

TEST(CachingAllocator, LimitRaisesClearOutOfMemory) {
  CachingAllocator allocator(1 << 20);  // 1 MiB
  void* a = allocator.allocate(600 * 1024);
  try {
    allocator.allocate(600 * 1024);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cannot allocate 600.00 KiB (614400 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("memory limit of 1.00 MiB"), std::string::npos) << message;
    EXPECT_NE(message.find("live 640.00 KiB in 1 blocks"), std::string::npos) << message;
  }
  allocator.deallocate(a);
  EXPECT_EQ(allocator.stats().live_bytes, 0u);
}

TEST(CachingAllocator, FragmentedCacheIsReleasedBeforeFailing) {
  // Many small cached blocks of the wrong class must not make a large request fail.
  CachingAllocator allocator(1 << 20);
  std::vector<void*> small;
  for (int i = 0; i < 60; ++i) small.push_back(allocator.allocate(16 * 1024));
  for (void* p : small) allocator.deallocate(p);
  EXPECT_EQ(allocator.stats().cached_bytes, 60u * 16 * 1024);
  void* large = allocator.allocate(512 * 1024);
  const AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.cached_bytes, 0u) << "the fragmented cache was returned to the OS";
  EXPECT_EQ(s.live_bytes, 512u * 1024);
  EXPECT_LE(s.reserved_bytes, std::size_t{1} << 20);
  allocator.deallocate(large);
}

TEST(CachingAllocator, FencedBlocksWaitForTheirStream) {
  CachingAllocator allocator;
  auto fence = std::make_shared<ManualFence>();
  void* a = allocator.allocate(4096, /*stream=*/1);
  allocator.deallocate(a, fence);
  void* other_stream = allocator.allocate(4096, /*stream=*/2);
  EXPECT_NE(other_stream, a) << "stream 2 must not get a block stream 1 may still use";
  void* same_stream = allocator.allocate(4096, /*stream=*/1);
  EXPECT_EQ(same_stream, a) << "in-order execution makes reuse on the same stream safe";
  allocator.deallocate(same_stream, fence);
  fence->open = true;
  void* after_fence = allocator.allocate(4096, /*stream=*/2);
  EXPECT_EQ(after_fence, a) << "once the stream has passed the fence, anyone may reuse the block";
  allocator.deallocate(after_fence);
  allocator.deallocate(other_stream);
}

TEST(CachingAllocator, EmptyCacheKeepsBlocksStillFenced) {
  CachingAllocator allocator;
  auto fence = std::make_shared<ManualFence>();
  allocator.deallocate(allocator.allocate(8192, 1), fence);
  allocator.deallocate(allocator.allocate(100, 1));
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().cached_bytes, 8192u) << "a stream may still use the fenced block";
  fence->open = true;
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().cached_bytes, 0u);
}

// The VmFlags line of the mapping in /proc/self/smaps that holds `address` ("" when none does).
std::string vm_flags_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) inside = a >= begin && a < end;
    else if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(CachingAllocator, LargeBlocksAskForHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) GTEST_SKIP() << "this kernel has no transparent huge pages";
  CachingAllocator allocator;
  constexpr std::size_t kLarge = std::size_t{8} << 20, kSmall = std::size_t{1} << 20;
  auto* large = static_cast<char*>(allocator.allocate(kLarge));
  auto* small = static_cast<char*>(allocator.allocate(kSmall));
  // The middle of an 8 MiB block lies in its 2 MiB-aligned part, which carries the advice ("hg").
  const std::string large_flags = vm_flags_at(large + kLarge / 2), small_flags = vm_flags_at(small + kSmall / 2);
  ASSERT_FALSE(large_flags.empty()) << "no mapping in /proc/self/smaps holds the block";
  EXPECT_NE((large_flags + " ").find(" hg "), std::string::npos) << large_flags;
  EXPECT_EQ((small_flags + " ").find(" hg "), std::string::npos) << "a 1 MiB block is left to the system's default: " << small_flags;
  allocator.deallocate(large);
  allocator.deallocate(small);
}

TEST(CachingAllocator, RejectsForeignPointers) {
  CachingAllocator allocator;
  int local = 0;
  EXPECT_THROW(allocator.deallocate(&local), Error);
  void* p = allocator.allocate(64);
  allocator.deallocate(p);
  EXPECT_THROW(allocator.deallocate(p), Error) << "double free is detected";
}

TEST(CachingAllocator, ConcurrentAllocationFromSeveralThreads) {
  CachingAllocator allocator;
  constexpr int kThreads = 4, kRounds = 4000;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<unsigned char*, std::size_t>> held;
      for (int i = 0; i < kRounds; ++i) {
        if (held.size() < 16 && (held.empty() || rng() % 3 != 0)) {
          const std::size_t n = 1 + rng() % 20000;
          auto* p = static_cast<unsigned char*>(allocator.allocate(n, static_cast<StreamTag>(t)));
          std::memset(p, t + 1, n);  // a block shared with another thread would be overwritten
          held.emplace_back(p, n);
        } else {
          const std::size_t k = rng() % held.size();
          auto [p, n] = held[k];
          for (std::size_t b = 0; b < n; ++b)
            if (p[b] != t + 1) {
              corrupted++;
              break;
            }
          allocator.deallocate(p);
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (auto [p, n] : held) allocator.deallocate(p);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupted.load(), 0) << "two threads were handed the same live block";
  const AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.reserved_bytes, s.cached_bytes);
  EXPECT_EQ(s.hits + s.misses, s.hits + s.os_allocations);
  EXPECT_GT(s.hits, 0u);
}

}  // namespace caching_allocator_test
}  // namespace cubevec
