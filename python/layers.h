// MindIE SD's layers (attention, sparse attention, RoPE, norms, activations) for the Python module:
// registers the native functions python/cubevec/layers.py calls after checking the arguments.
#pragma once

#include <pybind11/pybind11.h>

namespace cubevec::python {

void register_layers(pybind11::module_& m);

}  // namespace cubevec::python
