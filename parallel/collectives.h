// Collectives on tensors: kernels on the device's communication unit, ordered on streams after the
// work that produced their inputs, traced with their bytes and modelled from the profile's link
// figures like every other kernel. A failure (another rank failed, a rank did not arrive, ranks
// called different collectives) surfaces at the stream's synchronize, naming the kernel.
//
// `label` names the call site (e.g. "ulysses.q"); with the dtype and the shape it must match on
// every member. Layout copies around the transfer (packing the parts of an all-to-all, placing
// gathered blocks) run on the Vector unit.
#pragma once

#include <string>
#include <vector>

#include "device/stream.h"
#include "parallel/communicator.h"

namespace cubevec::parallel {

// `total` split into `parts` pieces as torch.tensor_split does: the first total % parts one larger.
std::vector<int64_t> split_sizes(int64_t total, int parts);

// Every member's `x` concatenated along `dim` in rank order. `sizes[r]` is member r's size along
// `dim` (empty: every member has x's); the other dimensions must be the same everywhere.
Tensor all_gather(const Tensor& x, int64_t dim, const Communicator& comm, const Stream& stream, const std::string& label,
                  std::vector<int64_t> sizes = {});

// `x` split along `scatter_dim` by split_sizes (part j to member j); the parts this rank receives
// are concatenated along `gather_dim` in rank order. `gather_sizes[r]` is member r's size along
// `gather_dim` (empty: every member has x's). Ulysses' sequence-to-heads switch is
// all_to_all(x [B, S/P, H, D], 2, 1) -> [B, S, H/P, D], and back all_to_all(o, 1, 2).
Tensor all_to_all(const Tensor& x, int64_t scatter_dim, int64_t gather_dim, const Communicator& comm, const Stream& stream,
                  const std::string& label, std::vector<int64_t> gather_sizes = {});

// The element-wise sum of every member's `x` (f32), in a new tensor.
Tensor all_reduce_sum(const Tensor& x, const Communicator& comm, const Stream& stream, const std::string& label);

// Sends `x` to member `dest` and returns what member `source` sends, which must have `shape` and
// x's dtype (one step of a ring).
Tensor send_recv(const Tensor& x, int dest, int source, const Shape& shape, const Communicator& comm, const Stream& stream,
                 const std::string& label);

}  // namespace cubevec::parallel
