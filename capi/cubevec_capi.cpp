// The C API (include/cubevec.h) over the generation library: every call catches what the library
// throws and hands it back as an error string in the request's terms (pipelines/request.h).
#include "cubevec.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <string>

#include "pipelines/pipeline.h"
#include "base/json_text.h"

#define CUBEVEC_EXPORT __attribute__((visibility("default")))

struct cubevec_pipeline {
  std::unique_ptr<cubevec::pipelines::Pipeline> pipeline;
};

struct cubevec_result {
  cubevec::pipelines::GenerationResult result;
  std::string json;
};

namespace {

// A copy the caller frees with cubevec_string_free (malloc'd: C code may also free() it).
char* copy_string(const std::string& text) {
  char* s = static_cast<char*>(std::malloc(text.size() + 1));
  if (s) std::memcpy(s, text.c_str(), text.size() + 1);
  return s;
}

// Errors go to C callers and language bindings: valid UTF-8 (a byte that does not start or continue
// a character becomes '?'; a message echoing a bad input may have been cut inside one), and at most
// kMaxError bytes (a message may quote the whole input).
constexpr std::size_t kMaxError = 4096;

std::string valid_utf8(const std::string& text) {
  std::string out;
  out.reserve(std::min(text.size(), kMaxError + 3));
  for (std::size_t i = 0; i < text.size() && out.size() < kMaxError;) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = length > 0 && i + length <= text.size();
    for (std::size_t k = 1; ok && k < length; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(text, i, length);
      i += length;
    } else {
      out += '?';
      ++i;
    }
  }
  if (out.size() >= kMaxError) out += "...";
  return out;
}

void set_error(char** error, const std::string& message) {
  if (error) *error = copy_string(valid_utf8(message));
}

// Runs `f`, turning any exception into NULL and an error.
template <class F>
auto guarded(char** error, F&& f) -> decltype(f()) {
  if (error) *error = nullptr;
  try {
    return f();
  } catch (const cubevec::pipelines::Cancelled&) {
    throw;
  } catch (const std::bad_alloc&) {
    set_error(error, "out of memory");
  } catch (const std::filesystem::filesystem_error& e) {
    set_error(error, e.path1().string() + ": " + e.code().message());
  } catch (const std::exception& e) {
    set_error(error, cubevec::pipelines::in_request_terms(e.what()));
  } catch (...) {
    set_error(error, "unknown error");
  }
  return nullptr;
}

}  // namespace

extern "C" {

CUBEVEC_EXPORT const char* cubevec_version(void) { return "0.1.0 (API 1)"; }

CUBEVEC_EXPORT cubevec_pipeline* cubevec_pipeline_load(const char* model_dir, const char* options_json, char** error) {
  return guarded(error, [&]() -> cubevec_pipeline* {
    if (!model_dir) throw cubevec::Error("model_dir is NULL (expected a model folder's path)");
    const cubevec::pipelines::LoadOptions options =
        cubevec::pipelines::LoadOptions::parse(options_json ? options_json : "", "options_json");
    auto p = std::make_unique<cubevec_pipeline>();
    p->pipeline = cubevec::pipelines::Pipeline::load(model_dir, options);
    return p.release();
  });
}

CUBEVEC_EXPORT cubevec_result* cubevec_generate(cubevec_pipeline* pipeline, const char* request_json,
                                                int (*progress)(void* user, int step, int steps), void* user, char** error) {
  std::atomic<bool> cancel{false};
  int stopped_at = 0, steps = 0, code = 0;
  try {
    return guarded(error, [&]() -> cubevec_result* {
      if (!pipeline || !pipeline->pipeline) throw cubevec::Error("pipeline is NULL (expected one from cubevec_pipeline_load)");
      if (!request_json) throw cubevec::Error("request_json is NULL (expected a JSON object such as {\"prompt\": \"...\"})");
      const cubevec::pipelines::Request request = cubevec::pipelines::Request::parse(request_json, "request_json");
      cubevec::pipelines::GenerateHooks hooks;
      hooks.cancel = &cancel;
      if (progress)
        hooks.on_step = [&](const cubevec::pipelines::Progress& p) {
          if (cancel.load()) return;
          code = progress(user, p.step, p.steps);
          if (code != 0) {
            stopped_at = p.step, steps = p.steps;
            cancel = true;
          }
        };
      auto r = std::make_unique<cubevec_result>();
      r->result = pipeline->pipeline->generate(request, hooks);
      r->json = cubevec::dump_json(r->result.report);
      return r.release();
    });
  } catch (const cubevec::pipelines::Cancelled&) {
    set_error(error, "cancelled: the progress callback returned " + std::to_string(code) + " after step " + std::to_string(stopped_at) +
                         " of " + std::to_string(steps));
    return nullptr;
  }
}

CUBEVEC_EXPORT int cubevec_result_count(const cubevec_result* result) {
  return result ? static_cast<int>(result->result.images.size()) : -1;
}

CUBEVEC_EXPORT const unsigned char* cubevec_result_rgb(const cubevec_result* result, int index, int* width, int* height) {
  if (width) *width = 0;
  if (height) *height = 0;
  if (!result || index < 0 || index >= static_cast<int>(result->result.images.size())) return nullptr;
  const cubevec::media::RgbImage& image = result->result.images[static_cast<std::size_t>(index)];
  if (width) *width = image.width;
  if (height) *height = image.height;
  return image.pixels.data();
}

CUBEVEC_EXPORT const char* cubevec_result_json(const cubevec_result* result) { return result ? result->json.c_str() : nullptr; }

CUBEVEC_EXPORT void cubevec_result_free(cubevec_result* result) { delete result; }
CUBEVEC_EXPORT void cubevec_pipeline_free(cubevec_pipeline* pipeline) { delete pipeline; }
CUBEVEC_EXPORT void cubevec_string_free(char* string) { std::free(string); }

}  // extern "C"
