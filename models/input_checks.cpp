#include "models/input_checks.h"

#include <algorithm>

#include "base/error.h"

namespace cubevec::models {

void require_input_dtype(const Tensor& t, const std::string& where, const std::string& name, std::initializer_list<DType> allowed) {
  if (!t.defined() || std::find(allowed.begin(), allowed.end(), t.dtype()) != allowed.end()) return;
  std::string list;
  std::size_t i = 0;
  for (DType d : allowed) {
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + std::string(dtype_name(d));
    ++i;
  }
  throw Error(where + ": " + name + " must be " + list + ", got " + std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape()));
}

}  // namespace cubevec::models
