// The C API (include/cubevec.h): results against the C++ library's, and every function with bad
// arguments returning NULL / -1 and an error that names the argument or key, never a crash (CI runs
// these under AddressSanitizer too).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cubevec.h"
#include "pipelines/pipeline.h"

namespace capi_test {

const std::string kTinyFlux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
const std::string kTinyWan = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinywan";
const char* const kRequest = R"({"prompt": "a large red circle in the center on a blue background", "num_inference_steps": 6, "seed": 3})";

// The error a call left, freed; "" when none.
std::string take(char*& error) {
  std::string text = error ? error : "";
  cubevec_string_free(error);
  error = nullptr;
  return text;
}

struct Pipeline {
  cubevec_pipeline* p = nullptr;
  explicit Pipeline(const std::string& dir, const char* options = nullptr) {
    char* error = nullptr;
    p = cubevec_pipeline_load(dir.c_str(), options, &error);
    EXPECT_NE(p, nullptr) << take(error);
  }
  ~Pipeline() { cubevec_pipeline_free(p); }
};

std::vector<unsigned char> pixels(const cubevec_result* r, int index) {
  int w = 0, h = 0;
  const unsigned char* rgb = cubevec_result_rgb(r, index, &w, &h);
  return rgb ? std::vector<unsigned char>(rgb, rgb + static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3)
             : std::vector<unsigned char>();
}

TEST(CApi, GeneratesTheLibrarysPixelsAndReport) {
  Pipeline flux(kTinyFlux);
  ASSERT_NE(flux.p, nullptr);
  char* error = nullptr;
  cubevec_result* r = cubevec_generate(flux.p, kRequest, nullptr, nullptr, &error);
  ASSERT_NE(r, nullptr) << take(error);
  EXPECT_EQ(error, nullptr);
  EXPECT_EQ(cubevec_result_count(r), 1);
  int w = 0, h = 0;
  ASSERT_NE(cubevec_result_rgb(r, 0, &w, &h), nullptr);
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 64);
  const nlohmann::json report = nlohmann::json::parse(cubevec_result_json(r));
  EXPECT_EQ(report["steps"], 6);
  EXPECT_EQ(report["seed"], 3);
  // The C++ library's pixels for the same request.
  const auto library = cubevec::pipelines::Pipeline::load(kTinyFlux)->generate(cubevec::pipelines::Request::parse(kRequest));
  EXPECT_EQ(pixels(r, 0), library.images[0].pixels);
  cubevec_result_free(r);
}

TEST(CApi, AVideoIsOneImagePerFrame) {
  Pipeline wan(kTinyWan);
  ASSERT_NE(wan.p, nullptr);
  char* error = nullptr;
  cubevec_result* r = cubevec_generate(wan.p, R"({"prompt": "a red circle moving right", "num_frames": 17, "num_inference_steps": 3})",
                                       nullptr, nullptr, &error);
  ASSERT_NE(r, nullptr) << take(error);
  EXPECT_EQ(cubevec_result_count(r), 17);
  EXPECT_FALSE(pixels(r, 16).empty());
  EXPECT_TRUE(pixels(r, 17).empty());
  cubevec_result_free(r);
}

int stop_at_two(void* user, int step, int) {
  ++*static_cast<int*>(user);
  return step == 2 ? 7 : 0;
}

TEST(CApi, AProgressCallbackCancelsAndThePipelineStaysUsable) {
  Pipeline flux(kTinyFlux);
  ASSERT_NE(flux.p, nullptr);
  char* error = nullptr;
  cubevec_result* reference = cubevec_generate(flux.p, kRequest, nullptr, nullptr, &error);
  ASSERT_NE(reference, nullptr) << take(error);
  int calls = 0;
  EXPECT_EQ(cubevec_generate(flux.p, kRequest, stop_at_two, &calls, &error), nullptr);
  EXPECT_EQ(take(error), "cancelled: the progress callback returned 7 after step 2 of 6");
  EXPECT_EQ(calls, 2);
  cubevec_result* again = cubevec_generate(flux.p, kRequest, nullptr, nullptr, &error);
  ASSERT_NE(again, nullptr) << take(error);
  EXPECT_EQ(pixels(again, 0), pixels(reference, 0));
  cubevec_result_free(again);
  cubevec_result_free(reference);
}

