// The shipped tiny text-to-video model (assets/tinywan, trained by tools/tinywan/train.py) run by
// cubevec's pipeline against the PyTorch sampler (tools/tinywan/sample.py, written from the porting
// spec): the text encoder, the FlowMatch Euler loop with CFG at the model's generation defaults and
// the VAE decode give the clip of tests/data/tinywan_reference.safetensors (`sample.py reference`)
// with a PSNR of at least 40 dB. The Wan goldens check each part on random weights; this checks the
// trained model as users run it (rerun `sample.py reference` whenever assets/tinywan changes).
#include <gtest/gtest.h>

#include <cstdio>

#include "models/tiny_text_encoder.h"
#include "ops/vector_ops.h"
#include "pipelines/quality.h"
#include "pipelines/wan_t2v.h"
#include "tensor/safetensors.h"

namespace cubevec {
namespace tinywan_test {  // named after the file: unity batches never mix two files' helpers

const std::string kModel = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinywan";
const std::string kReference = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/tinywan_reference.safetensors";

TEST(TinyWan, PipelineMatchesThePyTorchSampler) {
  const SafetensorsFile ref = SafetensorsFile::open(kReference);
  const auto& meta = ref.metadata();
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(kModel);
  const std::unique_ptr<models::TinyTextEncoder> text = models::TinyTextEncoder::load(kModel);
  pipelines::T2VOptions o;
  o.width = std::stoll(meta.at("width"));
  o.height = std::stoll(meta.at("height"));
  o.frames = std::stoll(meta.at("frames"));
  o.steps = std::stoi(meta.at("steps"));
  o.guidance = std::stod(meta.at("guidance"));
  o.seed = std::stoull(meta.at("seed"));
  o.cfg = pipelines::CfgMode::fused;
  const pipelines::PromptEmbeddings positive = text->encode(meta.at("prompt")), negative = text->encode("");
  pipeline.check(o, true);
  Device& device = default_device();
  pipelines::T2ITimings timings;
  const Tensor latents = pipeline.denoise(positive, &negative, o, device, {}, timings);
  std::vector<Tensor> chunks;
  pipeline.decode(
      latents, o, device, [&](const Tensor& frames) { chunks.push_back(frames); }, timings);
  const Tensor video = ops::concat(chunks, 2, device.default_stream());
  const Tensor want = ref.tensor("video");
  ASSERT_EQ(video.shape(), want.shape());
  ASSERT_EQ(latents.shape(), ref.tensor("latents").shape());
  const double db = pipelines::compare_pictures(video, want).psnr_db;
  RecordProperty("psnr_db", std::to_string(db));
  std::printf("PSNR of the C++ pipeline against the PyTorch sampler: %.2f dB\n", db);
  EXPECT_GE(db, 40.0);
}

}  // namespace tinywan_test
}  // namespace cubevec
