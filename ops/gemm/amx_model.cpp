// The AMX tile model (amx_model.h): the instructions' semantics from Intel's SDM, written as plain
// loops over a per-thread register file. Compiled at the x86-64 baseline (it includes the standard
// library); the AVX-512 kernels built against it call in here.
#include "ops/gemm/amx_model.h"

#include <bit>
#include <cstring>
#include <string>

#include "base/error.h"

namespace cubevec::ops::gemm::amx_model {
namespace {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

struct TileFile {
  bool configured = false;
  int rows[kTiles] = {};
  int colsb[kTiles] = {};
  alignas(64) unsigned char data[kTiles][kMaxRows][kMaxColsb] = {};
};

// Each thread has its own tiles, as each core has its own registers.
thread_local TileFile tiles;

[[noreturn]] void fault(const std::string& what) { throw Error("AMX model: " + what); }

void check_tile(int t, const char* instruction) {
  if (!tiles.configured) fault(std::string(instruction) + " before the tile configuration was loaded (the CPU raises #UD)");
  if (t < 0 || t >= kTiles) fault(std::string(instruction) + ": tile " + std::to_string(t) + " does not exist (expected 0 to 7)");
}

// The three tiles of a dot product: distinct, shapes that agree (C m x n, A m x k, B k/4 x n), as
// the CPU checks before it runs one.
void check_product(int c, int a, int b, const char* instruction) {
  check_tile(c, instruction), check_tile(a, instruction), check_tile(b, instruction);
  if (c == a || c == b || a == b) fault(std::string(instruction) + ": its three tiles must be different registers");
  const auto shape = [](int t) { return std::to_string(tiles.rows[t]) + " x " + std::to_string(tiles.colsb[t]) + " bytes"; };
  if (tiles.colsb[a] % 4 != 0 || tiles.colsb[c] % 4 != 0 || tiles.colsb[a] / 4 != tiles.rows[b] || tiles.colsb[c] != tiles.colsb[b] ||
      tiles.rows[c] != tiles.rows[a])
    fault(std::string(instruction) + ": tile shapes do not agree (C " + shape(c) + ", A " + shape(a) + ", B " + shape(b) + ")");
}

// A row written by an instruction: the bytes past colsb are zeroed, as the hardware does.
void finish_rows(int t) {
  for (int r = 0; r < kMaxRows; ++r) {
    const int from = r < tiles.rows[t] ? tiles.colsb[t] : 0;
    std::memset(&tiles.data[t][r][from], 0, static_cast<std::size_t>(kMaxColsb - from));
  }
}

// bf16 to f32 treating denormal inputs as zero (DAZ).
float bf16_daz(uint16_t x) {
  if ((x & 0x7F80u) == 0) x &= 0x8000u;
  return std::bit_cast<float>(static_cast<uint32_t>(x) << 16);
}
// f32 results flushed to zero when denormal (FTZ).
float ftz(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return (bits & 0x7F800000u) == 0 ? std::bit_cast<float>(bits & 0x80000000u) : x;
}

template <class T>
T element(int t, int row, int index) {
  T v;
  std::memcpy(&v, &tiles.data[t][row][index * static_cast<int>(sizeof(T))], sizeof(T));
  return v;
}
template <class T>
void set_element(int t, int row, int index, T v) {
  std::memcpy(&tiles.data[t][row][index * static_cast<int>(sizeof(T))], &v, sizeof(T));
}

// s32 sums of byte quads, wrapping at 32 bits (done in unsigned arithmetic: no overflow in C++).
template <class AByte, class BByte>
void dp_bytes(int c, int a, int b, const char* instruction) {
  check_product(c, a, b, instruction);
  for (int m = 0; m < tiles.rows[c]; ++m)
    for (int n = 0; n < tiles.colsb[c] / 4; ++n) {
      uint32_t sum = static_cast<uint32_t>(element<int32_t>(c, m, n));
      for (int k = 0; k < tiles.colsb[a] / 4; ++k) {
        int32_t quad = 0;
        for (int i = 0; i < 4; ++i)
          quad += static_cast<int32_t>(element<AByte>(a, m, 4 * k + i)) * static_cast<int32_t>(element<BByte>(b, k, 4 * n + i));
        sum += static_cast<uint32_t>(quad);
      }
      set_element<int32_t>(c, m, n, static_cast<int32_t>(sum));
    }
  finish_rows(c);
}

}  // namespace

void load_config(const void* config) {
  unsigned char bytes[64];
  std::memcpy(bytes, config, sizeof bytes);
  const int palette = bytes[0];
  if (palette == 0) {  // releases the tiles
    tiles = TileFile{};
    return;
  }
  if (palette != 1) fault("tile configuration with palette " + std::to_string(palette) + " (expected 0 or 1; the CPU raises #GP)");
  if (bytes[1] != 0) fault("tile configuration with start_row " + std::to_string(bytes[1]) + " (expected 0)");
  for (int i = 2; i < 16; ++i)
    if (bytes[i] != 0) fault("tile configuration with a nonzero reserved byte " + std::to_string(i));
  TileFile next;
  for (int t = 0; t < kTiles; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, bytes + 16 + 2 * t, 2);
    const int rows = bytes[48 + t];
    if (rows > kMaxRows || colsb > kMaxColsb || (rows == 0) != (colsb == 0))
      fault("tile " + std::to_string(t) + " configured as " + std::to_string(rows) + " rows of " + std::to_string(colsb) +
            " bytes (palette 1 allows up to 16 rows of up to 64 bytes, both or neither zero)");
    next.rows[t] = rows;
    next.colsb[t] = colsb;
  }
  for (int i = 16 + 2 * kTiles; i < 48; ++i)
    if (bytes[i] != 0) fault("tile configuration with a nonzero byte " + std::to_string(i) + " (tiles 8 to 15 do not exist)");
  for (int i = 48 + kTiles; i < 64; ++i)
    if (bytes[i] != 0) fault("tile configuration with a nonzero byte " + std::to_string(i) + " (tiles 8 to 15 do not exist)");
  next.configured = true;
  tiles = next;
}

