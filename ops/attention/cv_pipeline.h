// CV-pipelined flash attention: the tiles of flash.cpp split across the device's units, as
// Ascend's fused attention splits them between the AIC (Cube) and the AIVs (Vector).
//
// Each lane is one Cube thread and one Vector thread joined by a queue of two S/P slots (double
// buffering, Ascend's TQue with num = 2). The Cube side computes S = QK^T for tile t+1 while the
// Vector side turns S(t) into P(t) (scale, mask, online softmax); then the Cube side runs P(t) V.
// Between tiles the Vector side also packs the next head's K and V (layout change and bf16
// conversion, the data movement Ascend's MTE/Vector units do), into the second of two buffers.
//
// Note [CV pipeline without deadlock]
// The two halves are separate kernels on separate streams, so either may start late: the Vector
// unit may be busy with other work, or run the halves of two calls in the other order than the
// Cube unit. So no side ever waits for the other to arrive. Softmax tiles are claimed in order by
// compare-and-swap; while the Vector side has not joined (or has left after waiting too long for
// an S tile), the Cube side claims and computes the softmax itself. The Cube side waits only for a
// tile the Vector side has claimed, and the Vector side claims only a tile whose S is ready.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "ops/attention/problem.h"

namespace cubevec::ops::attn {

struct FlashGeometry;

struct CvPipelineStats {
  int64_t tiles = 0;         // softmax tiles in the call
  int64_t vector_tiles = 0;  // of those, computed on the Vector unit
  int64_t heads = 0;         // K/V packings in the call (one per head and lane)
  int64_t vector_packs = 0;  // of those, done on the Vector unit
};

class CvPipeline {
 public:
  CvPipeline(AttentionBatch batch, int lanes);
  ~CvPipeline();
  CvPipeline(const CvPipeline&) = delete;
  CvPipeline& operator=(const CvPipeline&) = delete;

  void run_cube();    // the Cube-unit kernel's body
  void run_vector();  // the Vector-unit kernel's body
  CvPipelineStats stats() const;

 private:
  struct Lane;
  void run_cube_lane(int lane);
  AttentionBatch batch_;
  std::unique_ptr<FlashGeometry> geometry_;
  std::unique_ptr<Lane[]> lanes_;
  int lane_count_;
};

// The stats of the most recent CV-pipelined call that finished (for the benchmark's report).
CvPipelineStats last_cv_pipeline_stats();

}  // namespace cubevec::ops::attn
