// Small ops written for the device tests: they launch kernels the way ops/ does (declare unit,
// FLOPs and bytes; touch data only through unsynchronized pointers inside the body).
#pragma once

#include <chrono>
#include <future>
#include <thread>

#include "device/device.h"

namespace cubevec::testing_ops {

// Fills a new f32 tensor with `value` on `stream`, optionally sleeping first to make races likely.
inline Tensor fill(const Stream& stream, Shape shape, float value, Unit unit = Unit::vector, int sleep_ms = 0) {
  Tensor out = stream.device().empty(std::move(shape), DType::f32, stream);
  const auto n = static_cast<std::size_t>(out.numel());
  stream.launch({"fill", unit, 0, 4.0 * static_cast<double>(n)}, {}, {out}, [out, n, value, sleep_ms] {
    if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    auto* p = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
    for (std::size_t i = 0; i < n; ++i) p[i] = value;
  });
  return out;
}

// out = a + b, elementwise, same shapes.
inline Tensor add(const Stream& stream, const Tensor& a, const Tensor& b, int sleep_ms = 0) {
  Tensor out = stream.device().empty(a.shape(), DType::f32, stream);
  const auto n = static_cast<std::size_t>(out.numel());
  stream.launch({"add", Unit::vector, static_cast<double>(n), 12.0 * static_cast<double>(n)}, {a, b}, {out}, [a, b, out, n, sleep_ms] {
    if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    const auto* x = reinterpret_cast<const float*>(a.unsynchronized_data_ptr());
    const auto* y = reinterpret_cast<const float*>(b.unsynchronized_data_ptr());
    auto* z = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
    for (std::size_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
  });
  return out;
}

// c = a @ b for [M, K] x [K, N], a plain loop on the Cube unit.
inline Tensor matmul(const Stream& stream, const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor c = stream.device().empty({m, n}, DType::f32, stream);
  const auto flops = 2.0 * static_cast<double>(m * n * k);
  const auto bytes = 4.0 * static_cast<double>(m * k + k * n + m * n);
  stream.launch({"matmul", Unit::cube, flops, bytes}, {a, b}, {c}, [a, b, c, m, n, k] {
    const auto* x = reinterpret_cast<const float*>(a.unsynchronized_data_ptr());
    const auto* y = reinterpret_cast<const float*>(b.unsynchronized_data_ptr());
    auto* z = reinterpret_cast<float*>(c.unsynchronized_data_ptr());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0;
        for (int64_t p = 0; p < k; ++p) sum += x[i * k + p] * y[p * n + j];
        z[i * n + j] = sum;
      }
  });
  return c;
}

// Runs `action` on another thread and fails the test if it takes longer than `seconds`: a hang
// becomes a failure instead of a stuck test run.
template <class F>
auto within_seconds(double seconds, F action) {
  auto future = std::async(std::launch::async, std::move(action));
  if (future.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << "timed out after " << seconds << " s (a hang)";
    std::abort();  // the action cannot be cancelled; do not leave a stuck process behind
  }
  return future.get();
}

inline DeviceProfile two_thread_profile() {
  DeviceProfile p = builtin_cpu_profile();
  p.cube_threads = 1;
  p.vector_threads = 1;
  return p;
}

}  // namespace cubevec::testing_ops
