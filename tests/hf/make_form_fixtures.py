"""Fixtures of published checkpoint forms (issue 28), made by torch / transformers 5.24 and committed:

forms/fp8.safetensors:
  codes        F8_E4M3 [256]     every e4m3 code 0..255
  values       F32 [256]         torch's float8_e4m3fn -> float32 of them (NaN for the two NaN codes)
  w            F8_E4M3 [5, 7]    a weight with ragged last blocks in 2 x 3 blocks
  w_scale_inv  F32 [3, 3]        its block scales
  w_deq        F32 [5, 7]        transformers' finegrained_fp8._dequantize_fp8_weight(w, w_scale_inv, [2, 3], f32)

Run: /tmp/hfvenv/bin/python tests/hf/make_form_fixtures.py (from the repository root).
"""
import os

import torch
from safetensors.torch import save_file
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "forms")


def main():
    os.makedirs(OUT, exist_ok=True)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    g = torch.Generator().manual_seed(28)
    w = torch.randint(0, 256, (5, 7), generator=g, dtype=torch.uint8)
    w[(w & 0x7F) == 0x7F] ^= 1  # no NaN codes in a weight
    w = w.view(torch.float8_e4m3fn)
    scale = torch.rand(3, 3, generator=g, dtype=torch.float32) * 0.01 + 1e-3
    deq = _dequantize_fp8_weight(w.clone(), scale, [2, 3], torch.float32)
    save_file(
        {"codes": codes, "values": codes.to(torch.float32), "w": w, "w_scale_inv": scale, "w_deq": deq.contiguous()},
        os.path.join(OUT, "fp8.safetensors"),
    )


if __name__ == "__main__":
    main()
