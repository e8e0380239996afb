// `cubevec forward` on the VAE decoders (the model registry by _class_name): `latent` ->
// vae.decode(latent).sample against the PyTorch goldens; `sample` -> the AutoencoderKL encoder's
// `latent` (latent_dist.mean) and the AutoencoderKLWan encoder's (Wan2.1's and Wan2.2's VAE), and their errors; component folders read by weight-file
// name whatever lies beside, --variant, and the errors for unknown classes and missing weights.
#include <filesystem>
#include <fstream>
#include <limits>

#include "cli/run_cubevec.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace forward_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using ForwardCli = cubevec_cli_test::CliTest;

using cubevec_cli_test::kData;

TEST_F(ForwardCli, DecodesWithAutoencoderKL) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_flux.safetensors").string());
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(inputs, {{"latent", goldens.tensor("vae_decode.z")}});
  const auto r = run({"forward", "--model", (kData / "flux_tiny" / "vae").string(), "--inputs", inputs, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("AutoencoderKL"), std::string::npos) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), goldens.tensor("vae_decode.expected"), 1e-4,
                                     "AutoencoderKL decode");
}

TEST_F(ForwardCli, EncodesWithAutoencoderKL) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_vae_encoder.safetensors").string());
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  for (const std::string vae : {"flux", "sd"}) {
    cubevec::write_safetensors(inputs, {{"sample", goldens.tensor(vae + "_whole.sample")}});
    const auto r = run({"forward", "--model", (kData / "vae_encoder" / vae).string(), "--inputs", inputs, "--out", out});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("-> latent"), std::string::npos) << r.err;
    cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("latent"), goldens.tensor(vae + "_whole.expected_mean"),
                                       1e-4, "AutoencoderKL encode " + vae);
  }
  // Both arguments, or an encode of a checkpoint saved without its encoder: errors that say so.
  const cubevec::Tensor sample = goldens.tensor("flux_whole.sample");
  cubevec::write_safetensors(inputs, {{"sample", sample}, {"latent", cubevec::Tensor::zeros({1, 16, 8, 8}, cubevec::DType::f32)}});
  auto r = run({"forward", "--model", (kData / "vae_encoder" / "flux").string(), "--inputs", inputs, "--out", out});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("give 'sample' (an image to encode) or 'latent'"), std::string::npos) << r.err;
  cubevec::write_safetensors(inputs, {{"sample", sample}});
  r = run({"forward", "--model", (kData / "flux_tiny" / "vae").string(), "--inputs", inputs, "--out", out});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("encoder cannot be loaded"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("encoder.conv_in.weight"), std::string::npos) << r.err;
}

TEST_F(ForwardCli, DecodesWithAutoencoderKLWanClamped) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_wan.safetensors").string());
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(inputs, {{"latent", goldens.tensor("vae.z")}});
  const auto r = run({"forward", "--model", (kData / "wan_tiny" / "vae").string(), "--inputs", inputs, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), goldens.tensor("vae.video"), 1e-4,
                                     "AutoencoderKLWan decode");
}

TEST_F(ForwardCli, EncodesWithAutoencoderKLWan) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_wan_vae_encoder.safetensors").string());
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(inputs, {{"sample", goldens.tensor("wan_nine_frames.sample")}});
  auto r = run({"forward", "--model", (kData / "vae_encoder" / "wan").string(), "--inputs", inputs, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("-> latent"), std::string::npos) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("latent"), goldens.tensor("wan_nine_frames.expected_mean"),
                                     1e-4, "AutoencoderKLWan encode");
  // wan_tiny/vae holds only a few encoder tensors: the encode says which are missing.
  r = run({"forward", "--model", (kData / "wan_tiny" / "vae").string(), "--inputs", inputs, "--out", out});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("encoder cannot be loaded"), std::string::npos) << r.err;
  // A frame count that is not 1 + 4k names what fits.
  cubevec::write_safetensors(inputs, {{"sample", cubevec::Tensor::zeros({1, 3, 4, 16, 16}, cubevec::DType::f32)}});
  r = run({"forward", "--model", (kData / "vae_encoder" / "wan").string(), "--inputs", inputs, "--out", out});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("1 + 4k frames"), std::string::npos) << r.err;
}

