// flash_amx_kernels.cpp again, its tile instructions on ops/gemm/amx_model.h's plain C++ tiles: the same kernels
// as amx_model::*, run where CUBEVEC_AMX_MODEL=1 (or a test) asks for them (see ops/gemm/amx_tiles.h).
#define CUBEVEC_AMX_MODEL_BUILD 1
#include "ops/attention/flash_amx_kernels.cpp"
