#include "media/png.h"

#include <png.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string_view>

#include "base/error.h"
#include "base/output_file.h"
#include "base/regular_file.h"

namespace cubevec::media {

namespace {

// libpng's simplified API keeps its state in a png_image; this frees it on every path.
struct PngImage {
  png_image image{};
  PngImage() { image.version = PNG_IMAGE_VERSION; }
  ~PngImage() { png_image_free(&image); }
  PngImage(const PngImage&) = delete;
  PngImage& operator=(const PngImage&) = delete;
  std::string why() const { return image.message[0] ? std::string(image.message) : std::string("libpng gave no reason"); }
};

void check_consistent(const RgbImage& image, const std::string& what) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3)
    throw Error(what + ": cannot write an empty or inconsistent image");
}

}  // namespace

std::vector<uint8_t> encode_png(const RgbImage& image, const std::string& what) {
  check_consistent(image, what);
  PngImage png;
  png.image.width = static_cast<png_uint_32>(image.width);
  png.image.height = static_cast<png_uint_32>(image.height);
  png.image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  // The first call sizes the output, the second writes it.
  if (!png_image_write_to_memory(&png.image, nullptr, &size, 0, image.pixels.data(), 0, nullptr))
    throw Error(what + ": PNG encoding failed: " + png.why());
  std::vector<uint8_t> bytes(size);
  if (!png_image_write_to_memory(&png.image, bytes.data(), &size, 0, image.pixels.data(), 0, nullptr))
    throw Error(what + ": PNG encoding failed: " + png.why());
  bytes.resize(size);
  return bytes;
}

bool is_png(const uint8_t* data, std::size_t size) { return size >= 8 && png_sig_cmp(data, 0, 8) == 0; }

RgbImage decode_png(const uint8_t* data, std::size_t size, const std::string& what) {
  if (!data || !is_png(data, size)) throw Error(what + ": not a PNG image (it does not start with the PNG signature)");
  PngImage png;
  if (!png_image_begin_read_from_memory(&png.image, data, size)) throw Error(what + ": not a valid PNG image: " + png.why());
  const int64_t width = png.image.width, height = png.image.height;
  if (width <= 0 || height <= 0 || width > kMaxPngSide || height > kMaxPngSide || width * height > kMaxPngPixels)
    throw Error(what + ": the PNG declares " + std::to_string(width) + "x" + std::to_string(height) + " pixels; at most " +
                std::to_string(kMaxPngSide) + " a side and " + std::to_string(kMaxPngPixels) + " in all are read");
  png.image.format = PNG_FORMAT_RGB;
  RgbImage out;
  out.width = static_cast<int>(width);
  out.height = static_cast<int>(height);
  out.pixels.resize(static_cast<std::size_t>(width * height * 3));
  const png_color black{0, 0, 0};
  if (!png_image_finish_read(&png.image, &black, out.pixels.data(), 0, nullptr))
    throw Error(what + ": the PNG image data is damaged or truncated: " + png.why());
  return out;
}

void write_png(const std::string& path, const RgbImage& image) {
  const std::vector<uint8_t> bytes = encode_png(image, path);
  write_output_file(path, "PNG output", std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

RgbImage read_png(const std::string& path) {
  const std::string bytes = read_regular_file(path, std::size_t{1} << 30);
  return decode_png(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

ImageFormat image_format_for(const std::string& path, const std::string& flag) {
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(), [](unsigned char c) { return std::tolower(c); });
  if (extension == ".png") return ImageFormat::png;
  if (extension.empty() || extension == ".jpg" || extension == ".jpeg" || extension == ".jpe" || extension == ".jfif")
    return ImageFormat::jpeg;
  throw Error(flag + " " + path + ": the picture is written as PNG (.png) or JPEG (.jpg, .jpeg); '" + extension + "' is neither");
}

void write_image(const std::string& path, const RgbImage& image, ImageFormat format, int jpeg_quality) {
  if (format == ImageFormat::png) write_png(path, image);
  else write_jpeg(path, image, jpeg_quality);
}

}  // namespace cubevec::media
