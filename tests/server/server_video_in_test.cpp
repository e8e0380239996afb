// Pictures into cubevec serve's video route: POST /v1/videos as a multipart form (OpenAI's video
// API: `input_reference` is the first frame; cubevec's `last_image` the last) on the tiny
// image-to-video models (tests/data/wan_i2v_tiny, wan_flf2v_tiny) gives the library's frames for the
// same request and pictures; every bad upload or field is a 400 naming it, and a request naming a
// picture file is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "media/avi.h"
#include "media/image_input.h"
#include "media/jpeg.h"
#include "media/png.h"
#include "pipelines/pipeline.h"
#include "server/test_server.h"

namespace server_video_in_test {

using namespace cubevec_server_test;
using cubevec::media::RgbImage;
using nlohmann::json;

std::string data(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

std::string file_bytes(const std::string& path) {
  std::string bytes(std::filesystem::file_size(path), '\0');
  std::ifstream(path, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

const std::string kVideoPrompt = "a red circle moving right on a blue background";

httplib::MultipartFormDataItems video_form(const std::string& model) {
  return {{"model", model, "", ""},
          {"prompt", kVideoPrompt, "", ""},
          {"size", "48x32", "", ""},
          {"num_frames", "9", "", ""},
          {"num_inference_steps", "2", "", ""},
          {"seed", "4", "", ""},
          {"input_reference", file_bytes(data("images/rgb.png")), "first.png", "image/png"}};
}

// The finished job's frames, from its AVI.
std::vector<RgbImage> job_frames(TestServer& server, const std::string& id) {
  server.scheduler().find(id)->wait_finished(std::chrono::steady_clock::now() + std::chrono::seconds(120));
  const json done = json_of(server.get("/v1/videos/" + id));
  EXPECT_EQ(done["status"], "completed") << done;
  const auto content = server.get("/v1/videos/" + id + "/content");
  const std::string path = (std::filesystem::temp_directory_path() / (id + ".avi")).string();
  std::ofstream(path, std::ios::binary) << content->body;
  const cubevec::media::AviInfo info = cubevec::media::read_avi_info(path);
  std::vector<RgbImage> frames;
  for (const auto& f : info.frames) frames.push_back(cubevec::media::decode_jpeg(cubevec::media::read_avi_frame(path, f)));
  std::filesystem::remove(path);
  return frames;
}

// The library's frames for the same request, each through the AVI's JPEG (quality 90) as the server writes it.
std::vector<RgbImage> library_frames(const std::string& model, bool last) {
  const auto pipeline = cubevec::pipelines::Pipeline::load(data(model));
  cubevec::pipelines::Request request = cubevec::pipelines::Request::parse(
      R"({"prompt": ")" + kVideoPrompt + R"(", "width": 48, "height": 32, "num_frames": 9, "num_inference_steps": 2, "seed": 4})");
  request.image_pixels = std::make_shared<const RgbImage>(cubevec::media::read_input_image(data("images/rgb.png")));
  if (last) request.last_image_pixels = std::make_shared<const RgbImage>(cubevec::media::read_input_image(data("images/photo.jpg")));
  std::vector<RgbImage> frames;
  for (const RgbImage& f : pipeline->generate(request).images)
    frames.push_back(cubevec::media::decode_jpeg(cubevec::media::encode_jpeg(f, 90)));
  return frames;
}

TEST(ServerVideoIn, ImageToVideoFormGivesTheLibrarysFrames) {
  TestServer server({{"i2v", data("wan_i2v_tiny")}, {"flf2v", data("wan_flf2v_tiny")}});
  auto r = server.client().Post("/v1/videos", video_form("i2v"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<RgbImage> first = job_frames(server, json::parse(r->body)["id"]);
  const std::vector<RgbImage> want = library_frames("wan_i2v_tiny", false);
  ASSERT_EQ(first.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(first[i].pixels, want[i].pixels) << "frame " << i;
  // First-last-frame: the last picture as `last_image`.
  auto form = video_form("flf2v");
  form.push_back({"last_image", file_bytes(data("images/photo.jpg")), "last.jpg", "image/jpeg"});
  r = server.client().Post("/v1/videos", form);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<RgbImage> flf = job_frames(server, json::parse(r->body)["id"]);
  const std::vector<RgbImage> want_flf = library_frames("wan_flf2v_tiny", true);
  ASSERT_EQ(flf.size(), want_flf.size());
  for (std::size_t i = 0; i < want_flf.size(); ++i) EXPECT_EQ(flf[i].pixels, want_flf[i].pixels) << "frame " << i;
}

TEST(ServerVideoIn, BadUploadsAndFieldsAreNamed) {
  TestServer server({{"i2v", data("wan_i2v_tiny")}, {"a14b", data("wan22_tiny_a14b")}});
  const auto param = [&](const httplib::MultipartFormDataItems& form) {
    const auto r = server.client().Post("/v1/videos", form);
    EXPECT_TRUE(r);
    if (!r) return std::string("no response");
    EXPECT_EQ(r->status, 400) << r->body;
    const json error = json_of(r)["error"];
    return error["param"].is_string() ? error["param"].get<std::string>() : "(no param) " + r->body;
  };
  auto form = video_form("i2v");
  form.back().content = "not a picture";
  EXPECT_EQ(param(form), "input_reference");
  form = video_form("i2v");
  form.push_back({"input_reference", file_bytes(data("images/rgb.png")), "again.png", "image/png"});
  EXPECT_EQ(param(form), "input_reference");
  form = video_form("i2v");
  form.back() = {"input_reference", "rgb.png", "", ""};  // text where a file belongs
  EXPECT_EQ(param(form), "input_reference");
  form = video_form("i2v");
  form.pop_back();  // no picture for an image-to-video model
  EXPECT_EQ(param(form), "input_reference");
  form = video_form("a14b");  // a picture for a text-to-video model
  EXPECT_EQ(param(form), "input_reference");
  form = video_form("i2v");
  form.push_back({"last_image", file_bytes(data("images/photo.jpg")), "last.jpg", "image/jpeg"});  // no FLF2V table
  EXPECT_EQ(param(form), "last_image");
  form = video_form("i2v");
  form.push_back({"guidance_scale_2", "3", "", ""});  // one transformer
  EXPECT_EQ(param(form), "guidance_scale_2");
  form = video_form("i2v");
  form.push_back({"num_inference_steps", "2", "", ""});
  EXPECT_EQ(param(form), "num_inference_steps");  // twice
  // A NUL in a text field is refused, not read up to it ("5\0-1" was seed 5).
  for (const char* field : {"seed", "num_frames", "guidance_scale", "size"}) {
    form = video_form("i2v");
    form.push_back({field, std::string("5\0-1", 4), "", ""});
    EXPECT_EQ(param(form), field);
  }
  // A JSON body naming a picture file is refused: the server reads no file a request names.
  const auto r = server.post("/v1/videos", json{{"model", "i2v"}, {"prompt", kVideoPrompt}, {"last_image", "/etc/passwd"}}.dump());
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json_of(r)["error"]["param"], "last_image");
  const auto named =
      server.post("/v1/videos", json{{"model", "a14b"}, {"prompt", kVideoPrompt}, {"input_reference", "/etc/passwd"}}.dump());
  EXPECT_EQ(named->status, 400);
  EXPECT_EQ(json_of(named)["error"]["param"], "input_reference");
}

}  // namespace server_video_in_test