// The Wan2.2 VAE (is_residual, patch_size 2): 3-channel video frames out, a 3-channel video in.
TEST_F(ForwardCli, DecodesAndEncodesWithTheWan22Vae) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_wan22.safetensors").string());
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  const std::string vae = (kData / "wan22_vae_tiny").string();
  cubevec::write_safetensors(inputs, {{"latent", goldens.tensor("vae22_decode.z")}});
  auto r = run({"forward", "--model", vae, "--inputs", inputs, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), goldens.tensor("vae22_decode.video"), 1e-4,
                                     "Wan2.2 VAE decode");
  cubevec::write_safetensors(inputs, {{"sample", goldens.tensor("vae22_encode.video")}});
  r = run({"forward", "--model", vae, "--inputs", inputs, "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("-> latent"), std::string::npos) << r.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("latent"), goldens.tensor("vae22_encode.mean"), 1e-4,
                                     "Wan2.2 VAE encode");
}

TEST_F(ForwardCli, ReadsTheWeightsByNameAndTheVariant) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_flux.safetensors").string());
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(inputs, {{"latent", goldens.tensor("vae_decode.z")}});
  const fs::path vae = dir_ / "vae";
  fs::create_directories(vae);
  fs::copy_file(kData / "flux_tiny" / "vae" / "config.json", vae / "config.json");
  // Another safetensors file beside the weights is not read (diffusers reads the weights by name).
  cubevec::write_safetensors((vae / "notes.safetensors").string(), {{"x", cubevec::Tensor::zeros({2}, cubevec::DType::f32)}});
  fs::copy_file(kData / "flux_tiny" / "vae" / "diffusion_pytorch_model.safetensors", vae / "diffusion_pytorch_model.fp16.safetensors");
  const auto missing = run({"forward", "--model", vae.string(), "--inputs", inputs, "--out", out});
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("no diffusion_pytorch_model.safetensors or diffusion_pytorch_model.safetensors.index.json (here: "
                             "diffusion_pytorch_model.fp16.safetensors, notes.safetensors); a variant such as"),
            std::string::npos)
      << missing.err;
  const auto variant = run({"forward", "--model", vae.string(), "--inputs", inputs, "--out", out, "--variant", "fp16"});
  ASSERT_EQ(variant.status, 0) << variant.err;
  fs::copy_file(kData / "flux_tiny" / "vae" / "diffusion_pytorch_model.safetensors", vae / "diffusion_pytorch_model.safetensors");
  const auto named = run({"forward", "--model", vae.string(), "--inputs", inputs, "--out", out});
  ASSERT_EQ(named.status, 0) << named.err;
  cubevec::testing::expect_close_rel(cubevec::SafetensorsFile::open(out).tensor("sample"), goldens.tensor("vae_decode.expected"), 1e-4,
                                     "decode from the named file");
}

TEST_F(ForwardCli, UnknownClassAndWrongInputNames) {
  const fs::path model = dir_ / "m";
  fs::create_directories(model);
  std::ofstream(model / "config.json") << R"({"_class_name": "UNet2DConditionModel"})";
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(inputs, {{"latent", cubevec::Tensor::zeros({1, 16, 4, 4}, cubevec::DType::f32)}});
  const auto r = run({"forward", "--model", model.string(), "--inputs", inputs, "--out", out});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("_class_name 'UNet2DConditionModel' is not a model cubevec runs (expected one of: AutoencoderKL, "
                       "AutoencoderKLWan, CLIPVisionModel, FluxTransformer2DModel, WanTransformer3DModel)"),
            std::string::npos)
      << r.err;
  cubevec::write_safetensors(inputs, {{"z", cubevec::Tensor::zeros({1, 16, 4, 4}, cubevec::DType::f32)}});
  const auto wrong = run({"forward", "--model", (kData / "flux_tiny" / "vae").string(), "--inputs", inputs, "--out", out});
  EXPECT_EQ(wrong.status, 1);
  EXPECT_NE(wrong.err.find("unknown tensor 'z' (AutoencoderKL.forward takes latent, sample)"), std::string::npos) << wrong.err;
}

