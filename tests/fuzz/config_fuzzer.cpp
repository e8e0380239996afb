// libFuzzer target for the JSON config readers a user hands cubevec: model configs (Flux, Wan, the
// two VAEs, the tiny text encoder, CLIPVisionModel and its CLIPImageProcessor), scheduler configs (FlowMatch Euler, UniPC), generation_defaults.json, the timestep
// policy and device profiles. A cubevec::Error is the expected answer to a bad file; any other
// exception, a sanitizer report, or an accepted config whose numbers are not finite is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "device/device_profile.h"
#include "models/autoencoder_kl.h"
#include "models/autoencoder_kl_wan.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision_model.h"
#include "models/flux_transformer.h"
#include "models/tiny_text_encoder.h"
#include "models/wan_transformer.h"
#include "pipelines/flow_match.h"
#include "pipelines/generation_defaults.h"
#include "pipelines/unipc.h"
#include "quant/timestep_policy.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

template <typename Parse>
void expect_error_or_value(Parse parse) {
  try {
    parse();
  } catch (const cubevec::Error& e) {
    require(e.what()[0] != '\0');
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  expect_error_or_value([&] {
    const cubevec::DeviceProfile p = cubevec::parse_device_profile(text, "fuzz.json");
    require(p.cube_threads > 0 && p.vector_threads > 0 && std::isfinite(p.hbm_gbps));
  });
  nlohmann::json json;
  try {
    json = cubevec::parse_strict_json(text, 16);
  } catch (const cubevec::Error&) {
    return 0;
  }
  expect_error_or_value([&] { (void)cubevec::models::FluxConfig::from_json(json, "fuzz.json"); });
  expect_error_or_value([&] { (void)cubevec::models::WanConfig::from_json(json, "fuzz.json"); });
  expect_error_or_value([&] { (void)cubevec::models::AutoencoderKLConfig::from_json(json, "fuzz.json"); });
  expect_error_or_value([&] { (void)cubevec::models::AutoencoderKLWanConfig::from_json(json, "fuzz.json"); });
  expect_error_or_value([&] { (void)cubevec::models::TinyTextEncoderConfig::from_json(json, "fuzz.json"); });
  expect_error_or_value([&] {
    const cubevec::models::ClipVisionConfig c = cubevec::models::ClipVisionConfig::from_json(json, "fuzz.json");
    require(c.num_positions() >= 2 && c.hidden_size % c.num_attention_heads == 0 && std::isfinite(c.layer_norm_eps));
  });
  expect_error_or_value([&] {
    const cubevec::models::ClipImageProcessorConfig c = cubevec::models::ClipImageProcessorConfig::from_json(json, "fuzz.json");
    require(c.crop_height >= 1 && c.crop_width >= 1 && std::isfinite(c.rescale_factor));
    for (std::size_t i = 0; i < 3; ++i) require(std::isfinite(c.image_mean[i]) && std::isfinite(c.image_std[i]) && c.image_std[i] != 0);
  });
  expect_error_or_value([&] { (void)cubevec::quant::TimestepPolicy::from_json(json, "fuzz.json"); });
  expect_error_or_value([&] {
    const cubevec::pipelines::GenerationDefaults d = cubevec::pipelines::GenerationDefaults::from_json(json, "fuzz.json");
    require(!d.width || (*d.width % 16 == 0 && *d.width >= 16));
    require(!d.frames || (*d.frames - 1) % 4 == 0);
    require(!d.guidance || (std::isfinite(*d.guidance) && *d.guidance >= 0 && *d.guidance <= 100));
  });
  expect_error_or_value([&] {
    const cubevec::pipelines::FlowMatchConfig c = cubevec::pipelines::FlowMatchConfig::from_json(json, "fuzz.json");
    cubevec::pipelines::FlowMatchEulerScheduler s(c);
    s.set_timesteps(4, 0.5);
    for (float sigma : s.sigmas()) require(std::isfinite(sigma));
  });
  expect_error_or_value([&] {
    const cubevec::pipelines::UniPCConfig c = cubevec::pipelines::UniPCConfig::from_json(json, "fuzz.json");
    cubevec::pipelines::UniPCMultistepScheduler s(c);
    s.set_timesteps(4);
    for (float sigma : s.sigmas()) require(std::isfinite(sigma));
  });
  return 0;
}
