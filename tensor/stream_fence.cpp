#include "tensor/stream_fence.h"

namespace cubevec {

FenceSet::FenceSet(std::vector<FencePtr> fences) : fences_(std::move(fences)), stream_(kHostStream) {
  for (std::size_t i = 0; i < fences_.size(); ++i) {
    const StreamTag s = fences_[i]->stream();
    stream_ = i == 0 ? s : (s == stream_ ? s : kSeveralStreams);
  }
}

bool FenceSet::passed() const {
  for (const auto& f : fences_)
    if (!f->passed()) return false;
  return true;
}

void FenceSet::host_wait() const {
  for (const auto& f : fences_) f->host_wait();
}

}  // namespace cubevec
