#!/usr/bin/env python3
"""Writes tests/hf/fixtures/config_v4.json: deepseek_v4 config.json inputs and what transformers
5.24's DeepseekV4Config makes of them (the per-layer kinds and MLP types, the compress rates, the
rotated width, and each RoPE's inverse frequencies and attention scaling as
DeepseekV4RotaryEmbedding computes them) and the config.json transformers writes for it, for tests/model/test_config_v4.cpp. Inputs cover the
defaults (DeepSeek-V4-Flash's geometry), the legacy names (compress_ratios with the MTP layer's
entry, num_hash_layers, qk_rope_head_dim, compress_rate_csa/_hca, a flat rope_scaling with YaRN),
the modern ones (layer_types, mlp_layer_types, compress_rates, partial_rotary_factor) and a nested
main/compress rope_parameters with YaRN on compress and no attention_factor (then YaRN's own
mscale applies).

Needs a virtual environment outside the tree (not part of the default suite):
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers==5.24.0
    /tmp/hfvenv/bin/python tests/hf/make_v4_config_fixtures.py
"""
import json
import os

import transformers
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

PINNED = "5.24.0"
HERE = os.path.dirname(os.path.abspath(__file__))

YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}
CASES = {
    "defaults": {},
    "legacy": dict(num_hidden_layers=5, compress_ratios=[0, 4, 128, 4, 0, 4], num_hash_layers=2, qk_rope_head_dim=64,
                   rope_scaling=YARN, compress_rope_theta=40000.0),
    "legacy_rates": dict(num_hidden_layers=4, head_dim=32, qk_rope_head_dim=8, compress_rate_csa=8, compress_rate_hca=16,
                         rope_parameters={"rope_type": "default"}, max_position_embeddings=4096),
    "modern": dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, head_dim=32, o_groups=2, partial_rotary_factor=0.5,
                   layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                                "compressed_sparse_attention"],
                   mlp_layer_types=["hash_moe", "moe", "moe", "hash_moe"],
                   compress_rates={"compressed_sparse_attention": 8, "heavily_compressed_attention": 16}, max_position_embeddings=2048,
                   scoring_func="sigmoid", swiglu_limit=7.0, hc_mult=2, rope_theta=5000.0,
                   rope_parameters={"main": {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
                                    "compress": {"rope_type": "yarn", "rope_theta": 80000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 512, "beta_fast": 16,
                                                 "beta_slow": 2, "partial_rotary_factor": 0.5}}),
}


def main():
    assert transformers.__version__ == PINNED, f"transformers {transformers.__version__}, pinned {PINNED}"
    out = {}
    for name, kw in CASES.items():
        c = DeepseekV4Config(**kw)
        rot = DeepseekV4RotaryEmbedding(c)
        inp = dict(kw, model_type="deepseek_v4")
        out[name] = {
            "config": inp,
            "written": json.loads(c.to_json_string(use_diff=False)),
            "layer_types": list(c.layer_types),
            "mlp_layer_types": list(c.mlp_layer_types),
            "compress_rates": dict(c.compress_rates),
            "qk_rope_head_dim": c.qk_rope_head_dim,
            "rope": {k: {"inv_freq": [float(x) for x in getattr(rot, f"{k}_inv_freq")],
                         "attention_scaling": float(getattr(rot, f"{k}_attention_scaling"))} for k in ("main", "compress")},
        }
    path = os.path.join(HERE, "fixtures", "config_v4.json")
    with open(path, "w") as f:
        json.dump({"transformers": PINNED, "cases": out}, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
