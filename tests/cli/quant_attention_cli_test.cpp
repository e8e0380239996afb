// `--quant-attention int8` as a user runs it: t2i on the tiny Flux model reports the stage and
// how many attention calls ran in int8 (or, on a CPU without AMX-INT8, refuses naming what it
// lacks); a simulated run prices it on any CPU; a bad value is a one-line error naming the flag.
#include <string>
#include <vector>

#include "cli/run_cubevec.h"
#include "ops/attention.h"

namespace quant_attention_cli_test {  // named after the file: unity batches never mix two files' helpers

using QuantAttentionCli = cubevec_cli_test::CliTest;

const std::string kTinyFlux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";

TEST_F(QuantAttentionCli, T2iReportsTheStageOrRefusesNamingTheCpu) {
  const auto r = run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "2", "--quant-attention", "int8", "--out",
                      (dir_ / "q.png").string()});
  if (cubevec::ops::attention_impl_available(cubevec::ops::AttentionImpl::flash_int8)) {
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("quant-attention int8"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(8 attention calls in int8)"), std::string::npos) << r.err;  // 2 steps x 4 blocks
  } else {
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("--quant-attention int8 needs AMX-INT8"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "q.png"));
  }
  const auto simulated =
      run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "2", "--quant-attention", "int8", "--simulate"});
  ASSERT_EQ(simulated.status, 0) << simulated.err;
  EXPECT_NE(simulated.err.find("(8 attention calls in int8)"), std::string::npos) << simulated.err;
}

TEST_F(QuantAttentionCli, BadValuesAndCombinationsAreOneLineErrors) {
  const auto sparse = run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "1", "--quant-attention", "int8", "--sparse",
                           "ada_bsa", "--simulate"});
  EXPECT_NE(sparse.status, 0);
  EXPECT_NE(sparse.err.find("--quant-attention with --sparse is not supported yet"), std::string::npos) << sparse.err;
  for (const char* value : {"fp8", "INT8", ""}) {
    const auto r = run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "1", "--quant-attention", value, "--out",
                        (dir_ / "q.png").string()});
    EXPECT_NE(r.status, 0) << value;
    EXPECT_NE(r.err.find("--quant-attention"), std::string::npos) << value << ": " << r.err;
    EXPECT_NE(r.err.find("none, int8"), std::string::npos) << value << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "q.png")) << value;
  }
}

}  // namespace quant_attention_cli_test
