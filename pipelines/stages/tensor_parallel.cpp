#include "pipelines/stages/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "models/layers.h"
#include "ops/vector_ops.h"
#include "parallel/collectives.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

// Rows [first, first + count) of a weight or vector (dim 0), shape-only for a meta tensor.
Tensor take_rows(const Tensor& t, int64_t first, int64_t count) {
  Shape shape = t.shape();
  shape[0] = count;
  if (!t.has_storage()) return Tensor::meta(shape, t.dtype());
  return t.narrow(0, first, count).contiguous();
}

// The columns of a 2-D weight in `ranges` (first, count), side by side.
Tensor take_columns(const Tensor& w, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t width = 0;
  for (const auto& [first, count] : ranges) width += count;
  if (!w.has_storage()) return Tensor::meta({w.size(0), width}, w.dtype());
  const Tensor src = w.contiguous();
  Tensor out = Tensor::empty({w.size(0), width}, w.dtype());
  const std::size_t item = src.itemsize();
  const auto* from = static_cast<const std::byte*>(src.data_ptr());
  auto* to = static_cast<std::byte*>(out.mutable_data_ptr());
  for (int64_t row = 0; row < w.size(0); ++row) {
    int64_t column = 0;
    for (const auto& [first, count] : ranges) {
      std::memcpy(to + static_cast<std::size_t>(row * width + column) * item,
                  from + static_cast<std::size_t>(row * w.size(1) + first) * item, static_cast<std::size_t>(count) * item);
      column += count;
    }
  }
  return out;
}

// A row-parallel Linear's product: this rank's partial x W_r^T, all-reduced over the group, then the
// bias (once) and the layer's epilogue, which must come after the sum.
class RowParallelKernel : public models::LinearKernel {
 public:
  RowParallelKernel(parallel::Communicator group, Tensor bias, std::shared_ptr<TensorParallelStage::Counts> counts)
      : group_(std::move(group)), bias_(std::move(bias)), counts_(std::move(counts)) {}
  std::string name() const override { return "tensor parallel (row)"; }
  std::size_t weight_bytes() const override { return 0; }  // the shard stays in the layer's weight
  Tensor forward(const models::Linear& layer, const Tensor& x, const Stream& stream, const ops::MatmulOptions& epilogue) const override {
    if (epilogue.activation != ops::GemmActivation::none)
      throw Error(layer.name + ": a row-parallel Linear cannot fuse an activation (it would apply before the all-reduce)");
    const Tensor partial = ops::cast(layer.float_forward(x, stream), DType::f32, stream);  // the layer holds no bias now
    Tensor y = parallel::all_reduce_sum(partial, group_, stream, layer.name);
    ++counts_->all_reduces;
    if (bias_.defined()) y = ops::add(y, bias_, stream);
    if (epilogue.residual.defined()) {
      const Tensor gated = epilogue.gate.defined() ? ops::mul(y, epilogue.gate, stream) : y;
      y = ops::add(ops::cast(epilogue.residual, DType::f32, stream), gated, stream);
    }
    return ops::cast(y, epilogue.out, stream);
  }

 private:
  parallel::Communicator group_;
  Tensor bias_;  // f32 [out]
  std::shared_ptr<TensorParallelStage::Counts> counts_;
};

}  // namespace

TensorParallelStage::TensorParallelStage(parallel::Communicator group, models::TensorParallelPlan plan)
    : group_(std::move(group)), plan_(std::move(plan)) {}

void TensorParallelStage::after_load(models::ParameterTable& table) {
  const int64_t ranks = group_.size(), rank = group_.rank();
  if (ranks == 1) return;
  const std::string flag = "--tp " + std::to_string(ranks);
  if (plan_.heads % ranks != 0)
    throw Error(flag + " must divide the transformer's " + std::to_string(plan_.heads) +
                " attention heads (each rank computes heads / T of them)");
  const auto share = [&](const std::string& what, int64_t size) {
    if (size % ranks != 0)
      throw Error(flag + ": " + what + " has " + std::to_string(size) + ", which " + std::to_string(ranks) + " ranks cannot share evenly");
    return size / ranks;
  };
  const auto free_layer = [&](const std::string& module) -> models::Linear& {
    models::Linear& layer = table.linear(module);
    if (layer.kernel)
      throw Error(flag + ": " + module + " already runs as " + layer.kernel->name() + " (quantized layers and --tp do not combine yet)");
    return layer;
  };
  for (const std::string& module : plan_.column) {
    models::Linear& layer = free_layer(module);
    const int64_t part = share(module + "'s output features", layer.out);
    layer.weight = take_rows(layer.weight, rank * part, part);
    if (layer.bias.defined()) layer.bias = take_rows(layer.bias, rank * part, part);
    layer.out = part;
    ++column_layers_;
  }
  for (const models::TensorParallelPlan::RowLinear& row : plan_.row) {
    models::Linear& layer = free_layer(row.module);
    const std::vector<int64_t> segments = row.segments.empty() ? std::vector<int64_t>{layer.in} : row.segments;
    if (std::accumulate(segments.begin(), segments.end(), int64_t{0}) != layer.in)
      throw Error(flag + ": the plan's input segments of " + row.module + " do not add up to its " + std::to_string(layer.in) +
                  " input features");
    std::vector<std::pair<int64_t, int64_t>> ranges;
    int64_t start = 0;
    for (const int64_t segment : segments) {
      const int64_t part = share(row.module + "'s input features", segment);
      ranges.emplace_back(start + rank * part, part);
      start += segment;
    }
    layer.weight = take_columns(layer.weight, ranges);
    layer.in /= ranks;
    layer.kernel = std::make_shared<RowParallelKernel>(group_, layer.bias, counts_);
    layer.bias = Tensor{};
    ++row_layers_;
  }
  for (const std::string& name : plan_.channel_vectors) {
    const auto spec =
        std::find_if(table.specs().begin(), table.specs().end(), [&](const models::ParameterSpec& s) { return s.name == name; });
    if (spec == table.specs().end()) throw Error(flag + ": the model has no parameter '" + name + "' to share");
    Tensor& vector = *spec->slot;
    const int64_t part = share(name, vector.size(0));
    vector = take_rows(vector, rank * part, part);
    ++vectors_;
  }
}

Tensor TensorParallelStage::rms_norm_across_heads(const Tensor& x, const Tensor& weight, float eps, const Stream& stream) {
  const Tensor sums = parallel::all_reduce_sum(ops::row_sum_of_squares(x, stream), group_, stream, "tp.rms_norm");
  ++counts_->all_reduces;
  return ops::rms_norm_with_sums(x, sums, x.size(-1) * group_.size(), weight, eps, stream);
}

std::string TensorParallelStage::summary() const {
  return std::to_string(column_layers_) + " Linears split by output, " + std::to_string(row_layers_) + " by input; " +
         std::to_string(counts_->all_reduces) + " all-reduces";
}

nlohmann::ordered_json TensorParallelStage::report() const {
  return {{"degree", group_.size()},
          {"column_linears", column_layers_},
          {"row_linears", row_layers_},
          {"channel_vectors", vectors_},
          {"all_reduces", counts_->all_reduces}};
}

}  // namespace cubevec::pipelines
