// PNG files through libpng's simplified API: 8-bit RGB in and out, in memory and as files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "media/jpeg.h"

namespace cubevec::media {

// The largest picture decode_png accepts (each side, and the pixel count), so a small crafted file
// that declares a huge image is refused before its pixels are allocated.
inline constexpr int kMaxPngSide = 16384;
inline constexpr int64_t kMaxPngPixels = int64_t{1} << 28;

// Lossless, 8-bit RGB. `what` names the image in error messages (a file name, "image 2").
std::vector<uint8_t> encode_png(const RgbImage& image, const std::string& what = "image");
// Any PNG (palette, grey, 16-bit, alpha: alpha is composited on black) as 8-bit RGB. Malformed or
// truncated data, or a picture over the limits above, is an Error naming `what`.
RgbImage decode_png(const uint8_t* data, std::size_t size, const std::string& what = "PNG data");
inline RgbImage decode_png(const std::vector<uint8_t>& bytes, const std::string& what = "PNG data") {
  return decode_png(bytes.data(), bytes.size(), what);
}
// True when the bytes start with PNG's signature.
bool is_png(const uint8_t* data, std::size_t size);

// Written through base/output_file.h: the file lands whole or not at all.
void write_png(const std::string& path, const RgbImage& image);
RgbImage read_png(const std::string& path);

// The picture written as PNG when `path` ends in .png, as JPEG for .jpg / .jpeg / .jpe / .jfif or
// no extension; any other extension is an Error naming `flag` and the extensions it takes.
enum class ImageFormat { png, jpeg };
ImageFormat image_format_for(const std::string& path, const std::string& flag);
void write_image(const std::string& path, const RgbImage& image, ImageFormat format, int jpeg_quality = 92);

}  // namespace cubevec::media
