// FP8 weights with block scales, as DeepSeek-V3.2's release stores them (quantization_config
// {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [br, bc]}): each quantized Linear
// `X.weight` [out, in] is F8_E4M3 next to `X.weight_scale_inv` f32 [ceil(out / br), ceil(in / bc)],
// and the weight is w[i][j] = e4m3(X.weight[i][j]) * X.weight_scale_inv[i / br][j / bc] (the last
// blocks of a row or column ragged), as transformers' finegrained_fp8 dequantizes it.
#pragma once
#include <cstdint>
#include <string>

#include "hmla/io/safetensors.h"

namespace hmla::io {

// The value of an e4m3 code (torch.float8_e4m3fn: 1 sign, 4 exponent bits of bias 7, 3 mantissa
// bits; no infinities; S.1111.111 is NaN, returned as NaN). Exact: every e4m3 value is an f32.
float e4m3_to_f32(uint8_t code);

// Replaces every F8_E4M3 tensor `X.weight` of `fp8` by its dequantized f32 tensor in `tensors`,
// consuming `X.weight_scale_inv` from `tensors`. Everything is checked before anything is
// dequantized: a 2-D weight named *.weight, its scale present, f32, of the shape above and finite,
// no NaN code; `fmt` null (the config has no quantization_config) with FP8 tensors is an error.
// IoError naming the tensor; `what` names the checkpoint.
struct Fp8Blocks {
  int64_t rows = 128, cols = 128;
};
void dequantize_fp8_weights(TensorMap& tensors, StoredMap& fp8, const Fp8Blocks* fmt, const std::string& what);

}  // namespace hmla::io
