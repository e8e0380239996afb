// What a run may do to files (docs/robustness.md, "The command-line contract"): an output that
// cubevec would have to destroy (symlink, FIFO, read-only file) or cannot write is refused before
// any work; a run that fails or is interrupted leaves the previous output byte for byte and no
// temporary; an output may not be one of the inputs; non-finite inputs are errors naming the
// tensor.
#include <signal.h>
#include <sys/file.h>

#include <chrono>
#include <limits>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "cli/run_cubevec.h"
#include "ops/vector_ops.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace outputs_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using OutputsCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

using cubevec_cli_test::kTinyFlux;
using cubevec_cli_test::kWan;

using cubevec_cli_test::write_text;

std::string embeds_file(const fs::path& dir, float poison = 0.0f) {
  cubevec::Tensor e = cubevec::testing::random_tensor({1, 7, 24}, 2, cubevec::DType::f32, 1.0f);
  if (poison != 0.0f) static_cast<float*>(e.mutable_data_ptr())[3 * 24 + 5] = poison;
  const std::string path = (dir / "e.safetensors").string();
  cubevec::write_safetensors(path, {{"prompt_embeds", e}});
  return path;
}

int entries(const fs::path& dir) { return static_cast<int>(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }

// Starts cubevec with `args` (stderr to err_path), waits until stderr holds `ready`, sends SIGINT,
// and returns the exit status (-1 when a signal ended it).
int interrupt_when(std::vector<std::string> args, const std::string& err_path, const std::string& ready,
                   std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
  std::string binary = CUBEVEC_BINARY;
  std::vector<char*> argv = {binary.data()};
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return -2;
  if (pid == 0) {
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null = ::open("/dev/null", O_WRONLY);
    if (err < 0 || null < 0 || ::dup2(err, 2) < 0 || ::dup2(null, 1) < 0) ::_exit(127);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(err_path).find(ready) == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(delay);
  ::kill(pid, SIGINT);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
}

TEST_F(OutputsCli, OutputsThatWouldBeDestroyedAreRefusedBeforeAnyWork) {
  write_text(dir_ / "target.jpg", "someone's picture");
  fs::create_symlink(dir_ / "target.jpg", dir_ / "link.jpg");
  ASSERT_EQ(::mkfifo((dir_ / "fifo.jpg").c_str(), 0644), 0);
  write_text(dir_ / "ro.jpg", "read-only");
  fs::permissions(dir_ / "ro.jpg", fs::perms::owner_read);
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", (dir_ / "link.jpg").string()}, "link.jpg: is a symbolic link"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", (dir_ / "fifo.jpg").string()}, "fifo.jpg: is not a regular file"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", (dir_ / "ro.jpg").string()}, "ro.jpg: is read-only"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", (dir_ / "new.jpg").string(), "--json",
        (dir_ / "no/r.json").string()},
       "--json: " + (dir_ / "no/r.json").string() + ": the directory " + (dir_ / "no").string() + " does not exist"},
      {{"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", (dir_ / "new.jpg").string(), "--trace",
        (dir_ / "link.jpg").string()},
       "--trace: " + (dir_ / "link.jpg").string() + ": is a symbolic link"},
  };
  for (const auto& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = run(c.args);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0) << "refused before the model loads";
  }
  EXPECT_EQ(read_file((dir_ / "target.jpg").string()), "someone's picture");
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.jpg"));
  EXPECT_TRUE(fs::is_fifo(dir_ / "fifo.jpg"));
  EXPECT_EQ(read_file((dir_ / "ro.jpg").string()), "read-only");
  EXPECT_FALSE(fs::exists(dir_ / "new.jpg"));
}

TEST_F(OutputsCli, AFailedRunLeavesThePreviousVideoAndNoTemporary) {
  const std::string embeds = embeds_file(dir_), video = (dir_ / "keep.avi").string();
  const std::vector<std::string> base = {"t2v", "--model", kWan, "--prompt-embeds", embeds, "--frames", "9",  "--width", "512", "--height",
                                         "256", "--steps", "2",  "--cfg",           "off",  "--out",    video};
  ASSERT_EQ(run(base).status, 0);
  const std::string before = read_file(video);
  const int files = entries(dir_);
  // ada_bsa at 0.95 keeps no block of a 12-block row: the error comes from the first sparse
  // attention call, in the middle of denoising (once the old writer had already truncated the AVI).
  std::vector<std::string> failing = base;
  failing.insert(failing.end(), {"--sparse", "ada_bsa", "--sparsity", "0.95", "--json", (dir_ / "r.json").string()});
  const auto r = run(failing);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("keeps no block"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(video), before);
  EXPECT_EQ(entries(dir_), files) << "no temporary, no --json left behind";
}

