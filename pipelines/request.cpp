#include "pipelines/request.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

// The request's ranges; the command line's flags check the same ones (cli/generate_command.cpp).
constexpr int64_t kMaxImageSide = 16384;
constexpr int64_t kMaxFrames = 4097;
constexpr int kMaxSteps = 1000;
constexpr double kMaxGuidance = 100.0;
constexpr int kMaxSequenceLength = 4096;

SparseConfig sparse_from_json(const nlohmann::json& json, const std::string& source) {
  SparseConfig c;
  if (json.is_string()) {
    const std::string type = json.get<std::string>();
    if (type != "rf_v2" && type != "ada_bsa") throw Error(source + ": 'sparse' must be rf_v2 or ada_bsa (or an object of sparse settings)");
    c.type = ops::parse_sparse_type(type);
    return c;
  }
  ConfigReader r(json, source + ": 'sparse'", "sparse attention settings");
  std::string type, blocks;
  if (!r.has("type")) r.fail("type", "is required: rf_v2 or ada_bsa");
  r.text("type", type, {"rf_v2", "ada_bsa"})
      .number_in("sparsity", c.sparsity, 0.0, 1.0)
      .integer("step_start", c.step_start, 0, kMaxSteps)
      .text("blocks", blocks)
      .integer("mask_refresh", c.mask_refresh, 1, kMaxSteps)
      .number_in("cdf_threshold", c.cdf_threshold, 0.0, 1.0);
  r.reject_unknown();
  c.type = ops::parse_sparse_type(type);
  if (r.has("cdf_threshold") && c.type != ops::SparseType::ada_bsa) r.fail("cdf_threshold", "applies to \"type\": \"ada_bsa\" only");
  if (!blocks.empty()) std::tie(c.block_first, c.block_last) = SparseConfig::parse_blocks(blocks);
  c.validate();
  return c;
}

nlohmann::ordered_json sparse_to_json(const SparseConfig& c) {
  nlohmann::ordered_json j{
      {"type", ops::sparse_type_name(c.type)}, {"sparsity", c.sparsity}, {"step_start", c.step_start}, {"mask_refresh", c.mask_refresh}};
  if (c.block_first != 0 || c.block_last != -1)
    j["blocks"] = std::to_string(c.block_first) + "-" + (c.block_last < 0 ? std::string("end") : std::to_string(c.block_last));
  if (c.type == ops::SparseType::ada_bsa) j["cdf_threshold"] = c.cdf_threshold;
  return j;
}

}  // namespace

