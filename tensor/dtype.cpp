#include "tensor/dtype.h"

#include "base/error.h"

namespace cubevec {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  throw Error("dtype_size: invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  throw Error("dtype_name: invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

DType parse_dtype(std::string_view name) {
  std::string known;
  for (DType d : kAllDTypes) {
    if (dtype_name(d) == name) return d;
    known += (known.empty() ? "" : ", ") + std::string(dtype_name(d));
  }
  throw Error("unknown dtype '" + std::string(name) + "' (expected one of: " + known + ")");
}

bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16; }

}  // namespace cubevec
