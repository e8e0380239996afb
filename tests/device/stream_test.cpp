// Streams and events: ordering, cross-stream waits, real concurrency of the two units, error
// propagation without hangs, and the implicit dependencies of Note [Implicit dependencies].
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>

#include "device_test_util.h"

namespace cubevec {
namespace stream_test {  // named after the file: unity batches never mix two files' helpers

using namespace testing_ops;
using namespace std::chrono_literals;

// Waits up to 5 s for `flag`; true if it was set.
bool wait_for_flag(const std::atomic<bool>& flag) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(Stream, KernelsRunInLaunchOrderAcrossUnits) {
  Device device(two_thread_profile());
  Stream stream = device.new_stream("ordered");
  std::vector<int> order;
  std::mutex mutex;
  for (int i = 0; i < 200; ++i) {
    const Unit unit = (i % 3 == 0) ? Unit::cube : Unit::vector;
    stream.launch({"step", unit}, {}, {}, [&, i] {
      if (i % 17 == 0) std::this_thread::sleep_for(1ms);
      std::lock_guard lock(mutex);
      order.push_back(i);
    });
  }
  within_seconds(10, [&] { stream.synchronize(); });
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
}

TEST(Stream, EventWaitOrdersTwoStreams) {
  Device device(two_thread_profile());
  Stream producer = device.new_stream("producer"), consumer = device.new_stream("consumer");
  std::atomic<bool> produced{false}, saw_it{false};
  producer.launch({"produce", Unit::cube}, {}, {}, [&] {
    std::this_thread::sleep_for(50ms);
    produced = true;
  });
  const Event ready = producer.record();
  consumer.wait(ready);
  consumer.launch({"consume", Unit::vector}, {}, {}, [&] { saw_it = produced.load(); });
  within_seconds(10, [&] { consumer.synchronize(); });
  EXPECT_TRUE(saw_it) << "the consumer ran before the event it waited for";
  EXPECT_TRUE(ready.query());
}

TEST(Stream, CubeAndVectorKernelsOverlap) {
  // Each kernel waits for the other to start: both can finish only if they truly run together.
  Device device(two_thread_profile(), {.trace = true});
  Stream a = device.new_stream("a"), b = device.new_stream("b");
  std::atomic<bool> cube_started{false}, vector_started{false}, cube_saw{false}, vector_saw{false};
  a.launch({"cube_work", Unit::cube}, {}, {}, [&] {
    cube_started = true;
    cube_saw = wait_for_flag(vector_started);
    std::this_thread::sleep_for(20ms);
  });
  b.launch({"vector_work", Unit::vector}, {}, {}, [&] {
    vector_started = true;
    vector_saw = wait_for_flag(cube_started);
    std::this_thread::sleep_for(20ms);
  });
  within_seconds(20, [&] { device.synchronize(); });
  EXPECT_TRUE(cube_saw && vector_saw) << "the Cube and Vector kernels did not run at the same time";
  const auto records = device.trace().records();
  ASSERT_EQ(records.size(), 2u);
  const double overlap =
      std::min(records[0].real_end_s, records[1].real_end_s) - std::max(records[0].real_start_s, records[1].real_start_s);
  EXPECT_GT(overlap, 0.015) << "the trace should show the two kernels overlapping";
}

TEST(Stream, KernelFailureIsRethrownWithItsName) {
  Device device(two_thread_profile());
  Stream stream = device.new_stream();
  std::atomic<bool> later_ran{false};
  stream.launch({"exploding_kernel", Unit::cube}, {}, {}, [] { throw Error("bad tile size 0"); });
  stream.launch({"after", Unit::vector}, {}, {}, [&] { later_ran = true; });
  try {
    within_seconds(10, [&] { stream.synchronize(); });
    FAIL() << "expected the kernel's failure";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("kernel 'exploding_kernel' on the cube unit"), std::string::npos) << message;
    EXPECT_NE(message.find("bad tile size 0"), std::string::npos) << message;
  }
  EXPECT_FALSE(later_ran) << "work after a failure on the same stream is skipped";
  // Reported once; the stream then works again.
  std::atomic<bool> ran_again{false};
  stream.launch({"again", Unit::vector}, {}, {}, [&] { ran_again = true; });
  within_seconds(10, [&] { stream.synchronize(); });
  EXPECT_TRUE(ran_again);
}

TEST(Stream, PoisonedEventFailsWaitersInsteadOfHanging) {
  Device device(two_thread_profile());
  Stream producer = device.new_stream(), consumer = device.new_stream();
  producer.launch({"broken_producer", Unit::cube}, {}, {}, [] {
    std::this_thread::sleep_for(20ms);
    throw std::runtime_error("NaN in accumulator");
  });
  const Event done = producer.record();
  consumer.wait(done);
  std::atomic<bool> consumer_ran{false};
  consumer.launch({"consumer", Unit::vector}, {}, {}, [&] { consumer_ran = true; });
  EXPECT_THROW(within_seconds(10, [&] { done.synchronize(); }), Error);
  try {
    within_seconds(10, [&] { consumer.synchronize(); });
    FAIL() << "the waiting stream must fail too";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken_producer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("waited for work that failed"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(consumer_ran);
  EXPECT_THROW(producer.synchronize(), Error);
}

TEST(Stream, ReadAfterWriteAcrossStreamsNeedsNoExplicitSync) {
  Device device(two_thread_profile());
  Stream a = device.new_stream("a"), b = device.new_stream("b");
  const Tensor x = fill(a, {1000}, 2.0f, Unit::vector, /*sleep_ms=*/50);
  const Tensor y = fill(a, {1000}, 3.0f);
  const Tensor z = add(b, x, y);                                           // on another stream: must wait for a's writes
  const float* out = within_seconds(10, [&] { return z.data<float>(); });  // host read: waits for add
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out[i], 5.0f) << i;
}

TEST(Stream, ReadAfterWriteAcrossDevicesWaitsToo) {
  // Each device's default stream is its first: a tensor written by one device's default stream and
  // read by another's must still be waited for (stream ids are unique in the process).
  Device first(two_thread_profile()), second(two_thread_profile());
  const Tensor x = fill(first.default_stream(), {1000}, 2.0f, Unit::vector, /*sleep_ms=*/50);
  const Tensor y = fill(first.default_stream(), {1000}, 3.0f);
  const Tensor z = add(second.default_stream(), x, y);
  EXPECT_NE(first.default_stream().id(), second.default_stream().id());
  const float* out = within_seconds(10, [&] { return z.data<float>(); });
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out[i], 5.0f) << i;
}

TEST(Stream, WriteAfterReadAcrossStreamsWaitsForTheReader) {
  Device device(two_thread_profile());
  Stream a = device.new_stream("a"), b = device.new_stream("b");
  Tensor x = fill(a, {256}, 1.0f);
  const Tensor y = fill(a, {256}, 1.0f);
  const Tensor sum = add(a, x, y, /*sleep_ms=*/60);  // a slow read of x on stream a
  // Overwrite x on stream b: this must wait until the add has read it.
  b.launch({"overwrite", Unit::vector}, {}, {x}, [x] {
    auto* p = reinterpret_cast<float*>(x.unsynchronized_data_ptr());
    for (int i = 0; i < 256; ++i) p[i] = 100.0f;
  });
  const float* s = within_seconds(10, [&] { return sum.data<float>(); });
  for (int i = 0; i < 256; ++i) ASSERT_EQ(s[i], 2.0f) << "the add saw x after it was overwritten";
  const float* after = within_seconds(10, [&] { return x.data<float>(); });
  EXPECT_EQ(after[0], 100.0f);
}

TEST(Stream, HostWritesWaitForDeviceReaders) {
  Device device(two_thread_profile());
  Stream a = device.new_stream();
  Tensor x = fill(a, {64}, 1.0f);
  const Tensor y = fill(a, {64}, 2.0f);
  const Tensor sum = add(a, x, y, /*sleep_ms=*/50);
  float* p = within_seconds(10, [&] { return x.mutable_data<float>(); });  // waits for the add's read
  p[0] = -1.0f;
  EXPECT_EQ(sum.data<float>()[0], 3.0f);
}

TEST(Stream, DefaultStreamLooksSynchronous) {
  Device device(two_thread_profile());
  const Stream s = device.default_stream();
  const Tensor a = fill(s, {3, 3}, 1.5f);
  const Tensor b = fill(s, {3, 3}, 2.0f);
  const Tensor c = matmul(s, a, b);
  EXPECT_EQ(c.at<float>({2, 1}), 9.0f);  // 3 * 1.5 * 2, read right after launching
}

TEST(Stream, FreedMemoryIsNotHandedToAnotherStreamWhileInUse) {
  Device device(two_thread_profile());
  Stream a = device.new_stream("a"), b = device.new_stream("b");
  std::atomic<bool> release{false};
  const void* first = nullptr;
  {
    Tensor x = device.empty({1 << 16}, DType::f32, a);
    first = x.unsynchronized_data_ptr();
    a.launch({"long_reader", Unit::vector}, {x}, {}, [&] { wait_for_flag(release); });
  }  // the host drops x while stream a still uses it
  Tensor y = device.empty({1 << 16}, DType::f32, b);
  EXPECT_NE(y.unsynchronized_data_ptr(), first) << "stream b got memory stream a is still reading";
  release = true;
  within_seconds(10, [&] { device.synchronize(); });
  Tensor z = device.empty({1 << 16}, DType::f32, b);
  EXPECT_EQ(z.unsynchronized_data_ptr(), first) << "after the stream passed the fence, the block is reused";
}

// The host stops launching once the queued kernels write more than the stream's byte bound
// (8 MiB), well before the 32-kernel bound: sixteen 1 MiB outputs behind a blocked kernel.
TEST(Stream, HostWaitsWhenQueuedKernelsWriteTooManyBytes) {
  Device device(two_thread_profile());
  Stream s = device.new_stream("bounded");
  std::atomic<bool> release{false};
  std::atomic<int> launched{0};
  constexpr int kLaunches = 16;
  auto host = std::async(std::launch::async, [&] {
    s.launch({"blocker", Unit::vector}, {}, {}, [&] { wait_for_flag(release); });
    for (int i = 0; i < kLaunches; ++i) {
      const Tensor out = device.empty({1 << 18}, DType::f32, s);  // 1 MiB
      s.launch({"writer", Unit::vector}, {}, {out}, [] {});
      launched += 1;
    }
  });
  std::this_thread::sleep_for(200ms);  // far longer than ten launches take when nothing stops them
  EXPECT_LT(launched.load(), kLaunches) << "the host queued " << launched.load() << " kernels writing 1 MiB each behind a blocked one";
  EXPECT_GE(launched.load(), 3) << "the host stopped before the byte bound";
  release = true;
  within_seconds(10, [&] {
    host.get();
    s.synchronize();
  });
  EXPECT_EQ(launched.load(), kLaunches);
}

TEST(Stream, KernelsMayReadTheirOwnTensorsThroughTheSyncedAccessors) {
  // Inside a kernel the host-side waits are skipped (they would wait for the kernel itself).
  Device device(two_thread_profile());
  const Stream s = device.new_stream();
  const Tensor x = fill(s, {4}, 7.0f);
  float seen = 0;
  s.launch({"reader", Unit::vector}, {x}, {}, [&, x] { seen = x.data<float>()[3]; });
  within_seconds(10, [&] { s.synchronize(); });
  EXPECT_EQ(seen, 7.0f);
}

}  // namespace stream_test
}  // namespace cubevec
