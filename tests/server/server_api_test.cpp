// cubevec serve's routes against a server on an ephemeral loopback port: the OpenAI images API, the
// job API with Server-Sent Events, video jobs, the AUTOMATIC1111 subset, /health and /metrics; each
// error as OpenAI's error object naming the field; the queue's 429; cancel; the timeout; instances
// running at once give the pixels of sequential runs; stage state never carries between requests.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "media/avi.h"
#include "ops/attention.h"
#include "pipelines/pipeline.h"
#include "server/test_server.h"
#include "tensor/safetensors.h"

namespace server_api_test {

using namespace cubevec_server_test;
using cubevec::media::RgbImage;
using nlohmann::json;

// The same picture from the library directly (the server is only a front end to it).
RgbImage library_image(const std::string& request_json) {
  static const auto pipeline = cubevec::pipelines::Pipeline::load(kTinyFlux);
  return pipeline->generate(cubevec::pipelines::Request::parse(request_json)).images.at(0);
}

json body_with(const json& extra) {
  json body{{"prompt", kPrompt}, {"num_inference_steps", 3}, {"size", "48x32"}, {"seed", 5}};
  if (extra.is_object()) body.update(extra);
  return body;
}

// One instance and room for one waiting request: the queue's edges within two requests.
cubevec::server::SchedulerOptions one_instance_queue_of_one() {
  cubevec::server::SchedulerOptions options;
  options.instances = 1;
  options.max_queue = 1;
  return options;
}

// Requests of up to 1,000 steps: long enough to cancel or time out mid-run.
cubevec::server::ServeLimits long_runs() {
  cubevec::server::ServeLimits limits;
  limits.max_steps = 1000;
  return limits;
}

// Waits until the job has left the queue and runs (or has finished).
void wait_running(const TestServer& server, const std::string& path) {
  for (int i = 0; i < 400; ++i) {
    const json job = json_of(server.get(path));
    if (job.value("status", "") != "queued") return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << path << " never started";
}

TEST(ServerApi, OpenAiImagesB64PngEqualsTheLibrarysPixels) {
  TestServer server;
  const auto r = server.post("/v1/images/generations", body_with({{"n", 2}}).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json answer = json::parse(r->body);
  ASSERT_EQ(answer["data"].size(), 2u);
  EXPECT_EQ(answer["size"], "48x32");
  EXPECT_EQ(answer["output_format"], "png");
  for (int i = 0; i < 2; ++i) {
    const std::string png = from_base64(answer["data"][i]["b64_json"]);
    ASSERT_TRUE(cubevec::media::is_png(reinterpret_cast<const uint8_t*>(png.data()), png.size()));
    const RgbImage got = png_of(png);
    // n pictures have seeds seed, seed + 1.
    EXPECT_EQ(answer["data"][i]["seed"], 5 + i);
    const RgbImage expected = library_image(
        R"({"prompt": ")" + kPrompt + R"(", "num_inference_steps": 3, "width": 48, "height": 32, "seed": )" + std::to_string(5 + i) + "}");
    EXPECT_EQ(got.width, 48);
    EXPECT_EQ(got.height, 32);
    EXPECT_EQ(got.pixels, expected.pixels) << "picture " << i;
  }
}

TEST(ServerApi, UrlResponseServesThePictureAsPngAndJpeg) {
  TestServer server;
  const auto r = server.post("/v1/images/generations", body_with({{"response_format", "url"}}).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string url = json::parse(r->body)["data"][0]["url"];
  const std::string prefix = "http://127.0.0.1:" + std::to_string(server.port());
  ASSERT_EQ(url.rfind(prefix, 0), 0u) << url;
  const auto file = server.get(url.substr(prefix.size()));
  ASSERT_TRUE(file);
  ASSERT_EQ(file->status, 200);
  EXPECT_EQ(file->get_header_value("Content-Type"), "image/png");
  const RgbImage expected =
      library_image(R"({"prompt": ")" + kPrompt + R"(", "num_inference_steps": 3, "width": 48, "height": 32, "seed": 5})");
  EXPECT_EQ(png_of(file->body).pixels, expected.pixels);
  // JPEG output decodes to the same picture within JPEG's error.
  const auto jpeg = server.post("/v1/images/generations", body_with({{"output_format", "jpeg"}}).dump());
  ASSERT_EQ(jpeg->status, 200) << jpeg->body;
  const std::string bytes = from_base64(json::parse(jpeg->body)["data"][0]["b64_json"]);
  const RgbImage decoded = cubevec::media::decode_jpeg(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_EQ(decoded.pixels.size(), expected.pixels.size());
  double error = 0;
  for (std::size_t i = 0; i < decoded.pixels.size(); ++i) error += std::abs(int(decoded.pixels[i]) - int(expected.pixels[i]));
  EXPECT_LT(error / double(decoded.pixels.size()), 6.0);
  EXPECT_EQ(server.get("/v1/images/files/img_0000000000000000.png")->status, 404);
}

// Per-request LoRA ("lora": "NAME:SCALE"): only files of --lora-dir, by plain name; the picture is
// the library's with the same LoRA, and a request without it the plain picture.
TEST(ServerApi, RequestLorasComeFromTheLoraDirOnly) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("cubevec_server_lora_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  std::vector<float> a(2 * 192), b(192 * 2);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(0.2 * std::sin(0.3 * static_cast<double>(i)));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(0.4 * std::cos(0.7 * static_cast<double>(i)));
  cubevec::write_safetensors((dir / "style.safetensors").string(),
                             {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", cubevec::Tensor::from_vector(a, {2, 192})},
                              {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", cubevec::Tensor::from_vector(b, {192, 2})}});
  fs::copy_file(dir / "style.safetensors", dir / "sub" / "inner.safetensors");
  fs::create_symlink(dir / "style.safetensors", dir / "link.safetensors");
  cubevec::server::ServeLimits limits;
  limits.lora_dir = dir.string();
  TestServer server({}, limits);
  const auto picture = [&](const json& extra) {
    const auto r = server.post("/v1/images/generations", body_with(extra).dump());
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    return png_of(from_base64(json::parse(r->body)["data"][0]["b64_json"]));
  };
  const std::string plain_json = R"({"prompt": ")" + kPrompt + R"(", "num_inference_steps": 3, "width": 48, "height": 32, "seed": 5)";
  const RgbImage with = picture({{"lora", "style.safetensors:0.9"}});
  EXPECT_EQ(with.pixels, library_image(plain_json + R"(, "lora": [")" + (dir / "style.safetensors").string() + R"(:0.9"]})").pixels);
  EXPECT_NE(with.pixels, library_image(plain_json + "}").pixels);
  EXPECT_EQ(picture(json::object()).pixels, library_image(plain_json + "}").pixels);
  for (const char* bad :
       {"../style.safetensors", "sub/inner.safetensors", "link.safetensors", "missing.safetensors", "/etc/passwd", ".hidden", "sub"}) {
    const auto r = server.post("/v1/images/generations", body_with({{"lora", bad}}).dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_EQ(json_of(r)["error"]["param"], "lora") << r->body;
  }
  // The AUTOMATIC1111 route takes it too.
  const auto a1111 = server.post(
      "/sdapi/v1/txt2img",
      json{{"prompt", kPrompt}, {"steps", 3}, {"width", 48}, {"height", 32}, {"seed", 5}, {"lora", "style.safetensors:0.9"}}.dump());
  ASSERT_TRUE(a1111);
  ASSERT_EQ(a1111->status, 200) << a1111->body;
  EXPECT_EQ(png_of(from_base64(json::parse(a1111->body)["images"][0])).pixels, with.pixels);
  // A LoRA whose values overflow the activations is the request's fault: a 400 naming it.
  std::vector<float> huge(2 * 192, 3e18f);
  cubevec::write_safetensors((dir / "huge.safetensors").string(),
                             {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", cubevec::Tensor::from_vector(huge, {2, 192})},
                              {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", cubevec::Tensor::from_vector(huge, {192, 2})}});
  const auto overflow = server.post("/v1/images/generations", body_with({{"lora", "huge.safetensors"}}).dump());
  ASSERT_TRUE(overflow);
  EXPECT_EQ(overflow->status, 400) << overflow->body;
  EXPECT_EQ(json_of(overflow)["error"]["param"], "lora") << overflow->body;
  TestServer closed;  // no --lora-dir: no request may name a LoRA
  const auto r = closed.post("/v1/images/generations", body_with({{"lora", "style.safetensors"}}).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("--lora-dir"), std::string::npos) << r->body;
  fs::remove_all(dir);
}

TEST(ServerApi, ModelsHealthAndUnknownRoutes) {
  TestServer server;
  const json models = json_of(server.get("/v1/models"));
  ASSERT_EQ(models["data"].size(), 1u) << models;
  EXPECT_EQ(models["data"][0]["id"], "tinyflux");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(json_of(server.get("/health"))["status"], "ok");
  const auto missing = server.get("/v2/nothing");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json_of(missing)["error"]["code"], "not_found");
  // A known path with another method: 405 and the methods it takes.
  const auto wrong = server.client().Put("/v1/images/generations", "{}", "application/json");
  EXPECT_EQ(wrong->status, 405) << wrong->body;
  EXPECT_EQ(wrong->get_header_value("Allow"), "POST");
  EXPECT_EQ(json_of(wrong)["error"]["code"], "method_not_allowed");
  EXPECT_EQ(server.client().Patch("/v1/jobs/job_0123", "{}", "application/json")->get_header_value("Allow"), "GET, DELETE");
}

struct BadRequest {
  std::string body;
  int status;
  std::string param, in_message;
};

TEST(ServerApi, EachBadRequestIsAnOpenAiErrorNamingTheField) {
  cubevec::server::ServeLimits limits;
  limits.max_body_bytes = 4096;
  TestServer server({}, limits);
  const std::vector<BadRequest> cases = {
      {"{\"prompt\": ", 400, "", "not valid JSON"},
      {"[1, 2]", 400, "", "must be a JSON object"},
      {"", 400, "", "empty"},
      {R"({"prompt": 7})", 400, "prompt", "must be a string"},
      {R"({"num_inference_steps": 2})", 400, "prompt", "'prompt' is required"},
      {R"({"prompt": "a red circle", "n": "2"})", 400, "n", "must be an integer"},
      {R"({"prompt": "a red circle", "n": 5})", 400, "n", "1..4"},
      {R"({"prompt": "a red circle", "n": 0})", 400, "n", "1..4"},
      {R"({"prompt": "a red circle", "size": "64"})", 400, "size", "WIDTHxHEIGHT"},
      {R"({"prompt": "a red circle", "size": "4096x4096"})", 400, "size", "16..2048"},
      {R"({"prompt": "a red circle", "size": "-64x64"})", 400, "size", "WIDTHxHEIGHT"},
      {R"({"prompt": "a red circle", "size": 64})", 400, "size", "must be a string"},
      {R"({"prompt": "a red circle", "num_inference_steps": 0})", 400, "num_inference_steps", "num_inference_steps"},
      {R"({"prompt": "a red circle", "num_inference_steps": 201})", 400, "num_inference_steps", "--max-steps"},
      {R"({"prompt": "a red circle", "num_inference_steps": 2.5})", 400, "num_inference_steps", "integer"},
      {R"({"prompt": "a red circle", "guidance_scale": "high"})", 400, "guidance_scale", "guidance_scale"},
      {R"({"prompt": "a red circle", "seed": -1})", 400, "seed", "seed"},
      {R"({"prompt": "a red circle", "model": "sdxl"})", 404, "model", "sdxl"},
      // A NUL or a control character in the name is shown escaped, not raw.
      {R"({"prompt": "a red circle", "model": "tiny\u0000flux"})", 404, "model", R"(the model "tiny\u0000flux" does not exist)"},
      {R"({"prompt": "a red circle", "response_format": "gif"})", 400, "response_format", "b64_json, url"},
      {R"({"prompt": "a red circle", "output_format": "webp"})", 400, "output_format", "webp"},
      {R"({"prompt": "a red circle", "prompt_embeds": "/etc/passwd"})", 400, "prompt_embeds", "reads no file"},
      {R"({"prompt": "a red circle", "size": "20x20"})", 400, "width", "multiples of 8"},
      {R"({"prompt": "a red circle", "num_frames": 17})", 400, "num_frames", "video models"},
      {R"({"prompt": "a red circle", "cfg": "sideways"})", 400, "cfg", "cfg"},
      {R"({"prompt": "a red circle", "quant_attention": "fp8"})", 400, "quant_attention", R"(must be one of "none", "int8", got "fp8")"},
      {R"({"prompt": "a red circle", "quant_attention": true})", 400, "quant_attention", "quant_attention"},
      {R"({"prompt": "a red circle", "cache": {"cache": "db", "nonsense": 1}})", 400, "cache", "nonsense"},
      {"{\"prompt\": \"" + std::string(5000, 'a') + "\"}", 413, "", "--max-body"},
      {"{\"a\":" + std::string(20, '[') + std::string(20, ']') + "}", 400, "", "nest"},
      {R"({"prompt": "a red circle", "prompt": "twice"})", 400, "", "prompt"},
  };
  for (const BadRequest& c : cases) {
    const auto r = server.post("/v1/images/generations", c.body);
    ASSERT_TRUE(r) << c.body;
    EXPECT_EQ(r->status, c.status) << c.body << "\n" << r->body;
    const json error = json_of(r)["error"];
    ASSERT_TRUE(error.is_object()) << c.body << "\n" << r->body;
    EXPECT_EQ(error["param"].is_null() ? "" : error["param"].get<std::string>(), c.param) << c.body << "\n" << r->body;
    EXPECT_TRUE(error["type"].is_string() && error["code"].is_string()) << r->body;
    EXPECT_NE(error["message"].get<std::string>().find(c.in_message), std::string::npos) << c.body << "\n" << r->body;
  }
  // int8 attention where the CPU runs it; a named refusal where it does not.
  const auto int8 = server.post("/v1/images/generations", body_with({{"quant_attention", "int8"}}).dump());
  if (cubevec::ops::attention_impl_available(cubevec::ops::AttentionImpl::flash_int8)) {
    EXPECT_EQ(int8->status, 200) << int8->body;
  } else {
    EXPECT_EQ(int8->status, 400) << int8->body;
    EXPECT_NE(int8->body.find("needs AMX-INT8"), std::string::npos) << int8->body;
  }
  // Unknown fields are ignored, as OpenAI does.
  const auto ok = server.post("/v1/images/generations", body_with({{"quality", "hd"}, {"style", "vivid"}, {"user", "me"}}).dump());
  EXPECT_EQ(ok->status, 200) << ok->body;
  // A word the tiny text encoder does not know fails at encoding: still the client's error.
  const auto word = server.post("/v1/images/generations", body_with({{"prompt", "a red zebra"}}).dump());
  EXPECT_EQ(word->status, 400) << word->body;
  EXPECT_EQ(json_of(word)["error"]["param"], "prompt") << word->body;
}

TEST(ServerApi, JobEventsArriveInOrderAndEndWithTheResult) {
  TestServer server;
  const auto r = server.post("/v1/jobs", json{{"prompt", kPrompt}, {"num_inference_steps", 4}, {"seed", 2}}.dump());
  ASSERT_EQ(r->status, 202) << r->body;
  const std::string id = json::parse(r->body)["id"];
  std::string stream;
  auto client = server.client();
  const auto events = client.Get(("/v1/jobs/" + id + "/events").c_str(), [&](const char* data, size_t size) {
    stream.append(data, size);
    return true;
  });
  ASSERT_TRUE(events);
  EXPECT_EQ(events->get_header_value("Content-Type"), "text/event-stream");
  std::vector<std::string> names;
  std::vector<json> data;
  std::size_t pos = 0;
  while ((pos = stream.find("event: ", pos)) != std::string::npos) {
    const std::size_t end = stream.find('\n', pos);
    names.push_back(stream.substr(pos + 7, end - pos - 7));
    const std::size_t data_end = stream.find("\n\n", end);
    data.push_back(json::parse(stream.substr(end + 7, data_end - end - 7)));
    pos = data_end;
  }
  const std::vector<std::string> expected = {"queued", "started", "progress", "progress", "progress", "progress", "decoding", "completed"};
  ASSERT_EQ(names, expected) << stream;
  for (int step = 1; step <= 4; ++step) {
    EXPECT_EQ(data[static_cast<std::size_t>(step + 1)]["step"], step);
    EXPECT_EQ(data[static_cast<std::size_t>(step + 1)]["steps"], 4);
    EXPECT_GE(data[static_cast<std::size_t>(step + 1)]["eta"].get<double>(), 0.0);
  }
  const json& done = data.back();
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["result"]["outputs"], 1);
  const auto content = server.get("/v1/jobs/" + id + "/content");
  ASSERT_EQ(content->status, 200);
  EXPECT_EQ(png_of(content->body).pixels, library_image(R"({"prompt": ")" + kPrompt + R"(", "num_inference_steps": 4, "seed": 2})").pixels);
  // The finished job's events replay from the start.
  const auto again = server.get("/v1/jobs/" + id + "/events");
  EXPECT_NE(again->body.find("event: completed"), std::string::npos);
  EXPECT_EQ(server.get("/v1/jobs/job_0000000000000000/events")->status, 404);
}

TEST(ServerApi, CancelStopsARunningJobAndCancellingAFinishedOneIsAConflict) {
  TestServer server({}, long_runs());
  const auto r = server.post("/v1/jobs", json{{"prompt", kPrompt}, {"num_inference_steps", 1000}}.dump());
  ASSERT_EQ(r->status, 202) << r->body;
  const std::string id = json::parse(r->body)["id"];
  wait_running(server, "/v1/jobs/" + id);
  const auto cancel = server.del("/v1/jobs/" + id);
  EXPECT_EQ(cancel->status, 202) << cancel->body;
  server.scheduler().find(id)->wait_finished(std::chrono::steady_clock::now() + std::chrono::seconds(60));
  const json job = json_of(server.get("/v1/jobs/" + id));
  EXPECT_EQ(job["status"], "cancelled") << job;
  EXPECT_LT(job["step"].get<int>(), 1000);
  const auto again = server.del("/v1/jobs/" + id);
  EXPECT_EQ(again->status, 409);
  EXPECT_EQ(json_of(again)["error"]["code"], "already_finished");
  EXPECT_EQ(server.get("/v1/jobs/" + id + "/content")->status, 409);
  // The pipeline stays usable.
  EXPECT_EQ(server.post("/v1/images/generations", body_with({}).dump())->status, 200);
}

TEST(ServerApi, AFullQueueAnswers429WithRetryAfter) {
  TestServer server(one_instance_queue_of_one(), long_runs());
  const std::string slow = json{{"prompt", kPrompt}, {"num_inference_steps", 1000}}.dump();
  const auto running = server.post("/v1/jobs", slow);
  ASSERT_EQ(running->status, 202);
  wait_running(server, "/v1/jobs/" + json_of(running)["id"].get<std::string>());
  const auto queued = server.post("/v1/jobs", slow);
  ASSERT_EQ(queued->status, 202) << queued->body;
  const auto refused = server.post("/v1/jobs", slow);
  EXPECT_EQ(refused->status, 429) << refused->body;
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json_of(refused)["error"]["code"], "queue_full");
  // n = 2 when one place is left is refused whole.
  const auto metrics = server.get("/metrics")->body;
  EXPECT_NE(metrics.find("cubevec_queue_depth{model=\"tinyflux\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("cubevec_running{model=\"tinyflux\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("cubevec_requests_total{model=\"tinyflux\",status=\"rejected\"} 1"), std::string::npos) << metrics;
  server.del("/v1/jobs/" + json_of(running)["id"].get<std::string>());
  server.del("/v1/jobs/" + json_of(queued)["id"].get<std::string>());
}

TEST(ServerApi, ARequestPastTheTimeoutFailsWith504) {
  cubevec::server::SchedulerOptions options;
  options.timeout_s = 0.3;
  TestServer server(options, long_runs());
  const auto r = server.post("/v1/images/generations", body_with({{"num_inference_steps", 1000}}).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_EQ(json_of(r)["error"]["code"], "timeout");
  EXPECT_EQ(server.post("/v1/images/generations", body_with({}).dump())->status, 200);
}

TEST(ServerApi, TwoInstancesAtOnceGiveTheSequentialPixels) {
  cubevec::server::SchedulerOptions options;
  options.instances = 2;
  TestServer server(options);
  const json cache{{"cache", "db"}, {"cache-fn", 1}, {"cache-bn", 0}, {"cache-threshold", 1.0}};
  const std::string a = body_with({{"seed", 11}, {"cache", cache}, {"size", "64x64"}, {"num_inference_steps", 8}}).dump(),
                    b = body_with({{"seed", 12}, {"size", "64x64"}}).dump();
  const auto pixels = [&](const std::string& body) {
    const auto r = server.post("/v1/images/generations", body);
    EXPECT_EQ(r->status, 200) << r->body;
    return png_of(from_base64(json::parse(r->body)["data"][0]["b64_json"])).pixels;
  };
  const auto sequential_a = pixels(a), sequential_b = pixels(b);
  std::vector<uint8_t> concurrent_a, concurrent_b;
  std::thread ta([&] { concurrent_a = pixels(a); }), tb([&] { concurrent_b = pixels(b); });
  ta.join();
  tb.join();
  EXPECT_EQ(concurrent_a, sequential_a);
  EXPECT_EQ(concurrent_b, sequential_b);
  EXPECT_NE(sequential_a, sequential_b);
}

TEST(ServerApi, StepCacheStateStartsFromZeroForEveryRequest) {
  TestServer server;
  const std::string body = json{{"prompt", kPrompt},
                                {"num_inference_steps", 8},
                                {"seed", 4},
                                {"cache", {{"cache", "db"}, {"cache-fn", 1}, {"cache-bn", 0}, {"cache-threshold", 0.3}}}}
                               .dump();
  json reports[2];
  std::vector<uint8_t> pixels[2];
  for (int i = 0; i < 2; ++i) {
    const auto r = server.post("/v1/jobs", body);
    ASSERT_EQ(r->status, 202) << r->body;
    const std::string id = json::parse(r->body)["id"];
    server.scheduler().find(id)->wait_finished(std::chrono::steady_clock::now() + std::chrono::seconds(60));
    reports[i] = json_of(server.get("/v1/jobs/" + id))["result"]["report"];
    pixels[i] = png_of(server.get("/v1/jobs/" + id + "/content")->body).pixels;
  }
  ASSERT_TRUE(reports[0].contains("step_counts")) << reports[0];
  // The report names the model, not the server's folder.
  EXPECT_EQ(reports[0]["model"], "tinyflux");
  EXPECT_EQ(reports[0].dump().find(CUBEVEC_SOURCE_DIR), std::string::npos) << reports[0];
  EXPECT_EQ(reports[0]["step_counts"], reports[1]["step_counts"]);
  EXPECT_NE(reports[0]["step_counts"].dump().find("skipped"), std::string::npos) << reports[0]["step_counts"];
  EXPECT_EQ(pixels[0], pixels[1]);
}

TEST(ServerApi, VideoJobsGiveAnAviOfTheRequestedFrames) {
  TestServer server({}, {}, /*with_wan=*/true);
  const auto r = server.post("/v1/videos", json{{"model", "tinywan"},
                                                {"prompt", "a red circle moving right on a blue background"},
                                                {"num_inference_steps", 2},
                                                {"num_frames", 17},
                                                {"size", "48x32"},
                                                {"seed", 1}}
                                               .dump());
  ASSERT_EQ(r->status, 200) << r->body;
  const json video = json::parse(r->body);
  EXPECT_EQ(video["object"], "video");
  const std::string id = video["id"];
  server.scheduler().find(id)->wait_finished(std::chrono::steady_clock::now() + std::chrono::seconds(120));
  const json done = json_of(server.get("/v1/videos/" + id));
  EXPECT_EQ(done["status"], "completed") << done;
  EXPECT_EQ(done["progress"], 100);
  const auto content = server.get("/v1/videos/" + id + "/content");
  ASSERT_EQ(content->status, 200);
  EXPECT_EQ(content->get_header_value("Content-Type"), "video/x-msvideo");
  const std::string path = (std::filesystem::temp_directory_path() / (id + ".avi")).string();
  std::ofstream(path, std::ios::binary) << content->body;
  const cubevec::media::AviInfo info = cubevec::media::read_avi_info(path);
  std::filesystem::remove(path);
  EXPECT_EQ(info.frame_count, 17);
  EXPECT_EQ(info.width, 48);
  EXPECT_EQ(info.height, 32);
  // Each frame as a PNG too (the page plays them): within JPEG's error of the AVI's frame.
  const auto frame = server.get("/v1/jobs/" + id + "/frames/16.png");
  ASSERT_EQ(frame->status, 200);
  const RgbImage png = png_of(frame->body);
  EXPECT_EQ(png.width, 48);
  EXPECT_EQ(png.height, 32);
  EXPECT_EQ(server.get("/v1/jobs/" + id + "/frames/17.png")->status, 404);
  EXPECT_EQ(server.get("/v1/jobs/" + id + "/frames/99999999.png")->status, 404);
  // A picture model on the video route, and a video model on the picture route, are refused.
  EXPECT_EQ(server.post("/v1/videos", json{{"model", "tinyflux"}, {"prompt", kPrompt}}.dump())->status, 400);
  EXPECT_EQ(server.post("/v1/images/generations", json{{"model", "tinywan"}, {"prompt", kPrompt}}.dump())->status, 400);
  // Two models: the model is required.
  EXPECT_EQ(json_of(server.post("/v1/images/generations", json{{"prompt", kPrompt}}.dump()))["error"]["param"], "model");
  // DELETE removes a finished video.
  EXPECT_EQ(json_of(server.del("/v1/videos/" + id))["deleted"], true);
  EXPECT_EQ(server.get("/v1/videos/" + id)->status, 404);
}

TEST(ServerApi, Automatic1111Txt2ImgProgressInterruptAndModels) {
  TestServer server({}, long_runs());
  const auto r = server.post(
      "/sdapi/v1/txt2img",
      json{{"prompt", kPrompt}, {"steps", 3}, {"seed", 5}, {"width", 48}, {"height", 32}, {"batch_size", 2}, {"sampler_name", "Euler"}}
          .dump());
  ASSERT_EQ(r->status, 200) << r->body;
  const json answer = json::parse(r->body);
  ASSERT_EQ(answer["images"].size(), 2u);
  const json info = json::parse(answer["info"].get<std::string>());
  EXPECT_EQ(info["all_seeds"], json::array({5, 6}));
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(png_of(from_base64(answer["images"][i])).pixels,
              library_image(R"({"prompt": ")" + kPrompt + R"(", "num_inference_steps": 3, "width": 48, "height": 32, "seed": )" +
                            std::to_string(5 + i) + "}")
                  .pixels);
  const json models = json_of(server.get("/sdapi/v1/sd-models"));
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]["model_name"], "tinyflux");
  EXPECT_EQ(server.post("/sdapi/v1/txt2img", json{{"prompt", kPrompt}, {"steps", "3"}}.dump())->status, 400);
  // cubevec's stages go to the library as it reads them (the route dropped them before): a bad
  // value of each is the library's 400 naming the key, where it used to be ignored.
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"cfg", "sideways"}, {"cache", json{{"cache", "nope"}}}, {"sparse", json{{"sparse", "nope"}}}, {"quant_attention", "int4"}}) {
    const auto bad = server.post("/sdapi/v1/txt2img", json{{"prompt", kPrompt}, {"steps", 1}, {key, value}}.dump());
    EXPECT_EQ(bad->status, 400) << key << ": " << bad->body;
    EXPECT_NE(bad->body.find(key), std::string::npos) << bad->body;
  }
  const auto good =
      server.post("/sdapi/v1/txt2img", json{{"prompt", kPrompt}, {"steps", 1}, {"cfg", "off"}, {"quant_attention", "none"}}.dump());
  EXPECT_EQ(good->status, 200) << good->body;
  EXPECT_EQ(server.post("/sdapi/v1/txt2img", json{{"prompt", kPrompt}, {"batch_size", 3}, {"n_iter", 2}}.dump())->status, 400);

  // A long one, watched through /progress and stopped by /interrupt.
  int slow_status = 0;
  std::string slow_body;
  std::thread caller([&] {
    const auto interrupted = server.post("/sdapi/v1/txt2img", json{{"prompt", kPrompt}, {"steps", 1000}, {"seed", -1}}.dump());
    if (interrupted) slow_status = interrupted->status, slow_body = interrupted->body;
  });
  json progress = json::object();
  for (int i = 0; i < 500 && progress.is_object() && progress.value("state", json::object()).value("sampling_step", 0) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    progress = json_of(server.get("/sdapi/v1/progress"));
  }
  EXPECT_EQ(progress["state"]["sampling_steps"], 1000) << progress;
  EXPECT_GT(progress["progress"].get<double>(), 0.0);
  EXPECT_EQ(server.post("/sdapi/v1/interrupt", "")->status, 200);
  caller.join();
  ASSERT_EQ(slow_status, 200) << slow_body;
  EXPECT_EQ(json::parse(slow_body)["images"].size(), 0u);
  EXPECT_TRUE(json::parse(json::parse(slow_body)["info"].get<std::string>())["interrupted"].get<bool>());
}

TEST(ServerApi, MetricsCountWhatHappened) {
  TestServer server;
  ASSERT_EQ(server.post("/v1/images/generations", body_with({}).dump())->status, 200);
  ASSERT_EQ(server.post("/v1/images/generations", body_with({{"n", 2}}).dump())->status, 200);
  const auto r = server.get("/metrics");
  ASSERT_EQ(r->status, 200);
  const std::string& text = r->body;
  EXPECT_NE(text.find("cubevec_requests_total{model=\"tinyflux\",status=\"completed\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("cubevec_request_latency_seconds_count{model=\"tinyflux\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("cubevec_request_latency_seconds_bucket{model=\"tinyflux\",le=\"+Inf\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("cubevec_denoising_steps_total{model=\"tinyflux\"} 9"), std::string::npos) << text;
  EXPECT_NE(text.find("process_resident_memory_bytes "), std::string::npos);
  EXPECT_NE(text.find("# TYPE cubevec_request_latency_seconds histogram"), std::string::npos);
}

// What probing found: a 100,000-character unknown key (the error names it without a regex), a
// Range header (ignored: answers stay whole), a seed that rounds to 2^63 as a double, seeds that
// would pass INT64_MAX, the video routes on a picture job.
TEST(ServerApi, HostileFieldsAndHeadersGetWholeAnswers) {
  TestServer server;
  const auto long_key = server.post("/v1/jobs", "{\"prompt\": \"a red circle\", \"" + std::string(100000, 'a') + "\": 1}");
  ASSERT_TRUE(long_key);
  EXPECT_EQ(long_key->status, 400);
  EXPECT_NE(json_of(long_key)["error"]["message"].get<std::string>().find("unknown"), std::string::npos) << long_key->body.substr(0, 200);
  auto client = server.client();
  const auto ranged =
      client.Post("/v1/jobs", {{"Range", "bytes=0-20"}}, json{{"prompt", kPrompt}, {"num_inference_steps", 2}}.dump(), "application/json");
  ASSERT_TRUE(ranged);
  EXPECT_EQ(ranged->status, 202);
  EXPECT_TRUE(json_of(ranged).contains("id")) << ranged->body;
  const auto bad_range = client.Get("/metrics", {{"Range", "bytes=0-10,5-1,99999999999999999999-"}});
  ASSERT_TRUE(bad_range);
  EXPECT_TRUE(json_of(bad_range).is_object() && !json_of(bad_range).is_discarded()) << bad_range->body;
  const auto float_seed = server.post("/sdapi/v1/txt2img", R"({"prompt": "a red circle", "steps": 1, "seed": 9223372036854775808.0})");
  EXPECT_EQ(float_seed->status, 400) << float_seed->body;
  EXPECT_EQ(json_of(float_seed)["error"]["param"], "seed");
  const auto past_max = server.post("/v1/images/generations", body_with({{"seed", UINT64_MAX - 1}, {"n", 3}}).dump());
  EXPECT_EQ(past_max->status, 400) << past_max->body;
  EXPECT_EQ(json_of(past_max)["error"]["param"], "seed");
  const auto bad_checkpoint =
      server.post("/sdapi/v1/txt2img", R"({"prompt": "a red circle", "override_settings": {"sd_model_checkpoint": 5}})");
  EXPECT_EQ(json_of(bad_checkpoint)["error"]["param"], "override_settings.sd_model_checkpoint") << bad_checkpoint->body;
  // A picture job is not a video.
  const std::string picture = json_of(ranged)["id"];
  server.scheduler().find(picture)->wait_finished(std::chrono::steady_clock::now() + std::chrono::seconds(60));
  EXPECT_EQ(server.get("/v1/videos/" + picture)->status, 404);
  EXPECT_EQ(server.del("/v1/videos/" + picture)->status, 404);
  EXPECT_EQ(server.get("/v1/jobs/" + picture + "/content")->status, 200);
}

TEST(ServerApi, CancellingAQueuedJobFreesItsPlaceAtOnce) {
  TestServer server(one_instance_queue_of_one(), long_runs());
  const std::string slow = json{{"prompt", kPrompt}, {"num_inference_steps", 1000}}.dump();
  const std::string running = json_of(server.post("/v1/jobs", slow))["id"];
  wait_running(server, "/v1/jobs/" + running);
  const std::string queued = json_of(server.post("/v1/jobs", slow))["id"];
  EXPECT_EQ(server.del("/v1/jobs/" + queued)->status, 202);
  EXPECT_EQ(json_of(server.get("/v1/jobs/" + queued))["status"], "cancelled");
  EXPECT_EQ(server.del("/v1/jobs/" + queued)->status, 409);
  const auto next = server.post("/v1/jobs", slow);
  EXPECT_EQ(next->status, 202) << next->body;
  server.del("/v1/jobs/" + json_of(next)["id"].get<std::string>());
  server.del("/v1/jobs/" + running);
}

TEST(ServerApi, EventStreamsTakeAtMostHalfTheConnectionThreads) {
  cubevec::server::ServeLimits limits = long_runs();
  limits.http_threads = 4;
  TestServer server({}, limits);
  const std::string id = json_of(server.post("/v1/jobs", json{{"prompt", kPrompt}, {"num_inference_steps", 1000}}.dump()))["id"];
  std::vector<std::thread> streams;
  std::atomic<int> ended{0};
  for (int i = 0; i < 2; ++i)
    streams.emplace_back([&] {
      server.get("/v1/jobs/" + id + "/events");
      ++ended;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto third = server.get("/v1/jobs/" + id + "/events");
  EXPECT_EQ(third->status, 429) << third->body;
  EXPECT_EQ(json_of(third)["error"]["code"], "too_many_streams");
  EXPECT_EQ(server.get("/health")->status, 200);
  server.del("/v1/jobs/" + id);
  for (std::thread& t : streams) t.join();
  EXPECT_EQ(ended, 2);
}

TEST(ServerApi, VideoSecondsAndWhatTheShapeRulesOut) {
  cubevec::server::SchedulerOptions options;
  options.video_fps = 8;
  TestServer server(options, {}, /*with_wan=*/true);
  const json base{{"model", "tinywan"}, {"prompt", "a red circle moving right on a blue background"}, {"num_inference_steps", 1}};
  json two_seconds = base;
  two_seconds["seconds"] = "2";  // as OpenAI's clients send it: 1 + 4 round(2 x 8 / 4) = 17 frames at --fps 8
  const auto r = server.post("/v1/videos", two_seconds.dump());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json_of(r)["num_frames"], 17);
  EXPECT_EQ(json_of(r)["seconds"], "2.125");
  for (const json& seconds : {json("garbage"), json(-5), json(true)}) {
    json bad = base;
    bad["seconds"] = seconds;
    const auto refused = server.post("/v1/videos", bad.dump());
    EXPECT_EQ(refused->status, 400) << seconds << refused->body;
    EXPECT_EQ(json_of(refused)["error"]["param"], "seconds") << refused->body;
  }
  json both = two_seconds;
  both["num_frames"] = 17;
  EXPECT_EQ(json_of(server.post("/v1/videos", both.dump()))["error"]["param"], "seconds");
  json frames = base;
  frames["num_frames"] = 8;
  const auto not_4k = server.post("/v1/videos", frames.dump());
  EXPECT_EQ(not_4k->status, 400);
  EXPECT_EQ(json_of(not_4k)["error"]["param"], "num_frames") << not_4k->body;
  // rf_v2 on tinywan's 64x64 x 17 (its latent grid is not a multiple of 8): what only the run can
  // see is still a 400-type error on the job.
  json sparse = base;
  sparse["num_frames"] = 17;
  sparse["sparse"] = "rf_v2";
  const auto job = server.post("/v1/jobs", sparse.dump());
  ASSERT_EQ(job->status, 202) << job->body;
  const std::string id = json_of(job)["id"];
  server.scheduler().find(id)->wait_finished(std::chrono::steady_clock::now() + std::chrono::seconds(60));
  const json failed = json_of(server.get("/v1/jobs/" + id));
  EXPECT_EQ(failed["status"], "failed") << failed;
  EXPECT_EQ(failed["error"]["type"], "invalid_request_error") << failed;
}

// A client that sends half a request and stalls is dropped after --read-timeout, and holds no
// generation instance meanwhile: other requests are served.
TEST(ServerApi, AStalledClientIsDroppedAndOthersAreServed) {
  cubevec::server::ServeLimits limits;
  limits.read_timeout_s = 1;
  TestServer server({}, limits);
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server.port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const std::string partial = "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"prompt\"";
  ASSERT_EQ(::send(sock, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  EXPECT_EQ(server.post("/v1/images/generations", body_with({}).dump())->status, 200);
  const auto start = std::chrono::steady_clock::now();
  char buffer[4096];
  timeval wait{10, 0};
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  ssize_t got = 0;
  std::string answer;
  while ((got = ::recv(sock, buffer, sizeof buffer, 0)) > 0) answer.append(buffer, static_cast<std::size_t>(got));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(sock);
  EXPECT_EQ(got, 0) << "the connection was not closed";
  EXPECT_LT(seconds, 8.0);
  EXPECT_EQ(answer.find("200 OK"), std::string::npos) << answer;
}

// A body whose end is ambiguous (two Content-Lengths, a list, Content-Length beside
// Transfer-Encoding, an encoding other than chunked) is refused with a 400 before the body is read,
// and the connection is closed: nothing sent after it is taken as another request.
std::string raw_exchange(int port, const std::string& first, const std::string& then) {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  if (sock < 0) return "socket failed";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return "connect failed";
  timeval wait{10, 0};
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  ::send(sock, first.data(), first.size(), MSG_NOSIGNAL);
  char buffer[4096];
  std::string answer;
  ssize_t got = ::recv(sock, buffer, sizeof buffer, 0);  // the answer to the first request
  if (got > 0) answer.append(buffer, static_cast<std::size_t>(got));
  ::send(sock, then.data(), then.size(), MSG_NOSIGNAL);  // the body, itself a request
  while ((got = ::recv(sock, buffer, sizeof buffer, 0)) > 0) answer.append(buffer, static_cast<std::size_t>(got));
  ::close(sock);
  return got == 0 || (got < 0 && errno == ECONNRESET) ? answer : answer + "\n[the connection was not closed]";
}

TEST(ServerApi, AmbiguousFramingIsRefusedAndTheConnectionClosed) {
  TestServer server;
  const std::string smuggled = "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const std::string size = std::to_string(smuggled.size());
  const std::string head = "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const struct {
    std::string headers, in_message;
  } cases[] = {
      {"Content-Length: " + size + "\r\nContent-Length: " + size + "\r\n", "2 Content-Length headers"},
      {"Content-Length: " + size + ", 5\r\n", "Content-Length is not one decimal number"},
      {"Content-Length: " + size + "\r\nTransfer-Encoding: chunked\r\n", "both Content-Length and Transfer-Encoding"},
      {"Transfer-Encoding: xchunked\r\n", "takes chunked only"},
  };
  for (const auto& c : cases) {
    const std::string answer = raw_exchange(server.port(), head + c.headers + "\r\n", smuggled);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << c.headers << answer;
    EXPECT_NE(answer.find("ambiguous_framing"), std::string::npos) << c.headers << answer;
    EXPECT_NE(answer.find(c.in_message), std::string::npos) << c.headers << answer;
    EXPECT_EQ(answer.find("HTTP/1.1 200"), std::string::npos) << "the smuggled request was answered: " << c.headers << answer;
    EXPECT_EQ(answer.find("[the connection was not closed]"), std::string::npos) << c.headers << answer;
  }
  // A plain request still works, and its connection closes after the answer (one request each).
  const std::string ok = raw_exchange(server.port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", smuggled);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  EXPECT_EQ(ok.find("\"object\":\"list\""), std::string::npos) << "a second request on the connection was answered: " << ok;
}

}  // namespace server_api_test
