#include "tensor/caching_allocator.h"

#include <bit>
#include <cstdio>
#include <cstdint>
#include <cstdlib>

#include <sys/mman.h>

#include "base/error.h"

namespace cubevec {

namespace {

// A cached block may serve a request of up to 25% less than its size: enough slack to reuse
// blocks across nearby classes, little enough to bound the waste.
std::size_t largest_block_for(std::size_t request_class) { return request_class + request_class / 4; }

// A large request that no such block serves may take a cached block of up to twice its size
// before it asks the OS: fresh memory costs a page fault and the kernel zeroing it on first touch
// (1-2 GB/s on the VMs measured: 4 KiB pages and first-time huge pages alike), so a one-shot
// run's VAE decode, whose activations are sizes the denoising never used, ran its elementwise ops
// at 1-2 GB/s where reused memory gave 20-38 GB/s. Twice, not more: a small tensor must not pin a
// block a later large request will miss.
constexpr std::size_t kLargeRequestBytes = std::size_t{1} << 20;
std::size_t largest_spare_block_for(std::size_t request_class) { return 2 * request_class; }

// Blocks from this size on get the huge-page advice (at least one whole 2 MiB page inside).
constexpr std::size_t kHugePageAdviceBytes = std::size_t{4} << 20;

// Asks for transparent huge pages on the 2 MiB-aligned part of a large block (where the kernel
// gives them only on request, THP "madvise"): a block comes from the OS once and is then reused,
// so its first touch pays a page fault per 4 KiB unless it is backed by 2 MiB pages. Measured on the
// FLUX-width model (f32, 512x512, Zen 3, THP "madvise"): load 8.9 -> 6.5 s, VAE decode 1.23 -> 0.90 s,
// denoising within the noise.
void advise_huge_pages(void* ptr, std::size_t size) {
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t first = (begin + kHuge - 1) / kHuge * kHuge, last = (begin + size) / kHuge * kHuge;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // advice only: failure is harmless
}

}  // namespace

std::string mib(std::size_t bytes, int decimals) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f MiB", decimals, static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

std::string human_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

std::string format_stats(const AllocatorStats& s) {
  return "live " + human_bytes(s.live_bytes) + " in " + std::to_string(s.live_blocks) + " blocks, cached " + human_bytes(s.cached_bytes) +
         " in " + std::to_string(s.cached_blocks) + " blocks, peak live " + human_bytes(s.peak_live_bytes) + ", peak reserved " +
         human_bytes(s.peak_reserved_bytes) + ", " + std::to_string(s.hits) + " cache hits, " + std::to_string(s.misses) + " misses";
}

CachingAllocator::CachingAllocator(std::size_t memory_limit) : memory_limit_(memory_limit) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks belong to storages that must not outlive their allocator; only the cache is ours.
  for (auto& [size, blocks] : cache_)
    for (auto& block : blocks) std::free(block.ptr);
}

