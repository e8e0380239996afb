// `cubevec encode-image` and `cubevec forward` on CLIPVisionModel folders, end to end through the
// binary, against tests/data/goldens_clip_vision.safetensors (make_clip_vision_reference.py):
//   - encode-image of images/portrait.png with tests/data/clip_vision_tiny (its
//     preprocessor_config.json beside the model) writes processor_portrait's pixel_values bit for
//     bit and vision_tiny's penultimate_hidden_state of batch 0 (within 1e-4 of max |expected| in
//     f32, 2e-2 with bf16 weights); a diffusers folder (image_encoder/ + image_processor/) gives
//     the same file;
//   - forward on the tiny folders writes penultimate_hidden_state, last_hidden_state and
//     pooler_output for a batch of 2 (and the quick_gelu model's);
//   - every bad input is one error line naming it, and nothing is written.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "cli/run_cubevec.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace encode_image_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using EncodeImageCli = cubevec_cli_test::CliTest;
using cubevec::SafetensorsFile;
using cubevec::Tensor;
using cubevec_cli_test::kData;
using cubevec_cli_test::read_file;
using cubevec_cli_test::write_text;

const std::string kTiny = (kData / "clip_vision_tiny").string();
const std::string kQuick = (kData / "clip_vision_tiny_quick").string();
const std::string kPortrait = (kData / "images" / "portrait.png").string();

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open((kData / "goldens_clip_vision.safetensors").string());
  return file;
}

// Every f32 equal, bit for bit.
void expect_same_values(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(cubevec::testing::values(got), cubevec::testing::values(want)) << what;
}

// A diffusers pipeline folder holding the tiny encoder as image_encoder/ and its processor.
fs::path pipeline_folder(const fs::path& dir) {
  const fs::path p = dir / "wan_i2v";
  fs::create_directories(p / "image_encoder");
  fs::create_directories(p / "image_processor");
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy(kTiny + "/" + f, p / "image_encoder" / f);
  fs::copy(kTiny + "/preprocessor_config.json", p / "image_processor" / "preprocessor_config.json");
  write_text(p / "model_index.json", R"({"_class_name": "WanImageToVideoPipeline"})");
  return p;
}

