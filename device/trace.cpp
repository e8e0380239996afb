#include "device/trace.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/output_file.h"

namespace cubevec {

namespace {

// The union of the intervals, sorted and without overlaps.
Intervals merged_intervals(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

}  // namespace

double busy_time(Intervals intervals) {
  double total = 0;
  for (const auto& [start, end] : merged_intervals(std::move(intervals))) total += end - start;
  return total;
}

double overlap_time(Intervals a, Intervals b) {
  const Intervals x = merged_intervals(std::move(a)), y = merged_intervals(std::move(b));
  double total = 0;
  std::size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const double lo = std::max(x[i].first, y[j].first), hi = std::min(x[i].second, y[j].second);
    if (hi > lo) total += hi - lo;
    (x[i].second < y[j].second ? i : j) += 1;
  }
  return total;
}

KernelRecord* Trace::add(KernelRecord record) {
  std::lock_guard lock(mutex_);
  records_.push_back(std::move(record));
  return &records_.back();
}

std::vector<KernelRecord> Trace::records() const {
  std::lock_guard lock(mutex_);
  return {records_.begin(), records_.end()};
}

void Trace::clear() {
  std::lock_guard lock(mutex_);
  records_.clear();
  epoch_ = std::chrono::steady_clock::now();
}

void Trace::write_chrome_json(const std::string& path, const std::string& device_name) const {
  write_chrome_trace(path, {{device_name, records()}});
}

void write_chrome_trace(const std::string& path, const std::vector<TraceSection>& sections) {
  // Four processes per section, so Perfetto groups the tracks: what ran on this CPU (by unit, by
  // stream) and what the cost model says the NPU would do (by unit, by stream).
  nlohmann::json events = nlohmann::json::array();
  const auto name_process = [&](int pid, const std::string& name) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  };
  const auto name_thread = [&](int pid, uint64_t tid, const std::string& name) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
  };
  for (std::size_t index = 0; index < sections.size(); ++index) {
    const TraceSection& section = sections[index];
    const int base = static_cast<int>(4 * index);
    const int measured_units = base + 1, measured_streams = base + 2, modelled_units = base + 3, modelled_streams = base + 4;
    name_process(measured_units, section.name + ": measured on this CPU, by unit");
    name_process(measured_streams, section.name + ": measured on this CPU, by stream");
    name_process(modelled_units, section.name + ": modelled NPU, by unit");
    name_process(modelled_streams, section.name + ": modelled NPU, by stream");
    for (Unit unit : kAllUnits) {
      name_thread(measured_units, static_cast<uint64_t>(unit) + 1, std::string(unit_name(unit)));
      name_thread(modelled_units, static_cast<uint64_t>(unit) + 1, std::string(unit_name(unit)));
    }
    std::map<StreamTag, std::string> streams;
    for (const KernelRecord& r : section.records) {
      streams[r.stream] = r.stream_label;
      const nlohmann::json args = {{"unit", unit_name(r.desc.unit)},
                                   {"stream", r.stream},
                                   {"flops", r.desc.flops},
                                   {"bytes", r.desc.bytes},
                                   {"dtype", dtype_name(r.desc.dtype)},
                                   {"modelled_us", (r.modelled_end_s - r.modelled_start_s) * 1e6}};
      const auto slice = [&](int pid, uint64_t tid, double start_s, double end_s) {
        events.push_back({{"ph", "X"},
                          {"name", r.desc.name},
                          {"cat", unit_name(r.desc.unit)},
                          {"pid", pid},
                          {"tid", tid},
                          {"ts", start_s * 1e6},
                          {"dur", (end_s - start_s) * 1e6},
                          {"args", args}});
      };
      const uint64_t unit_tid = static_cast<uint64_t>(r.desc.unit) + 1;
      if (r.ran) {
        slice(measured_units, unit_tid, r.real_start_s, r.real_end_s);
        slice(measured_streams, r.stream, r.real_start_s, r.real_end_s);
      }
      slice(modelled_units, unit_tid, r.modelled_start_s, r.modelled_end_s);
      slice(modelled_streams, r.stream, r.modelled_start_s, r.modelled_end_s);
    }
    for (const auto& [tag, label] : streams) {
      const std::string name = "stream " + std::to_string(tag) + (label.empty() ? "" : " (" + label + ")");
      name_thread(measured_streams, tag, name);
      name_thread(modelled_streams, tag, name);
    }
  }
  write_output_file(path, "trace", nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n");
}

}  // namespace cubevec
