// Suite `launch`: what a kernel launch costs. Throughput: many empty kernels queued, then one
// synchronize (the steady-state cost a model's launches pay). Round trip: launch one empty kernel
// and wait for it (the latency a synchronous caller sees).
#include "bench/harness.h"
#include "device/device.h"

namespace cubevec::bench {

void launch_suite(Context& context) {
  Device device(builtin_cpu_profile());
  const Stream stream = device.new_stream("bench");
  for (Unit unit : kAllUnits) {
    const int launches = 20000;
    const Timing t = time_runs(
        [&] {
          for (int i = 0; i < launches; ++i) stream.launch({"empty", unit}, {}, {}, [] {});
          stream.synchronize();
        },
        context.repeats);
    Result r{"launch", "empty-kernel-queued-" + std::string(unit_name(unit)), "cubevec"};
    r.timing = {t.median_s / launches, t.min_s / launches, t.max_s / launches, t.runs};
    r.extra["us_per_launch"] = r.timing.median_s * 1e6;
    context.add(r);
  }
  const int round_trips = 2000;
  const Timing t = time_runs(
      [&] {
        for (int i = 0; i < round_trips; ++i) {
          stream.launch({"empty", Unit::vector}, {}, {}, [] {});
          stream.synchronize();
        }
      },
      context.repeats);
  Result r{"launch", "empty-kernel-round-trip", "cubevec"};
  r.timing = {t.median_s / round_trips, t.min_s / round_trips, t.max_s / round_trips, t.runs};
  r.extra["us_per_launch"] = r.timing.median_s * 1e6;
  context.add(r);
}

}  // namespace cubevec::bench