Request Request::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "generation request");
  Request q;
  int64_t width = 0, height = 0, frames = 0;
  int steps = 0, max_sequence_length = 0;
  double guidance = 0, guidance_2 = 0, true_cfg = 0, strength = 0;
  r.text("prompt", q.text.prompt)
      .text("negative_prompt", q.text.negative_prompt)
      .text("prompt_embeds", q.text.prompt_embeds)
      .integer("max_sequence_length", max_sequence_length, 1, kMaxSequenceLength)
      .integer("width", width, 16, kMaxImageSide)
      .integer("height", height, 16, kMaxImageSide)
      .integer("num_frames", frames, 1, kMaxFrames)
      .integer("num_inference_steps", steps, 1, kMaxSteps)
      .number_in("guidance_scale", guidance, 0.0, kMaxGuidance)
      .number_in("guidance_scale_2", guidance_2, 0.0, kMaxGuidance)
      .number_in("true_cfg_scale", true_cfg, 0.0, kMaxGuidance)
      .text("cfg", q.cfg, {"off", "fused", "streams"})
      .text("image", q.image)
      .text("mask_image", q.mask_image)
      .text("last_image", q.last_image)
      .number_in("strength", strength, 0.0, 1.0)
      .unsigned_integer("seed", q.seed);
  std::string quant_attention = "none";
  r.text("quant_attention", quant_attention, {"none", "int8"});
  q.quant_attention = parse_attention_quant(quant_attention, source + ": 'quant_attention'");
  bool edit = false, auto_resize = true;
  int64_t max_area = 0;
  r.boolean("edit", edit).boolean("auto_resize", auto_resize).integer("max_area", max_area, 256, kMaxImageSide * kMaxImageSide);
  if (r.has("edit")) q.edit = edit;
  if (r.has("auto_resize")) q.auto_resize = auto_resize;
  if (r.has("max_area")) q.max_area = max_area;
  if (const nlohmann::json& lora = r.raw("lora"); !lora.is_null()) {
    // One "FILE[:SCALE]" string or a list of them.
    const nlohmann::json list = lora.is_string() ? nlohmann::json::array({lora}) : lora;
    if (!list.is_array() || list.empty() || list.size() > 16)
      r.fail("lora", "must be a \"FILE[:SCALE]\" string or a list of 1 to 16 of them, got " + lora.dump());
    for (const nlohmann::json& item : list) {
      if (!item.is_string() || item.get<std::string>().empty() || item.get<std::string>().find('\0') != std::string::npos)
        r.fail("lora", "must list \"FILE[:SCALE]\" strings, got " + item.dump());
      q.lora.push_back(item.get<std::string>());
    }
  }
  if (r.has("strength")) {
    if (!(strength > 0.0)) r.fail("strength", "must be in (0, 1]: 0 would run no denoising step");
    q.strength = strength;
  }
  for (const auto& [key, path] :
       {std::pair<const char*, const std::string*>{"image", &q.image}, {"mask_image", &q.mask_image}, {"last_image", &q.last_image}})
    if (r.has(key) && path->empty()) r.fail(key, "must name a PNG or JPEG file, got an empty string");
  if (r.has("max_sequence_length")) q.text.max_sequence_length = max_sequence_length, q.text.max_sequence_length_given = true;
  if (r.has("width")) q.width = width;
  if (r.has("height")) q.height = height;
  if (r.has("num_frames")) q.num_frames = frames;
  if (r.has("num_inference_steps")) q.num_inference_steps = steps;
  if (r.has("guidance_scale")) q.guidance_scale = guidance;
  if (r.has("true_cfg_scale")) q.true_cfg_scale = true_cfg;
  if (r.has("guidance_scale_2")) q.guidance_scale_2 = guidance_2;
  if (const nlohmann::json& cache = r.raw("cache"); !cache.is_null()) {
    if (cache.is_string()) {
      const std::string method = cache.get<std::string>();
      try {
        q.cache.method = parse_cache_method(method);
      } catch (const Error&) {
        r.fail("cache", "must be one of none, attention, dit-block, db (or an object of cache settings), got \"" + method + "\"");
      }
    } else if (cache.is_object()) {
      q.cache = CacheConfig::from_json(cache, source + ": 'cache'");
    } else {
      r.fail("cache", "must be a method name or an object of cache settings, got " + cache.dump());
    }
  }
  if (const nlohmann::json& sparse = r.raw("sparse"); !sparse.is_null()) {
    if (!sparse.is_string() && !sparse.is_object())
      r.fail("sparse", "must be rf_v2, ada_bsa or an object of sparse settings, got " + sparse.dump());
    q.sparse = sparse_from_json(sparse, source);
  }
  r.reject_unknown();
  if (q.text.prompt.empty() && q.text.prompt_embeds.empty()) r.fail("prompt", "is required (a string), or prompt_embeds (a file)");
  if (!q.text.prompt.empty() && !q.text.prompt_embeds.empty())
    r.fail("prompt_embeds", "and 'prompt' are both given: pass the text or its embeddings, not both");
  // C strings end at a NUL: a prompt holding one would be encoded (and reported) cut short.
  const std::pair<const char*, const std::string*> texts[] = {{"prompt", &q.text.prompt},
                                                              {"negative_prompt", &q.text.negative_prompt},
                                                              {"prompt_embeds", &q.text.prompt_embeds},
                                                              {"image", &q.image},
                                                              {"mask_image", &q.mask_image},
                                                              {"last_image", &q.last_image}};
  for (const auto& [key, text] : texts)
    if (text->find('\0') != std::string::npos) r.fail(key, "holds a NUL character (\\u0000), which no text may hold");
  return q;
}

Request Request::parse(const std::string& json_text, const std::string& source) {
  nlohmann::json json;
  try {
    json = parse_strict_json(json_text, 8);
  } catch (const StrictJsonError& e) {
    throw Error(source + ": " + (e.kind() == StrictJsonError::Kind::Syntax ? "" : "not valid JSON: ") + e.what());
  }
  return from_json(json, source);
}

