// Quantized attention as a request asks for it (pipelines/stages/quant_attention.h): every
// attention call of tinyflux and tinywan runs int8 Q K^T, and the picture stays within a stated
// PSNR of the exact run's (computed here on the 8-bit pixels: 10 log10(255^2 / MSE) over every
// pixel of every frame); the request key's errors; CPUs without AMX-INT8 get an error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "pipelines/pipeline.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace quant_attention_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::pipelines;

const std::string kTinyFlux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
const std::string kTinyWan = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinywan";

using testing::message_of;

double psnr_8bit(const std::vector<media::RgbImage>& a, const std::vector<media::RgbImage>& b) {
  EXPECT_EQ(a.size(), b.size());
  double se = 0;
  std::size_t n = 0;
  for (std::size_t f = 0; f < std::min(a.size(), b.size()); ++f) {
    EXPECT_EQ(a[f].pixels.size(), b[f].pixels.size());
    for (std::size_t i = 0; i < std::min(a[f].pixels.size(), b[f].pixels.size()); ++i) {
      const double d = double(a[f].pixels[i]) - double(b[f].pixels[i]);
      se += d * d;
      ++n;
    }
  }
  return se == 0 ? INFINITY : 10.0 * std::log10(255.0 * 255.0 / (se / double(n)));
}

int int8_calls(const GenerationResult& r) {
  for (const auto& stage : r.stages.stages())
    if (stage->name() == "quant-attention int8") return stage->report().at("int8_calls").get<int>();
  return 0;
}

// The exact run and the int8 run of `request`; returns the PSNR of the second against the first.
double int8_psnr(const std::string& model, Request request, const std::string& what) {
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(model);
  const GenerationResult exact = pipeline->generate(request);
  request.quant_attention = AttentionQuant::int8;
  const GenerationResult int8 = pipeline->generate(request);
  EXPECT_GT(int8_calls(int8), 0) << what << ": the stage ran no attention call";
  EXPECT_EQ(int8_calls(exact), 0);
  const double db = psnr_8bit(exact.images, int8.images);
  std::printf("%s: int8 attention against exact attention, %.2f dB over %zu frame(s)\n", what.c_str(), db, int8.images.size());
  return db;
}

TEST(QuantAttention, TinyFluxPictureStaysWithin50Db) {
  if (!ops::attention_impl_available(ops::AttentionImpl::flash_int8)) GTEST_SKIP() << "no AMX-INT8 on this CPU";
  const double db =
      int8_psnr(kTinyFlux, Request::parse(R"({"prompt": "a large red circle in the center on a blue background", "seed": 3})"),
                "tinyflux (default size and steps)");
  EXPECT_GE(db, 50.0);  // 66.2 dB measured
  EXPECT_TRUE(std::isfinite(db)) << "the int8 run must differ from the exact one (else the stage did nothing)";
}

TEST(QuantAttention, TinyWanVideoStaysWithin40Db) {
  if (!ops::attention_impl_available(ops::AttentionImpl::flash_int8)) GTEST_SKIP() << "no AMX-INT8 on this CPU";
  const double db =
      int8_psnr(kTinyWan, Request::parse(R"({"prompt": "a red circle moving right on a blue background", "num_frames": 17, "seed": 1})"),
                "tinywan (17 frames, default steps)");
  EXPECT_GE(db, 40.0);  // 49.2 dB measured
  EXPECT_TRUE(std::isfinite(db));
}

TEST(QuantAttention, RequestKeyErrorsAndRoundTrip) {
  EXPECT_NE(message_of([] { Request::parse(R"({"prompt": "x", "quant_attention": "fp8"})"); }).find("quant_attention"), std::string::npos);
  EXPECT_NE(message_of([] { Request::parse(R"({"prompt": "x", "quant_attention": 8})"); }).find("quant_attention"), std::string::npos);
  const Request r = Request::parse(R"({"prompt": "x", "quant_attention": "int8"})");
  EXPECT_EQ(r.quant_attention, AttentionQuant::int8);
  EXPECT_EQ(r.to_json().at("quant_attention"), "int8");
  EXPECT_EQ(Request::from_json(r.to_json()).quant_attention, AttentionQuant::int8);
  EXPECT_FALSE(Request::parse(R"({"prompt": "x", "quant_attention": "none"})").to_json().contains("quant_attention"));
  EXPECT_EQ(in_request_terms("--quant-attention int8 needs AMX-INT8"), "quant_attention int8 needs AMX-INT8");
}

// Where the CPU has no AMX-INT8 the request is refused before any work, naming what it lacks; a
// simulated (shape-only) run prices the kernel on any CPU.
TEST(QuantAttention, CpusWithoutAmxInt8RefuseTheRequestAndSimulationPricesIt) {
  Request request = Request::parse(R"({"prompt": "a red circle", "num_inference_steps": 2, "quant_attention": "int8"})");
  const std::unique_ptr<Pipeline> pipeline = Pipeline::load(kTinyFlux);
  if (!ops::attention_impl_available(ops::AttentionImpl::flash_int8))
    EXPECT_NE(message_of([&] { pipeline->checked(request); }).find("needs AMX-INT8"), std::string::npos);
  else EXPECT_EQ(message_of([&] { pipeline->checked(request); }), "(no error)");
  LoadOptions simulate;
  simulate.simulate = true;
  const GenerationResult r = Pipeline::load(kTinyFlux, simulate)->generate(request);
  EXPECT_GT(int8_calls(r), 0);
}

}  // namespace quant_attention_test
}  // namespace cubevec
