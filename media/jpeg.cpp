#include "media/jpeg.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "base/output_file.h"
#include "base/regular_file.h"

namespace cubevec::media {

namespace {

struct TjHandle {
  explicit TjHandle(tjhandle h) : handle(h) {}
  ~TjHandle() {
    if (handle) tjDestroy(handle);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  tjhandle handle;
};

}  // namespace

RgbImage to_rgb(const Tensor& image) {
  if (image.dim() != 4 || image.size(0) != 1 || image.size(1) != 3)
    throw Error("to_rgb: expected an image [1, 3, H, W], got " + shape_to_string(image.shape()));
  if (image.dtype() != DType::f32) throw Error("to_rgb: expected f32, got " + std::string(dtype_name(image.dtype())));
  const Tensor x = image.contiguous();
  RgbImage out;
  out.height = static_cast<int>(x.size(2));
  out.width = static_cast<int>(x.size(3));
  out.pixels.resize(static_cast<std::size_t>(out.width) * static_cast<std::size_t>(out.height) * 3);
  const float* p = x.data<float>();
  const std::size_t plane = static_cast<std::size_t>(out.width) * static_cast<std::size_t>(out.height);
  for (std::size_t i = 0; i < plane; ++i)
    for (std::size_t c = 0; c < 3; ++c) {
      float v = p[c * plane + i] * 0.5f + 0.5f;
      v = std::isnan(v) ? 0.0f : std::min(1.0f, std::max(0.0f, v));
      out.pixels[i * 3 + c] = static_cast<uint8_t>(std::lround(v * 255.0f));
    }
  return out;
}

std::vector<uint8_t> encode_jpeg(const RgbImage& image, int quality, const std::string& what) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3)
    throw Error(what + ": cannot write an empty or inconsistent image");
  if (quality < 1 || quality > 100) throw Error(what + ": JPEG quality must be in 1..100, got " + std::to_string(quality));
  TjHandle tj(tjInitCompress());
  if (!tj.handle) throw Error(what + ": TurboJPEG could not start: " + std::string(tjGetErrorStr()));
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int subsampling = quality >= 90 ? TJSAMP_444 : TJSAMP_420;
  if (tjCompress2(tj.handle, image.pixels.data(), image.width, 0, image.height, TJPF_RGB, &buffer, &size, subsampling, quality,
                  TJFLAG_ACCURATEDCT) != 0) {
    const std::string why = tjGetErrorStr2(tj.handle);
    tjFree(buffer);
    throw Error(what + ": JPEG encoding failed: " + why);
  }
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(buffer, [](unsigned char* b) { tjFree(b); });
  return std::vector<uint8_t>(buffer, buffer + size);
}

void write_jpeg(const std::string& path, const RgbImage& image, int quality) {
  const std::vector<uint8_t> bytes = encode_jpeg(image, quality, path);
  write_output_file(path, "JPEG output", std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

JpegSize jpeg_size(const uint8_t* data, std::size_t size, const std::string& what) {
  TjHandle tj(tjInitDecompress());
  if (!tj.handle) throw Error(what + ": TurboJPEG could not start: " + std::string(tjGetErrorStr()));
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (size == 0 || tjDecompressHeader3(tj.handle, data, size, &width, &height, &subsampling, &colorspace) != 0)
    throw Error(what + ": not a JPEG file: " + (size == 0 ? std::string("no data") : std::string(tjGetErrorStr2(tj.handle))));
  return {width, height};
}

RgbImage decode_jpeg(const uint8_t* data, std::size_t size, const std::string& what) {
  const JpegSize dims = jpeg_size(data, size, what);
  TjHandle tj(tjInitDecompress());
  if (!tj.handle) throw Error(what + ": TurboJPEG could not start: " + std::string(tjGetErrorStr()));
  RgbImage image;
  image.width = dims.width;
  image.height = dims.height;
  image.pixels.resize(static_cast<std::size_t>(dims.width) * static_cast<std::size_t>(dims.height) * 3);
  if (tjDecompress2(tj.handle, data, size, image.pixels.data(), dims.width, 0, dims.height, TJPF_RGB, TJFLAG_ACCURATEDCT) != 0)
    throw Error(what + ": JPEG decoding failed: " + std::string(tjGetErrorStr2(tj.handle)));
  return image;
}

RgbImage read_jpeg(const std::string& path) {
  const std::string bytes = read_regular_file(path, std::size_t{1} << 30);
  return decode_jpeg(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

}  // namespace cubevec::media