nlohmann::ordered_json Request::to_json() const {
  nlohmann::ordered_json j;
  if (!text.prompt.empty()) j["prompt"] = text.prompt;
  if (!text.negative_prompt.empty()) j["negative_prompt"] = text.negative_prompt;
  if (!text.prompt_embeds.empty()) j["prompt_embeds"] = text.prompt_embeds;
  if (text.max_sequence_length_given) j["max_sequence_length"] = text.max_sequence_length;
  if (width) j["width"] = *width;
  if (height) j["height"] = *height;
  if (num_frames) j["num_frames"] = *num_frames;
  if (num_inference_steps) j["num_inference_steps"] = *num_inference_steps;
  if (guidance_scale) j["guidance_scale"] = *guidance_scale;
  if (guidance_scale_2) j["guidance_scale_2"] = *guidance_scale_2;
  if (true_cfg_scale) j["true_cfg_scale"] = *true_cfg_scale;
  if (!cfg.empty()) j["cfg"] = cfg;
  if (!image.empty()) j["image"] = image;
  if (!mask_image.empty()) j["mask_image"] = mask_image;
  if (!last_image.empty()) j["last_image"] = last_image;
  if (strength) j["strength"] = *strength;
  if (!lora.empty()) j["lora"] = lora;
  if (edit) j["edit"] = *edit;
  if (max_area) j["max_area"] = *max_area;
  if (auto_resize) j["auto_resize"] = *auto_resize;
  j["seed"] = seed;
  if (cache.method != CacheMethod::none) j["cache"] = cache.to_json();
  if (sparse) j["sparse"] = sparse_to_json(*sparse);
  if (quant_attention != AttentionQuant::none) j["quant_attention"] = std::string(attention_quant_name(quant_attention));
  return j;
}

std::string in_request_terms(const std::string& message) {
  // Longest flags first, so "--prompt-embeds" is not read as "--prompt".
  static const std::vector<std::pair<std::string, std::string>> kTable = [] {
    std::vector<std::pair<std::string, std::string>> t = {
        {"--prompt-embeds", "prompt_embeds"},
        {"--negative-prompt", "negative_prompt"},
        {"--prompt", "prompt"},
        {"--max-sequence-length", "max_sequence_length"},
        {"--width", "width"},
        {"--height", "height"},
        {"--frames", "num_frames"},
        {"--steps", "num_inference_steps"},
        {"--guidance-2", "guidance_scale_2"},
        {"--guidance", "guidance_scale"},
        {"--cfg-scale", "true_cfg_scale"},
        {"--cfg", "cfg"},
        {"--seed", "seed"},
        {"--last-image", "last_image"},
        {"--image", "image"},
        {"--mask", "mask_image"},
        {"--strength", "strength"},
        {"--no-auto-resize", "auto_resize"},
        {"--max-area", "max_area"},
        {"--edit", "edit"},
        {"--cache-config", "cache"},
        {"--cache-step-start", "cache.cache-step-start"},
        {"--cache-interval", "cache.cache-interval"},
        {"--cache-step-end", "cache.cache-step-end"},
        {"--cache-block-start", "cache.cache-block-start"},
        {"--cache-block-end", "cache.cache-block-end"},
        {"--cache-fn", "cache.cache-fn"},
        {"--cache-bn", "cache.cache-bn"},
        {"--cache-threshold", "cache.cache-threshold"},
        {"--cache-warmup", "cache.cache-warmup"},
        {"--cache-max-cached", "cache.cache-max-cached"},
        {"--cache-max-continuous", "cache.cache-max-continuous"},
        {"--taylorseer", "cache.taylorseer"},
        {"--cache", "cache"},
        {"--sparse-step-start", "sparse.step_start"},
        {"--sparse-blocks", "sparse.blocks"},
        {"--sparse-mask-refresh", "sparse.mask_refresh"},
        {"--sparse-cdf-threshold", "sparse.cdf_threshold"},
        {"--sparsity", "sparse.sparsity"},
        {"--sparse", "sparse"},
        {"--quant-attention", "quant_attention"},
        {"--lora-ignore-unmatched", "lora_ignore_unmatched"},
        {"--lora-mode", "lora_mode"},
        {"--lora", "lora"},
        {"--quant-2", "quant_2"},
        {"--quant", "quant"},
        {"--timestep-policy", "timestep_policy"},
        {"--offload", "offload"},
        {"--packed-cache", "packed_cache"},
        {"--dtype", "dtype"},
        {"--variant", "variant"},
        {"--memory-limit", "memory_limit"},
        {"--check-weights", "check_weights"},
        {"--threads", "threads"},
        {"--cube-threads", "cube_threads"},
        {"--vector-threads", "vector_threads"},
        {"--device-profile", "device_profile"},
    };
    std::sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    return t;
  }();
  std::string out;
  out.reserve(message.size());
  for (std::size_t i = 0; i < message.size();) {
    bool replaced = false;
    if (message.compare(i, 2, "--") == 0) {
      for (const auto& [flag, key] : kTable) {
        const std::size_t end = i + flag.size();
        if (end > message.size() || message.compare(i, flag.size(), flag) != 0) continue;
        // A whole flag, not the start of a longer word ("--frames" in "--frames-dir").
        const bool whole = end == message.size() ||
                           !(std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-' || message[end] == '_');
        if (whole) {
          out += key;
          i = end;
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out += message[i++];
  }
  return out;
}

}  // namespace cubevec::pipelines
