// The project's own probe suite (issue 17, Deliver 7): a corpus of bad inputs generated here at
// test time (nothing large is committed) and run against the built binary, one family of the
// hardening contract at a time. Every case must exit 1 with one line, "error: ...", that names the
// input (the file, flag, key or tensor), is the last line (and, but for values that turn
// non-finite mid-run, the only one) and leaves no output file behind; a pre-existing output must be
// byte-for-byte untouched.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace probe_corpus_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using ProbeCorpus = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

using cubevec_cli_test::kFlux;
using cubevec_cli_test::kTinyFlux;
using cubevec_cli_test::kWan;

struct Case {
  std::string family;
  std::vector<std::string> args;
  std::string names;  // what the error line must contain: the input and what was expected
};

// A copy of `model` with one JSON file edited.
fs::path edited_model(const fs::path& scratch, const std::string& model, const std::string& name, const std::string& file,
                      const std::function<void(nlohmann::json&)>& edit) {
  const fs::path copy = scratch / name;
  fs::copy(model, copy, fs::copy_options::recursive);
  nlohmann::json j = nlohmann::json::parse(read_file((copy / file).string()));
  edit(j);
  std::ofstream(copy / file, std::ios::trunc) << j.dump();
  return copy;
}

using cubevec_cli_test::write_text;

