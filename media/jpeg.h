// JPEG files through TurboJPEG, and the conversion from a decoded image tensor to 8-bit RGB.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace cubevec::media {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3, row-major
};

// A VAE output [1, 3, H, W] (values in about [-1, 1]) as diffusers' postprocess makes it:
// round(clamp(x / 2 + 0.5, 0, 1) * 255).
RgbImage to_rgb(const Tensor& image);

// Writes `image` as a baseline JPEG (4:2:0 subsampling below quality 90, 4:4:4 from 90 up).
// Throws naming the file on any failure.
void write_jpeg(const std::string& path, const RgbImage& image, int quality = 92);
// Reads a JPEG back as RGB (for tests and tools).
RgbImage read_jpeg(const std::string& path);

// The same in memory (for MJPEG video frames). `what` names the image or data in error messages
// (a file name, "frame 3 of out.avi").
std::vector<uint8_t> encode_jpeg(const RgbImage& image, int quality = 92, const std::string& what = "image");
RgbImage decode_jpeg(const uint8_t* data, std::size_t size, const std::string& what = "JPEG data");
inline RgbImage decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& what = "JPEG data") {
  return decode_jpeg(bytes.data(), bytes.size(), what);
}

struct JpegSize {
  int width = 0, height = 0;
};
// Width and height from a JPEG's header, without decoding the image.
JpegSize jpeg_size(const uint8_t* data, std::size_t size, const std::string& what = "JPEG data");

}  // namespace cubevec::media
