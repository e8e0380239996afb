// PNG in and out (media/png.h): pictures written by hand here (stored deflate blocks, CRC and
// Adler-32 by plain loops: an encoder independent of libpng) decode to their pixels; what
// encode_png writes decodes back exactly; damaged, truncated, foreign and oversized files are
// errors naming the input; the --out extension picks the format.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "media/png.h"

namespace png_test {

using cubevec::media::RgbImage;
using Bytes = std::vector<uint8_t>;

uint32_t crc32(const Bytes& data, std::size_t begin, std::size_t end) {
  uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = begin; i < end; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put32(Bytes& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(v >> shift));
}

void chunk(Bytes& png, const char* type, const Bytes& data) {
  put32(png, static_cast<uint32_t>(data.size()));
  const std::size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  put32(png, crc32(png, start, png.size()));
}

// A PNG of `rows` (each row's bytes without the filter byte) in one stored deflate block.
Bytes hand_made_png(uint32_t width, uint32_t height, uint8_t color_type, const std::vector<Bytes>& rows, const Bytes& palette = {}) {
  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  Bytes ihdr;
  put32(ihdr, width);
  put32(ihdr, height);
  ihdr.insert(ihdr.end(), {8, color_type, 0, 0, 0});
  chunk(png, "IHDR", ihdr);
  if (!palette.empty()) chunk(png, "PLTE", palette);
  Bytes raw;
  for (const Bytes& row : rows) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), row.begin(), row.end());
  }
  Bytes zlib = {0x78, 0x01, 0x01};  // zlib header; a final stored block
  const uint16_t n = static_cast<uint16_t>(raw.size());
  zlib.insert(zlib.end(), {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(~n), static_cast<uint8_t>(~n >> 8)});
  zlib.insert(zlib.end(), raw.begin(), raw.end());
  uint32_t a = 1, b = 0;
  for (const uint8_t byte : raw) a = (a + byte) % 65521, b = (b + a) % 65521;
  put32(zlib, (b << 16) | a);
  chunk(png, "IDAT", zlib);
  chunk(png, "IEND", {});
  return png;
}

std::string error_of(const Bytes& bytes) {
  try {
    cubevec::media::decode_png(bytes, "test.png");
  } catch (const cubevec::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Png, HandMadeRgbPaletteAndAlphaDecodeToTheirPixels) {
  const Bytes rgb = hand_made_png(3, 2, 2, {{255, 0, 0, 0, 255, 0, 0, 0, 255}, {10, 20, 30, 40, 50, 60, 70, 80, 90}});
  const RgbImage a = cubevec::media::decode_png(rgb);
  EXPECT_EQ(a.width, 3);
  EXPECT_EQ(a.height, 2);
  EXPECT_EQ(a.pixels, (Bytes{255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 40, 50, 60, 70, 80, 90}));
  // Palette: indices into PLTE.
  const Bytes palette = hand_made_png(2, 1, 3, {{1, 0}}, {1, 2, 3, 200, 100, 50});
  EXPECT_EQ(cubevec::media::decode_png(palette).pixels, (Bytes{200, 100, 50, 1, 2, 3}));
  // RGBA: alpha 255 keeps the colour, alpha 0 is black (composited on black).
  const Bytes rgba = hand_made_png(2, 1, 6, {{9, 99, 199, 255, 9, 99, 199, 0}});
  EXPECT_EQ(cubevec::media::decode_png(rgba).pixels, (Bytes{9, 99, 199, 0, 0, 0}));
}

TEST(Png, EncodeDecodesBackExactly) {
  RgbImage image;
  image.width = 37;
  image.height = 11;
  for (int i = 0; i < 37 * 11 * 3; ++i) image.pixels.push_back(static_cast<uint8_t>((i * 7919) % 251));
  const Bytes png = cubevec::media::encode_png(image);
  ASSERT_TRUE(cubevec::media::is_png(png.data(), png.size()));
  const RgbImage back = cubevec::media::decode_png(png);
  EXPECT_EQ(back.width, 37);
  EXPECT_EQ(back.height, 11);
  EXPECT_EQ(back.pixels, image.pixels);
  RgbImage inconsistent = image;
  inconsistent.pixels.pop_back();
  EXPECT_THROW(cubevec::media::encode_png(inconsistent), cubevec::Error);
}

TEST(Png, DamagedTruncatedForeignAndHugeFilesAreErrorsNamingTheInput) {
  const Bytes good = hand_made_png(3, 1, 2, {{1, 2, 3, 4, 5, 6, 7, 8, 9}});
  EXPECT_NE(error_of({}).find("test.png: not a PNG"), std::string::npos);
  EXPECT_NE(error_of({0xFF, 0xD8, 0xFF, 0xE0, 0, 0, 0, 0, 0}).find("not a PNG"), std::string::npos);
  for (const std::size_t keep : {8u, 20u, 40u, 50u}) {
    const std::string message = error_of(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep)));
    EXPECT_NE(message.find("test.png"), std::string::npos) << keep << ": " << message;
    EXPECT_EQ(message.find("(no error)"), std::string::npos) << keep;
  }
  Bytes bad_crc = good;
  bad_crc[29] ^= 0xFF;  // IHDR's CRC
  EXPECT_NE(error_of(bad_crc).find("test.png"), std::string::npos);
  const Bytes huge = hand_made_png(100000, 100000, 2, {});
  EXPECT_NE(error_of(huge).find("at most 16384 a side"), std::string::npos) << error_of(huge);
}

TEST(Png, OutExtensionPicksTheFormat) {
  using cubevec::media::image_format_for;
  using cubevec::media::ImageFormat;
  EXPECT_EQ(image_format_for("a.png", "--out"), ImageFormat::png);
  EXPECT_EQ(image_format_for("dir.x/A.PNG", "--out"), ImageFormat::png);
  EXPECT_EQ(image_format_for("a.jpg", "--out"), ImageFormat::jpeg);
  EXPECT_EQ(image_format_for("a.jpeg", "--out"), ImageFormat::jpeg);
  EXPECT_EQ(image_format_for("picture", "--out"), ImageFormat::jpeg);
  try {
    image_format_for("a.webp", "--out");
    ADD_FAILURE() << "a.webp accepted";
  } catch (const cubevec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--out a.webp"), std::string::npos) << e.what();
  }
}

}  // namespace png_test