TEST(CApi, BadLoadArgumentsGiveErrorsNamingThem) {
  char* error = nullptr;
  const auto load_error = [&](const char* dir, const char* options) {
    cubevec_pipeline* p = cubevec_pipeline_load(dir, options, &error);
    EXPECT_EQ(p, nullptr);
    cubevec_pipeline_free(p);
    return take(error);
  };
  EXPECT_NE(load_error(nullptr, nullptr).find("model_dir is NULL"), std::string::npos);
  EXPECT_NE(load_error("/nonexistent/cubevec", nullptr).find("/nonexistent/cubevec: no such model folder"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), "{").find("options_json: not valid JSON"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), R"({"dtyp": "bf16"})").find("'dtyp'"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), R"({"dtype": "f16"})").find("'dtype'"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), R"({"offload": "2"})").find("'offload'"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), R"({"offload": -1})").find("'offload'"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), R"({"memory_limit": "lots"})").find("'memory_limit'"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), R"({"quant": "/nonexistent/q.json"})").find("/nonexistent/q.json"), std::string::npos);
  EXPECT_NE(load_error(kTinyFlux.c_str(), R"({"offload": 1000})").find("offload 1000: the resident blocks"), std::string::npos);
  EXPECT_EQ(cubevec_pipeline_load(nullptr, nullptr, nullptr), nullptr);  // no error pointer: still no crash
}

TEST(CApi, BadRequestsGiveErrorsNamingTheKey) {
  Pipeline flux(kTinyFlux);
  ASSERT_NE(flux.p, nullptr);
  char* error = nullptr;
  const auto generate_error = [&](cubevec_pipeline* p, const char* request) {
    cubevec_result* r = cubevec_generate(p, request, nullptr, nullptr, &error);
    EXPECT_EQ(r, nullptr);
    cubevec_result_free(r);
    return take(error);
  };
  EXPECT_NE(generate_error(nullptr, kRequest).find("pipeline is NULL"), std::string::npos);
  EXPECT_NE(generate_error(flux.p, nullptr).find("request_json is NULL"), std::string::npos);
  EXPECT_NE(generate_error(flux.p, "not json").find("request_json: not valid JSON"), std::string::npos);
  EXPECT_NE(generate_error(flux.p, R"({"prompt": "x", "stepz": 3})").find("'stepz'"), std::string::npos);
  EXPECT_NE(generate_error(flux.p, R"({"prompt": 5})").find("'prompt'"), std::string::npos);
  EXPECT_NE(generate_error(flux.p, R"({"prompt": "x", "num_inference_steps": 100000})").find("'num_inference_steps'"), std::string::npos);
  EXPECT_NE(generate_error(flux.p, R"({"prompt": "x", "width": 70})").find("width and height must be positive multiples of"),
            std::string::npos);
  // The library's flag names come back as the request's keys.
  EXPECT_NE(generate_error(flux.p, R"({"prompt": "   "})").find("prompt TEXT is required"), std::string::npos);
  EXPECT_EQ(generate_error(flux.p, R"({"prompt": "   "})").find("--prompt"), std::string::npos);
  EXPECT_NE(generate_error(flux.p, R"({"prompt_embeds": "/nonexistent/e.safetensors"})").find("/nonexistent/e.safetensors"),
            std::string::npos);
  EXPECT_EQ(cubevec_generate(flux.p, "{}", nullptr, nullptr, nullptr), nullptr);  // no error pointer
}

