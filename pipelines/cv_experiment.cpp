#include "pipelines/cv_experiment.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "ops/gemm.h"
#include "ops/vector_ops.h"
#include "base/enum_names.h"

namespace cubevec {

namespace {

Tensor random_matrix(int64_t rows, int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  return Tensor::from_vector(values, {rows, cols});
}

}  // namespace

std::string_view cv_mode_name(CvMode mode) {
  static constexpr auto kNames =
      enum_names<CvMode>("CV mode", {{CvMode::serialized, "serialized"}, {CvMode::overlapped, "overlapped"}, {CvMode::pinned, "pinned"}});
  return kNames.name(mode);
}

CvResult run_cv_experiment(const CvWorkload& w, CvMode mode, const DeviceProfile& base_profile, int repeats) {
  if (w.chunks < 1 || w.m < 1 || w.n < 1 || w.k < 1) throw Error("cv-experiment: chunks, M, N and K must all be at least 1");
  if (repeats < 1) throw Error("cv-experiment: repeats must be at least 1, got " + std::to_string(repeats));
  DeviceProfile profile = base_profile;
  profile.pin_units = mode == CvMode::pinned;
  Device device(profile, {.trace = true});
  const Stream one = device.new_stream("cube+vector");
  const Stream cube = mode == CvMode::serialized ? one : device.new_stream("cube");
  const Stream vector = mode == CvMode::serialized ? one : device.new_stream("vector");

  const Tensor weight = random_matrix(w.k, w.n, 1);
  std::vector<Tensor> inputs;
  for (int i = 0; i < w.chunks; ++i) inputs.push_back(random_matrix(w.m, w.k, 100 + static_cast<unsigned>(i)));

  std::vector<CvResult> runs;
  for (int run = 0; run <= repeats; ++run) {  // run 0 warms caches and the allocator
    device.reset_timeline();
    std::vector<Tensor> outputs;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < w.chunks; ++i) {
      const Tensor y = ops::matmul(inputs[i], weight, {}, cube);
      const Tensor normed = ops::rms_norm(y, {}, 1e-6f, vector);
      outputs.push_back(ops::softmax(ops::activation(normed, ops::Activation::gelu_tanh, vector), vector));
    }
    device.synchronize();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (run == 0) continue;

    CvResult r;
    r.mode = mode;
    r.wall_s = wall;
    r.records = device.trace().records();
    r.modelled_s = device.stats().modelled_makespan_s;
    Intervals cube_busy, vector_busy;
    for (const KernelRecord& k : r.records)
      if (k.desc.unit != Unit::comm) (k.desc.unit == Unit::cube ? cube_busy : vector_busy).emplace_back(k.real_start_s, k.real_end_s);
    r.cube_busy_s = busy_time(cube_busy);
    r.vector_busy_s = busy_time(vector_busy);
    r.overlap_fraction = overlap_time(cube_busy, vector_busy) / wall;
    for (const Tensor& z : outputs) {
      double sum = 0;
      const float* p = z.data<float>();
      for (int64_t e = 0; e < z.numel(); ++e) sum += p[e];
      r.checksum.push_back(static_cast<float>(sum));
    }
    runs.push_back(std::move(r));
  }
  std::sort(runs.begin(), runs.end(), [](const CvResult& a, const CvResult& b) { return a.wall_s < b.wall_s; });
  CvResult median = runs[runs.size() / 2];
  for (const CvResult& r : runs) median.walls_s.push_back(r.wall_s);
  return median;
}

}  // namespace cubevec
