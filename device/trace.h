// Trace: one record per kernel launch with its metadata, the real start and end on this CPU, and
// its start and end on the modelled NPU timeline. Written as Chrome trace JSON (open it in
// Perfetto: ui.perfetto.dev, or chrome://tracing).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device/kernel.h"
#include "tensor/stream_fence.h"

namespace cubevec {

struct KernelRecord {
  KernelDesc desc;
  StreamTag stream = 0;
  std::string stream_label;
  double modelled_start_s = 0;  // on the modelled NPU timeline
  double modelled_end_s = 0;
  double real_start_s = -1;  // seconds since the trace's epoch; -1 until the kernel ran
  double real_end_s = -1;
  bool ran = false;  // false if skipped (simulate mode, or an earlier failure on its stream)
};

class Trace {
 public:
  Trace() : epoch_(std::chrono::steady_clock::now()) {}

  // Adds a record; the pointer stays valid until clear(). Thread-safe.
  KernelRecord* add(KernelRecord record);
  double now_s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count(); }
  std::chrono::steady_clock::time_point epoch() const { return epoch_; }  // real_start_s / real_end_s count from it
  std::vector<KernelRecord> records() const;                              // a copy; synchronize the device first
  void clear();

  // Chrome trace JSON of this trace alone (see write_chrome_trace).
  void write_chrome_json(const std::string& path, const std::string& device_name) const;

 private:
  mutable std::mutex mutex_;
  std::deque<KernelRecord> records_;
  std::chrono::steady_clock::time_point epoch_;
};

// One run's records under a name, for traces that show several runs side by side.
struct TraceSection {
  std::string name;
  std::vector<KernelRecord> records;
};

// Busy time of a set of [start, end) intervals (overlaps counted once), and the time two sets are
// busy at once: what a trace's Cube and Vector records give for CV overlap.
using Intervals = std::vector<std::pair<double, double>>;
double busy_time(Intervals intervals);
double overlap_time(Intervals a, Intervals b);

// Chrome trace JSON: per section, measured tracks per unit and per stream, and modelled NPU tracks
// per unit and per stream. Throws cubevec::Error if the file cannot be written.
void write_chrome_trace(const std::string& path, const std::vector<TraceSection>& sections);

}  // namespace cubevec