// Whether `text` is well-formed UTF-8.
bool valid_utf8(const std::string& text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

TEST(CApi, ErrorsAreShortValidUtf8AndNameThePath) {
  Pipeline flux(kTinyFlux);
  ASSERT_NE(flux.p, nullptr);
  char* error = nullptr;
  std::string wide;  // 30 three-byte characters: the reader cuts the echoed value inside one
  for (int i = 0; i < 30; ++i) wide += "\xe7\xba\xa2";
  EXPECT_EQ(cubevec_generate(flux.p, (R"({"prompt": "x", "cfg": ")" + wide + R"("})").c_str(), nullptr, nullptr, &error), nullptr);
  const std::string cut = take(error);
  EXPECT_NE(cut.find("'cfg'"), std::string::npos) << cut;
  EXPECT_TRUE(valid_utf8(cut)) << cut;
  const std::string long_key = R"({"prompt": "x", ")" + std::string(100000, 'k') + R"(": 1})";
  EXPECT_EQ(cubevec_generate(flux.p, long_key.c_str(), nullptr, nullptr, &error), nullptr);
  EXPECT_LT(take(error).size(), 4200u);
  // A symlink loop is the path and the system's reason, not a C++ library message.
  const std::string loop = testing::TempDir() + "/cubevec_capi_loop";
  std::filesystem::remove(loop);
  std::filesystem::create_symlink(loop, loop);
  EXPECT_EQ(cubevec_pipeline_load(loop.c_str(), nullptr, &error), nullptr);
  const std::string message = take(error);
  EXPECT_NE(message.find(loop + ": Too many levels of symbolic links"), std::string::npos) << message;
  EXPECT_EQ(message.find("filesystem error"), std::string::npos) << message;
  std::filesystem::remove(loop);
}

struct Reentry {
  cubevec_pipeline* pipeline = nullptr;
  std::string inner_error;
  bool inner_returned_null = false;
};

int generate_again(void* user, int step, int) {
  auto* r = static_cast<Reentry*>(user);
  if (step != 1) return 0;
  char* error = nullptr;
  cubevec_result* inner = cubevec_generate(r->pipeline, kRequest, nullptr, nullptr, &error);
  r->inner_returned_null = inner == nullptr;
  r->inner_error = take(error);
  cubevec_result_free(inner);
  return 0;
}

TEST(CApi, AProgressCallbackCallingGenerateOnAnOffloadedPipelineGetsAnErrorNotADeadlock) {
  Pipeline offloaded(kTinyFlux, R"({"offload": 1})");
  ASSERT_NE(offloaded.p, nullptr);
  Reentry reentry;
  reentry.pipeline = offloaded.p;
  char* error = nullptr;
  cubevec_result* outer = cubevec_generate(offloaded.p, kRequest, generate_again, &reentry, &error);
  ASSERT_NE(outer, nullptr) << take(error);
  EXPECT_TRUE(reentry.inner_returned_null);
  EXPECT_NE(reentry.inner_error.find("streams its weights (offload)"), std::string::npos) << reentry.inner_error;
  cubevec_result_free(outer);
}

TEST(CApi, ResultFunctionsTakeNullAndBadIndices) {
  EXPECT_EQ(cubevec_result_count(nullptr), -1);
  int w = 7, h = 7;
  EXPECT_EQ(cubevec_result_rgb(nullptr, 0, &w, &h), nullptr);
  EXPECT_EQ(w, 0);
  EXPECT_EQ(h, 0);
  EXPECT_EQ(cubevec_result_rgb(nullptr, 0, nullptr, nullptr), nullptr);
  EXPECT_EQ(cubevec_result_json(nullptr), nullptr);
  cubevec_result_free(nullptr);
  cubevec_pipeline_free(nullptr);
  cubevec_string_free(nullptr);
  EXPECT_NE(std::string(cubevec_version()).find("API 1"), std::string::npos);
}

}  // namespace capi_test
