// Pictures into cubevec serve: POST /v1/images/edits (OpenAI's multipart form: image, optional mask
// whose transparent pixels are repainted) and POST /sdapi/v1/img2img (AUTOMATIC1111: base64
// init_images, mask, denoising_strength) give the library's pixels for the same picture, and every
// bad upload or field is a 400 naming it; a request naming a file (image, mask_image) is refused.
#include <gtest/gtest.h>

#include <png.h>

#include "media/png.h"
#include "pipelines/pipeline.h"
#include "server/routes.h"
#include "server/test_server.h"

namespace server_images_in_test {

using namespace cubevec_server_test;
using cubevec::media::RgbImage;
using nlohmann::json;

// The library's picture for a request with the given pictures in memory.
RgbImage library_image(const std::string& request_json, const RgbImage& image, const RgbImage* mask) {
  static const auto pipeline = cubevec::pipelines::Pipeline::load(kTinyFlux);
  cubevec::pipelines::Request request = cubevec::pipelines::Request::parse(request_json);
  request.image_pixels = std::make_shared<const RgbImage>(image);
  if (mask) request.mask_pixels = std::make_shared<const RgbImage>(*mask);
  return pipeline->generate(request).images.at(0);
}

RgbImage source_picture() {
  static const auto pipeline = cubevec::pipelines::Pipeline::load(kTinyFlux);
  return pipeline->generate(cubevec::pipelines::Request::parse(R"({"prompt": ")" + kPrompt + R"(", "width": 48, "height": 32, "seed": 3})"))
      .images.at(0);
}

std::string png_bytes(const RgbImage& image) {
  const std::vector<uint8_t> bytes = cubevec::media::encode_png(image);
  return std::string(bytes.begin(), bytes.end());
}

// An RGBA PNG: fully transparent (alpha 0) in the left `transparent_columns`, opaque elsewhere.
std::string rgba_mask_png(int width, int height, int transparent_columns) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> pixels(static_cast<std::size_t>(width * height * 4), 0);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) pixels[static_cast<std::size_t>((y * width + x) * 4 + 3)] = x < transparent_columns ? 0 : 255;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr);
  std::string out(size, '\0');
  png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr);
  out.resize(size);
  return out;
}

const std::string kEditPrompt = "a small green triangle at the left on a white background";

TEST(ServerImagesIn, OpenAiEditsGiveTheLibrarysPixels) {
  TestServer server;
  const RgbImage source = source_picture();
  httplib::MultipartFormDataItems form = {{"image", png_bytes(source), "source.png", "image/png"},
                                          {"prompt", kEditPrompt, "", ""},
                                          {"size", "48x32", "", ""},
                                          {"num_inference_steps", "6", "", ""},
                                          {"seed", "4", "", ""},
                                          {"strength", "0.6", "", ""},
                                          {"user", "ignored", "", ""}};
  auto r = server.client().Post("/v1/images/edits", form);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string request = R"({"prompt": ")" + kEditPrompt + R"(", "width": 48, "height": 32, "num_inference_steps": 6, "seed": 4, )";
  EXPECT_EQ(png_of(from_base64(json::parse(r->body)["data"][0]["b64_json"])).pixels,
            library_image(request + R"("strength": 0.6})", source, nullptr).pixels);
  // A mask's transparent pixels are repainted (OpenAI's rule): the left 24 columns here.
  form.push_back({"mask", rgba_mask_png(48, 32, 24), "mask.png", "image/png"});
  form[5].content = "1";
  r = server.client().Post("/v1/images/edits", form);
  ASSERT_EQ(r->status, 200) << r->body;
  RgbImage white_left;
  white_left.width = 48;
  white_left.height = 32;
  white_left.pixels.assign(48 * 32 * 3, 0);
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 24; ++x)
      for (int c = 0; c < 3; ++c) white_left.pixels[static_cast<std::size_t>((y * 48 + x) * 3 + c)] = 255;
  EXPECT_EQ(png_of(from_base64(json::parse(r->body)["data"][0]["b64_json"])).pixels,
            library_image(request + R"("strength": 1.0})", source, &white_left).pixels);
}

