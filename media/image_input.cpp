#include "media/image_input.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/regular_file.h"

namespace cubevec::media {

namespace {

void check_dimensions(int64_t width, int64_t height, const std::string& what) {
  if (width <= 0 || height <= 0 || width > kMaxInputSide || height > kMaxInputSide || width * height > kMaxInputPixels)
    throw Error(what + ": the image declares " + std::to_string(width) + "x" + std::to_string(height) + " pixels; between 1 and " +
                std::to_string(kMaxInputSide) + " a side and at most " + std::to_string(kMaxInputPixels) + " in all are read");
}

uint32_t read_u(const uint8_t* p, int bytes, bool big_endian) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint32_t>(p[big_endian ? i : bytes - 1 - i]) << (8 * (bytes - 1 - i));
  return v;
}

// --- PNG: libpng's low-level reader, with PIL's conversions and none of libpng's gamma handling ---

struct PngSource {
  const uint8_t* data;
  std::size_t size, position;
  char message[256];  // libpng's error, kept for the exception thrown after longjmp
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof source->message, "%s", message);
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

void png_read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (length > source->size - source->position) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, source->data + source->position, length);
  source->position += length;
}

RgbImage decode_png_rgb(const uint8_t* data, std::size_t size, const std::string& what, std::vector<uint8_t>* alpha) {
  // The IHDR's size first (bytes 16..23 after the signature and the chunk's length and name), so a
  // picture too large (or of zero size) is named as such, not as libpng's "Invalid IHDR data".
  if (size >= 24 && std::memcmp(data + 12, "IHDR", 4) == 0) check_dimensions(read_u(data + 16, 4, true), read_u(data + 20, 4, true), what);
  PngSource source{data, size, 0, {0}};
  RgbImage out;                 // made before setjmp: a longjmp never skips a destructor
  std::vector<png_bytep> rows;  // likewise
  std::vector<uint8_t> rgba;    // likewise: the pixels with their alpha, when it is asked for
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, png_fail, png_ignore_warning);
  if (!png) throw Error(what + ": libpng could not start");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    throw Error(what + ": libpng could not start");
  }
  // Set after setjmp and read after a longjmp: volatile, so their values survive it.
  volatile int64_t width = 0, height = 0;
  volatile bool too_large = false, keep_alpha = false;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    if (too_large) check_dimensions(width, height, what);
    throw Error(what + ": not a readable PNG image: " + std::string(source.message));
  }
  png_set_read_fn(png, &source, png_read_from_memory);
  png_set_user_limits(png, kMaxInputSide, kMaxInputSide);
  png_set_chunk_malloc_max(png, png_alloc_size_t{64} << 20);  // a text or ICC chunk may not be a decompression bomb either
  png_read_info(png, info);
  width = png_get_image_width(png, info);
  height = png_get_image_height(png, info);
  if (width <= 0 || height <= 0 || width * height > kMaxInputPixels) {
    too_large = true;
    png_error(png, "dimensions");
  }
  const int color = png_get_color_type(png, info);
  png_set_expand(png);    // a palette to RGB, grey below 8 bits to 8, tRNS to an alpha channel
  png_set_strip_16(png);  // 16-bit samples by their high byte, as PIL's unpacking of 16-bit RGB
  keep_alpha = alpha && ((color & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(png, info, PNG_INFO_tRNS) != 0);
  if (!keep_alpha) png_set_strip_alpha(png);  // dropped, not composited: PIL's convert("RGB")
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int64_t channels = keep_alpha ? 4 : 3;
  if (png_get_rowbytes(png, info) != static_cast<png_size_t>(width * channels)) png_error(png, "unexpected row layout after conversion");
  out.width = static_cast<int>(width);
  out.height = static_cast<int>(height);
  std::vector<uint8_t>& target = keep_alpha ? rgba : out.pixels;
  target.resize(static_cast<std::size_t>(width * height * channels));
  rows.resize(static_cast<std::size_t>(height));
  for (int64_t y = 0; y < height; ++y) rows[static_cast<std::size_t>(y)] = target.data() + y * width * channels;
  png_read_image(png, rows.data());
  png_destroy_read_struct(&png, &info, nullptr);
  if (keep_alpha) {
    out.pixels.resize(static_cast<std::size_t>(width * height * 3));
    alpha->resize(static_cast<std::size_t>(width * height));
    for (std::size_t i = 0; i < alpha->size(); ++i) {
      std::memcpy(&out.pixels[i * 3], &rgba[i * 4], 3);
      (*alpha)[i] = rgba[i * 4 + 3];
    }
  }
  return out;
}

