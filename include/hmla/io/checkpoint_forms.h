// FP8 weights with block scales, as DeepSeek-V3.2's and V4's releases store them
// (quantization_config {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [br, bc]}): each
// quantized Linear `X.weight` [out, in] is F8_E4M3 next to its scales [ceil(out / br), ceil(in / bc)]
// (V3.2: `X.weight_scale_inv` f32; V4: `X.scale` F8_E8M0, 2^(code - 127), with scale_fmt "ue8m0";
// either name, f32 or F8_E8M0 or e8m0 bytes (U8), as transformers' finegrained_fp8 reads them), and
// the weight is w[i][j] = e4m3(X.weight[i][j]) * scale[i / br][j / bc] (the last blocks of a row or
// column ragged). DeepSeek-V4's released experts (expert_dtype "fp4") are packed FP4: `X.weight` I8
// [out, in / 2], two e2m1 codes a byte (element 2j in the low nibble, 2j + 1 in the high one), with
// F8_E8M0 scales [out, in / 32]: the block is what the scale grid divides the weight into.
#pragma once
#include <cstdint>
#include <string>

#include "hmla/io/safetensors.h"

namespace hmla::io {

// The value of an e4m3 code (torch.float8_e4m3fn: 1 sign, 4 exponent bits of bias 7, 3 mantissa
// bits; no infinities; S.1111.111 is NaN, returned as NaN). Exact: every e4m3 value is an f32.
float e4m3_to_f32(uint8_t code);

// The value of an e8m0 code (torch.float8_e8m0fnu: 2^(code - 127); 0xff is NaN). Exact: 2^-127 is
// an f32 subnormal, 2^127 the largest power of two.
float e8m0_to_f32(uint8_t code);
// The value of an e2m1 code (4 bits: 1 sign, 2 exponent bits of bias 1, 1 mantissa bit; no NaN).
float e2m1_to_f32(uint8_t code);

// Replaces every quantized tensor `X.weight` of `fp8` by its dequantized f32 tensor in `tensors`,
// consuming its scales (from `tensors` when f32, from `fp8` when F8_E8M0 or U8). Everything is
// checked before anything is dequantized: a 2-D weight named *.weight, its scales present under one
// name, of the shape above and finite, no NaN code; FP4 weights only with expert_dtype "fp4"; no
// quantized tensor left over (a scale without its weight). `fmt` null (the config has no
// quantization_config) with quantized tensors is an error. IoError naming the tensor; `what` names
// the checkpoint.
struct Fp8Blocks {
  int64_t rows = 128, cols = 128;
  bool fp4 = false;  // expert_dtype "fp4": I8 weights are packed e2m1
};
void dequantize_fp8_weights(TensorMap& tensors, StoredMap& fp8, const Fp8Blocks* fmt, const std::string& what);

}  // namespace hmla::io
