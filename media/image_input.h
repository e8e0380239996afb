// Pictures in (image-to-image, inpainting, editing, image-to-video): a PNG or JPEG file read as
// diffusers reads one, `load_image(path)` = PIL's Image.open, ImageOps.exif_transpose and
// .convert("RGB"), then resized and scaled as VaeImageProcessor.preprocess does (PIL's Lanczos
// resize, then 2 * pixel / 255 - 1). docs/models.md, "Images in", says where this differs from PIL.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "media/jpeg.h"
#include "tensor/tensor.h"

namespace cubevec::media {

// The largest picture read (each side, and the pixel count): a small file declaring a huge image is
// refused before its pixels are allocated.
inline constexpr int kMaxInputSide = 16384;
inline constexpr int64_t kMaxInputPixels = int64_t{1} << 26;  // 67 M pixels (8192 x 8192)
inline constexpr std::size_t kMaxInputFileBytes = std::size_t{256} << 20;

// `path` as 8-bit RGB, as PIL's .convert("RGB") gives it: grey replicated, a palette looked up,
// alpha (and a palette's or grey's transparency) dropped, not composited; 16-bit samples by their
// high byte; a JPEG's EXIF orientation applied (load_image's exif_transpose). Anything else (not a
// regular file, neither PNG nor JPEG, truncated, damaged, zero or too large dimensions, a CMYK
// JPEG) is one Error naming `flag` (the option that named the file, "--image") and the file.
RgbImage read_input_image(const std::string& path, const std::string& flag = "image");
// The same from bytes in memory (an upload); `what` names them in errors. With `alpha`, a PNG's
// alpha channel (or its transparency, expanded) is also returned there, one byte per pixel; it is
// left empty for a picture without one.
RgbImage decode_input_image(const uint8_t* data, std::size_t size, const std::string& what, std::vector<uint8_t>* alpha = nullptr);

// PIL's Image.resize((width, height), Image.LANCZOS) on 8-bit RGB, bit for bit: Lanczos-3 weights
// stretched by the scale when shrinking, normalized per output pixel and rounded to 22-bit fixed
// point, the horizontal pass first into an 8-bit image, then the vertical one.
RgbImage resize_lanczos(const RgbImage& image, int width, int height);
// PIL's Image.resize((width, height), Image.BICUBIC) on 8-bit RGB, bit for bit: the same scheme
// with Keys' cubic kernel (a = -0.5, support 2 stretched by the scale when shrinking), as
// CLIPImageProcessor resizes (models/clip_image_processor.h).
RgbImage resize_bicubic(const RgbImage& image, int width, int height);

// VaeImageProcessor's preprocess after the resize: [1, 3, H, W] f32, 2 * (v / 255) - 1 computed in
// f32 as NumPy does it.
Tensor image_to_tensor(const RgbImage& image);

}  // namespace cubevec::media
