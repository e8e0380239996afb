// The MJPEG AVI writer and reader: frames of known synthetic images read back and decode to the
// right pixels; the byte layout checked by offset independently of the reader (so the two cannot
// be consistently wrong together); the destructor finishing a file; the size limit; argument
// errors; and malformed files (truncated, bad fourccs, an index pointing outside 'movi', counts
// that disagree) rejected with messages naming the file and the fault.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "media/avi.h"
#include "media/jpeg.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace avi_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using media::MjpegAviWriter;
using media::RgbImage;

constexpr int kWidth = 48, kHeight = 40;  // 40 is not a multiple of the 16-row MCU

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("cubevec_avi_" + std::to_string(::getpid()) + "_" + name)).string();
}

// A smooth picture that moves with `t` (a JPEG at quality 85 keeps it within a few levels).
RgbImage frame_image(int t, int width = kWidth, int height = kHeight) {
  RgbImage image{width, height, std::vector<uint8_t>(static_cast<std::size_t>(width * height * 3))};
  const double two_pi = 2 * std::numbers::pi;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      const double u = double(x) / width, v = double(y) / height, phase = 0.9 * t;
      const double rgb[3] = {0.5 + 0.4 * std::sin(two_pi * u + phase), 0.15 + 0.7 * v, 0.5 + 0.4 * std::cos(two_pi * (u + v) / 2 - phase)};
      for (int c = 0; c < 3; ++c)
        image.pixels[static_cast<std::size_t>((y * width + x) * 3 + c)] = static_cast<uint8_t>(std::lround(255 * rgb[c]));
    }
  return image;
}

double mean_abs_error(const RgbImage& a, const RgbImage& b) {
  EXPECT_EQ(a.pixels.size(), b.pixels.size());
  double sum = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i) sum += std::fabs(double(a.pixels[i]) - double(b.pixels[i]));
  return sum / static_cast<double>(a.pixels.size());
}

