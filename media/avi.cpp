#include "media/avi.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "base/error.h"

namespace cubevec::media {

namespace {

// The writer's fixed header: RIFF 'AVI ' (12) + LIST 'hdrl' (12) + 'avih' (8 + 56) +
// LIST 'strl' (12) + 'strh' (8 + 56) + 'strf' (8 + 40) + LIST 'movi' (12) = 224 bytes.
constexpr uint64_t kHdrlSize = 192, kStrlSize = 116, kMoviFourcc = 220, kHeaderSize = 224;
constexpr uint32_t kAvifHasIndex = 0x10, kAvifIsInterleaved = 0x100, kAviifKeyframe = 0x10;
constexpr int kMaxSide = 65500;  // the largest JPEG TurboJPEG writes

struct Bytes {
  std::vector<uint8_t> b;
  void u32(uint64_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u16(unsigned v) {
    b.push_back(static_cast<uint8_t>(v));
    b.push_back(static_cast<uint8_t>(v >> 8));
  }
  // Byte by byte: GCC 12's -Wstringop-overflow misfires on a 4-byte range insert under -O2 + TSan.
  void cc(const char* fourcc) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(fourcc[i]));
  }
};

uint32_t le32(const uint8_t* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24; }

// A fourcc as text for messages, non-printable bytes as '?'.
std::string printable(const uint8_t* p) {
  std::string s(reinterpret_cast<const char*>(p), 4);
  for (char& c : s)
    if (c < 32 || c > 126) c = '?';
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

MjpegAviWriter::MjpegAviWriter(const std::string& path, int width, int height, int fps_num, int fps_den, uint64_t max_file_bytes)
    : MjpegAviWriter(path, nullptr, width, height, fps_num, fps_den, max_file_bytes) {}

MjpegAviWriter::MjpegAviWriter(std::vector<uint8_t>& memory, const std::string& what, int width, int height, int fps_num, int fps_den,
                               uint64_t max_file_bytes)
    : MjpegAviWriter(what, &memory, width, height, fps_num, fps_den, max_file_bytes) {}

MjpegAviWriter::MjpegAviWriter(const std::string& path, std::vector<uint8_t>* memory, int width, int height, int fps_num, int fps_den,
                               uint64_t max_file_bytes)
    : path_(path), width_(width), height_(height), fps_num_(fps_num), fps_den_(fps_den), max_file_bytes_(max_file_bytes), memory_(memory) {
  if (width <= 0 || height <= 0 || width > kMaxSide || height > kMaxSide)
    throw Error(path + ": AVI frame size must be 1..65500 on each side, got " + std::to_string(width) + "x" + std::to_string(height));
  if (fps_num <= 0 || fps_den <= 0)
    throw Error(path + ": AVI frame rate must be positive, got " + std::to_string(fps_num) + "/" + std::to_string(fps_den));
  if (max_file_bytes > 0xFFFFFFFFu || max_file_bytes < kHeaderSize + 8)
    throw Error(path + ": AVI size limit must be in " + std::to_string(kHeaderSize + 8) + "..4294967295 bytes, got " +
                std::to_string(max_file_bytes));
  const int g = std::gcd(fps_num, fps_den);
  fps_num_ /= g;
  fps_den_ /= g;
  if (memory_) memory_->clear();
  else file_ = std::make_unique<OutputFile>(path, "AVI output");
  const std::vector<uint8_t> h = header(kHeaderSize, kHeaderSize);
  append(h.data(), h.size());
}

MjpegAviWriter::~MjpegAviWriter() = default;  // an unfinished temporary is removed by OutputFile

std::vector<uint8_t> MjpegAviWriter::header(uint64_t movi_end, uint64_t file_end) const {
  const uint64_t frames = index_.size(), w = static_cast<uint64_t>(width_), h = static_cast<uint64_t>(height_);
  const uint64_t num = static_cast<uint64_t>(fps_num_), den = static_cast<uint64_t>(fps_den_);
  const uint64_t buffer = max_chunk_ + (max_chunk_ & 1u);
  const uint64_t bytes_per_sec = std::min<uint64_t>(0xFFFFFFFFu, (buffer * num + den - 1) / den);
  Bytes b;
  b.cc("RIFF"), b.u32(file_end - 8), b.cc("AVI ");
  b.cc("LIST"), b.u32(kHdrlSize), b.cc("hdrl");
  b.cc("avih"), b.u32(56);
  b.u32(static_cast<uint64_t>(std::llround(1e6 * static_cast<double>(den) / static_cast<double>(num))));
  b.u32(bytes_per_sec), b.u32(0), b.u32(kAvifHasIndex | kAvifIsInterleaved);
  b.u32(frames), b.u32(0), b.u32(1), b.u32(buffer), b.u32(w), b.u32(h);
  for (int i = 0; i < 4; ++i) b.u32(0);
  b.cc("LIST"), b.u32(kStrlSize), b.cc("strl");
  b.cc("strh"), b.u32(56), b.cc("vids"), b.cc("MJPG"), b.u32(0), b.u16(0), b.u16(0), b.u32(0);
  b.u32(den), b.u32(num), b.u32(0), b.u32(frames), b.u32(buffer), b.u32(0xFFFFFFFFu), b.u32(0);
  b.u16(0), b.u16(0), b.u16(static_cast<unsigned>(w)), b.u16(static_cast<unsigned>(h));
  b.cc("strf"), b.u32(40), b.u32(40), b.u32(w), b.u32(h), b.u16(1), b.u16(24), b.cc("MJPG"), b.u32(w * h * 3);
  for (int i = 0; i < 4; ++i) b.u32(0);
  b.cc("LIST"), b.u32(movi_end - kMoviFourcc), b.cc("movi");
  return b.b;
}

void MjpegAviWriter::check_open(const char* action) const {
  if (finished_) throw Error(path_ + ": cannot " + action + " after finish()");
  if (broken_) throw Error(path_ + ": cannot " + action + ": an earlier write to the file failed");
}

void MjpegAviWriter::append(const uint8_t* data, std::size_t size) {
  try {
    if (memory_) memory_->insert(memory_->end(), data, data + size);
    else file_->write(data, size);
  } catch (...) {
    broken_ = true;
    throw;
  }
  end_ += size;
}

void MjpegAviWriter::add_frame(const std::vector<uint8_t>& jpeg) {
  check_open("add a frame");
  const std::string what = path_ + ": frame " + std::to_string(index_.size());
  const JpegSize size = jpeg_size(jpeg.data(), jpeg.size(), what);
  if (size.width != width_ || size.height != height_)
    throw Error(what + " is " + std::to_string(size.width) + "x" + std::to_string(size.height) + ", but the video is " +
                std::to_string(width_) + "x" + std::to_string(height_));
  const uint64_t pad = jpeg.size() & 1u;
  const uint64_t total = end_ + 8 + jpeg.size() + pad + 8 + 16 * (index_.size() + 1);  // with the finished index
  if (total > max_file_bytes_)
    throw Error(what + " (" + std::to_string(jpeg.size()) + " bytes) would make the file " + std::to_string(total) +
                " bytes, over its limit of " + std::to_string(max_file_bytes_) + " (" +
                (max_file_bytes_ == kAviClassicLimit ? "the 1 GiB limit of a classic AVI file" : "max_file_bytes") +
                "); use fewer frames, smaller frames or a lower JPEG quality");
  const IndexEntry entry{static_cast<uint32_t>(end_ - kMoviFourcc), static_cast<uint32_t>(jpeg.size())};
  Bytes chunk;
  chunk.cc("00dc"), chunk.u32(jpeg.size());
  append(chunk.b.data(), chunk.b.size());
  append(jpeg.data(), jpeg.size());
  const uint8_t zero = 0;
  if (pad) append(&zero, 1);
  index_.push_back(entry);
  max_chunk_ = std::max(max_chunk_, entry.size);
}

void MjpegAviWriter::add_frame(const RgbImage& image, int quality) {
  check_open("add a frame");
  const std::string what = path_ + ": frame " + std::to_string(index_.size());
  if (image.width != width_ || image.height != height_)
    throw Error(what + " is " + std::to_string(image.width) + "x" + std::to_string(image.height) + ", but the video is " +
                std::to_string(width_) + "x" + std::to_string(height_));
  add_frame(encode_jpeg(image, quality, what));
}

void MjpegAviWriter::finish() {
  if (finished_) return;
  check_open("finish");
  const uint64_t movi_end = end_;
  Bytes idx1;
  idx1.cc("idx1"), idx1.u32(16 * index_.size());
  for (const IndexEntry& e : index_) idx1.cc("00dc"), idx1.u32(kAviifKeyframe), idx1.u32(e.offset), idx1.u32(e.size);
  append(idx1.b.data(), idx1.b.size());
  const std::vector<uint8_t> h = header(movi_end, end_);
  try {
    if (memory_) {
      std::copy(h.begin(), h.end(), memory_->begin());
    } else {
      file_->write_at(0, h.data(), h.size());
      file_->commit();
    }
  } catch (...) {
    broken_ = true;
    throw;
  }
  finished_ = true;
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

class AviReader {
 public:
  struct Chunk {
    std::string id;
    uint64_t pos = 0;
    uint32_t size = 0;
    uint64_t data() const { return pos + 8; }
    uint64_t end() const { return pos + 8 + size; }
  };

  explicit AviReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    std::error_code ec;
    size_ = std::filesystem::file_size(path, ec);
    if (!in_ || ec) fail("cannot be read" + (ec ? ": " + ec.message() : std::string()));
  }
  uint64_t size() const { return size_; }
  [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + what); }

  void read(uint64_t pos, uint8_t* out, std::size_t n, const char* what) {
    if (pos + n > size_)
      fail(std::string("truncated: ") + what + " at offset " + std::to_string(pos) + " needs " + std::to_string(n) +
           " bytes, but the file ends at " + std::to_string(size_));
    in_.seekg(static_cast<std::streamoff>(pos));
    in_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n));
    if (!in_) fail("read error at offset " + std::to_string(pos));
  }
  uint32_t u32(uint64_t pos, const char* what) {
    uint8_t b[4];
    read(pos, b, 4, what);
    return le32(b);
  }
  std::string fourcc(uint64_t pos, const char* what) {
    uint8_t b[4];
    read(pos, b, 4, what);
    return printable(b);
  }
  Chunk chunk(uint64_t pos, uint64_t parent_end, const std::string& parent) {
    uint8_t b[8];
    read(pos, b, 8, "a chunk header");
    Chunk c{printable(b), pos, le32(b + 4)};
    if (c.end() > parent_end)
      fail("chunk '" + c.id + "' at offset " + std::to_string(pos) + " declares " + std::to_string(c.size) + " bytes, past the end of " +
           parent + " at offset " + std::to_string(parent_end));
    return c;
  }
  // The chunks in [begin, end) (a RIFF or LIST body); odd sizes are followed by a pad byte.
  std::vector<Chunk> children(uint64_t begin, uint64_t end, const std::string& parent) {
    std::vector<Chunk> out;
    for (uint64_t pos = begin; pos + 8 <= end;) {
      out.push_back(chunk(pos, end, parent));
      pos = out.back().end() + (out.back().size & 1u);
    }
    return out;
  }
  // The first chunk named `id` (for "LIST", of list type `type`), if any.
  std::optional<Chunk> find(const std::vector<Chunk>& chunks, const std::string& id, const char* type = nullptr) {
    for (const Chunk& c : chunks)
      if (c.id == id && (!type || (c.size >= 4 && fourcc(c.data(), "a LIST type") == type))) return c;
    return std::nullopt;
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

bool is_video_chunk(const std::string& id) { return id == "00dc" || id == "00db"; }

}  // namespace

