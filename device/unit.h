// The units of the emulated Ascend device: two compute units and the communication unit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cubevec {

// Cube: matrix work (GEMM, convolution, attention's matmuls). Vector: elementwise and reductions.
// Comm: collectives and point-to-point transfers between devices (one thread, the only one that
// calls MPI), so communication overlaps compute like another unit of the card.
enum class Unit : uint8_t { cube, vector, comm };

inline constexpr Unit kAllUnits[] = {Unit::cube, Unit::vector, Unit::comm};
inline constexpr std::size_t kUnitCount = 3;

inline std::string_view unit_name(Unit unit) {
  switch (unit) {
    case Unit::cube: return "cube";
    case Unit::vector: return "vector";
    case Unit::comm: return "comm";
  }
  return "?";
}

}  // namespace cubevec
