// Stream: an in-order asynchronous queue of work on a Device, like aclrtStream.
// Work launched on one stream runs in launch order; work on different streams may overlap, each
// kernel on the unit it declares. A stream may be used from any host thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/event.h"
#include "device/kernel.h"
#include "tensor/tensor.h"

namespace cubevec {

class Device;
class StreamState;

class Stream {
 public:
  explicit Stream(std::shared_ptr<StreamState> state) : state_(std::move(state)) {}

  StreamTag id() const;
  const std::string& label() const;
  Device& device() const;

  // Queues a kernel that reads `reads` and writes `writes`. The device orders it after the work on
  // other streams that wrote what it reads, or used what it writes (Note [Implicit dependencies]),
  // and keeps the tensors' storage alive until it has run. When the stream has 32 kernels queued,
  // or its queued kernels write more than 8 MiB, the host waits here until 16 kernels and 4 MiB
  // remain (not inside a kernel), so the tensors pinned by queued work stay about a block's worth.
  void launch(const KernelDesc& kernel, const std::vector<Tensor>& reads, const std::vector<Tensor>& writes, KernelBody body) const;
  // An event reached once the work launched so far has run.
  Event record() const;
  // Work launched after this waits for `event` (recorded on any stream of the same device).
  void wait(const Event& event) const;
  // Blocks until the work launched so far has run; rethrows the first failure since the last
  // synchronize, naming the kernel. The stream goes on working afterwards.
  void synchronize() const;
  bool query() const { return record().query(); }
  // Where the stream's modelled NPU clock stands (seconds).
  double modelled_time_s() const;

  const std::shared_ptr<StreamState>& state() const { return state_; }

 private:
  std::shared_ptr<StreamState> state_;
};

}  // namespace cubevec
