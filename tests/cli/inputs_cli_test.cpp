// Inputs mean what they say: non-finite numbers and negative unsigned values are refused for every
// flag (by type, tests/cli sees a sample), range flags say whether the value is no number of the
// kind or out of range, a prompt without words is the empty-prompt error, and
// thread counts beyond what helps are refused naming where they came from.
#include <thread>

#include "cli/run_cubevec.h"

namespace inputs_cli_test {  // named after the file: unity batches never mix two files' helpers

using InputsCli = cubevec_cli_test::CliTest;

using cubevec_cli_test::kTinyFlux;
const std::string kFluxConfig = std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/flux1-dev";
using cubevec_cli_test::kTinyWan;

TEST_F(InputsCli, NumbersMustBeFiniteAndUnsignedValuesNonNegative) {
  const std::string out = (dir_ / "x.jpg").string();
  const int limit = 16 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--seed", "-1"}, "--seed: must not be negative, got -1"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--guidance", "nan"},
       "--guidance: must be a finite number, got nan"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--seed", "18446744073709551616"},
       "--seed: must be below 2^64, got 18446744073709551616"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--cfg-scale", "NaN"},
       "--cfg-scale: must be a finite number, got NaN"},
      {{"quantize", "--model", kTinyFlux, "--algo", "W8A8", "--prompt", "a red circle", "--out", (dir_ / "q").string(), "--seed", " -3"},
       "--seed: must not be negative"},
      {{"t2i", "--model", kTinyFlux, "--prompt", " ,. ", "--out", out}, "--prompt TEXT is required (' ,. ' has no words)"},
      {{"t2i", "--simulate", "--model", kFluxConfig, "--steps", "1", "--threads", std::to_string(limit + 1)},
       "--cube-threads (or --threads) " + std::to_string(limit + 1) + " is above this machine's limit of " + std::to_string(limit)},
      {{"cv-experiment", "--vector-threads", std::to_string(limit + 1)}, "--vector-threads " + std::to_string(limit + 1) + " is above"},
      // Range flags name what the value is not (CLI11's Range said "Value abc not in range").
      {{"t2v", "--simulate", "--model", kTinyWan, "--frames", "abc"}, "--frames: 'abc' is not an integer from 1 to 4097"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--steps", "1.5"},
       "--steps: '1.5' is not an integer from 1 to 1000"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--steps", "0"},
       "--steps: 0 is out of range: expected an integer from 1 to 1000"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--guidance", "x2"},
       "--guidance: 'x2' is not a finite number from 0 to 100"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--guidance", "101"},
       "--guidance: 101 is out of range: expected a finite number from 0 to 100"},
      // Integers are decimal (CLI11 alone reads 0x10 as 16; the environment's counts never did).
      {{"t2i", "--simulate", "--model", kFluxConfig, "--steps", "1", "--cube-threads", "0x10"},
       "--cube-threads: '0x10' is not an integer from 1 to 4096"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", out, "--steps", "0b11"},
       "--steps: '0b11' is not an integer from 1 to 1000"},
      {{"serve", "--model", kTinyFlux, "--instances", "abc"}, "--instances: 'abc' is not an integer from 1 to 64"},
      {{"serve", "--model", kTinyFlux, "--instances", "0x2"}, "--instances: '0x2' is not an integer from 1 to 64"},
  };
  for (const auto& c : cases) {
    const auto r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.message << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace inputs_cli_test