// --- JPEG: TurboJPEG, and the EXIF orientation load_image applies ---------------------------------

struct TurboJpeg {
  tjhandle handle = tjInitDecompress();
  ~TurboJpeg() {
    if (handle) tjDestroy(handle);
  }
  TurboJpeg() = default;
  TurboJpeg(const TurboJpeg&) = delete;
  TurboJpeg& operator=(const TurboJpeg&) = delete;
};

// The EXIF Orientation tag (1..8) of a JPEG's APP1 segment, or 1 when there is none or it is
// unreadable (an unreadable EXIF block is not an unreadable picture).
int exif_orientation(const uint8_t* data, std::size_t size) {
  std::size_t pos = 2;  // after SOI
  while (pos + 4 <= size && data[pos] == 0xFF) {
    const uint8_t marker = data[pos + 1];
    if (marker == 0xDA || marker == 0xD9) break;  // the image data starts: no more metadata
    const std::size_t length = read_u(data + pos + 2, 2, true);
    if (length < 2 || pos + 2 + length > size) break;
    const uint8_t* seg = data + pos + 4;
    const std::size_t seg_size = length - 2;
    if (marker == 0xE1 && seg_size > 14 && std::memcmp(seg, "Exif\0\0", 6) == 0) {
      const uint8_t* tiff = seg + 6;
      const std::size_t tiff_size = seg_size - 6;
      const bool big = tiff[0] == 'M' && tiff[1] == 'M';
      if (!big && !(tiff[0] == 'I' && tiff[1] == 'I')) return 1;
      const std::size_t ifd = read_u(tiff + 4, 4, big);
      if (ifd + 2 > tiff_size) return 1;
      const std::size_t entries = read_u(tiff + ifd, 2, big);
      for (std::size_t e = 0; e < entries; ++e) {
        const std::size_t at = ifd + 2 + 12 * e;
        if (at + 12 > tiff_size) return 1;
        if (read_u(tiff + at, 2, big) == 0x0112 && read_u(tiff + at + 2, 2, big) == 3) {  // Orientation, SHORT
          const int v = static_cast<int>(read_u(tiff + at + 8, 2, big));
          return v >= 1 && v <= 8 ? v : 1;
        }
      }
      return 1;
    }
    pos += 2 + length;
  }
  return 1;
}

// PIL's ImageOps.exif_transpose for orientations 2..8.
RgbImage apply_orientation(const RgbImage& in, int orientation) {
  if (orientation == 1) return in;
  const int w = in.width, h = in.height;
  const bool swaps = orientation >= 5;
  RgbImage out;
  out.width = swaps ? h : w;
  out.height = swaps ? w : h;
  out.pixels.resize(in.pixels.size());
  for (int y = 0; y < out.height; ++y)
    for (int x = 0; x < out.width; ++x) {
      int sy = y, sx = x;
      switch (orientation) {
        case 2: sx = w - 1 - x; break;                  // FLIP_LEFT_RIGHT
        case 3: sy = h - 1 - y, sx = w - 1 - x; break;  // ROTATE_180
        case 4: sy = h - 1 - y; break;                  // FLIP_TOP_BOTTOM
        case 5: sy = x, sx = y; break;                  // TRANSPOSE
        case 6: sy = h - 1 - x, sx = y; break;          // ROTATE_270 (clockwise 90)
        case 7: sy = h - 1 - x, sx = w - 1 - y; break;  // TRANSVERSE
        case 8: sy = x, sx = w - 1 - y; break;          // ROTATE_90 (counter-clockwise)
        default: break;
      }
      std::memcpy(&out.pixels[(static_cast<std::size_t>(y) * out.width + x) * 3], &in.pixels[(static_cast<std::size_t>(sy) * w + sx) * 3],
                  3);
    }
  return out;
}