TEST_F(ProbeCorpus, EveryBadInputIsANamedOneLineError) {
  const fs::path d = dir_;
  const std::string out = (d / "out.jpg").string(), video = (d / "out.avi").string();
  // Inputs the cases refer to.
  const std::string embeds = (d / "embeds.safetensors").string(), nan_embeds = (d / "nan_embeds.safetensors").string();
  cubevec::write_safetensors(embeds, {{"prompt_embeds", cubevec::testing::random_tensor({1, 5, 40}, 1, cubevec::DType::f32, 1.0f)},
                                      {"pooled_prompt_embeds", cubevec::testing::random_tensor({1, 24}, 2, cubevec::DType::f32, 1.0f)}});
  cubevec::Tensor bad = cubevec::testing::random_tensor({1, 5, 40}, 1, cubevec::DType::f32, 1.0f);
  bad.mutable_data<float>()[7] = std::numeric_limits<float>::infinity();
  cubevec::write_safetensors(
      nan_embeds,
      {{"prompt_embeds", bad}, {"pooled_prompt_embeds", cubevec::testing::random_tensor({1, 24}, 2, cubevec::DType::f32, 1.0f)}});
  write_text(d / "garbage.safetensors", "this is not a safetensors file at all");
  write_text(d / "huge_header.safetensors", std::string("\xff\xff\xff\xff\xff\xff\x00\x00", 8) + "{}");
  ASSERT_EQ(::mkfifo((d / "fifo.safetensors").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((d / "fifo.jpg").c_str(), 0600), 0);
  fs::create_directories(d / "a_directory.safetensors");
  fs::create_directories(d / "loop");
  fs::create_symlink(d / "loop" / "transformer", d / "loop" / "transformer");  // a symlink to itself
  write_text(d / "profile.json", R"({"name": "p", "cpu": {"cube_threads": 1, "vector_threads": 1, "pin_units": false},
    "npu": {"ai_cores": 1, "vector_cores": 1, "cube_tflops": {"f32": 1}, "vector_tflops": {"f32": 1},
            "hbm_gbps": 1e-320, "l2_mib": 1, "launch_overhead_us": 1}})");
  const fs::path shift = edited_model(d, kFlux, "flux_shift", "scheduler/scheduler_config.json", [](auto& j) { j["shift"] = 1e308; });
  const fs::path scaling = edited_model(d, kFlux, "flux_scaling", "vae/config.json", [](auto& j) { j["scaling_factor"] = 1e-308; });
  const fs::path heads =
      edited_model(d, kFlux, "flux_heads", "transformer/config.json", [](auto& j) { j["num_attention_heads"] = 4611686018427387904; });
  const fs::path typo = edited_model(d, kFlux, "flux_typo", "transformer/config.json", [](auto& j) { j["num_layer"] = 2; });
  const fs::path wan_std = edited_model(d, kWan, "wan_std", "vae/config.json", [](auto& j) { j["latents_std"][0] = 1e-320; });
  const fs::path broken = d / "flux_broken";
  fs::copy(kFlux, broken, fs::copy_options::recursive);
  write_text(broken / "transformer" / "config.json", R"({"num_layers": 2,)");
  const std::string wan_embeds = (d / "wan_embeds.safetensors").string();
  cubevec::write_safetensors(wan_embeds, {{"prompt_embeds", cubevec::testing::random_tensor({1, 7, 24}, 1, cubevec::DType::f32, 1.0f)}});
  const std::string wide_embeds = (d / "wide_embeds.safetensors").string(), wide_pooled = (d / "wide_pooled.safetensors").string();
  cubevec::write_safetensors(wide_embeds, {{"prompt_embeds", cubevec::testing::random_tensor({1, 8, 25}, 1, cubevec::DType::f32, 1.0f)}});
  cubevec::write_safetensors(wide_pooled,
                             {{"prompt_embeds", cubevec::testing::random_tensor({1, 5, 40}, 1, cubevec::DType::f32, 1.0f)},
                              {"pooled_prompt_embeds", cubevec::testing::random_tensor({1, 25}, 2, cubevec::DType::f32, 1.0f)}});
  const std::string latent_i64 = (d / "latent_i64.safetensors").string();
  cubevec::write_safetensors(latent_i64, {{"latent", cubevec::Tensor::zeros({1, 16, 4, 4}, cubevec::DType::i64)}});

  const fs::path wan_class = edited_model(d, kWan, "wan_class", "scheduler/scheduler_config.json", [](auto& j) { j["_class_name"] = 5; });
  const fs::path wan_qk = edited_model(d, kWan, "wan_qk", "transformer/config.json", [](auto& j) { j["qk_norm"] = nullptr; });
  write_text(d / "fp8_profile.json", R"({"name": "p", "cpu": {"cube_threads": 1, "vector_threads": 1, "pin_units": false},
    "npu": {"ai_cores": 1, "vector_cores": 1, "cube_tflops": {"fp8": 1}, "vector_tflops": {"f32": 1},
            "hbm_gbps": 10, "l2_mib": 1, "launch_overhead_us": 1}})");
  // The Wan VAE clamps its output: an inf weight must be caught before the clamp hides it.
  const fs::path wan_inf = d / "wan_inf";
  fs::copy(kWan, wan_inf, fs::copy_options::recursive);
  {
    const std::string weights = (wan_inf / "vae" / "diffusion_pytorch_model.safetensors").string();
    const cubevec::SafetensorsFile file = cubevec::SafetensorsFile::open(weights);
    cubevec::NamedTensors tensors;
    for (const auto& e : file.entries()) {
      cubevec::Tensor t = file.tensor(e.name).contiguous().clone();
      if (e.name == "decoder.conv_out.bias") t.mutable_data<float>()[2] = std::numeric_limits<float>::infinity();
      tensors.push_back({e.name, t});
    }
    fs::remove(weights);
    cubevec::write_safetensors(weights, tensors);
  }
  // Weights that are a directory: named as not a regular file.
  const fs::path dir_weights = d / "flux_dir_weights";
  fs::copy(kFlux, dir_weights, fs::copy_options::recursive);
  fs::remove(dir_weights / "transformer" / "diffusion_pytorch_model.safetensors");
  fs::create_directories(dir_weights / "transformer" / "diffusion_pytorch_model.safetensors");
  std::string essay;
  for (int i = 0; i < 10000; ++i) essay += "zebra" + std::to_string(i) + " ";
  write_text(d / "red", "a file whose name is a prompt word");

  const std::vector<std::string> t2i = {"t2i", "--model",  kFlux, "--prompt-embeds", embeds, "--width",
                                        "32",  "--height", "32",  "--steps",         "1"};
  const auto with = [](std::vector<std::string> base, const std::vector<std::string>& more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  const auto t2i_model = [&](const fs::path& model) {
    return std::vector<std::string>{
        "t2i", "--model", model.string(), "--prompt-embeds", embeds, "--width", "32", "--height", "32", "--steps", "1", "--out", out};
  };
  const std::vector<Case> cases = {
      // 1. Outputs are never destroyed: special, missing-directory and directory targets.
      {"outputs", with(t2i, {"--out", (d / "fifo.jpg").string()}), "fifo.jpg: is not a regular file"},
      {"outputs", with(t2i, {"--out", (d / "no_such_dir" / "x.jpg").string()}), "no_such_dir"},
      {"outputs", with(t2i, {"--out", (d / "a_directory.safetensors").string()}), "a_directory.safetensors"},
      {"outputs", with(t2i, {"--out", out, "--json", (d / "fifo.jpg").string()}), "fifo.jpg"},
      {"outputs", with(t2i, {"--out", embeds}), "embeds.safetensors"},
      // 2. Inputs are bounded: FIFOs, directories, garbage, absurd headers, symlink loops, huge configs.
      {"inputs",
       {"t2i", "--model", kFlux, "--prompt-embeds", (d / "fifo.safetensors").string(), "--out", out},
       "fifo.safetensors: is not a regular file"},
      {"inputs",
       {"t2i", "--model", kFlux, "--prompt-embeds", (d / "a_directory.safetensors").string(), "--out", out},
       "a_directory.safetensors"},
      {"inputs", {"t2i", "--model", kFlux, "--prompt-embeds", (d / "garbage.safetensors").string(), "--out", out}, "garbage.safetensors"},
      {"inputs",
       {"t2i", "--model", kFlux, "--prompt-embeds", (d / "huge_header.safetensors").string(), "--out", out},
       "huge_header.safetensors"},
      {"inputs", {"inspect", (d / "fifo.safetensors").string()}, "fifo.safetensors: is not a regular file"},
      {"inputs", t2i_model(d / "loop"), "loop"},
      {"inputs", t2i_model(broken), "flux_broken/transformer/config.json: not valid JSON"},
      {"inputs", t2i_model(typo), "'num_layer'"},
      {"inputs", t2i_model(heads), "num_attention_heads"},
      {"inputs", with(t2i, {"--out", out, "--threads", "100000"}), "--threads"},
      {"inputs", with(t2i, {"--out", out, "--device-profile", ""}),
       "--device-profile: expected a device profile JSON file, got an empty path"},
      // 3. Non-finite values are never silent.
      {"non-finite", with(t2i, {"--out", out, "--guidance", "nan"}), "--guidance: must be a finite number, got nan"},
      {"non-finite", with(t2i, {"--out", out, "--cfg-scale", "inf"}), "--cfg-scale"},
      {"non-finite",
       {"t2i", "--model", kFlux, "--prompt-embeds", nan_embeds, "--width", "32", "--height", "32", "--out", out},
       "nan_embeds.safetensors: 'prompt_embeds': element [0, 0, 7] is inf"},
      {"non-finite", with(t2i, {"--out", out, "--device-profile", (d / "profile.json").string()}), "profile.json.npu.hbm_gbps"},
      {"non-finite", t2i_model(shift), "flux_shift/scheduler/scheduler_config.json"},
      {"non-finite", t2i_model(scaling), "'scaling_factor'"},
      {"non-finite",
       {"t2v", "--model", wan_std.string(), "--prompt-embeds", wan_embeds, "--cfg", "off", "--frames", "1", "--width", "16", "--height",
        "16", "--steps", "1", "--out", video},
       "'latents_std'"},
      // 4. Inputs mean what they say.
      {"meaning", with(t2i, {"--out", out, "--seed", "-1"}), "--seed: must not be negative, got -1"},
      {"meaning", {"t2i", "--model", kTinyFlux, "--prompt", "   ,.;  ", "--out", out}, "--prompt"},
      {"meaning", with(t2i, {"--out", out, "--memory-limit", "lots"}), "--memory-limit: 'lots'"},
      {"meaning", with(t2i, {"--out", out, "--memory-limit", "1K"}), "above --memory-limit 1K"},
      {"meaning",
       {"t2v", "--model", kWan, "--prompt-embeds", wan_embeds, "--cfg", "off", "--frames", "4097", "--width", "16", "--height", "16",
        "--steps", "1", "--out", video},
       "--frames 4097 gives 1025 patches on that axis, above the transformer's rope_max_seq_len 1024"},
      {"inputs",
       {"t2v", "--model", wan_class.string(), "--prompt-embeds", wan_embeds, "--cfg", "off", "--frames", "1", "--width", "16", "--height",
        "16", "--steps", "1", "--out", video},
       "wan_class/scheduler/scheduler_config.json: '_class_name' must be a string"},
      {"inputs",
       {"t2v", "--model", wan_qk.string(), "--prompt-embeds", wan_embeds, "--cfg", "off", "--frames", "1", "--width", "16", "--height",
        "16", "--steps", "1", "--out", video},
       "'qk_norm' is null"},
      {"inputs", t2i_model(dir_weights), "transformer/diffusion_pytorch_model.safetensors: directory holds no .safetensors file"},
      {"non-finite",
       {"t2v", "--model", wan_inf.string(), "--prompt-embeds", wan_embeds, "--cfg", "off", "--frames", "1", "--width", "16", "--height",
        "16", "--steps", "1", "--out", video},
       "AutoencoderKLWan decode: latent frame 0 decodes to non-finite values before the clamp"},
      {"outputs",
       {"t2v", "--model", wan_inf.string(), "--prompt-embeds", wan_embeds, "--cfg", "off", "--frames", "1", "--width", "16", "--height",
        "16", "--steps", "1", "--out", video, "--frames-dir", (wan_inf / "frames").string()},
       "--frames-dir " + (wan_inf / "frames").string() + ": lies inside the --model folder"},
      {"names", with(t2i, {"--out", out, "--device-profile", (d / "fp8_profile.json").string()}),
       "fp8_profile.json.npu.cube_tflops: unknown dtype 'fp8'"},
      // Long and odd text: a prompt is never taken for a path, and the error line stays readable.
      {"meaning", {"t2i", "--model", kTinyFlux, "--prompt", essay, "--out", out}, "and 9990 more"},
      {"meaning", {"t2i", "--model", kTinyFlux, "--prompt", std::string(300, 'r'), "--out", out}, "does not know: 'rrrr"},
      {"names", {"t2i", "--model", kTinyFlux, "--prompt", "caf\xe9 \x1b[31m", "--out", out}, "\\xe9"},
      {"names",
       {"t2v", "--model", kWan, "--prompt-embeds", wide_embeds, "--cfg", "off", "--frames", "1", "--width", "16", "--height", "16", "--out",
        video},
       "wide_embeds.safetensors: 'prompt_embeds' must be [1, L, 24] with L >= 1 for this model, got [1, 8, 25]"},
      {"names",
       {"t2i", "--model", kFlux, "--prompt-embeds", wide_pooled, "--out", out},
       "wide_pooled.safetensors: 'pooled_prompt_embeds' must be [1, 24] for this model, got [1, 25]"},
      // 5. Errors name the input: forward's tensors by their argument names.
      {"names",
       {"forward", "--model", kFlux + "/vae", "--inputs", latent_i64, "--out", (d / "sample.safetensors").string()},
       "latent must be f32 or bf16, got i64"},
      {"names", {"cubevec-has-no-such-command"}, "cubevec-has-no-such-command"},
  };
  // A pre-existing output that every failing run must leave as it was.
  write_text(out, "the user's earlier picture");
  for (const Case& c : cases) {
    const auto r = run(c.args);
    std::string command;
    for (const std::string& a : c.args) command += a + " ";
    EXPECT_EQ(r.status, 1) << "[" << c.family << "] " << command << "\n" << r.err;
    // The error is one line, the last: a check that fires mid-run (a NaN in the decode) follows the
    // progress lines, every other one is all the run prints.
    const std::size_t last_line = r.err.rfind('\n', r.err.size() - 2) == std::string::npos ? 0 : r.err.rfind('\n', r.err.size() - 2) + 1;
    EXPECT_EQ(r.err.compare(last_line, 7, "error: "), 0) << "[" << c.family << "] " << command << "\n" << r.err;
    EXPECT_EQ(r.err.find("error: "), last_line) << "[" << c.family << "] one error line: " << command << "\n" << r.err;
    EXPECT_EQ(r.err.back(), '\n') << "[" << c.family << "] " << command;
    if (c.family != "non-finite") {
      EXPECT_EQ(last_line, 0u) << "[" << c.family << "] refused before any work: " << command << "\n" << r.err;
    }
    EXPECT_LT(r.err.size(), 1200u) << "[" << c.family << "] a readable line: " << command.substr(0, 200);
    EXPECT_NE(r.err.find(c.names), std::string::npos) << "[" << c.family << "] expected '" << c.names << "' in: " << r.err;
    EXPECT_EQ(read_file(out), "the user's earlier picture") << "[" << c.family << "] " << command;
    EXPECT_FALSE(fs::exists(video)) << "[" << c.family << "] " << command;
    EXPECT_FALSE(fs::exists(d / "sample.safetensors")) << "[" << c.family << "] " << command;
  }
  // A prompt word that names a file is not an input file: writing that file is allowed.
  const auto red = run({"t2i", "--model", kTinyFlux, "--prompt", "red", "--steps", "1", "--out", (d / "red").string()});
  EXPECT_EQ(red.status, 0) << red.err;
  // Nothing but the inputs is left in the scratch folder: no temporaries of the failed runs.
  for (const auto& entry : fs::directory_iterator(d))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

}  // namespace probe_corpus_test