void zero(int t) {
  check_tile(t, "tilezero");
  std::memset(tiles.data[t], 0, sizeof tiles.data[t]);
}

void load(int t, const void* base, int64_t stride) {
  check_tile(t, "tileloadd");
  for (int r = 0; r < tiles.rows[t]; ++r)
    std::memcpy(tiles.data[t][r], static_cast<const unsigned char*>(base) + r * stride, static_cast<std::size_t>(tiles.colsb[t]));
  finish_rows(t);
}

void store(int t, void* base, int64_t stride) {
  check_tile(t, "tilestored");
  for (int r = 0; r < tiles.rows[t]; ++r)
    std::memcpy(static_cast<unsigned char*>(base) + r * stride, tiles.data[t][r], static_cast<std::size_t>(tiles.colsb[t]));
}

void dp_bf16ps(int c, int a, int b) {
  // The SDM's order: per C element, an even and an odd f32 sum over the k pairs (each an FMA whose
  // product of two bf16 is exact, rounded to nearest even, denormals flushed), then their sum added to C.
  check_product(c, a, b, "tdpbf16ps");
  for (int m = 0; m < tiles.rows[c]; ++m)
    for (int n = 0; n < tiles.colsb[c] / 4; ++n) {
      float even = 0, odd = 0;
      for (int k = 0; k < tiles.colsb[a] / 4; ++k) {
        even = ftz(even + bf16_daz(element<uint16_t>(a, m, 2 * k)) * bf16_daz(element<uint16_t>(b, k, 2 * n)));
        odd = ftz(odd + bf16_daz(element<uint16_t>(a, m, 2 * k + 1)) * bf16_daz(element<uint16_t>(b, k, 2 * n + 1)));
      }
      set_element<float>(c, m, n, ftz(element<float>(c, m, n) + ftz(even + odd)));
    }
  finish_rows(c);
}

void dp_busd(int c, int a, int b) { dp_bytes<uint8_t, int8_t>(c, a, b, "tdpbusd"); }
void dp_bssd(int c, int a, int b) { dp_bytes<int8_t, int8_t>(c, a, b, "tdpbssd"); }

}  // namespace cubevec::ops::gemm::amx_model