std::size_t CachingAllocator::size_class(std::size_t nbytes) {
  if (nbytes <= kAllocationAlignment) return kAllocationAlignment;
  const std::size_t below = std::size_t{1} << (std::bit_width(nbytes - 1) - 1);  // below < nbytes <= 2*below
  const std::size_t step = below / 8 > kAllocationAlignment ? below / 8 : kAllocationAlignment;
  return (nbytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(std::size_t nbytes, StreamTag stream) {
  const std::size_t size = size_class(nbytes);
  std::lock_guard lock(mutex_);
  if (void* ptr = take_cached(size, largest_block_for(size), stream)) return ptr;
  if (size >= kLargeRequestBytes)
    if (void* ptr = take_cached(size, largest_spare_block_for(size), stream)) return ptr;
  void* ptr = allocate_from_os(size, nbytes);
  record_live(ptr, size);
  return ptr;
}

void* CachingAllocator::take_cached(std::size_t size, std::size_t largest, StreamTag stream) {
  for (auto it = cache_.lower_bound(size); it != cache_.end() && it->first <= largest; ++it) {
    auto& blocks = it->second;
    // Newest first: the most recently freed block is the likeliest to be in cache.
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
      const bool usable = !b->fence || b->fence->stream() == stream || b->fence->passed();
      if (!usable) continue;
      void* ptr = b->ptr;
      const std::size_t block_size = it->first;
      blocks.erase(std::next(b).base());
      if (blocks.empty()) cache_.erase(it);
      stats_.cached_bytes -= block_size;
      stats_.cached_blocks -= 1;
      stats_.reserved_bytes -= block_size;  // record_live adds it back
      stats_.hits += 1;
      record_live(ptr, block_size);
      return ptr;
    }
  }
  return nullptr;
}

void* CachingAllocator::allocate_from_os(std::size_t size, std::size_t requested) {
  const auto over_limit = [&] { return memory_limit_ != 0 && stats_.reserved_bytes + size > memory_limit_; };
  // Cached blocks of other classes are the fragmentation cost of caching: give them back first.
  if (over_limit()) release_cache(/*keep_fenced=*/true);
  void* ptr = over_limit() ? nullptr : std::aligned_alloc(kAllocationAlignment, size);
  if (!ptr && !over_limit()) {  // the OS said no: retry once with an empty cache
    release_cache(true);
    ptr = std::aligned_alloc(kAllocationAlignment, size);
  }
  if (!ptr) {
    const std::string why =
        over_limit() ? "it would exceed the memory limit of " + human_bytes(memory_limit_) : "the operating system refused it";
    throw OutOfMemoryError("out of memory: cannot allocate " + human_bytes(requested) + " (" + std::to_string(requested) +
                           " bytes, size class " + std::to_string(size) + " bytes): " + why + "; allocator: " + format_stats(stats_));
  }
  if (size >= kHugePageAdviceBytes) advise_huge_pages(ptr, size);
  stats_.misses += 1;
  stats_.os_allocations += 1;
  return ptr;
}

void CachingAllocator::record_live(void* ptr, std::size_t size) {
  live_.emplace(ptr, size);
  stats_.live_bytes += size;
  stats_.live_blocks += 1;
  stats_.reserved_bytes += size;
  if (stats_.live_bytes > stats_.peak_live_bytes) stats_.peak_live_bytes = stats_.live_bytes;
  if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::deallocate(void* ptr, FencePtr fence) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  const auto it = live_.find(ptr);
  if (it == live_.end()) throw Error("CachingAllocator::deallocate: pointer was not allocated here or is already free");
  const std::size_t size = it->second;
  live_.erase(it);
  stats_.live_bytes -= size;
  stats_.live_blocks -= 1;
  stats_.cached_bytes += size;
  stats_.cached_blocks += 1;
  cache_[size].push_back(CachedBlock{ptr, std::move(fence)});
}

void CachingAllocator::release_cache(bool keep_fenced) {
  for (auto it = cache_.begin(); it != cache_.end();) {
    auto& blocks = it->second;
    std::erase_if(blocks, [&](const CachedBlock& b) {
      if (keep_fenced && b.fence && !b.fence->passed()) return false;
      std::free(b.ptr);
      stats_.cached_bytes -= it->first;
      stats_.cached_blocks -= 1;
      stats_.reserved_bytes -= it->first;
      stats_.os_frees += 1;
      return true;
    });
    it = blocks.empty() ? cache_.erase(it) : std::next(it);
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cache(/*keep_fenced=*/true);
}

void CachingAllocator::set_memory_limit(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  memory_limit_ = bytes;
}

std::size_t CachingAllocator::memory_limit() const {
  std::lock_guard lock(mutex_);
  return memory_limit_;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.peak_live_bytes = stats_.live_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

CachingAllocator& default_allocator() {
  // Leaked on purpose: storages may be destroyed during static destruction, after any owner.
  static CachingAllocator* instance = new CachingAllocator();
  return *instance;
}

}  // namespace cubevec