RgbImage decode_jpeg_rgb(const uint8_t* data, std::size_t size, const std::string& what) {
  TurboJpeg tj;
  if (!tj.handle) throw Error(what + ": TurboJPEG could not start: " + std::string(tjGetErrorStr()));
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.handle, data, static_cast<unsigned long>(size), &width, &height, &subsampling, &colorspace) != 0)
    throw Error(what + ": not a readable JPEG image: " + std::string(tjGetErrorStr2(tj.handle)));
  if (width == 0 || height == 0) throw Error(what + ": not a readable JPEG image: it has no frame header (a truncated file?)");
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
    throw Error(what + ": a CMYK JPEG; convert it to RGB first (cubevec reads RGB and greyscale JPEGs)");
  check_dimensions(width, height, what);
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
  // The accurate integer DCT and fancy upsampling: libjpeg's defaults, which PIL uses. libjpeg's
  // warnings (a truncated file, which it would fill with grey) are errors, as PIL's "image file is
  // truncated".
  if (tjDecompress2(tj.handle, data, static_cast<unsigned long>(size), image.pixels.data(), width, 0, height, TJPF_RGB,
                    TJFLAG_ACCURATEDCT) != 0)
    throw Error(what + ": the JPEG image data is damaged or truncated: " + std::string(tjGetErrorStr2(tj.handle)));
  return apply_orientation(image, exif_orientation(data, size));
}

// --- Resampling, as PIL's Resample.c (the 8-bit path) ---------------------------------------------

constexpr int kPrecisionBits = 32 - 8 - 2;

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

double lanczos(double x) { return (x > -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

// Keys' cubic convolution with a = -0.5 (PIL's bicubic_filter).
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// A resampling filter: its kernel and the half-width (support) where the kernel is non-zero at scale 1.
struct Filter {
  double (*kernel)(double);
  double support;
  const char* name;  // for errors
};
constexpr Filter kLanczos{lanczos, 3.0, "resize_lanczos"};
constexpr Filter kBicubic{bicubic, 2.0, "resize_bicubic"};

struct Coefficients {
  int ksize = 0;
  std::vector<int> bounds;   // per output pixel: first input pixel, count
  std::vector<int> weights;  // per output pixel: ksize fixed-point weights
};

Coefficients precompute(int in_size, int out_size, const Filter& filter) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filter.support * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<std::size_t>(out_size) * 2);
  c.weights.assign(static_cast<std::size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(static_cast<std::size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale, ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    xmin = std::max(xmin, 0);
    int xmax = static_cast<int>(center + support + 0.5);
    xmax = std::min(xmax, in_size) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[static_cast<std::size_t>(x)] = filter.kernel((x + xmin - center + 0.5) * ss);
      ww += k[static_cast<std::size_t>(x)];
    }
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[static_cast<std::size_t>(x)] / ww : k[static_cast<std::size_t>(x)];
      c.weights[static_cast<std::size_t>(xx) * c.ksize + x] =
          static_cast<int>(w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
    }
    c.bounds[static_cast<std::size_t>(xx) * 2] = xmin;
    c.bounds[static_cast<std::size_t>(xx) * 2 + 1] = xmax;
  }
  return c;
}

uint8_t clip8(int64_t sum) {
  const int64_t v = sum >> kPrecisionBits;  // floor, as C's >> on PIL's int
  return static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
}

}  // namespace

RgbImage decode_input_image(const uint8_t* data, std::size_t size, const std::string& what, std::vector<uint8_t>* alpha) {
  if (alpha) alpha->clear();
  if (size >= 8 && png_sig_cmp(data, 0, 8) == 0) return decode_png_rgb(data, size, what, alpha);
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return decode_jpeg_rgb(data, size, what);
  throw Error(what + ": neither a PNG nor a JPEG image (" + (size == 0 ? std::string("an empty file") : std::string("unknown signature")) +
              ")");
}

RgbImage read_input_image(const std::string& path, const std::string& flag) {
  const std::string what = flag.empty() ? path : flag + " " + path;
  std::string bytes;
  try {
    bytes = read_regular_file(path, kMaxInputFileBytes);
  } catch (const Error& e) {
    throw Error(flag.empty() ? std::string(e.what()) : flag + " " + e.what());
  }
  return decode_input_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), what);
}

