// The default device is leaked on purpose (tensors may release storage after main()), so its unit
// threads can still be running kernels while static objects are destroyed. Every global those
// kernels use must outlive that: the program below returns with GEMMs in flight, and a global
// destroyed under them is a heap-use-after-free that the sanitizer tree reports (and that fails
// this test there; the release tree only checks the program exits cleanly).
#include <gtest/gtest.h>

#include "cli/run_cubevec.h"

namespace kernels_at_exit_test {

using namespace cubevec_cli_test;

class KernelsAtExit : public CliTest {};

TEST_F(KernelsAtExit, TheGlobalsTheyUseOutliveMain) {
  // 2,000 int8 GEMMs still queued at exit: with the tuner a plain static, ASan reported the
  // use-after-free on every one of several runs.
  const Process p = run_program({CUBEVEC_KERNELS_AT_EXIT, dir_.string()}, dir_);
  EXPECT_EQ(p.status, 0) << p.err;
  EXPECT_EQ(p.out, "enqueued\n");
  EXPECT_EQ(p.err.find("AddressSanitizer"), std::string::npos) << p.err;
}

}  // namespace kernels_at_exit_test
