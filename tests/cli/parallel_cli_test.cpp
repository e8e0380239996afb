// Multi-device runs as a user starts them: `mpirun -np N cubevec forward|t2i ... --ulysses U
// --cfg-parallel C` on the tiny Flux and Wan checkpoints agrees with the single-device run (within
// 1e-5 of the output scale for a forward, within 2 JPEG levels for a picture); degrees that do not
// match the ranks, and head counts the Ulysses degree does not divide, are one-line errors on every
// rank and no rank hangs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "cli/tiny_prompt_embeds.h"
#include "models/flux_transformer.h"
#include "models/parameters.h"
#include "media/avi.h"
#include "media/jpeg.h"
#include "media/png.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace parallel_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using ParallelCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::Process;
using cubevec_cli_test::read_file;

using cubevec_cli_test::kData;

// `mpirun -np ranks cubevec args...`.
Process run_mpi(int ranks, const std::vector<std::string>& args, const fs::path& scratch) {
  std::vector<std::string> argv = cubevec_cli_test::mpirun_command(scratch);
  argv.insert(argv.end(), {"-np", std::to_string(ranks), CUBEVEC_BINARY});
  argv.insert(argv.end(), args.begin(), args.end());
  return cubevec_cli_test::run_program(argv, scratch);
}

// The transformer inputs of a golden file (its "transformer.*" tensors that forward takes).
std::string write_forward_inputs(const fs::path& dir, const std::string& goldens, const std::vector<std::string>& names) {
  const cubevec::SafetensorsFile g = cubevec::SafetensorsFile::open((kData / goldens).string());
  cubevec::NamedTensors inputs;
  for (const std::string& n : names) inputs.push_back({n, g.tensor("transformer." + n)});
  const std::string path = (dir / (goldens + ".inputs.safetensors")).string();
  cubevec::write_safetensors(path, inputs);
  return path;
}

// The tiny transformers a sharded forward is checked on, with the goldens holding their inputs.
struct ForwardCase {
  std::string model, goldens;
  std::vector<std::string> inputs;
};
const std::vector<ForwardCase> kForwardCases = {
    {"flux_tiny",
     "goldens_flux.safetensors",
     {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids", "guidance"}},
    {"wan_tiny", "goldens_wan.safetensors", {"hidden_states", "encoder_hidden_states", "timestep"}}};

// Complete ("X") comm-unit events of a Chrome trace whose name starts with `prefix`.
int count_comm_kernels(const std::string& trace, const std::string& prefix) {
  const nlohmann::json events = nlohmann::json::parse(read_file(trace));
  int count = 0;
  for (const auto& e : events.at("traceEvents")) {
    const auto ph = e.find("ph"), cat = e.find("cat"), name = e.find("name");
    if (ph == e.end() || cat == e.end() || name == e.end() || !name->is_string()) continue;
    if (*ph == "X" && *cat == "comm" && name->get_ref<const std::string&>().rfind(prefix, 0) == 0) ++count;
  }
  return count;
}

// The largest difference between two pictures, in JPEG levels (256 for different sizes).
int worst_level_difference(const cubevec::media::RgbImage& a, const cubevec::media::RgbImage& b) {
  if (a.pixels.size() != b.pixels.size()) return 256;
  int worst = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i) worst = std::max(worst, std::abs(int(a.pixels[i]) - int(b.pixels[i])));
  return worst;
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST_F(ParallelCli, UlyssesForwardMatchesOneDeviceOnFluxAndWan) {
  for (const ForwardCase& c : kForwardCases) {
    const std::string inputs = write_forward_inputs(dir_, c.goldens, c.inputs);
    const std::string model = (kData / c.model / "transformer").string();
    const std::string one = (dir_ / "one.safetensors").string(), two = (dir_ / "two.safetensors").string();
    const auto single = run({"forward", "--model", model, "--inputs", inputs, "--out", one});
    ASSERT_EQ(single.status, 0) << single.err;
    const auto sharded = run_mpi(2, {"forward", "--model", model, "--inputs", inputs, "--out", two, "--ulysses", "2"}, dir_);
    ASSERT_EQ(sharded.status, 0) << sharded.err;
    EXPECT_NE(sharded.err.find("rank 1 of 2, --ulysses 2"), std::string::npos) << sharded.err;
    cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(two).tensor("sample"),
                                       cubevec::SafetensorsFile::open(one).tensor("sample"), 1e-5, c.model + " ulysses 2");
  }
}

// Wan2.2 TI2V's per-token timesteps (frame 0's tokens at 0) with the tokens split: each rank's
// blocks take its rows of the timestep masks (the tiny TI2V transformer, 18 tokens).
TEST_F(ParallelCli, PerTokenTimestepsFollowTheSplitTokens) {
  const cubevec::SafetensorsFile g = cubevec::SafetensorsFile::open((kData / "goldens_wan22.safetensors").string());
  const std::string inputs = (dir_ / "ti2v.inputs.safetensors").string();
  cubevec::write_safetensors(inputs, {{"hidden_states", g.tensor("transformer_ti2v.hidden_states")},
                                      {"timestep", g.tensor("transformer_ti2v.timestep")},
                                      {"encoder_hidden_states", g.tensor("transformer_ti2v.encoder_hidden_states")}});
  const std::string model = (kData / "wan22_ti2v_tiny" / "transformer").string();
  for (const auto& degrees : {std::vector<std::string>{"--ulysses", "2"}, std::vector<std::string>{"--ring", "2"}}) {
    const std::string out = (dir_ / "ti2v.safetensors").string();
    const auto sharded = run_mpi(2, with({"forward", "--model", model, "--inputs", inputs, "--out", out}, degrees), dir_);
    ASSERT_EQ(sharded.status, 0) << sharded.err;
    cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), g.tensor("transformer_ti2v.sample"), 1e-4,
                                       "TI2V per-token forward, " + degrees[0] + " 2");
  }
}