// The same JPEG with a 1-byte comment segment after SOI when needed to make its length odd.
std::vector<uint8_t> odd_sized(std::vector<uint8_t> jpeg) {
  if (jpeg.size() % 2 == 0) jpeg.insert(jpeg.begin() + 2, {0xFF, 0xFE, 0x00, 0x03, 'x'});
  return jpeg;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

uint32_t u32_at(const std::vector<uint8_t>& b, std::size_t pos) {
  return uint32_t{b.at(pos)} | uint32_t{b.at(pos + 1)} << 8 | uint32_t{b.at(pos + 2)} << 16 | uint32_t{b.at(pos + 3)} << 24;
}
uint16_t u16_at(const std::vector<uint8_t>& b, std::size_t pos) { return static_cast<uint16_t>(b.at(pos) | b.at(pos + 1) << 8); }
std::string cc_at(const std::vector<uint8_t>& b, std::size_t pos) { return std::string(reinterpret_cast<const char*>(b.data() + pos), 4); }
void put_u32(std::vector<uint8_t>& b, std::size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.at(pos + static_cast<std::size_t>(i)) = static_cast<uint8_t>(v >> (8 * i));
}
void put_cc(std::vector<uint8_t>& b, std::size_t pos, const char* cc) {
  std::copy(cc, cc + 4, b.begin() + static_cast<std::ptrdiff_t>(pos));
}

// Writes `n` frames at 16 fps: all but the last through the RgbImage overload at quality 85, the
// last as JPEG bytes of odd length. Returns the JPEG bytes of each frame as stored.
std::vector<std::vector<uint8_t>> write_sample(const std::string& path, int n) {
  std::vector<std::vector<uint8_t>> jpegs;
  MjpegAviWriter writer(path, kWidth, kHeight, 16);
  for (int t = 0; t < n; ++t) {
    const RgbImage image = frame_image(t);
    jpegs.push_back(t + 1 < n ? media::encode_jpeg(image, 85) : odd_sized(media::encode_jpeg(image, 85)));
    if (t + 1 < n) writer.add_frame(image, 85);
    else writer.add_frame(jpegs.back());
  }
  EXPECT_EQ(writer.frame_count(), n);
  writer.finish();
  return jpegs;
}

TEST(AviWriter, FramesReadBackAndDecodeToTheImages) {
  const std::string path = temp_path("frames.avi");
  const int n = 6;
  write_sample(path, n);
  const media::AviInfo info = media::read_avi_info(path);
  EXPECT_EQ(info.width, kWidth);
  EXPECT_EQ(info.height, kHeight);
  EXPECT_EQ(info.rate, 16u);
  EXPECT_EQ(info.scale, 1u);
  EXPECT_DOUBLE_EQ(info.fps, 16.0);
  ASSERT_EQ(info.frame_count, n);
  ASSERT_EQ(info.frames.size(), static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) {
    const RgbImage back = media::decode_jpeg(media::read_avi_frame(path, info.frames[static_cast<std::size_t>(t)]));
    ASSERT_EQ(back.width, kWidth);
    ASSERT_EQ(back.height, kHeight);
    const double own = mean_abs_error(back, frame_image(t));
    EXPECT_LT(own, 3.0) << "frame " << t << " at quality 85";
    // In order: every other frame is much further away.
    for (int other = 0; other < n; ++other)
      if (other != t) {
        EXPECT_GT(mean_abs_error(back, frame_image(other)), 4 * own) << t << " vs " << other;
      }
  }
  std::filesystem::remove(path);
}

TEST(AviWriter, ByteLayoutByOffset) {
  const std::string path = temp_path("layout.avi");
  const int n = 5;
  const auto jpegs = write_sample(path, n);
  const std::vector<uint8_t> b = file_bytes(path);
  ASSERT_GT(b.size(), 224u);
  // RIFF 'AVI ' covering the whole file.
  EXPECT_EQ(cc_at(b, 0), "RIFF");
  EXPECT_EQ(u32_at(b, 4), b.size() - 8);
  EXPECT_EQ(cc_at(b, 8), "AVI ");
  // LIST 'hdrl' with 'avih'.
  EXPECT_EQ(cc_at(b, 12), "LIST");
  EXPECT_EQ(u32_at(b, 16), 192u);
  EXPECT_EQ(cc_at(b, 20), "hdrl");
  EXPECT_EQ(cc_at(b, 24), "avih");
  EXPECT_EQ(u32_at(b, 28), 56u);
  EXPECT_EQ(u32_at(b, 32), 62500u) << "microseconds per frame at 16 fps";
  EXPECT_NE(u32_at(b, 44) & 0x10u, 0u) << "AVIF_HASINDEX";
  EXPECT_EQ(u32_at(b, 48), static_cast<uint32_t>(n)) << "avih total frames";
  EXPECT_EQ(u32_at(b, 56), 1u) << "streams";
  std::size_t largest = 0;
  for (const auto& j : jpegs) largest = std::max(largest, j.size());
  EXPECT_GE(u32_at(b, 60), largest) << "suggested buffer size";
  EXPECT_EQ(u32_at(b, 64), static_cast<uint32_t>(kWidth));
  EXPECT_EQ(u32_at(b, 68), static_cast<uint32_t>(kHeight));
  // LIST 'strl': 'strh' vids/MJPG at 16/1 fps, 'strf' BITMAPINFOHEADER with MJPG.
  EXPECT_EQ(cc_at(b, 88), "LIST");
  EXPECT_EQ(u32_at(b, 92), 116u);
  EXPECT_EQ(cc_at(b, 96), "strl");
  EXPECT_EQ(cc_at(b, 100), "strh");
  EXPECT_EQ(u32_at(b, 104), 56u);
  EXPECT_EQ(cc_at(b, 108), "vids");
  EXPECT_EQ(cc_at(b, 112), "MJPG");
  EXPECT_EQ(u32_at(b, 128), 1u) << "scale";
  EXPECT_EQ(u32_at(b, 132), 16u) << "rate";
  EXPECT_EQ(u32_at(b, 140), static_cast<uint32_t>(n)) << "strh length";
  EXPECT_EQ(u16_at(b, 160), kWidth) << "rcFrame right";
  EXPECT_EQ(u16_at(b, 162), kHeight) << "rcFrame bottom";
  EXPECT_EQ(cc_at(b, 164), "strf");
  EXPECT_EQ(u32_at(b, 168), 40u);
  EXPECT_EQ(u32_at(b, 172), 40u) << "biSize";
  EXPECT_EQ(u32_at(b, 176), static_cast<uint32_t>(kWidth));
  EXPECT_EQ(u32_at(b, 180), static_cast<uint32_t>(kHeight));
  EXPECT_EQ(u16_at(b, 184), 1) << "planes";
  EXPECT_EQ(u16_at(b, 186), 24) << "bit count";
  EXPECT_EQ(cc_at(b, 188), "MJPG");
  // LIST 'movi': the JPEGs in '00dc' chunks, odd ones padded with a zero byte.
  EXPECT_EQ(cc_at(b, 212), "LIST");
  EXPECT_EQ(cc_at(b, 220), "movi");
  std::size_t pos = 224;
  std::vector<std::size_t> chunk_pos;
  bool saw_odd = false;
  for (const auto& jpeg : jpegs) {
    chunk_pos.push_back(pos);
    ASSERT_EQ(cc_at(b, pos), "00dc") << "at " << pos;
    ASSERT_EQ(u32_at(b, pos + 4), jpeg.size());
    ASSERT_TRUE(std::equal(jpeg.begin(), jpeg.end(), b.begin() + static_cast<std::ptrdiff_t>(pos + 8)));
    EXPECT_EQ(b[pos + 8], 0xFF);
    EXPECT_EQ(b[pos + 9], 0xD8) << "JPEG SOI";
    pos += 8 + jpeg.size();
    if (jpeg.size() % 2) {
      saw_odd = true;
      EXPECT_EQ(b.at(pos), 0) << "pad byte";
      ++pos;
    }
  }
  EXPECT_TRUE(saw_odd) << "the sample includes an odd-sized frame";
  EXPECT_EQ(u32_at(b, 216), pos - 220) << "movi LIST size";
  // 'idx1': one keyframe entry per chunk, offsets from the 'movi' fourcc, ending the file.
  ASSERT_EQ(cc_at(b, pos), "idx1");
  ASSERT_EQ(u32_at(b, pos + 4), 16u * n);
  EXPECT_EQ(pos + 8 + 16u * n, b.size());
  for (int i = 0; i < n; ++i) {
    const std::size_t e = pos + 8 + 16 * static_cast<std::size_t>(i);
    EXPECT_EQ(cc_at(b, e), "00dc");
    EXPECT_EQ(u32_at(b, e + 4), 0x10u) << "AVIIF_KEYFRAME";
    EXPECT_EQ(u32_at(b, e + 8), chunk_pos[static_cast<std::size_t>(i)] - 220);
    EXPECT_EQ(u32_at(b, e + 12), jpegs[static_cast<std::size_t>(i)].size());
  }
  EXPECT_EQ(u32_at(b, pos + 8 + 8), 4u) << "the first chunk sits right after the 'movi' fourcc";
  std::filesystem::remove(path);
}

TEST(AviWriter, FrameRateIsARationalInLowestTerms) {
  const std::string path = temp_path("ntsc.avi");
  {
    MjpegAviWriter writer(path, 16, 16, 60000, 2002);
    writer.add_frame(frame_image(0, 16, 16));
    writer.finish();
  }
  const std::vector<uint8_t> b = file_bytes(path);
  EXPECT_EQ(u32_at(b, 32), 33367u) << "round(1e6 * 1001 / 30000)";
  EXPECT_EQ(u32_at(b, 128), 1001u);
  EXPECT_EQ(u32_at(b, 132), 30000u);
  const media::AviInfo info = media::read_avi_info(path);
  EXPECT_NEAR(info.fps, 29.97, 0.001);
  EXPECT_EQ(info.frame_count, 1);
  std::filesystem::remove(path);
}

TEST(AviWriter, AnUnfinishedWriterLeavesTheOldFileAndNoTemporary) {
  const std::string path = temp_path("unfinished.avi");
  {
    MjpegAviWriter writer(path, kWidth, kHeight, 8);
    for (int t = 0; t < 3; ++t) writer.add_frame(frame_image(t));
    writer.finish();
  }
  const std::vector<uint8_t> before = file_bytes(path);
  {
    MjpegAviWriter abandoned(path, kWidth, kHeight, 8);  // an error or Ctrl-C mid-run
    abandoned.add_frame(frame_image(0));
  }
  EXPECT_EQ(file_bytes(path), before) << "the finished video from before is untouched";
  EXPECT_EQ(media::read_avi_info(path).frame_count, 3);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    entries += e.path().filename().string().find("unfinished.avi") != std::string::npos;
  EXPECT_EQ(entries, 1) << "no temporary left beside it";
  {
    MjpegAviWriter empty(path, kWidth, kHeight, 8);
    empty.finish();
  }
  EXPECT_EQ(media::read_avi_info(path).frame_count, 0) << "an empty video is still a valid file";
  std::filesystem::remove(path);
}

TEST(AviWriter, StaysUnderItsSizeLimit) {
  const std::string path = temp_path("limit.avi");
  const std::vector<uint8_t> jpeg = media::encode_jpeg(frame_image(0), 85);
  const uint64_t per_frame = 8 + jpeg.size() + jpeg.size() % 2 + 16;  // chunk + pad + index entry
  const uint64_t limit = 224 + 8 + 3 * per_frame;
  MjpegAviWriter writer(path, kWidth, kHeight, 16, 1, limit);
  for (int t = 0; t < 3; ++t) writer.add_frame(jpeg);
  const std::string message = message_of([&] { writer.add_frame(jpeg); });
  EXPECT_NE(message.find(path + ": frame 3"), std::string::npos) << message;
  EXPECT_NE(message.find("over its limit of " + std::to_string(limit)), std::string::npos) << message;
  writer.finish();
  EXPECT_EQ(std::filesystem::file_size(path), limit);
  EXPECT_EQ(media::read_avi_info(path).frame_count, 3);
  EXPECT_NE(message_of([&] { MjpegAviWriter(path, 16, 16, 16, 1, uint64_t{1} << 32); }).find("size limit"), std::string::npos);
  EXPECT_EQ(media::kAviClassicLimit, uint64_t{1} << 30);
  std::filesystem::remove(path);
}

TEST(AviWriter, ArgumentErrorsNameTheFile) {
  const std::string path = temp_path("args.avi");
  auto error = [&](const std::function<void()>& action, const std::string& want) {
    const std::string message = message_of(action);
    EXPECT_NE(message.find(want), std::string::npos) << "got: " << message;
  };
  error([&] { MjpegAviWriter(path, 0, 16, 16); }, path + ": AVI frame size must be 1..65500 on each side, got 0x16");
  error([&] { MjpegAviWriter(path, 16, -1, 16); }, "got 16x-1");
  error([&] { MjpegAviWriter(path, 70000, 16, 16); }, "got 70000x16");
  error([&] { MjpegAviWriter(path, 16, 16, 0); }, path + ": AVI frame rate must be positive, got 0/1");
  error([&] { MjpegAviWriter(path, 16, 16, 25, -1); }, "got 25/-1");
  error([&] { MjpegAviWriter("/nonexistent-dir/x.avi", 16, 16, 16); },
        "/nonexistent-dir/x.avi: the directory /nonexistent-dir does not exist");

  MjpegAviWriter writer(path, kWidth, kHeight, 16);
  error([&] { writer.add_frame(media::encode_jpeg(frame_image(0, 16, 16), 85)); }, path + ": frame 0 is 16x16, but the video is 48x40");
  error([&] { writer.add_frame(frame_image(0, 16, 16)); }, path + ": frame 0 is 16x16, but the video is 48x40");
  error([&] { writer.add_frame(std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o'}); }, path + ": frame 0: not a JPEG file");
  error([&] { writer.add_frame(std::vector<uint8_t>{}); }, path + ": frame 0: not a JPEG file");
  error([&] { writer.add_frame(frame_image(0), 0); }, "quality must be in 1..100");
  // Rejected frames leave the writer usable.
  writer.add_frame(frame_image(0));
  writer.finish();
  writer.finish();  // a second finish does nothing
  error([&] { writer.add_frame(frame_image(1)); }, path + ": cannot add a frame after finish()");
  EXPECT_EQ(media::read_avi_info(path).frame_count, 1);
  std::filesystem::remove(path);
}

TEST(AviJpeg, InMemoryEncodeDecodeAndHeaderSize) {
  const RgbImage image = frame_image(2);
  const std::vector<uint8_t> jpeg = media::encode_jpeg(image, 95);
  const media::JpegSize size = media::jpeg_size(jpeg.data(), jpeg.size());
  EXPECT_EQ(size.width, kWidth);
  EXPECT_EQ(size.height, kHeight);
  EXPECT_LT(mean_abs_error(media::decode_jpeg(jpeg), image), 1.5);
  EXPECT_LT(mean_abs_error(media::decode_jpeg(odd_sized(jpeg)), image), 1.5) << "a comment segment changes nothing";
  const std::vector<uint8_t> junk{1, 2, 3};
  EXPECT_NE(message_of([&] { media::decode_jpeg(junk, "frame 7"); }).find("frame 7: not a JPEG file"), std::string::npos);
  EXPECT_NE(message_of([&] { media::encode_jpeg(RgbImage{}, 85, "frame 2"); }).find("frame 2: cannot write an empty"), std::string::npos);
}

TEST(AviReader, MalformedFilesGiveClearErrors) {
  const std::string good_path = temp_path("good.avi"), path = temp_path("bad.avi");
  const int n = 3;
  write_sample(good_path, n);
  const std::vector<uint8_t> good = file_bytes(good_path);
  ASSERT_EQ(media::read_avi_info(good_path).frame_count, n);
  const std::size_t idx1 = good.size() - 8 - 16 * n;  // the index ends the file
  ASSERT_EQ(cc_at(good, idx1), "idx1");

  auto expect_error = [&](const std::vector<uint8_t>& bytes, const std::string& want) {
    write_file(path, bytes);
    const std::string message = message_of([&] { media::read_avi_info(path); });
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << "names the file: " << message;
    EXPECT_NE(message.find(want), std::string::npos) << "got: " << message;
  };
  auto edited = [&](const std::function<void(std::vector<uint8_t>&)>& edit) {
    std::vector<uint8_t> b = good;
    edit(b);
    return b;
  };

  EXPECT_NE(message_of([&] { media::read_avi_info(temp_path("missing.avi")); }).find("missing.avi: cannot be read"), std::string::npos);
  expect_error({'R', 'I', 'F', 'F', 0, 0}, "too short for an AVI file (6 bytes)");
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)),
               "truncated: the RIFF chunk ends at offset " + std::to_string(good.size()) + ", but the file has " +
                   std::to_string(good.size() / 2) + " bytes");
  expect_error(edited([](auto& b) { put_cc(b, 0, "RIFX"); }), "not a RIFF file: it starts with 'RIFX'");
  expect_error(edited([](auto& b) { put_cc(b, 8, "WAVE"); }), "the RIFF form is 'WAVE', expected 'AVI '");
  expect_error(edited([](auto& b) { put_cc(b, 108, "auds"); }), "the first stream is 'auds', not video");
  expect_error(edited([](auto& b) { put_cc(b, 188, "H264"); }), "compressed as 'H264', not 'MJPG'");
  expect_error(edited([](auto& b) { put_u32(b, 132, 0); }), "bad frame rate: strh rate/scale is 0/1");
  expect_error(edited([](auto& b) { put_u32(b, 176, 99); }), "bad frame size: avih says 48x40, strf says 99x40");
  expect_error(edited([](auto& b) { put_u32(b, 48, 5); }),
               "frame counts disagree: avih says 5, strh says 3, idx1 lists 3, LIST 'movi' holds 3");
  expect_error(edited([](auto& b) { put_u32(b, 140, 2); }), "strh says 2");
  // The index pointing past the end of the file, or not at a chunk's start.
  expect_error(edited([&](auto& b) { put_u32(b, idx1 + 8 + 16 + 8, 0x7FFFFFF0); }), "index entry 1 points at offset");
  expect_error(edited([&](auto& b) { put_u32(b, idx1 + 8 + 16 + 8, 0x7FFFFFF0); }), "outside LIST 'movi'");
  expect_error(edited([&](auto& b) { put_u32(b, idx1 + 8 + 12, u32_at(b, idx1 + 8 + 12) + 1); }),
               "index entry 0 points at offset 224, where the chunk is '00dc' of");
  expect_error(edited([&](auto& b) { put_u32(b, idx1 + 8 + 8, 6); }), "index entry 0 points at offset 226, where the chunk is");
  expect_error(edited([&](auto& b) { put_u32(b, idx1 + 4, 17); }), "past the end of the RIFF chunk");
  // A frame chunk whose size runs past its list; a file without its index.
  expect_error(edited([](auto& b) { put_u32(b, 228, 1u << 20); }),
               "chunk '00dc' at offset 224 declares 1048576 bytes, past the end of LIST 'movi'");
  expect_error(edited([&](auto& b) {
                 b.resize(idx1);
                 put_u32(b, 4, static_cast<uint32_t>(idx1 - 8));
               }),
               "no 'idx1' index");
  std::filesystem::remove(good_path);
  std::filesystem::remove(path);
}

}  // namespace avi_test
}  // namespace cubevec