TEST_F(OutputsCli, CtrlCStopsTheRunRemovesTemporariesAndKeepsTheOldOutput) {
  const std::string embeds = embeds_file(dir_), video = (dir_ / "keep.avi").string(), frames = (dir_ / "frames").string();
  write_text(video, "the previous video");
  const std::string err_path = (dir_ / "stderr.txt").string();
  const int status = interrupt_when({"t2v", "--model", kWan, "--prompt-embeds", embeds, "--frames", "17", "--width", "512", "--height",
                                     "256", "--steps", "400", "--cfg", "off", "--out", video, "--frames-dir", frames},
                                    err_path, "step 2/400");
  EXPECT_EQ(status, 130) << read_file(err_path);
  const std::string err = read_file(err_path);
  EXPECT_NE(err.find("error: interrupted by SIGINT; the run stopped and no output was written"), std::string::npos) << err;
  EXPECT_EQ(read_file(video), "the previous video");
  EXPECT_EQ(entries(dir_), 3) << "e.safetensors, keep.avi and stderr.txt: no temporary, and no frames folder (the run made it)";
  EXPECT_FALSE(std::filesystem::exists(frames));

  // A frames folder that was there before the run stays, with what it held.
  std::filesystem::create_directory(frames);
  write_text(frames + "/notes.txt", "mine");
  const std::string err_again = (dir_ / "stderr2.txt").string();  // not the first run's: its "step 2" would signal at once
  const int again = interrupt_when({"t2v", "--model", kWan, "--prompt-embeds", embeds, "--frames", "17", "--width", "512", "--height",
                                    "256", "--steps", "400", "--cfg", "off", "--out", video, "--frames-dir", frames},
                                   err_again, "step 2/400");
  EXPECT_EQ(again, 130) << read_file(err_again);
  EXPECT_EQ(entries(frames), 1) << "notes.txt alone: no frame temporary";
  EXPECT_EQ(read_file(frames + "/notes.txt"), "mine");
}