// Ring attention alone (2 ranks) and with Ulysses (2 x 2 on 4 ranks), tensor parallel alone and
// with ring, on the tiny Flux (joint attention: the text keys attended once on each rank; the
// single blocks' proj_out over [attention; MLP] shares) and the tiny Wan (self and cross attention,
// the q / k RMSNorm over all heads' channels).
TEST_F(ParallelCli, RingTensorParallelAndTheirCombinationsMatchOneDevice) {
  for (const ForwardCase& c : kForwardCases) {
    const std::string inputs = write_forward_inputs(dir_, c.goldens, c.inputs);
    const std::string model = (kData / c.model / "transformer").string();
    const std::string one = (dir_ / "one.safetensors").string();
    const auto single = run({"forward", "--model", model, "--inputs", inputs, "--out", one});
    ASSERT_EQ(single.status, 0) << single.err;
    const cubevec::Tensor want = cubevec::SafetensorsFile::open(one).tensor("sample");
    const struct {
      int ranks;
      std::vector<std::string> degrees;
      std::string stage;
    } runs[] = {{2, {"--ring", "2"}, "ring x2"},
                {4, {"--ulysses", "2", "--ring", "2"}, "ulysses x2 ring x2"},
                {2, {"--tp", "2"}, "tensor parallel x2"},
                {4, {"--tp", "2", "--ring", "2"}, "tensor parallel x2"}};
    for (const auto& r : runs) {
      const std::string out = (dir_ / ("ring" + std::to_string(r.ranks) + ".safetensors")).string();
      std::vector<std::string> args = {"forward", "--model", model, "--inputs", inputs, "--out", out};
      args.insert(args.end(), r.degrees.begin(), r.degrees.end());
      const auto sharded = run_mpi(r.ranks, args, dir_);
      ASSERT_EQ(sharded.status, 0) << sharded.err;
      EXPECT_NE(sharded.err.find(r.stage), std::string::npos) << sharded.err;
      cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), want, 1e-5, c.model + " " + r.stage);
    }
  }
}

