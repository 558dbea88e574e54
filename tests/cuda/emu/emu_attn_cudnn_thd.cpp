// The CUDA source, compiled as C++ for the SIMT emulator (emulate.h is force-included).
#include "attn_cudnn_thd.cu"
