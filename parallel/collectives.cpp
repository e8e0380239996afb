#include "parallel/collectives.h"

#include <algorithm>
#include <cstring>

#include "device/device.h"
#include "ops/vector_ops.h"
#include "base/error.h"

namespace cubevec::parallel {

namespace {

int64_t checked_dim(const Tensor& x, int64_t dim, const char* op, const char* which) {
  if (!x.defined()) throw Error(std::string(op) + ": x is undefined");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  if (d < 0 || d >= x.dim())
    throw Error(std::string(op) + ": " + which + " " + std::to_string(dim) + " is out of range for a tensor of shape " +
                shape_to_string(x.shape()));
  return d;
}

// "f32 [2, *, 64]": the dtype and the shape with `dim` (the one allowed to differ) starred; what
// every member must agree on.
std::string signature(const Tensor& x, std::initializer_list<int64_t> free_dims) {
  std::string text = std::string(dtype_name(x.dtype())) + " [";
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d) text += ", ";
    const bool free = std::find(free_dims.begin(), free_dims.end(), d) != free_dims.end();
    text += free ? std::string("*") : std::to_string(x.size(d));
  }
  return text + "]";
}

// Member sizes along a dim: `given` (checked) or every member with this rank's own.
std::vector<int64_t> member_sizes(std::vector<int64_t> given, int64_t own, const Communicator& comm, const char* op) {
  if (given.empty()) return std::vector<int64_t>(static_cast<std::size_t>(comm.size()), own);
  if (given.size() != static_cast<std::size_t>(comm.size()))
    throw Error(std::string(op) + ": " + std::to_string(given.size()) + " member sizes for " + comm.describe());
  for (const int64_t s : given)
    if (s < 0) throw Error(std::string(op) + ": member sizes must not be negative, got " + std::to_string(s));
  if (given[static_cast<std::size_t>(comm.rank())] != own)
    throw Error(std::string(op) + ": this rank's size " + std::to_string(own) + " is not the size " +
                std::to_string(given[static_cast<std::size_t>(comm.rank())]) + " given for it on " + comm.describe());
  return given;
}

Shape with_size(Shape shape, int64_t dim, int64_t size) {
  shape[static_cast<std::size_t>(dim)] = size;
  return shape;
}

// Blocks laid out one after another in `flat` (1-D), of the given shapes, joined along `dim`. When
// every dimension before `dim` has size 1 the blocks already are the concatenation: no copy.
Tensor join_blocks(const Tensor& flat, const std::vector<Shape>& shapes, int64_t dim, const Stream& stream) {
  Shape joined = shapes.front();
  joined[static_cast<std::size_t>(dim)] = 0;
  for (const Shape& s : shapes) joined[static_cast<std::size_t>(dim)] += s[static_cast<std::size_t>(dim)];
  bool outer_ones = true;
  for (int64_t d = 0; d < dim; ++d) outer_ones = outer_ones && joined[static_cast<std::size_t>(d)] == 1;
  if (outer_ones) return flat.view(joined);
  std::vector<Tensor> parts;
  int64_t offset = 0;
  for (const Shape& s : shapes) {
    const int64_t n = shape_numel(s);
    if (n > 0) parts.push_back(flat.narrow(0, offset, n).view(s));
    offset += n;
  }
  if (parts.empty()) return stream.device().empty(joined, flat.dtype(), stream);
  return ops::concat(parts, dim, stream);
}

std::size_t bytes_of(const Shape& shape, DType dtype) { return static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype); }

}  // namespace

std::vector<int64_t> split_sizes(int64_t total, int parts) {
  if (parts < 1) throw Error("split_sizes: parts must be at least 1, got " + std::to_string(parts));
  if (total < 0) throw Error("split_sizes: total must not be negative, got " + std::to_string(total));
  std::vector<int64_t> sizes(static_cast<std::size_t>(parts), total / parts);
  for (int64_t i = 0; i < total % parts; ++i) sizes[static_cast<std::size_t>(i)] += 1;
  return sizes;
}

Tensor all_gather(const Tensor& x, int64_t dim, const Communicator& comm, const Stream& stream, const std::string& label,
                  std::vector<int64_t> sizes) {
  const int64_t d = checked_dim(x, dim, "all_gather", "dim");
  sizes = member_sizes(std::move(sizes), x.size(d), comm, "all_gather");
  const Tensor xc = ops::contiguous(x, stream);
  std::vector<Shape> shapes;
  std::vector<std::size_t> bytes;
  int64_t total = 0;
  for (const int64_t s : sizes) {
    shapes.push_back(with_size(x.shape(), d, s));
    bytes.push_back(bytes_of(shapes.back(), x.dtype()));
    total += shape_numel(shapes.back());
  }
  Tensor gathered = stream.device().empty({total}, x.dtype(), stream);
  const std::string what = "all_gather '" + label + "' " + signature(x, {d}) + " dim " + std::to_string(d);
  // Modelled on a full mesh: every block crosses one link, all links at once.
  const double link_bytes = comm.size() > 1 ? static_cast<double>(*std::max_element(bytes.begin(), bytes.end())) : 0.0;
  stream.launch({"all_gather " + label, Unit::comm, 0.0, link_bytes, x.dtype()}, {xc}, {gathered}, [xc, gathered, bytes, what, comm] {
    comm.all_gather(xc.unsynchronized_data_ptr(), gathered.unsynchronized_data_ptr(), bytes, what);
  });
  return join_blocks(gathered, shapes, d, stream);
}