TEST(ServerImagesIn, Automatic1111Img2ImgGivesTheLibrarysPixels) {
  TestServer server;
  const RgbImage source = source_picture();
  const std::string b64 = cubevec::server::base64(png_bytes(source));
  const json body{
      {"init_images", {"data:image/png;base64," + b64}}, {"prompt", kEditPrompt}, {"steps", 6}, {"width", 48}, {"height", 32}, {"seed", 4}};
  const auto r = server.post("/sdapi/v1/img2img", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body.substr(0, 300);
  const std::string request = R"({"prompt": ")" + kEditPrompt + R"(", "width": 48, "height": 32, "num_inference_steps": 6, "seed": 4, )";
  // The web UI's default denoising_strength, 0.75.
  EXPECT_EQ(png_of(from_base64(json::parse(r->body)["images"][0])).pixels,
            library_image(request + R"("strength": 0.75})", source, nullptr).pixels);
}

struct Bad {
  std::string what;
  httplib::Result result;
  std::string param, in_message;
};

TEST(ServerImagesIn, BadUploadsAndFieldsAreErrorsNamingThem) {
  TestServer server;
  const std::string good = png_bytes(source_picture());
  auto edits = [&](httplib::MultipartFormDataItems form) { return server.client().Post("/v1/images/edits", form); };
  std::vector<Bad> cases;
  cases.push_back({"no image", edits({{"prompt", kPrompt, "", ""}}), "image", "'image' is required"});
  cases.push_back({"text image", edits({{"image", "abc", "", ""}, {"prompt", kPrompt, "", ""}}), "image", "must be a file"});
  cases.push_back({"not a picture", edits({{"image", "hello", "x.png", "image/png"}, {"prompt", kPrompt, "", ""}}), "image",
                   "neither a PNG nor a JPEG"});
  cases.push_back({"truncated", edits({{"image", good.substr(0, good.size() / 2), "x.png", "image/png"}, {"prompt", kPrompt, "", ""}}),
                   "image", "not a readable PNG image"});
  cases.push_back({"two images",
                   edits({{"image", good, "a.png", "image/png"}, {"image", good, "b.png", "image/png"}, {"prompt", kPrompt, "", ""}}),
                   "image", "one 'image'"});
  cases.push_back(
      {"mask of another size",
       edits(
           {{"image", good, "a.png", "image/png"}, {"mask", rgba_mask_png(16, 16, 8), "m.png", "image/png"}, {"prompt", kPrompt, "", ""}}),
       "mask", "one size"});
  cases.push_back({"strength not a number",
                   edits({{"image", good, "a.png", "image/png"}, {"prompt", kPrompt, "", ""}, {"strength", "lots", "", ""}}), "strength",
                   "must be a number"});
  cases.push_back({"strength 0", edits({{"image", good, "a.png", "image/png"}, {"prompt", kPrompt, "", ""}, {"strength", "0", "", ""}}),
                   "strength", "no denoising step"});
  cases.push_back({"a file as prompt", edits({{"image", good, "a.png", "image/png"}, {"prompt", kPrompt, "p.txt", "text/plain"}}), "prompt",
                   "must be a text field"});
  cases.push_back({"JSON body", server.post("/v1/images/edits", json{{"prompt", kPrompt}}.dump()), "image", "multipart form"});
  cases.push_back(
      {"a path in a job", server.post("/v1/jobs", json{{"prompt", kPrompt}, {"image", "/etc/passwd"}}.dump()), "image", "reads no file"});
  cases.push_back({"a path in generations",
                   server.post("/v1/images/generations", json{{"prompt", kPrompt}, {"mask_image", "/etc/passwd"}}.dump()), "mask_image",
                   "reads no file"});
  cases.push_back({"a prompt given twice",
                   edits({{"image", good, "a.png", "image/png"}, {"prompt", kPrompt, "", ""}, {"prompt", "again", "", ""}}), "prompt",
                   "more than once"});
  cases.push_back({"a path as a form field",
                   edits({{"image", good, "a.png", "image/png"}, {"prompt", kPrompt, "", ""}, {"prompt_embeds", "/etc/passwd", "", ""}}),
                   "prompt_embeds", "reads no file"});
  cases.push_back({"strength without a picture", server.post("/v1/images/generations", json{{"prompt", kPrompt}, {"strength", 0.5}}.dump()),
                   "strength", "applies with"});
  cases.push_back(
      {"a path in img2img",
       server.post("/sdapi/v1/img2img",
                   json{{"prompt", kPrompt}, {"init_images", {cubevec::server::base64(good)}}, {"image", "/etc/passwd"}}.dump()),
       "image", "reads no file"});
  cases.push_back(
      {"a1111 strength 0",
       server.post("/sdapi/v1/img2img",
                   json{{"prompt", kPrompt}, {"init_images", {cubevec::server::base64(good)}}, {"denoising_strength", 0}}.dump()),
       "denoising_strength", "no denoising step"});
  cases.push_back({"a1111 without init_images", server.post("/sdapi/v1/img2img", json{{"prompt", kPrompt}}.dump()), "init_images",
                   "'init_images' is required"});
  cases.push_back({"a1111 bad base64", server.post("/sdapi/v1/img2img", json{{"prompt", kPrompt}, {"init_images", {"@@@@"}}}.dump()),
                   "init_images", "not base64"});
  cases.push_back({"a1111 number as image", server.post("/sdapi/v1/img2img", json{{"prompt", kPrompt}, {"init_images", {7}}}.dump()),
                   "init_images", "must be a base64 string"});
  cases.push_back(
      {"a1111 strength out of range",
       server.post("/sdapi/v1/img2img",
                   json{{"prompt", kPrompt}, {"init_images", {cubevec::server::base64(good)}}, {"denoising_strength", 2}}.dump()),
       "denoising_strength", "denoising_strength"});
  for (const Bad& c : cases) {
    ASSERT_TRUE(c.result) << c.what;
    EXPECT_EQ(c.result->status, 400) << c.what << "\n" << c.result->body;
    const json error = json_of(c.result)["error"];
    ASSERT_TRUE(error.is_object()) << c.what << "\n" << c.result->body;
    EXPECT_EQ(error["param"].is_null() ? "" : error["param"].get<std::string>(), c.param) << c.what << "\n" << c.result->body;
    EXPECT_NE(error["message"].get<std::string>().find(c.in_message), std::string::npos) << c.what << "\n" << c.result->body;
  }
}

}  // namespace server_images_in_test
