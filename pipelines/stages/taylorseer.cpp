#include "pipelines/stages/taylorseer.h"

#include "ops/vector_ops.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

Tensor scaled(const Tensor& x, double factor, const Stream& s) {
  return ops::mul(x, Tensor::from_vector(std::vector<float>{static_cast<float>(factor)}, {1}), s);
}

}  // namespace

void TaylorSeer::update(const Tensor& y, int step, const Stream& s) {
  if (step <= last_step_)
    throw Error("TaylorSeer: step " + std::to_string(step) + " is not after the last one, " + std::to_string(last_step_));
  std::vector<Tensor> next{ops::cast(y, DType::f32, s)};
  if (!current_.empty() && current_[0].shape() != next[0].shape()) current_.clear(), previous_.clear();  // a new shape starts over
  const double window = step - last_step_;
  for (int i = 0; i < order_; ++i) {
    if (static_cast<int>(current_.size()) <= i || step <= 1) break;
    next.push_back(scaled(ops::sub(next[static_cast<std::size_t>(i)], current_[static_cast<std::size_t>(i)], s), 1.0 / window, s));
  }
  previous_ = std::move(current_);
  current_ = std::move(next);
  last_step_ = step;
}

Tensor TaylorSeer::approximate(int step, DType dtype, const Stream& s) const {
  if (current_.empty()) throw Error("TaylorSeer: nothing recorded to extrapolate from");
  const double elapsed = step - last_step_;
  Tensor out = current_[0];
  double factor = 1.0;
  for (std::size_t i = 1; i < current_.size(); ++i) {
    factor *= elapsed / static_cast<double>(i);  // elapsed^i / i!
    out = ops::add(out, scaled(current_[i], factor, s), s);
  }
  return ops::cast(out, dtype, s);
}

}  // namespace cubevec::pipelines