Tensor all_to_all(const Tensor& x, int64_t scatter_dim, int64_t gather_dim, const Communicator& comm, const Stream& stream,
                  const std::string& label, std::vector<int64_t> gather_sizes) {
  const int64_t sd = checked_dim(x, scatter_dim, "all_to_all", "scatter_dim");
  const int64_t gd = checked_dim(x, gather_dim, "all_to_all", "gather_dim");
  if (sd == gd) throw Error("all_to_all: scatter_dim and gather_dim must differ, both are " + std::to_string(sd));
  const int members = comm.size();
  gather_sizes = member_sizes(std::move(gather_sizes), x.size(gd), comm, "all_to_all");
  const std::vector<int64_t> parts = split_sizes(x.size(sd), members);
  const int64_t mine = parts[static_cast<std::size_t>(comm.rank())];

  // What goes to member j: x's part j along scatter_dim, each part contiguous, one after another.
  std::vector<Tensor> outgoing;
  std::vector<std::size_t> send_bytes;
  int64_t offset = 0;
  for (const int64_t p : parts) {
    const Tensor part = x.narrow(sd, offset, p);
    offset += p;
    send_bytes.push_back(bytes_of(part.shape(), x.dtype()));
    if (part.numel() > 0) outgoing.push_back(ops::contiguous(part, stream).view({part.numel()}));
  }
  const Tensor send = outgoing.empty()       ? stream.device().empty({0}, x.dtype(), stream)
                      : outgoing.size() == 1 ? outgoing.front()
                                             : ops::concat(outgoing, 0, stream);
  // What comes from member j: its part for this rank, of its own size along gather_dim.
  std::vector<Shape> shapes;
  std::vector<std::size_t> recv_bytes;
  int64_t total = 0;
  for (const int64_t g : gather_sizes) {
    shapes.push_back(with_size(with_size(x.shape(), sd, mine), gd, g));
    recv_bytes.push_back(bytes_of(shapes.back(), x.dtype()));
    total += shape_numel(shapes.back());
  }
  Tensor received = stream.device().empty({total}, x.dtype(), stream);
  const std::string what =
      "all_to_all '" + label + "' " + signature(x, {sd, gd}) + " scatter " + std::to_string(sd) + " gather " + std::to_string(gd);
  double link_bytes = 0;
  for (int j = 0; j < members; ++j)
    if (j != comm.rank())
      link_bytes = std::max({link_bytes, static_cast<double>(send_bytes[static_cast<std::size_t>(j)]),
                             static_cast<double>(recv_bytes[static_cast<std::size_t>(j)])});
  stream.launch({"all_to_all " + label, Unit::comm, 0.0, link_bytes, x.dtype()}, {send}, {received},
                [send, received, send_bytes, recv_bytes, what, comm] {
                  comm.all_to_all(send.unsynchronized_data_ptr(), send_bytes, received.unsynchronized_data_ptr(), recv_bytes, what);
                });
  return join_blocks(received, shapes, gd, stream);
}

Tensor all_reduce_sum(const Tensor& x, const Communicator& comm, const Stream& stream, const std::string& label) {
  if (!x.defined()) throw Error("all_reduce_sum: x is undefined");
  if (x.dtype() != DType::f32) throw Error("all_reduce_sum: sums f32 tensors, got " + std::string(dtype_name(x.dtype())));
  const Tensor xc = ops::contiguous(x, stream);
  Tensor out = stream.device().empty(x.shape(), DType::f32, stream);
  const std::string what = "all_reduce_sum '" + label + "' " + signature(x, {});
  // Modelled as a mesh reduce-scatter then all-gather: 2 / P of the tensor on each link.
  const double link_bytes = comm.size() > 1 ? 2.0 * static_cast<double>(x.nbytes()) / comm.size() : 0.0;
  stream.launch({"all_reduce_sum " + label, Unit::comm, 0.0, link_bytes, DType::f32}, {xc}, {out}, [xc, out, what, comm] {
    std::memcpy(out.unsynchronized_data_ptr(), xc.unsynchronized_data_ptr(), xc.nbytes());
    comm.all_reduce_sum(reinterpret_cast<float*>(out.unsynchronized_data_ptr()), static_cast<std::size_t>(xc.numel()), what);
  });
  return out;
}

Tensor send_recv(const Tensor& x, int dest, int source, const Shape& shape, const Communicator& comm, const Stream& stream,
                 const std::string& label) {
  if (!x.defined()) throw Error("send_recv: x is undefined");
  for (const int member : {dest, source})
    if (member < 0 || member >= comm.size())
      throw Error("send_recv '" + label + "': no member " + std::to_string(member) + " in " + comm.describe());
  const Tensor xc = ops::contiguous(x, stream);
  Tensor out = stream.device().empty(shape, x.dtype(), stream);
  const std::string what = "send_recv '" + label + "' " + std::string(dtype_name(x.dtype()));
  const std::size_t send_bytes = xc.nbytes(), recv_bytes = out.nbytes();
  const double link_bytes = static_cast<double>(std::max(send_bytes, recv_bytes));
  stream.launch({"send_recv " + label, Unit::comm, 0.0, comm.size() > 1 ? link_bytes : 0.0, x.dtype()}, {xc}, {out},
                [xc, out, dest, source, send_bytes, recv_bytes, what, comm] {
                  comm.send_recv(xc.unsynchronized_data_ptr(), send_bytes, dest, out.unsynchronized_data_ptr(), recv_bytes, source, what);
                });
  return out;
}

}  // namespace cubevec::parallel
