// The CUDA source, compiled as C++ for the SIMT emulator (emulate.h is force-included).
#include "sparse_index.cu"