AviInfo read_avi_info(const std::string& path) {
  AviReader r(path);
  if (r.size() < 12) r.fail("too short for an AVI file (" + std::to_string(r.size()) + " bytes)");
  if (const std::string id = r.fourcc(0, "the RIFF header"); id != "RIFF")
    r.fail("not a RIFF file: it starts with '" + id + "', expected 'RIFF'");
  if (const std::string form = r.fourcc(8, "the RIFF form"); form != "AVI ")
    r.fail("not an AVI file: the RIFF form is '" + form + "', expected 'AVI '");
  const uint64_t riff_end = 8 + uint64_t{r.u32(4, "the RIFF size")};
  if (riff_end > r.size())
    r.fail("truncated: the RIFF chunk ends at offset " + std::to_string(riff_end) + ", but the file has " + std::to_string(r.size()) +
           " bytes");

  const auto top = r.children(12, riff_end, "the RIFF chunk");
  const auto hdrl = r.find(top, "LIST", "hdrl");
  const auto movi = r.find(top, "LIST", "movi");
  const auto idx1 = r.find(top, "idx1");
  if (!hdrl) r.fail("no header list LIST 'hdrl'");
  if (!movi) r.fail("no frame list LIST 'movi'");
  if (!idx1) r.fail("no 'idx1' index (only indexed AVI files are read)");

  const auto header_chunks = r.children(hdrl->data() + 4, hdrl->end(), "LIST 'hdrl'");
  const auto avih = r.find(header_chunks, "avih");
  const auto strl = r.find(header_chunks, "LIST", "strl");
  if (!avih || avih->size < 56) r.fail("no 'avih' main header of 56 bytes in LIST 'hdrl'");
  if (!strl) r.fail("no stream header list LIST 'strl' in LIST 'hdrl'");
  const uint32_t avih_frames = r.u32(avih->data() + 16, "avih");
  const uint32_t width = r.u32(avih->data() + 32, "avih"), height = r.u32(avih->data() + 36, "avih");

  const auto stream_chunks = r.children(strl->data() + 4, strl->end(), "LIST 'strl'");
  const auto strh = r.find(stream_chunks, "strh");
  const auto strf = r.find(stream_chunks, "strf");
  if (!strh || strh->size < 48) r.fail("no 'strh' stream header of at least 48 bytes in the first LIST 'strl'");
  if (!strf || strf->size < 40) r.fail("no 'strf' BITMAPINFOHEADER of 40 bytes in the first LIST 'strl'");
  if (const std::string type = r.fourcc(strh->data(), "strh"); type != "vids")
    r.fail("the first stream is '" + type + "', not video ('vids')");
  const uint32_t scale = r.u32(strh->data() + 20, "strh"), rate = r.u32(strh->data() + 24, "strh");
  const uint32_t strh_frames = r.u32(strh->data() + 32, "strh");
  if (const std::string compression = r.fourcc(strf->data() + 16, "strf"); compression != "MJPG")
    r.fail("the video stream is compressed as '" + compression + "', not 'MJPG'");
  const auto bi_width = static_cast<int32_t>(r.u32(strf->data() + 4, "strf"));
  const auto bi_height = static_cast<int32_t>(r.u32(strf->data() + 8, "strf"));
  if (width == 0 || height == 0 || width > 65535 || height > 65535 || bi_width != static_cast<int64_t>(width) ||
      std::llabs(bi_height) != static_cast<int64_t>(height))
    r.fail("bad frame size: avih says " + std::to_string(width) + "x" + std::to_string(height) + ", strf says " + std::to_string(bi_width) +
           "x" + std::to_string(bi_height));
  if (scale == 0 || rate == 0) r.fail("bad frame rate: strh rate/scale is " + std::to_string(rate) + "/" + std::to_string(scale));

  int movi_frames = 0;
  for (const auto& c : r.children(movi->data() + 4, movi->end(), "LIST 'movi'")) movi_frames += is_video_chunk(c.id);

  if (idx1->size % 16 != 0) r.fail("the 'idx1' index has " + std::to_string(idx1->size) + " bytes, not a multiple of 16");
  AviInfo info;
  const uint64_t base = movi->data();  // offsets count from the 'movi' fourcc
  for (uint32_t i = 0; i < idx1->size / 16; ++i) {
    uint8_t e[16];
    r.read(idx1->data() + 16 * uint64_t{i}, e, 16, "an index entry");
    const std::string id = printable(e);
    if (!is_video_chunk(id)) continue;
    const uint64_t pos = base + le32(e + 8);
    const uint32_t size = le32(e + 12);
    if (pos < base + 4 || pos + 8 + size > movi->end())
      r.fail("index entry " + std::to_string(i) + " points at offset " + std::to_string(pos) + " (" + std::to_string(size) +
             " bytes), outside LIST 'movi' (offsets " + std::to_string(base + 4) + " to " + std::to_string(movi->end()) + ")");
    uint8_t h[8];
    r.read(pos, h, 8, "a chunk header");
    if (printable(h) != id || le32(h + 4) != size)
      r.fail("index entry " + std::to_string(i) + " points at offset " + std::to_string(pos) + ", where the chunk is '" + printable(h) +
             "' of " + std::to_string(le32(h + 4)) + " bytes, not '" + id + "' of " + std::to_string(size));
    info.frames.push_back({pos + 8, size});
  }
  if (avih_frames != strh_frames || strh_frames != info.frames.size() || info.frames.size() != static_cast<std::size_t>(movi_frames))
    r.fail("frame counts disagree: avih says " + std::to_string(avih_frames) + ", strh says " + std::to_string(strh_frames) +
           ", idx1 lists " + std::to_string(info.frames.size()) + ", LIST 'movi' holds " + std::to_string(movi_frames));
  info.width = static_cast<int>(width);
  info.height = static_cast<int>(height);
  info.rate = rate;
  info.scale = scale;
  info.fps = static_cast<double>(rate) / static_cast<double>(scale);
  info.frame_count = static_cast<int>(info.frames.size());
  return info;
}

std::vector<uint8_t> read_avi_frame(const std::string& path, const AviFrame& frame) {
  AviReader r(path);
  std::vector<uint8_t> bytes(frame.size);
  r.read(frame.offset, bytes.data(), bytes.size(), "a frame");
  return bytes;
}

}  // namespace cubevec::media
