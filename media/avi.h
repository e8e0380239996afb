// Motion-JPEG AVI files: a streaming writer (frames go to disk as they are produced) and a reader
// that validates the structure, for tests and tools.
//
// The layout is classic AVI 1.0, one video stream, as common players (ffmpeg/mpv, VLC, Windows)
// expect it:
//
//   RIFF 'AVI '
//     LIST 'hdrl'
//       'avih' (56 bytes: microseconds per frame, AVIF_HASINDEX, total frames, 1 stream, size)
//       LIST 'strl'
//         'strh' (56 bytes: 'vids' 'MJPG', scale/rate = the frame rate, length = frames)
//         'strf' (BITMAPINFOHEADER, 40 bytes, biCompression 'MJPG')
//     LIST 'movi'
//       '00dc' chunks, one JPEG each, padded to an even length
//     'idx1' (16 bytes a frame: '00dc', AVIIF_KEYFRAME, offset of the chunk header counted from
//             the 'movi' fourcc, JPEG length)
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "media/jpeg.h"
#include "base/output_file.h"

namespace cubevec::media {

// The size a classic (AVI 1.0, non-OpenDML) file must stay under to play everywhere.
inline constexpr uint64_t kAviClassicLimit = uint64_t{1} << 30;

// Writes an MJPEG AVI of width x height frames at fps_num / fps_den frames per second.
// The video is written to a temporary beside `path` (base/output_file.h), starting with a
// header of zero frames; add_frame() appends each JPEG straight to it (only 16 bytes of index a
// frame stay in memory); finish() writes the idx1 index, patches the frame counts and RIFF/LIST
// sizes and renames the finished file over `path`.
//
// Errors throw cubevec::Error naming the file. A frame rejected before anything is written
// (wrong size, not a JPEG, the size limit) leaves the writer usable. An I/O error leaves it
// broken: later calls throw. A writer destroyed without finish() (an error or Ctrl-C mid-run)
// removes its temporary: whatever was at `path` before stays as it was.
class MjpegAviWriter {
 public:
  // `max_file_bytes` bounds the whole file (index included); a frame that would pass it is
  // rejected with an error. The default is the classic 1 GiB limit.
  MjpegAviWriter(const std::string& path, int width, int height, int fps_num, int fps_den = 1, uint64_t max_file_bytes = kAviClassicLimit);
  // The same video built in `memory` (a server's response) instead of a file; `what` names it in
  // errors. `memory` must outlive the writer and holds the whole file after finish().
  MjpegAviWriter(std::vector<uint8_t>& memory, const std::string& what, int width, int height, int fps_num, int fps_den = 1,
                 uint64_t max_file_bytes = kAviClassicLimit);
  ~MjpegAviWriter();
  MjpegAviWriter(const MjpegAviWriter&) = delete;
  MjpegAviWriter& operator=(const MjpegAviWriter&) = delete;

  // Appends one frame: complete JPEG bytes (SOI to EOI) whose header says width x height.
  void add_frame(const std::vector<uint8_t>& jpeg);
  // Encodes `image` (width x height) with encode_jpeg and appends it. Quality below 90 gives
  // 4:2:0 chroma, which every MJPEG decoder supports.
  void add_frame(const RgbImage& image, int quality = 85);
  // Writes the index, patches the header and moves the file into place. A second call does nothing.
  void finish();

  int frame_count() const { return static_cast<int>(index_.size()); }
  const std::string& path() const { return path_; }

 private:
  struct IndexEntry {
    uint32_t offset, size;
  };
  MjpegAviWriter(const std::string& path, std::vector<uint8_t>* memory, int width, int height, int fps_num, int fps_den,
                 uint64_t max_file_bytes);
  std::vector<uint8_t> header(uint64_t movi_end, uint64_t file_end) const;
  void check_open(const char* action) const;
  void append(const uint8_t* data, std::size_t size);  // at the end, which grows

  std::string path_;
  int width_, height_, fps_num_, fps_den_;
  uint64_t max_file_bytes_;
  std::vector<uint8_t>* memory_ = nullptr;  // the in-memory target, else file_
  std::unique_ptr<OutputFile> file_;
  uint64_t end_ = 0;  // the file's current length
  uint32_t max_chunk_ = 0;
  std::vector<IndexEntry> index_;
  bool finished_ = false, broken_ = false;
};

struct AviFrame {
  uint64_t offset = 0;  // of the JPEG bytes in the file (after the chunk header)
  uint32_t size = 0;
};

struct AviInfo {
  int width = 0, height = 0;
  uint32_t rate = 0, scale = 0;  // frames per second = rate / scale
  double fps = 0;
  int frame_count = 0;
  std::vector<AviFrame> frames;  // in index order
};

// Parses and validates an MJPEG AVI: the RIFF structure and every chunk's bounds, the video
// stream's header (type 'vids', compression 'MJPG'), the idx1 index (each entry points at a
// '00dc'/'00db' chunk of the same size inside 'movi'; offsets relative to the 'movi' fourcc),
// and that avih, strh, idx1 and 'movi' agree on the number of frames. Throws cubevec::Error
// naming the file and what is wrong.
AviInfo read_avi_info(const std::string& path);
// The JPEG bytes of one frame from read_avi_info.
std::vector<uint8_t> read_avi_frame(const std::string& path, const AviFrame& frame);

}  // namespace cubevec::media