TEST_F(ForwardCli, BadLatentsNameTheArgument) {
  // The decoders' argument is `latent` in the user's file: errors call it that, with the expected
  // layout, for a wrong dtype, rank, channel count, an empty size, or a header shape beyond int64.
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  const struct {
    const char* vae;
    cubevec::Shape shape;
    cubevec::DType dtype;
    std::string expected;
  } cases[] = {
      {"flux_tiny", {1, 16, 8, 8}, cubevec::DType::i64, "AutoencoderKL.decode: latent must be f32 or bf16, got i64 [1, 16, 8, 8]"},
      {"flux_tiny",
       {1, 16, 8},
       cubevec::DType::f32,
       "AutoencoderKL.decode: latent must be [B, 16, h, w] with every size at least 1, got [1, 16, 8]"},
      {"flux_tiny",
       {1, 16, 0, 8},
       cubevec::DType::f32,
       "AutoencoderKL.decode: latent must be [B, 16, h, w] with every size at least 1, got [1, 16, 0, 8]"},
      {"flux_tiny", {0, 16, 8, 8}, cubevec::DType::f32, "with every size at least 1, got [0, 16, 8, 8]"},
      {"wan_tiny",
       {1, 5, 3, 4, 4},
       cubevec::DType::f32,
       "AutoencoderKLWan.decode: latent must be [B, 4, T, h, w] with every size at least 1, got [1, 5, 3, 4, 4]"},
      {"wan_tiny", {1, 4, 3, 4, 4}, cubevec::DType::f16, "AutoencoderKLWan.decode: latent must be f32 or bf16, got f16 [1, 4, 3, 4, 4]"},
  };
  for (const auto& c : cases) {
    cubevec::write_safetensors(inputs, {{"latent", cubevec::Tensor::zeros(c.shape, c.dtype)}});
    const auto r = run({"forward", "--model", (kData / c.vae / "vae").string(), "--inputs", inputs, "--out", out});
    EXPECT_EQ(r.status, 1) << c.expected << ": " << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  // [2^61, 0, 64] holds no data (valid safetensors) but has no int64 strides: the file and tensor are named.
  std::string header = R"({"latent":{"dtype":"F32","shape":[2305843009213693952,0,64],"data_offsets":[0,0]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(inputs, std::ios::binary | std::ios::trunc) << file << header;
  const auto r = run({"forward", "--model", (kData / "flux_tiny" / "vae").string(), "--inputs", inputs, "--out", out});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("'latent'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("its sizes multiply beyond int64"), std::string::npos) << r.err;
}

TEST_F(ForwardCli, ChecksTheWeightsByDefault) {
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open((kData / "goldens_flux.safetensors").string());
  const std::string inputs = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  cubevec::write_safetensors(inputs, {{"latent", goldens.tensor("vae_decode.z")}});
  const fs::path vae = dir_ / "vae";
  fs::create_directories(vae);
  fs::copy_file(kData / "flux_tiny" / "vae" / "config.json", vae / "config.json");
  const cubevec::SafetensorsFile weights =
      cubevec::SafetensorsFile::open((kData / "flux_tiny" / "vae" / "diffusion_pytorch_model.safetensors").string());
  cubevec::NamedTensors tensors;
  for (const auto& e : weights.entries()) {
    cubevec::Tensor t = weights.tensor(e.name).contiguous().clone();
    if (e.name == "decoder.conv_in.bias") t.mutable_data<float>()[2] = std::numeric_limits<float>::infinity();
    tensors.push_back({e.name, t});
  }
  cubevec::write_safetensors((vae / "diffusion_pytorch_model.safetensors").string(), tensors);
  const auto r = run({"forward", "--model", vae.string(), "--inputs", inputs, "--out", out});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find(vae.string() + ": weight 'decoder.conv_in.bias': element [2] is inf (expected finite values)"), std::string::npos)
      << r.err;
  // Unchecked, the inf reaches the output, which is refused as non-finite.
  const auto unchecked = run({"forward", "--model", vae.string(), "--inputs", inputs, "--out", out, "--no-check-weights"});
  EXPECT_EQ(unchecked.status, 1) << unchecked.err;
  EXPECT_NE(unchecked.err.find("the output 'sample'"), std::string::npos) << unchecked.err;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace forward_cli_test
