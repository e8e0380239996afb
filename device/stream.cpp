#include "device/stream.h"

#include "device/cost_model.h"
#include "device/device.h"
#include "device/stream_state.h"
#include "base/error.h"
#include "base/interrupt.h"

namespace cubevec {

namespace {

// The kernels a stream may have launched but not run before the host waits, and how far it then
// lets the stream drain: enough lookahead to keep both units fed, few enough that the tensors they
// pin are about a block's activations. Waiting down to half rather than one kernel at a time
// keeps a wait (a thread wake-up, ~3 us) to one per 16 launches (`cubevec-bench launch`).
constexpr std::size_t kMaxKernelsInFlight = 32;
constexpr std::size_t kKernelsInFlightAfterWait = 16;
// The same bound on the bytes the queued kernels write. Each written tensor is pinned until its
// kernel has run, so 32 kernels of a 512x512 VAE decode pinned about 500 MB, which a one-shot run
// took fresh from the OS (first touch at 1-2 GB/s on the VMs measured; reused memory 20-38 GB/s).
// FLUX-width decode on Zen 4 (three runs each, with the allocator's spare blocks): no byte bound
// 0.46-0.67 s, 32 MiB 0.37-0.58 s, 16 MiB 0.27-0.40 s, 8 MiB 0.28-0.37 s; the denoising steps and
// the tiny models within the noise. A kernel that writes megabytes runs for a millisecond or more,
// so one queued kernel keeps the unit busy while the host catches up.
constexpr std::size_t kMaxBytesInFlight = std::size_t{8} << 20;
constexpr std::size_t kBytesInFlightAfterWait = std::size_t{4} << 20;

// What a launch on `stream` must wait for before touching `storage`: events not yet reached are
// queued as waits; every event of another stream also bounds the modelled start (`ready_s`), so the
// modelled timeline never depends on how fast this CPU happened to be.
void collect_waits(const Storage& storage, bool writes, StreamTag stream, std::vector<std::shared_ptr<EventState>>& waits,
                   double& ready_s) {
  const Storage::Uses uses = storage.uses();
  const auto consider = [&](const FencePtr& fence) {
    if (!fence || fence->stream() == stream) return;
    auto event = std::dynamic_pointer_cast<const EventState>(fence);
    if (!event) {  // a fence from outside this device's streams: wait for it here
      fence->host_wait();
      return;
    }
    ready_s = std::max(ready_s, event->modelled_time_s());
    if (!event->passed()) waits.push_back(std::const_pointer_cast<EventState>(event));
  };
  consider(uses.writer);
  if (writes)
    for (const auto& reader : uses.readers) consider(reader);
}

}  // namespace

StreamTag Stream::id() const { return state_->id; }
const std::string& Stream::label() const { return state_->label; }
Device& Stream::device() const { return state_->device; }

void Stream::launch(const KernelDesc& kernel, const std::vector<Tensor>& reads, const std::vector<Tensor>& writes, KernelBody body) const {
  throw_if_interrupted();  // Ctrl-C stops the run after the kernel that is running
  StreamState& s = *state_;
  Device& device = s.device;
  const ModelledCost cost = model_kernel(device.profile(), kernel);

  std::shared_ptr<EventState> oldest;  // set when the host is too far ahead of the stream: wait for it
  {
    std::lock_guard lock(s.launch_mutex);
    std::vector<std::shared_ptr<EventState>> waits;
    double ready_s = s.modelled_clock_s;  // the modelled start: after the stream's previous work,
    StreamTask task;                      // the other streams' producers, and a free unit
    // Meta tensors take part too, so simulated work is ordered exactly like real work.
    for (const Tensor& t : reads)
      if (t.storage()) {
        collect_waits(*t.storage(), false, s.id, waits, ready_s);
        task.keep_alive.push_back(t.storage());
      }
    for (const Tensor& t : writes)
      if (t.storage()) {
        collect_waits(*t.storage(), true, s.id, waits, ready_s);
        task.keep_alive.push_back(t.storage());
      }

    // The host issues kernels one after another (eager launch): none starts before it is issued.
    s.modelled_host_s += device.profile().host_issue_us * 1e-6;
    ready_s = std::max(ready_s, s.modelled_host_s);
    const auto [start_s, end_s] = device.schedule_modelled(kernel, ready_s, cost);
    s.modelled_clock_s = end_s;

    task.kind = StreamTask::Kind::kernel;
    task.event = std::make_shared<EventState>(s.id, s.modelled_clock_s);
    task.name = kernel.name;
    task.unit = kernel.unit;
    task.body = std::move(body);
    if (device.tracing()) task.record = device.trace().add({kernel, s.id, s.label, start_s, s.modelled_clock_s});
    for (const Tensor& t : reads)
      if (t.storage()) t.storage()->record_read(task.event);
    for (const Tensor& t : writes)
      if (t.storage()) t.storage()->record_write(task.event);

    for (auto& w : waits) {
      StreamTask wait;
      wait.kind = StreamTask::Kind::wait;
      wait.event = std::move(w);
      s.push(std::move(wait));
    }
    std::size_t written = 0;
    for (const Tensor& t : writes)
      if (t.storage()) written += t.nbytes();
    s.in_flight.push_back({task.event, written});
    s.in_flight_bytes += written;
    const auto drop_oldest = [&] {
      s.in_flight_bytes -= s.in_flight.front().bytes;
      s.in_flight.pop_front();
    };
    while (!s.in_flight.empty() && s.in_flight.front().event->passed()) drop_oldest();
    if (s.in_flight.size() > kMaxKernelsInFlight || s.in_flight_bytes > kMaxBytesInFlight) {
      // In-order: once the last kernel dropped has run, so have all before it.
      while (s.in_flight.size() > kKernelsInFlightAfterWait || s.in_flight_bytes > kBytesInFlightAfterWait) {
        if (s.in_flight.size() == 1) break;  // the kernel just launched: nothing to wait for before it
        oldest = s.in_flight.front().event;
        drop_oldest();
      }
    }
    s.push(std::move(task));
  }
  // Every launched kernel keeps its tensors alive until it has run, so a host racing ahead of the
  // device would hold the activations of a whole forward (a 1024x1024 VAE decode: tens of GB)
  // where eager execution holds a few. The host waits here instead, outside the launch lock; not
  // inside a kernel, which may be the very work waited for. A failure is left for synchronize().
  if (oldest && !inside_kernel()) {
    try {
      oldest->host_wait();
    } catch (const Error&) {
    }
  }
}

Event Stream::record() const {
  StreamState& s = *state_;
  std::lock_guard lock(s.launch_mutex);
  StreamTask task;
  task.kind = StreamTask::Kind::record;
  task.event = std::make_shared<EventState>(s.id, s.modelled_clock_s);
  Event event(task.event);
  s.push(std::move(task));
  return event;
}

void Stream::wait(const Event& event) const {
  if (!event.state()) return;
  StreamState& s = *state_;
  std::lock_guard lock(s.launch_mutex);
  s.modelled_clock_s = std::max(s.modelled_clock_s, event.state()->modelled_time_s());
  StreamTask task;
  task.kind = StreamTask::Kind::wait;
  task.event = event.state();
  s.push(std::move(task));
}

void Stream::synchronize() const {
  const Event done = record();
  try {
    done.synchronize();
  } catch (...) {
    state_->take_failure();  // reported now; the stream carries on clean
    throw;
  }
}

double Stream::modelled_time_s() const {
  std::lock_guard lock(state_->launch_mutex);
  return state_->modelled_clock_s;
}

}  // namespace cubevec