namespace {

// PIL's ImagingResample on 8-bit RGB: the horizontal pass first (only over the input rows the
// vertical pass reads) into an 8-bit image, then the vertical one; a pass whose size does not change
// is skipped.
RgbImage resample(const RgbImage& image, int width, int height, const Filter& filter) {
  if (width < 1 || height < 1 || image.width < 1 || image.height < 1)
    throw Error(std::string(filter.name) + ": sizes must be positive, got " + std::to_string(image.width) + "x" +
                std::to_string(image.height) + " -> " + std::to_string(width) + "x" + std::to_string(height));
  if (width == image.width && height == image.height) return image;
  const Coefficients horizontal = precompute(image.width, width, filter), vertical = precompute(image.height, height, filter);
  // The input rows the vertical pass reads, as PIL keeps only those in its intermediate image.
  const int first = vertical.bounds[0], last = vertical.bounds[(height - 1) * 2] + vertical.bounds[(height - 1) * 2 + 1];
  RgbImage temp;
  const bool need_horizontal = width != image.width, need_vertical = height != image.height;
  const RgbImage* source = &image;
  int row_offset = 0;
  if (need_horizontal) {
    temp.width = width;
    temp.height = last - first;
    temp.pixels.resize(static_cast<std::size_t>(temp.width) * temp.height * 3);
    for (int y = 0; y < temp.height; ++y)
      for (int x = 0; x < width; ++x) {
        const int xmin = horizontal.bounds[x * 2], xmax = horizontal.bounds[x * 2 + 1];
        const int* k = &horizontal.weights[static_cast<std::size_t>(x) * horizontal.ksize];
        for (int c = 0; c < 3; ++c) {
          int64_t sum = int64_t{1} << (kPrecisionBits - 1);
          for (int i = 0; i < xmax; ++i)
            sum += int64_t{image.pixels[(static_cast<std::size_t>(y + first) * image.width + xmin + i) * 3 + c]} * k[i];
          temp.pixels[(static_cast<std::size_t>(y) * width + x) * 3 + c] = clip8(sum);
        }
      }
    source = &temp;
    row_offset = first;  // temp's row 0 is the input's row `first`
  }
  if (!need_vertical) return *source;
  RgbImage out;
  out.width = source->width;
  out.height = height;
  out.pixels.resize(static_cast<std::size_t>(out.width) * height * 3);
  for (int y = 0; y < height; ++y) {
    const int ymin = vertical.bounds[y * 2] - row_offset, ymax = vertical.bounds[y * 2 + 1];
    const int* k = &vertical.weights[static_cast<std::size_t>(y) * vertical.ksize];
    for (int x = 0; x < out.width; ++x)
      for (int c = 0; c < 3; ++c) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (int i = 0; i < ymax; ++i)
          sum += int64_t{source->pixels[(static_cast<std::size_t>(ymin + i) * source->width + x) * 3 + c]} * k[i];
        out.pixels[(static_cast<std::size_t>(y) * out.width + x) * 3 + c] = clip8(sum);
      }
  }
  return out;
}

}  // namespace

RgbImage resize_lanczos(const RgbImage& image, int width, int height) { return resample(image, width, height, kLanczos); }

RgbImage resize_bicubic(const RgbImage& image, int width, int height) { return resample(image, width, height, kBicubic); }

Tensor image_to_tensor(const RgbImage& image) {
  if (image.width < 1 || image.height < 1 ||
      image.pixels.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3)
    throw Error("image_to_tensor: an empty or inconsistent image");
  const int64_t h = image.height, w = image.width;
  Tensor out = Tensor::empty({1, 3, h, w}, DType::f32);
  float* p = out.mutable_data<float>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const float v = static_cast<float>(image.pixels[static_cast<std::size_t>((y * w + x) * 3 + c)]) / 255.0f;  // f32, as NumPy's
        p[(c * h + y) * w + x] = 2.0f * v - 1.0f;
      }
  return out;
}

}  // namespace cubevec::media
