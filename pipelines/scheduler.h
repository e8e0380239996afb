// What the denoising loop needs of a scheduler: the timesteps the model is given, the sigmas, and
// the update. FlowMatch Euler (pipelines/flow_match.h) and UniPC (pipelines/unipc.h) implement it.
#pragma once

#include <string>
#include <vector>

#include "device/stream.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual std::string name() const = 0;                     // "FlowMatch Euler (shift 3)", ...
  virtual const std::vector<float>& timesteps() const = 0;  // one per step, 0..1000
  virtual const std::vector<float>& sigmas() const = 0;     // steps + 1, ending at 0
  int steps() const { return static_cast<int>(timesteps().size()); }
  // One update from the model output v at sample x (same shape; v f32 or bf16, x f32) to the next
  // sample (f32). Steps must be taken in order.
  virtual Tensor step(const Tensor& v, const Tensor& x, const Stream& stream) = 0;
};

}  // namespace cubevec::pipelines
