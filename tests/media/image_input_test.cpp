// Image inputs (media/image_input.h) against PIL: every kind of PNG and JPEG in tests/data/images/
// read as diffusers' load_image reads it (exif_transpose, convert("RGB")), and resized as
// VaeImageProcessor resizes it (Image.resize LANCZOS), bit for bit against the goldens of
// tests/reference/make_image_input_reference.py; the [-1, 1] scaling against a plain loop; and every
// bad input (wrong magic, truncated, zero and huge dimensions, a decompression bomb, CMYK, a folder, a
// FIFO, an empty file) an Error naming the file.
#include "media/image_input.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "common/temp_dir.h"
#include "common/tensor_testing.h"
#include "tensor/safetensors.h"

namespace cubevec {
namespace image_input_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_image_input.safetensors"));
  return file;
}

// An image against a golden H x W x 3 array of 0..255: every byte equal.
void expect_pixels(const media::RgbImage& got, const std::string& golden, const std::string& what) {
  const Tensor want = goldens().tensor(golden);
  ASSERT_EQ(got.height, want.size(0)) << what;
  ASSERT_EQ(got.width, want.size(1)) << what;
  const std::vector<double> w = values(want);
  int64_t differing = 0;
  for (std::size_t i = 0; i < w.size(); ++i) differing += got.pixels[i] != static_cast<uint8_t>(w[i]);
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << w.size() << " bytes differ from PIL's";
}

const char* const kPictures[] = {"rgb.png",   "rgba.png",   "grey.png",  "grey_alpha.png", "palette.png", "interlaced.png",
                                 "rgb16.png", "grey16.png", "photo.jpg", "grey.jpg",       "rotated.jpg"};

TEST(ImageInput, EveryKindReadsAsPilReadsIt) {
  for (const char* name : kPictures)
    expect_pixels(media::read_input_image(data_path(std::string("images/") + name)), std::string(name) + ".rgb", name);
  // EXIF orientation 6: the 20x12 picture comes out 12 wide and 20 high.
  const media::RgbImage rotated = media::read_input_image(data_path("images/rotated.jpg"));
  EXPECT_EQ(rotated.width, 12);
  EXPECT_EQ(rotated.height, 20);
}

TEST(ImageInput, LanczosResizeIsPilsBitForBit) {
  for (const char* name : kPictures) {
    const media::RgbImage image = media::read_input_image(data_path(std::string("images/") + name));
    for (const auto& [w, h] : {std::pair{16, 16}, std::pair{64, 48}, std::pair{50, 10}, std::pair{37, 23}}) {
      const std::string size = std::to_string(w) + "x" + std::to_string(h);
      expect_pixels(media::resize_lanczos(image, w, h), std::string(name) + ".lanczos_" + size, std::string(name) + " -> " + size);
    }
  }
}

TEST(ImageInput, ScaledToMinusOneOneAsVaeImageProcessor) {
  media::RgbImage image;
  image.width = 2;
  image.height = 1;
  image.pixels = {0, 128, 255, 7, 64, 200};
  const Tensor t = media::image_to_tensor(image);
  ASSERT_EQ(t.shape(), (Shape{1, 3, 1, 2}));
  const std::vector<double> got = values(t);
  // [1, C, H, W]: channel c of pixel x at c * 2 + x; 2 * float32(v / 255) - 1 in float32.
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < 2; ++x) {
      const float v = static_cast<float>(image.pixels[static_cast<std::size_t>(x * 3 + c)]) / 255.0f;
      EXPECT_EQ(got[static_cast<std::size_t>(c * 2 + x)], static_cast<double>(2.0f * v - 1.0f));
    }
  EXPECT_EQ(got[0], -1.0);
  EXPECT_EQ(got[5], 1.0 * (2.0f * (200.0f / 255.0f) - 1.0f));
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A PNG of `width` x `height` 8-bit RGB whose rows are all zero (compressed, so a huge one is small).
std::string png_of_zeros(uint32_t width, uint32_t height, uint64_t rows_to_write) {
  const auto be32 = [](uint32_t v) { return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; };
  const auto chunk = [&](const std::string& kind, const std::string& body) {
    const std::string kb = kind + body;
    return be32(static_cast<uint32_t>(body.size())) + kb +
           be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(kb.data()), static_cast<uInt>(kb.size()))));
  };
  std::string ihdr = be32(width) + be32(height) + std::string{8, 2, 0, 0, 0};
  const std::string raw(static_cast<std::size_t>(rows_to_write * (1 + 3 * static_cast<uint64_t>(width))), '\0');
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string compressed(size, '\0');
  compress2(reinterpret_cast<Bytef*>(compressed.data()), &size, reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
            9);
  compressed.resize(size);
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", compressed) + chunk("IEND", "");
}

TEST(ImageInput, BadFilesAreOneLineErrorsNamingTheFile) {
  const TempDir dir("cubevec_image_input");
  const std::string good_png = bytes_of(data_path("images/rgb.png")), good_jpg = bytes_of(data_path("images/photo.jpg"));
  struct Case {
    std::string name, bytes, expect;
  };
  const std::vector<Case> cases = {
      {"text.png", "hello, not a picture", "neither a PNG nor a JPEG"},
      {"empty.png", "", "an empty file"},
      {"truncated.png", good_png.substr(0, good_png.size() / 2), "not a readable PNG image"},
      {"no_scan.jpg", good_jpg.substr(0, good_jpg.size() / 2), "not a readable JPEG image"},
      {"truncated.jpg", good_jpg.substr(0, good_jpg.size() * 9 / 10), "damaged or truncated"},
      {"header_only.jpg", good_jpg.substr(0, 20), "no frame header"},
      {"zero.png", png_of_zeros(0, 10, 0), "0x10 pixels"},
      {"huge.png", png_of_zeros(100000, 100000, 1), "100000x100000 pixels"},
      {"wide.png", png_of_zeros(16385, 1, 1), "16385x1 pixels"},
      // 16000 x 16000 declares 256 M pixels, more than the reader takes: refused before allocating.
      {"bomb.png", png_of_zeros(16000, 16000, 16), "16000x16000 pixels"},
      {"cmyk.jpg", bytes_of(data_path("images/cmyk.jpg")), "CMYK JPEG"},
  };
  for (const Case& c : cases) {
    const std::string path = (dir.path / c.name).string();
    write_bytes(path, c.bytes);
    const std::string message = message_of([&] { media::read_input_image(path, "--image"); });
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find("--image " + path), std::string::npos) << c.name << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << c.name << ": " << message;
  }
  const std::string folder = (dir.path / "folder.png").string();
  std::filesystem::create_directory(folder);
  EXPECT_NE(message_of([&] { media::read_input_image(folder, "--image"); }).find("is a directory"), std::string::npos);
  const std::string fifo = (dir.path / "fifo.png").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(message_of([&] { media::read_input_image(fifo, "--image"); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(message_of([&] { media::read_input_image((dir.path / "missing.png").string(), "--image"); }).find("cannot open"),
            std::string::npos);
}

}  // namespace image_input_test
}  // namespace cubevec
