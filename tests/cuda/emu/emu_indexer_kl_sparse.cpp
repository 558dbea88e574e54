// The CUDA source, compiled as C++ for the SIMT emulator (emulate.h is force-included).
#include "indexer_kl_sparse.cu"