// Ctrl-C while a kernel waits for the tuning file's lock (another process calibrating): the run ends
// as any interrupted run does, not as that kernel's failure or the prompt's.
TEST_F(OutputsCli, CtrlCWhileAKernelWaitsForTheTuningFilesLockIsAnInterruption) {
  const std::string tuning = (dir_ / "tuning.json").string(), err_path = (dir_ / "stderr.txt").string();
  const int holder = ::open((tuning + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(holder, 0);
  ASSERT_EQ(::flock(holder, LOCK_EX), 0);  // as a process calibrating into the same file holds it
  const int status =
      interrupt_when({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--out", (dir_ / "x.png").string(), "--tune-cache", tuning},
                     err_path, "waiting for");
  ::close(holder);
  const std::string err = read_file(err_path);
  EXPECT_EQ(status, 130) << err;
  EXPECT_NE(err.find("error: interrupted by SIGINT"), std::string::npos) << err;
  EXPECT_EQ(err.find("kernel '"), std::string::npos) << err;
  EXPECT_EQ(err.find("--prompt:"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.png"));
}

TEST_F(OutputsCli, ARunInsideOneLongKernelIsEndedByTheWatchdog) {
  // One 4096 x 4096 step of tinyflux runs for many seconds without a kernel launch in between: the
  // watchdog ends it 3 s after the signal, removing the temporary.
  const std::string picture = (dir_ / "keep.jpg").string(), err_path = (dir_ / "stderr.txt").string();
  write_text(picture, "the previous picture");
  const auto t0 = std::chrono::steady_clock::now();
  const int status = interrupt_when(
      {"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "1", "--width", "4096", "--height", "4096", "--out", picture},
      err_path, "t2i: 4096x4096", std::chrono::milliseconds(1500));
  EXPECT_EQ(status, 130) << read_file(err_path);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  // Usually "the run was ended (it did not reach a stopping point within 3 s)"; on a fast machine the
  // step may end first and the run stop at the next launch: either way exit 130 and nothing left.
  EXPECT_NE(read_file(err_path).find("error: interrupted by SIGINT; the run "), std::string::npos) << read_file(err_path);
  EXPECT_EQ(read_file(picture), "the previous picture");
  EXPECT_EQ(entries(dir_), 2) << "keep.jpg and stderr.txt: no temporary";
}

// A path that is not UTF-8 (Linux paths are bytes) is written to the JSON report with each
// offending byte as \xHH: the report is valid JSON, and the run succeeds with both outputs.
TEST_F(OutputsCli, ANonUtf8OutputPathIsEscapedInTheReport) {
  const std::string picture = (dir_ / "\xff\xfe.jpg").string(), report = (dir_ / "r.json").string();
  const auto r = run({"t2i", "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "2", "--out", picture, "--json", report});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(picture));
  const nlohmann::json json = nlohmann::json::parse(read_file(report));
  EXPECT_NE(json.dump().find("\\\\xFF\\\\xFE.jpg"), std::string::npos) << json.dump();
  EXPECT_EQ(cubevec::utf8_or_escaped("caf\xc3\xa9 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 ok"),
            "caf\xc3\xa9 \\xED\\xA0\\x80 \\xC0\\xAF \\xF4\\x90\\x80\\x80 ok");  // surrogate, overlong, > U+10FFFF
}

TEST_F(OutputsCli, AnOutputMayNotReplaceAnInput) {
  const std::string embeds = embeds_file(dir_), before = read_file(embeds);
  const auto t2v = run({"t2v", "--model", kWan, "--prompt-embeds", embeds, "--frames", "9", "--width", "64", "--height", "64", "--steps",
                        "2", "--cfg", "off", "--out", (dir_ / "." / "e.safetensors").string()});
  EXPECT_EQ(t2v.status, 1);
  EXPECT_NE(t2v.err.find("e.safetensors: is the --prompt-embeds file; write the result to another path"), std::string::npos) << t2v.err;
  EXPECT_EQ(read_file(embeds), before);
  // A model copy's own files, and one output over another.
  const fs::path model = dir_ / "tinyflux";
  fs::copy(kTinyFlux, model, fs::copy_options::recursive);
  const std::string config = (model / "transformer" / "config.json").string(), config_before = read_file(config);
  const auto inside = run(
      {"t2i", "--model", model.string(), "--prompt", "a red circle", "--steps", "1", "--out", (dir_ / "o.jpg").string(), "--json", config});
  EXPECT_EQ(inside.status, 1);
  EXPECT_NE(inside.err.find("--json " + config + ": lies inside the --model folder"), std::string::npos) << inside.err;
  EXPECT_EQ(read_file(config), config_before);
  const auto twice = run({"t2i", "--model", model.string(), "--prompt", "a red circle", "--steps", "1", "--out", (dir_ / "o.jpg").string(),
                          "--trace", (dir_ / "." / "o.jpg").string()});
  EXPECT_EQ(twice.status, 1);
  EXPECT_NE(twice.err.find("o.jpg: is also the --out file; give each output its own path"), std::string::npos) << twice.err;
  EXPECT_FALSE(fs::exists(dir_ / "o.jpg"));
}

TEST_F(OutputsCli, NonFiniteInputsNameTheTensorAndElement) {
  const std::string embeds = embeds_file(dir_, std::numeric_limits<float>::quiet_NaN());
  const auto r = run({"t2v", "--model", kWan, "--prompt-embeds", embeds, "--frames", "9", "--width", "64", "--height", "64", "--steps", "2",
                      "--cfg", "off", "--out", (dir_ / "v.avi").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(embeds + ": 'prompt_embeds': element [0, 3, 5] is nan (expected finite values)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "v.avi"));
}

TEST_F(OutputsCli, ANanVaeWeightIsAnErrorNotABlackPicture) {
  const fs::path model = dir_ / "tinyflux";
  fs::copy(kTinyFlux, model, fs::copy_options::recursive);
  const std::string weights = (model / "vae" / "diffusion_pytorch_model.safetensors").string();
  cubevec::NamedTensors tensors;
  {
    const cubevec::SafetensorsFile file = cubevec::SafetensorsFile::open(weights);
    for (const auto& e : file.entries())
      tensors.push_back({e.name, cubevec::ops::cast(file.tensor(e.name), cubevec::DType::f32).contiguous()});
  }
  bool poisoned = false;
  for (auto& [name, t] : tensors)
    if (name == "decoder.conv_in.bias")
      static_cast<float*>(t.mutable_data_ptr())[0] = std::numeric_limits<float>::quiet_NaN(), poisoned = true;
  ASSERT_TRUE(poisoned);
  cubevec::write_safetensors(weights, tensors);
  const auto r = run({"t2i", "--model", model.string(), "--prompt", "a red circle", "--steps", "2", "--out", (dir_ / "x.jpg").string()});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("error: the VAE decode gave a non-finite picture (a VAE weight or setting gives NaN or inf): element ["),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "x.jpg"));
}

TEST_F(OutputsCli, ANanWeightStopsTheRunAtTheFirstStep) {
  // A copy of the tiny model with one NaN in proj_out.bias: every latent turns NaN at step 1.
  const fs::path model = dir_ / "wan_nan";
  fs::copy(kWan, model, fs::copy_options::recursive);
  const std::string weights = (model / "transformer" / "diffusion_pytorch_model.safetensors").string();
  cubevec::NamedTensors tensors;
  {
    const cubevec::SafetensorsFile file = cubevec::SafetensorsFile::open(weights);
    for (const auto& e : file.entries()) tensors.push_back({e.name, file.tensor(e.name).clone()});
  }
  for (auto& [name, t] : tensors)
    if (name == "proj_out.bias") static_cast<float*>(t.mutable_data_ptr())[3] = std::numeric_limits<float>::quiet_NaN();
  cubevec::write_safetensors(weights, tensors);
  const auto r = run({"t2v", "--model", model.string(), "--prompt-embeds", embeds_file(dir_), "--frames", "9", "--width", "64", "--height",
                      "64", "--steps", "4", "--cfg", "off", "--out", (dir_ / "v.avi").string()});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(
      r.err.find("error: denoising step 1 of 4 turned the latents non-finite (a weight, input or setting gives NaN or inf): element ["),
      std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "v.avi"));
}

}  // namespace outputs_cli_test
