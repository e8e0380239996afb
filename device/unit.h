// The two compute units of the emulated Ascend device.
#pragma once

#include <cstdint>
#include <string_view>

namespace cubevec {

// Cube: matrix work (GEMM, convolution, attention's matmuls). Vector: elementwise and reductions.
enum class Unit : uint8_t { cube, vector };

inline constexpr Unit kAllUnits[] = {Unit::cube, Unit::vector};

inline std::string_view unit_name(Unit unit) { return unit == Unit::cube ? "cube" : "vector"; }

}  // namespace cubevec
