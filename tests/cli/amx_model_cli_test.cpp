// CUBEVEC_AMX_MODEL=1 as a user checks the AMX code paths on a CPU without AMX: tinyflux in bf16
// and in W8A8_DYNAMIC with every GEMM and the int8 attention forced onto AMX (CUBEVEC_GEMM_BF16=amx,
// CUBEVEC_INT8_ISA=amx, --quant-attention int8, whose tiles prefer AMX) runs on the tile model, says
// so, saves nothing to the tuning file, and draws the picture the dot-product kernels draw within
// 40 dB PSNR (measured: 59-63 dB; the two differ only in f32 summation order). A bad value is a
// one-line error before any work; `tune` refuses to run on the model.
#include <string>
#include <vector>

#include "cli/run_cubevec.h"
#include "media/png.h"
#include "ops/gemm/driver.h"
#include "pipelines/quality.h"

namespace amx_model_cli_test {  // named after the file: unity batches never mix two files' helpers

using AmxModelCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::kTinyFlux;
const std::string kPrompt = "a large red circle in the center on a blue background";

TEST_F(AmxModelCli, TinyfluxOnTheTileModelDrawsWhatTheDotProductKernelsDraw) {
  if (!cubevec::ops::gemm::has_bf16_dot()) GTEST_SKIP() << "no AVX512-BF16: the tile model's kernels cannot run on this CPU";
  const auto q = run(
      {"quantize", "--model", kTinyFlux, "--algo", "W8A8_DYNAMIC", "--prompt", kPrompt, "--steps", "2", "--out", (dir_ / "q").string()});
  ASSERT_EQ(q.status, 0) << q.err;
  const std::string quant = (dir_ / "q" / "quant_model_description_w8a8_dynamic.json").string();
  struct Case {
    std::string name;
    std::vector<std::string> extra;
  };
  for (const Case& c : {Case{"bf16", {}}, Case{"w8a8", {"--quant", quant}}}) {
    std::filesystem::remove(dir_ / "tuning.json");
    SCOPED_TRACE(c.name);
    const auto render = [&](bool model) {
      const std::string out = (dir_ / (c.name + (model ? "-model.png" : "-dot.png"))).string();
      std::vector<std::string> argv = {"/usr/bin/env"};
      if (model) argv.insert(argv.end(), {"CUBEVEC_AMX_MODEL=1", "CUBEVEC_GEMM_BF16=amx", "CUBEVEC_INT8_ISA=amx"});
      // ... the run on the model with an attention picks file of its own, which it must not write either
      else argv.insert(argv.end(), {"CUBEVEC_GEMM_BF16=avx512bf16", "CUBEVEC_INT8_ISA=avx512_vnni"});
      argv.insert(argv.end(), {CUBEVEC_BINARY, "t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--steps", "6", "--dtype", "bf16",
                               "--quant-attention", "int8", "--tune-cache", (dir_ / "tuning.json").string(), "--out", out});
      argv.insert(argv.end(), c.extra.begin(), c.extra.end());
      if (model) argv.insert(argv.end(), {"--attn-tune-cache", (dir_ / "attention.json").string()});
      const auto r = cubevec_cli_test::run_program(argv, dir_);
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.err.find("AMX kernels run on a plain C++ model of the tiles") != std::string::npos, model) << r.err;
      if (model) {
        EXPECT_EQ(r.err.find("calibrations will be written there"), std::string::npos) << r.err;
      }
      return cubevec::media::read_png(out);
    };
    const auto on_model = render(true);
    // What a run on the model measured (its attention picks, its forced int8 kernel) is not saved.
    EXPECT_FALSE(std::filesystem::exists(dir_ / "tuning.json")) << "after the first run on the model";
    EXPECT_FALSE(std::filesystem::exists(dir_ / "attention.json"));
    const auto on_dots = render(false);
    const double db = cubevec::pipelines::compare_pixels({on_model}, {on_dots}).psnr_db;
    EXPECT_GE(db, 40.0);
    std::printf("%s: tile model against dot products %.1f dB\n", c.name.c_str(), db);
  }
}

TEST_F(AmxModelCli, ABadKernelVariableIsAnErrorBeforeAnyWork) {
  // Every variable that forces a kernel is read first: an error naming it, not the tuning file's.
  for (const char* variable : {"CUBEVEC_GEMM_ISA", "CUBEVEC_GEMM_BF16", "CUBEVEC_INT8_ISA"}) {
    const auto r = cubevec_cli_test::run_program(
        {"/usr/bin/env", std::string(variable) + "=junk", CUBEVEC_BINARY, "t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--steps", "1",
         "--out", (dir_ / "x.png").string(), "--tune-cache", (dir_ / "never.json").string()},
        dir_);
    EXPECT_EQ(r.status, 1) << variable;
    EXPECT_NE(r.err.find("error: " + std::string(variable) + "=junk"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("tuning file"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "x.png"));
  }
}

TEST_F(AmxModelCli, ABadValueIsAnErrorBeforeAnyWork) {
  const std::string out = (dir_ / "x.png").string();
  for (const char* value : {"yes", "2", "1 "}) {
    const auto r = cubevec_cli_test::run_program({"/usr/bin/env", std::string("CUBEVEC_AMX_MODEL=") + value, CUBEVEC_BINARY, "t2i",
                                                  "--model", kTinyFlux, "--prompt", kPrompt, "--steps", "1", "--out", out},
                                                 dir_);
    EXPECT_EQ(r.status, 1) << value;
    EXPECT_NE(r.err.find("CUBEVEC_AMX_MODEL=" + std::string(value) + ": expected 1"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("step 1/1"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << value;
  }
  // `tune` exists to save what it measures, which a run on the model never does.
  const auto tune = cubevec_cli_test::run_program(
      {"/usr/bin/env", "CUBEVEC_AMX_MODEL=1", CUBEVEC_BINARY, "tune", "--tune-cache", (dir_ / "t.json").string(), "--families", "int8"},
      dir_);
  EXPECT_EQ(tune.status, 1);
  EXPECT_NE(tune.err.find(cubevec::ops::gemm::has_bf16_dot() ? "a run on the AMX tile model saves nothing to the tuning file"
                                                             : "the AMX tile model needs AVX512-BF16"),
            std::string::npos)
      << tune.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "t.json"));
  EXPECT_EQ(tune.err.find("calibrations will be written there"), std::string::npos) << tune.err;
  // 0 and empty are off: an ordinary run.
  const auto off = cubevec_cli_test::run_program({"/usr/bin/env", "CUBEVEC_AMX_MODEL=0", CUBEVEC_BINARY, "t2i", "--model", kTinyFlux,
                                                  "--prompt", kPrompt, "--steps", "1", "--out", out},
                                                 dir_);
  EXPECT_EQ(off.status, 0) << off.err;
  EXPECT_EQ(off.err.find("tile model"), std::string::npos) << off.err;
}

}  // namespace amx_model_cli_test
