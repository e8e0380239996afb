// Where an op's kernels go when the caller names no stream: the default device's default stream,
// which keeps simple use synchronous-looking (see Note [Implicit dependencies]).
#pragma once

#include "device/device.h"

namespace cubevec::ops {

inline Stream default_op_stream() { return default_device().default_stream(); }

// Throws naming `op` and `what` unless `t` is a contiguous f32 tensor (or a meta one in simulate mode).
void require_contiguous_f32(const Tensor& t, const char* op, const char* what);

}  // namespace cubevec::ops