TEST_F(ParallelCli, DegreesMustMatchTheRanksBeforeAnyWork) {
  const std::string inputs =
      write_forward_inputs(dir_, "goldens_flux.safetensors",
                           {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids", "guidance"});
  const std::string model = (kData / "flux_tiny" / "transformer").string(), out = (dir_ / "o.safetensors").string();
  const auto alone = run({"forward", "--model", model, "--inputs", inputs, "--out", out, "--ulysses", "2"});
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(
      alone.err.find("--ulysses 2 x --ring 1 x --cfg-parallel 1 x --tp 1 = 2 rank(s), but this run has one: start it with mpirun -np 2"),
      std::string::npos)
      << alone.err;
  const auto fewer = run_mpi(2, {"forward", "--model", model, "--inputs", inputs, "--out", out, "--ulysses", "4"}, dir_);
  EXPECT_NE(fewer.status, 0);
  for (const char* rank : {"error: rank 0: ", "error: rank 1: "})
    EXPECT_NE(fewer.err.find(std::string(rank) + "--ulysses 4 x --ring 1 x --cfg-parallel 1 x --tp 1 = 4 rank(s), but mpirun started 2"),
              std::string::npos)
        << fewer.err;
  EXPECT_FALSE(fs::exists(out));
  // The tiny Flux has 2 heads: 4 ranks cannot share them.
  const auto heads = run_mpi(4, {"forward", "--model", model, "--inputs", inputs, "--out", out, "--ulysses", "4"}, dir_);
  EXPECT_NE(heads.status, 0);
  EXPECT_NE(heads.err.find("has 2 heads, which 4 ranks cannot share evenly"), std::string::npos) << heads.err;
  EXPECT_FALSE(fs::exists(out));
  const std::string embeds = cubevec_cli_test::flux_embeds(dir_);
  const auto t2i = run_mpi(4,
                           {"t2i", "--model", (kData / "flux_tiny").string(), "--prompt-embeds", embeds, "--width", "32", "--height", "32",
                            "--steps", "1", "--out", (dir_ / "h.jpg").string(), "--ulysses", "4"},
                           dir_);
  EXPECT_NE(t2i.status, 0);
  EXPECT_NE(t2i.err.find("--ulysses 4 must divide the transformer's 2 attention heads"), std::string::npos) << t2i.err;
  EXPECT_FALSE(fs::exists(dir_ / "h.jpg"));
  const auto tp_heads = run_mpi(4, {"forward", "--model", model, "--inputs", inputs, "--out", out, "--tp", "4"}, dir_);
  EXPECT_NE(tp_heads.status, 0);
  EXPECT_NE(tp_heads.err.find("--tp 4 must divide the transformer's 2 attention heads"), std::string::npos) << tp_heads.err;
  EXPECT_FALSE(fs::exists(out));
  const auto both_heads = run_mpi(4,
                                  {"t2i", "--model", (kData / "flux_tiny").string(), "--prompt-embeds", embeds, "--width", "32", "--height",
                                   "32", "--steps", "1", "--out", (dir_ / "h.jpg").string(), "--ulysses", "2", "--tp", "2"},
                                  dir_);
  EXPECT_NE(both_heads.status, 0);
  EXPECT_NE(both_heads.err.find("--ulysses 2 x --tp 2 = 4 must divide the transformer's 2 attention heads"), std::string::npos)
      << both_heads.err;
  const auto vae =
      run_mpi(2, {"forward", "--model", (kData / "flux_tiny" / "vae").string(), "--inputs", inputs, "--out", out, "--tp", "2"}, dir_);
  EXPECT_NE(vae.status, 0);
  EXPECT_NE(vae.err.find("--tp shards a transformer's layers;"), std::string::npos) << vae.err;
  const auto quant = run_mpi(2, {"forward", "--model", model, "--inputs", inputs, "--out", out, "--tp", "2", "--quant", "q.json"}, dir_);
  EXPECT_NE(quant.status, 0);
  EXPECT_NE(quant.err.find("--quant with --tp is not supported yet"), std::string::npos) << quant.err;
  const auto timeout = run({"forward", "--model", model, "--inputs", inputs, "--out", out, "--comm-timeout", "0"});
  EXPECT_EQ(timeout.status, 1);
  EXPECT_NE(timeout.err.find("--comm-timeout must be a positive number of seconds, got 0"), std::string::npos) << timeout.err;
}

// Two experts (the tiny Wan2.2 A14B): tensor parallel cuts both experts by the one plan; the
// lossless frames stay within 2 levels of one device's.
TEST_F(ParallelCli, TwoExpertsUnderTensorParallelDrawTheOneDeviceFrames) {
  const std::vector<std::string>& t2v = cubevec_cli_test::kTinyA14bRun;
  const auto frames = [&](const std::string& name) { return cubevec_cli_test::read_frames((dir_ / name).string(), 9); };
  ASSERT_EQ(run(with(t2v, {"--out", (dir_ / "one.avi").string(), "--frames-dir", (dir_ / "one").string()})).status, 0);
  const auto tp = run_mpi(2, with(t2v, {"--tp", "2", "--out", (dir_ / "tp.avi").string(), "--frames-dir", (dir_ / "tp").string()}), dir_);
  ASSERT_EQ(tp.status, 0) << tp.err;
  EXPECT_NE(tp.err.find("tensor parallel x2"), std::string::npos) << tp.err;
  const auto one = frames("one"), sharded = frames("tp");
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_LE(worst_level_difference(sharded[i], one[i]), 2) << "frame " << i;
}

TEST_F(ParallelCli, CfgParallelAndUlyssesDrawTheOneDevicePicture) {
  const std::string embeds = cubevec_cli_test::flux_embeds(dir_), model = (kData / "flux_tiny").string();
  const std::vector<std::string> common = {"t2i", "--model", model, "--prompt-embeds", embeds,  "--width",     "32", "--height",
                                           "32",  "--steps", "2",   "--cfg",           "fused", "--cfg-scale", "3"};
  auto with = [&](std::vector<std::string> extra, const std::string& out) {
    std::vector<std::string> args = common;
    args.insert(args.end(), {"--out", (dir_ / out).string()});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const auto single = run(with({}, "one.jpg"));
  ASSERT_EQ(single.status, 0) << single.err;
  const std::string report = (dir_ / "cfg.json").string();
  const auto cfg = run_mpi(2, with({"--cfg-parallel", "2", "--json", report}, "cfg.jpg"), dir_);
  ASSERT_EQ(cfg.status, 0) << cfg.err;
  // One all-gather of the two velocities per step, reported in the stage table and the JSON.
  EXPECT_NE(cfg.err.find("(2 collectives, "), std::string::npos) << cfg.err;
  const nlohmann::json json = nlohmann::json::parse(cubevec_cli_test::read_file(report));
  EXPECT_EQ(json["communication"]["collectives"], 2) << json.dump();
  EXPECT_GT(json["communication"]["link_bytes"].get<double>(), 0) << json.dump();
  const auto both = run_mpi(4, with({"--cfg-parallel", "2", "--ulysses", "2"}, "both.jpg"), dir_);
  ASSERT_EQ(both.status, 0) << both.err;
  EXPECT_NE(both.err.find("ulysses x2"), std::string::npos) << both.err;
  const auto ring = run_mpi(4, with({"--cfg-parallel", "2", "--ring", "2"}, "ring.jpg"), dir_);
  ASSERT_EQ(ring.status, 0) << ring.err;
  EXPECT_NE(ring.err.find("ring x2"), std::string::npos) << ring.err;
  const auto tp = run_mpi(4, with({"--cfg-parallel", "2", "--tp", "2"}, "tp.jpg"), dir_);
  ASSERT_EQ(tp.status, 0) << tp.err;
  EXPECT_NE(tp.err.find("tensor parallel x2"), std::string::npos) << tp.err;
  const cubevec::media::RgbImage want = cubevec::media::read_jpeg((dir_ / "one.jpg").string());
  for (const char* out : {"cfg.jpg", "both.jpg", "ring.jpg", "tp.jpg"}) {
    EXPECT_LE(worst_level_difference(cubevec::media::read_jpeg((dir_ / out).string()), want), 2) << out;
  }
  // CFG parallel needs CFG on.
  std::vector<std::string> off = with({"--cfg-parallel", "2"}, "off.jpg");
  off[std::find(off.begin(), off.end(), "fused") - off.begin()] = "off";
  const auto refused = run_mpi(2, off, dir_);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("--cfg-parallel 2 runs the two CFG branches on two ranks, but --cfg is off"), std::string::npos)
      << refused.err;
  // Ring attention computes the attention itself: sparse attention cannot sit below it.
  const auto sparse = run_mpi(2, with({"--ring", "2", "--sparse", "ada_bsa"}, "sparse.jpg"), dir_);
  EXPECT_NE(sparse.status, 0);
  EXPECT_NE(sparse.err.find("cannot run with ring x2, which computes the attention itself"), std::string::npos) << sparse.err;
  EXPECT_FALSE(fs::exists(dir_ / "sparse.jpg"));
}

TEST_F(ParallelCli, SimulateModelsManyCardsInOneProcess) {
  // FLUX.1-dev's configs on the 910B profile, 1 and 4 modelled cards sharing the tokens.
  const std::string model = std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/flux1-dev";
  const std::string profile = std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/ascend-910b.json";
  std::vector<double> step_s;
  for (const char* ranks : {"1", "4"}) {
    const std::string json_path = (dir_ / (std::string(ranks) + ".json")).string(), trace = (dir_ / "trace.json").string();
    const auto r = run({"t2i", "--simulate", "--model", model, "--steps", "2", "--device-profile", profile, "--dtype", "bf16", "--ranks",
                        ranks, "--ulysses", ranks, "--json", json_path, "--trace", trace});
    ASSERT_EQ(r.status, 0) << r.err;
    step_s.push_back(nlohmann::json::parse(read_file(json_path))["modelled_step_mean_s"].get<double>());
    if (std::string(ranks) == "4") {
      // Every joint attention's q, k, v and output cross the ring of cards: 57 blocks x 4 per step.
      EXPECT_EQ(count_comm_kernels(trace, "all_to_all"), 2 * 2 * 57 * 4)
          << "2 steps; each kernel on the modelled by-unit and by-stream tracks";
    }
  }
  // The profile's cube and attention efficiencies were calibrated on MindIE SD's published 0.652 s/step
  // (FLUX.1-dev, 1024x1024, one 910B, fused attention and compile backend): it must stay so.
  EXPECT_NEAR(step_s[0], 0.652, 0.652 * 0.01);
  EXPECT_LT(step_s[1], step_s[0] / 2) << "4 modelled cards take less than half the time of one";
  {
    // Ring attention on 4 modelled cards: K and V pass 3 times around the ring per attention.
    const std::string json_path = (dir_ / "ring.json").string(), trace = (dir_ / "ring_trace.json").string();
    const auto r = run({"t2i", "--simulate", "--model", model, "--steps", "1", "--device-profile", profile, "--dtype", "bf16", "--ranks",
                        "4", "--ring", "4", "--json", json_path, "--trace", trace});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(count_comm_kernels(trace, "send_recv"), 2 * 57 * 3 * 2)
        << "k and v, 3 ring steps, 57 blocks; on the by-unit and by-stream tracks";
    const nlohmann::json report = nlohmann::json::parse(read_file(json_path));
    EXPECT_LT(report["modelled_step_mean_s"].get<double>(), step_s[0] / 2);
  }
  {
    // Tensor parallel on 2 modelled cards: an all-reduce after each row-split Linear, 19 double blocks
    // x 4 and 38 single blocks x 1.
    const std::string trace = (dir_ / "tp_trace.json").string();
    const auto r = run({"t2i", "--simulate", "--model", model, "--steps", "1", "--device-profile", profile, "--dtype", "bf16", "--ranks",
                        "2", "--tp", "2", "--trace", trace});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(count_comm_kernels(trace, "all_reduce"), 2 * (19 * 4 + 38)) << "on the by-unit and by-stream tracks";
  }
  const auto alone = run({"t2i", "--model", model, "--ranks", "2", "--ulysses", "2", "--out", (dir_ / "x.jpg").string()});
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(alone.err.find("--ranks models that many cards in one process and needs --simulate"), std::string::npos) << alone.err;
  // More ranks than tokens: every rank (here the modelled rank 0, which holds one) refuses.
  const auto few =
      run({"t2i", "--simulate", "--model", model, "--width", "64", "--height", "64", "--steps", "1", "--ranks", "32", "--ring", "32"});
  EXPECT_EQ(few.status, 1);
  EXPECT_NE(few.err.find("ring x32: 16 tokens cannot be shared by 32 ranks (each needs at least one)"), std::string::npos) << few.err;
  const auto product = run({"t2i", "--simulate", "--model", model, "--steps", "1", "--ranks", "8", "--ulysses", "2"});
  EXPECT_EQ(product.status, 1);
  EXPECT_NE(product.err.find("--ulysses 2 x --ring 1 x --cfg-parallel 1 x --tp 1 = 2 rank(s), but --ranks is 8"), std::string::npos)
      << product.err;
}

// --vae-parallel on top of a sharded transformer gives the picture (video) of the same run
// without it: the same latents, decoded by every rank instead of rank 0 alone.
TEST_F(ParallelCli, VaeParallelDecodesThePictureAndVideoOfOneDecoder) {
  struct Degrees {
    int ranks;
    std::vector<std::string> flags;
  };
  const std::vector<Degrees> degrees = {{2, {"--ulysses", "2"}}, {4, {"--ulysses", "2", "--ring", "2"}}};
  // The run writing `plain`, then the same with --vae-parallel writing `shared` and `trace`.
  const auto plain_then_shared = [&](const Degrees& d, const std::vector<std::string>& command, const std::string& plain,
                                     const std::string& shared, const std::string& trace) {
    const std::vector<std::string> args = with(command, d.flags);
    return std::make_pair(run_mpi(d.ranks, with(args, {"--out", plain}), dir_),
                          run_mpi(d.ranks, with(args, {"--out", shared, "--vae-parallel", "--trace", trace}), dir_));
  };
  // Flux: 64 x 48 is a 16 x 12 latent, 6 tiles of the tiny VAE's 8 latent pixels (overlap 2).
  const std::vector<std::string> t2i = {"t2i",
                                        "--model",
                                        (kData / "flux_tiny").string(),
                                        "--prompt-embeds",
                                        cubevec_cli_test::flux_embeds(dir_),
                                        "--width",
                                        "64",
                                        "--height",
                                        "48",
                                        "--steps",
                                        "1"};
  for (const Degrees& d : degrees) {
    const int ranks = d.ranks;
    const std::string plain = (dir_ / "plain.jpg").string(), shared = (dir_ / "shared.jpg").string(), trace = (dir_ / "t.json").string();
    const auto [a, b] = plain_then_shared(d, t2i, plain, shared, trace);
    ASSERT_EQ(a.status, 0) << a.err;
    ASSERT_EQ(b.status, 0) << b.err;
    EXPECT_NE(b.err.find("t2i: --vae-parallel: 6 VAE tiles dealt over " + std::to_string(ranks) + " ranks"), std::string::npos) << b.err;
    EXPECT_EQ(count_comm_kernels(trace, "all_gather vae.tile"), 6 * 4) << "measured and modelled, by unit and by stream";
    EXPECT_LE(worst_level_difference(cubevec::media::read_jpeg(shared), cubevec::media::read_jpeg(plain)), 1) << ranks;
  }
  // Wan: 9 frames of 48 x 32 are 3 latent frames of 4 x 6: bands of 2 rows (2 ranks) or 1 (4 ranks).
  const std::vector<std::string> t2v = {"t2v",
                                        "--model",
                                        (kData / "wan_tiny").string(),
                                        "--prompt-embeds",
                                        cubevec_cli_test::wan_embeds(dir_),
                                        "--frames",
                                        "9",
                                        "--width",
                                        "48",
                                        "--height",
                                        "32",
                                        "--steps",
                                        "1",
                                        "--cfg",
                                        "off"};
  for (const Degrees& d : degrees) {
    const int ranks = d.ranks;
    const std::string plain = (dir_ / "plain.avi").string(), shared = (dir_ / "shared.avi").string(), trace = (dir_ / "v.json").string();
    const auto [a, b] = plain_then_shared(d, t2v, plain, shared, trace);
    ASSERT_EQ(a.status, 0) << a.err;
    ASSERT_EQ(b.status, 0) << b.err;
    EXPECT_GT(count_comm_kernels(trace, "send_recv vae.halo"), 0);
    // Per chunk, the mid block's attention and the frames; measured and modelled, by unit and by stream.
    EXPECT_EQ(count_comm_kernels(trace, "all_gather vae.rows"), (3 + 3) * 4);
    const auto want = cubevec::media::read_avi_info(plain), got = cubevec::media::read_avi_info(shared);
    ASSERT_EQ(got.frames.size(), want.frames.size());
    for (std::size_t i = 0; i < got.frames.size(); ++i)
      EXPECT_LE(worst_level_difference(cubevec::media::decode_jpeg(cubevec::media::read_avi_frame(shared, got.frames[i])),
                                       cubevec::media::decode_jpeg(cubevec::media::read_avi_frame(plain, want.frames[i]))),
                1)
          << ranks << " ranks, frame " << i;
  }
}

TEST_F(ParallelCli, VaeParallelIsRefusedWhereItCannotShareBeforeAnyWork) {
  const std::string embeds = cubevec_cli_test::wan_embeds(dir_), out = (dir_ / "x.avi").string();
  const std::vector<std::string> t2v = {"t2v",
                                        "--model",
                                        (kData / "wan_tiny").string(),
                                        "--prompt-embeds",
                                        embeds,
                                        "--frames",
                                        "5",
                                        "--width",
                                        "32",
                                        "--height",
                                        "16",
                                        "--steps",
                                        "1",
                                        "--cfg",
                                        "off",
                                        "--out",
                                        out,
                                        "--vae-parallel"};
  const auto alone = run(t2v);
  EXPECT_NE(alone.status, 0);
  EXPECT_NE(alone.err.find("--vae-parallel shares the VAE decode among the ranks of the run, but this run has one"), std::string::npos)
      << alone.err;
  // 16 pixels are 2 latent rows: not enough for 4 ranks.
  const auto rows = run_mpi(4, with(t2v, {"--ulysses", "2", "--ring", "2"}), dir_);
  EXPECT_NE(rows.status, 0);
  EXPECT_NE(rows.err.find("--vae-parallel: the latent's 2 rows cannot be shared by 4 ranks"), std::string::npos) << rows.err;
  EXPECT_EQ(rows.err.find("step 1/1"), std::string::npos) << "refused after denoising: " << rows.err;
  EXPECT_FALSE(fs::exists(out));
  const auto simulated = run(
      {"t2i", "--simulate", "--model", (kData / "flux_tiny").string(), "--steps", "1", "--ranks", "2", "--ulysses", "2", "--vae-parallel"});
  EXPECT_NE(simulated.status, 0);
  EXPECT_NE(simulated.err.find("--vae-parallel shares the VAE decode, but --simulate models the transformer only"), std::string::npos)
      << simulated.err;
}

// flux_tiny with 8 heads of 8 (random weights) beside its scheduler and VAE: a model 8 Ulysses
// ranks can share.
fs::path eight_head_flux(const fs::path& dir) {
  const fs::path model = dir / "flux8";
  fs::create_directories(model / "transformer");
  for (const char* part : {"scheduler", "vae"}) fs::copy(kData / "flux_tiny" / part, model / part, fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(read_file((kData / "flux_tiny" / "transformer" / "config.json").string()));
  config["num_attention_heads"] = 8;
  config["attention_head_dim"] = 8;
  config["axes_dims_rope"] = {2, 2, 4};
  std::ofstream((model / "transformer" / "config.json").string()) << config.dump(2);
  cubevec::models::FluxTransformer2DModel transformer(cubevec::models::FluxConfig::from_json(config, "flux8"));
  cubevec::models::make_random_parameters(transformer.mutable_parameters(), cubevec::DType::f32, 8, 0.2f);
  cubevec::NamedTensors weights;
  for (const auto& spec : transformer.parameters().specs()) weights.push_back({spec.name, *spec.slot});
  cubevec::write_safetensors((model / "transformer" / "diffusion_pytorch_model.safetensors").string(), weights);
  return model;
}

struct TracedKernel {
  std::string name;
  std::string unit;
  double flops = 0;
};

// The modelled kernels of stream 1 in issue order, consecutive attention kernels as one
// "attention" (the tuner may pick a different attention kernel for another shape), without the
// layout copies (contiguous, concat: a collective packs one part per peer, so their count grows
// with the ranks).
std::vector<TracedKernel> modelled_kernels(const std::string& trace) {
  const nlohmann::json events = nlohmann::json::parse(read_file(trace));
  int by_stream = -1;
  for (const auto& e : events.at("traceEvents"))
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name" &&
        e.at("args").value("name", "").find("modelled NPU, by stream") != std::string::npos)
      by_stream = e.at("pid").get<int>();
  std::vector<std::pair<double, TracedKernel>> timed;
  for (const auto& e : events.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("pid", -1) != by_stream || e.at("args").value("stream", -1) != 1) continue;
    if (e.at("name") == "contiguous" || e.at("name") == "concat") continue;
    timed.push_back(
        {e.at("ts").get<double>(), {e.at("name").get<std::string>(), e.at("args").value("unit", ""), e.at("args").value("flops", 0.0)}});
  }
  std::stable_sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<TracedKernel> kernels;
  for (auto& [ts, k] : timed) {
    if (k.name.rfind("attention", 0) == 0) {
      if (!kernels.empty() && kernels.back().name == "attention") continue;
      k = {"attention", "cube", 0};
    }
    kernels.push_back(k);
  }
  return kernels;
}

TEST_F(ParallelCli, SimulatedEightRanksRunTheKernelsOfARealTwoRankRunScaled) {
  // 8 text tokens and 64 x 32 pixels, 32 image tokens: 2 and 8 ranks share both evenly.
  const std::string model = eight_head_flux(dir_).string(), embeds = (dir_ / "embeds8.safetensors").string();
  cubevec::write_safetensors(embeds, {{"prompt_embeds", cubevec::testing::random_tensor({1, 8, 40}, 1, cubevec::DType::f32, 1.0f)},
                                      {"pooled_prompt_embeds", cubevec::testing::random_tensor({1, 24}, 2, cubevec::DType::f32, 1.0f)}});
  const std::vector<std::string> t2i = {"t2i", "--model",  model, "--prompt-embeds", embeds, "--width",
                                        "64",  "--height", "32",  "--steps",         "2"};
  const std::string real_trace = (dir_ / "real.json").string(), simulated_trace = (dir_ / "sim.json").string();
  const auto real = run_mpi(2, with(t2i, {"--ulysses", "2", "--out", (dir_ / "r.jpg").string(), "--trace", real_trace}), dir_);
  ASSERT_EQ(real.status, 0) << real.err;
  const auto simulated = run(with(t2i, {"--simulate", "--ranks", "8", "--ulysses", "8", "--trace", simulated_trace}));
  ASSERT_EQ(simulated.status, 0) << simulated.err;
  // The simulated run stops after denoising; the real one then decodes (rank 0).
  const std::vector<TracedKernel> two = modelled_kernels(real_trace), eight = modelled_kernels(simulated_trace);
  ASSERT_GT(eight.size(), 100u);
  ASSERT_GT(two.size(), eight.size());
  // A GEMM's flops follow its rows. Per rank, 8 ranks hold a quarter of the tokens 2 ranks hold
  // (ratio 4) except where every rank holds every row (ratio 1: the embeddings, the modulation, the
  // text stream after its attention gathers it) and in the single blocks, whose rows are every text
  // token plus the rank's image tokens ((8 + 16) / (8 + 4) = 2).
  std::map<int, int> ratios;
  for (std::size_t i = 0; i < eight.size(); ++i) {
    if (eight[i].name != two[i].name) {
      std::string context;
      for (std::size_t j = i >= 6 ? i - 6 : 0; j < i + 4 && j < eight.size(); ++j)
        context += "\n  " + std::to_string(j) + ": " + eight[j].name + " | " + two[j].name;
      FAIL() << "kernel " << i << " (8 ranks | 2 ranks):" << context;
    }
    if (eight[i].unit != "cube" || eight[i].name == "attention") continue;
    const double ratio = two[i].flops / eight[i].flops;
    EXPECT_TRUE(ratio == 1 || ratio == 2 || ratio == 4)
        << "kernel " << i << " " << eight[i].name << ": " << two[i].flops << " flops on 2 ranks, " << eight[i].flops << " on 8";
    ++ratios[static_cast<int>(ratio)];
  }
  // Per step at least each double block's image q, k, v are sharded and each single block has a
  // GEMM on the joint rows.
  EXPECT_GE(ratios[4], 2 * 2 * 3) << ratios[1] << " repeated, " << ratios[2] << " joint";
  EXPECT_GE(ratios[2], 2 * 2) << ratios[1] << " repeated, " << ratios[4] << " sharded";
  EXPECT_GT(ratios[1], 0);
  EXPECT_EQ(two[eight.size()].name.find("all_to_all"), std::string::npos) << "the real run has transformer kernels the simulated one lacks";
}

}  // namespace parallel_cli_test