TEST_F(EncodeImageCli, WritesTheProcessorsPixelsAndThePenultimateState) {
  const std::string out = (dir_ / "clip.safetensors").string();
  const auto r = run({"encode-image", "--model", kTiny, "--image", kPortrait, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("encode-image: 61x97 picture -> pixel_values [1, 3, 42, 42] -> penultimate_hidden_state [1, 10, 32]"),
            std::string::npos)
      << r.err;
  const SafetensorsFile got = SafetensorsFile::open(out);
  EXPECT_EQ(got.entries().size(), 2u);
  expect_same_values(got.tensor("pixel_values"), goldens().tensor("processor_portrait.pixel_values"), "pixel_values");
  const Tensor expected = goldens().tensor("vision_tiny.expected_penultimate_hidden_state").slice(0, 0, 1).contiguous();
  const Tensor hidden = got.tensor("penultimate_hidden_state");
  EXPECT_EQ(hidden.dtype(), cubevec::DType::f32);
  cubevec::testing::expect_close_rel(hidden, expected, 1e-4, "penultimate_hidden_state");

  // The same from a diffusers folder; bf16 weights within 2e-2.
  const fs::path pipeline = pipeline_folder(dir_);
  const std::string out2 = (dir_ / "clip2.safetensors").string(), out3 = (dir_ / "clip3.safetensors").string();
  const auto r2 = run({"encode-image", "--model", pipeline.string(), "--image", kPortrait, "--out", out2});
  ASSERT_EQ(r2.status, 0) << r2.err;
  EXPECT_EQ(read_file(out2), read_file(out));
  const auto r3 = run({"encode-image", "--model", pipeline.string(), "--image", kPortrait, "--dtype", "bf16", "--out", out3});
  ASSERT_EQ(r3.status, 0) << r3.err;
  cubevec::testing::expect_close_rel(SafetensorsFile::open(out3).tensor("penultimate_hidden_state"), expected, 2e-2, "bf16");
}

TEST_F(EncodeImageCli, ForwardRunsCLIPVisionModelFolders) {
  for (const auto& [dir, c] : {std::pair{kTiny, std::string("vision_tiny")}, std::pair{kQuick, std::string("vision_tiny_quick")}}) {
    const std::string in = (dir_ / (c + "_in.safetensors")).string(), out = (dir_ / (c + "_out.safetensors")).string();
    cubevec::write_safetensors(in, {{"pixel_values", goldens().tensor(c + ".pixel_values")}});
    const auto r = run({"forward", "--model", dir, "--inputs", in, "--out", out});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("CLIPVisionModel"), std::string::npos) << r.err;
    const SafetensorsFile got = SafetensorsFile::open(out);
    EXPECT_EQ(got.entries().size(), 3u);
    for (const std::string name : {"penultimate_hidden_state", "last_hidden_state", "pooler_output"})
      cubevec::testing::expect_close_rel(got.tensor(name), goldens().tensor(c + ".expected_" + name), 1e-4, c + " " + name);
  }
  // Only pixel_values is an argument.
  const std::string in = (dir_ / "bad_in.safetensors").string();
  cubevec::write_safetensors(in, {{"hidden_states", goldens().tensor("vision_tiny.pixel_values")}});
  const auto r = run({"forward", "--model", kTiny, "--inputs", in, "--out", (dir_ / "o.safetensors").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("unknown tensor 'hidden_states' (CLIPVisionModel.forward takes pixel_values)"), std::string::npos) << r.err;
  cubevec::write_safetensors(in, {{"pixel_values", goldens().tensor("vision_tiny_quick.pixel_values")}});
  const auto wrong = run({"forward", "--model", kTiny, "--inputs", in, "--out", (dir_ / "o.safetensors").string()});
  EXPECT_EQ(wrong.status, 1);
  EXPECT_NE(wrong.err.find("pixel_values must be f32 [B, 3, 42, 42] with B >= 1, got f32 [1, 3, 28, 28]"), std::string::npos) << wrong.err;
  EXPECT_FALSE(fs::exists(dir_ / "o.safetensors"));
}

TEST_F(EncodeImageCli, BadInputsAreOneLineErrorsNamingThem) {
  const std::string out = (dir_ / "e.safetensors").string();
  const auto encode = [&](const std::string& model, const std::string& image, const std::string& output,
                          std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"encode-image", "--model", model, "--image", image, "--out", output};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  const auto expect_error = [&](const cubevec_cli_test::Process& r, const std::string& message) {
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  expect_error(encode((dir_ / "nope").string(), kPortrait, out), "--model " + (dir_ / "nope").string() + " does not exist");
  fs::create_directories(dir_ / "empty");
  expect_error(encode((dir_ / "empty").string(), kPortrait, out),
               "holds neither config.json (a CLIPVisionModel folder) nor image_encoder/");
  expect_error(encode(kQuick, kPortrait, out), kQuick + "/preprocessor_config.json does not exist");
  const fs::path pipeline = pipeline_folder(dir_);
  fs::remove(pipeline / "image_processor" / "preprocessor_config.json");
  expect_error(encode(pipeline.string(), kPortrait, out), "image_processor/preprocessor_config.json does not exist");
  expect_error(encode(kTiny, (dir_ / "none.png").string(), out), "--image " + (dir_ / "none.png").string());
  write_text(dir_ / "text.png", "not a picture");
  expect_error(encode(kTiny, (dir_ / "text.png").string(), out), "neither a PNG nor a JPEG image");
  expect_error(encode(kTiny, (dir_ / "empty").string(), out), "is a directory");
  expect_error(encode(kTiny, kPortrait, out, {"--dtype", "f16"}), "--dtype must be f32 or bf16, got 'f16'");
  // The processor's crop must be the encoder's image_size: the tiny processor (42) with the quick
  // encoder (28).
  const fs::path mixed = dir_ / "mixed";
  fs::copy(kQuick, mixed, fs::copy_options::recursive);
  fs::copy(kTiny + "/preprocessor_config.json", mixed / "preprocessor_config.json");
  expect_error(encode(mixed.string(), kPortrait, out), "makes 42x42 pixel_values of the 61x97 --image, but");
  write_text(mixed / "preprocessor_config.json", R"({"resample": 1})");
  expect_error(encode(mixed.string(), kPortrait, out), "preprocessor_config.json: 'resample' 1 is not supported");
  fs::copy(kTiny + "/preprocessor_config.json", mixed / "preprocessor_config.json", fs::copy_options::overwrite_existing);
  write_text(mixed / "config.json", R"({"architectures": ["CLIPVisionModel"], "num_channels": 4})");
  expect_error(encode(mixed.string(), kPortrait, out), "config.json: 'num_channels'");
  // Outputs that would destroy something, or overwrite the input, are refused.
  fs::create_symlink(dir_ / "target.safetensors", dir_ / "link.safetensors");
  expect_error(encode(kTiny, kPortrait, (dir_ / "link.safetensors").string()), "link.safetensors: is a symbolic link");
  ASSERT_EQ(::mkfifo((dir_ / "fifo.safetensors").c_str(), 0644), 0);
  expect_error(encode(kTiny, kPortrait, (dir_ / "fifo.safetensors").string()), "fifo.safetensors: is not a regular file");
  fs::copy(kPortrait, dir_ / "mine.png");
  expect_error(encode(kTiny, (dir_ / "mine.png").string(), (dir_ / "mine.png").string()), "is the --image file");
  expect_error(encode(kTiny, kPortrait, (dir_ / "no" / "e.safetensors").string()), "does not exist");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(read_file((dir_ / "mine.png").string()), read_file(kPortrait));
}

}  // namespace encode_image_cli_test
