#!/usr/bin/env python3
"""examples/torch_dsa_attention.py (the attention module on hmla.torch's operators) against
`hmla layer` on the same config, weights and inputs, in the four modes: output, the gradient of
the input and of every weight, and the indexer loss, each by the STYLE.md rule against the float64
reference of tests/python/mla_twin.py (the rule `hmla layer` itself passes there); in dsa_sparse
the module's selection table must be hmla layer's. Run with PYTHONPATH=BUILD/python."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import safetensors_lite as st  # noqa: E402
from attn_twin import check_by_rule, layout_doc_start  # noqa: E402
from mla_twin import base_config, make_weights, reference  # noqa: E402
from torch_dsa_attention import MODES, DSAAttention  # noqa: E402

HF_NAME = {"q_a_layernorm": "q_a_layernorm.weight", "kv_a_layernorm": "kv_a_layernorm.weight"}


def run_mode(mode, hmla, workdir, rng):
    cfg = base_config(q_lora=True, yarn=False, sink=mode != "mha", indexer=mode.startswith("dsa"))
    b, s, cu = 1, 40, [0, 17, 18, 33]
    weights = make_weights(cfg, rng)
    inp = {"hidden_states": rng.standard_normal((b, s, cfg["hidden_size"])).astype(np.float32),
           "grad_output": rng.standard_normal((b, s, cfg["hidden_size"])).astype(np.float32),
           "input_ids": rng.integers(0, 6, (b, s)).astype(np.int64),  # some pad tokens (id 0)
           "cu_seqlens": np.array(cu, dtype=np.int32)}
    paths = {k: os.path.join(workdir, f"{mode}.{k}") for k in ("config.json", "w.safetensors", "in.safetensors",
                                                              "out.safetensors")}
    with open(paths["config.json"], "w") as f:
        json.dump(cfg, f)
    st.save(paths["w.safetensors"], weights)
    st.save(paths["in.safetensors"], inp)
    subprocess.run([hmla, "layer", "--config", paths["config.json"], "--mode", mode, "--weights",
                    paths["w.safetensors"], "--inputs", paths["in.safetensors"], "--out", paths["out.safetensors"]],
                   check=True)
    layer = st.load(paths["out.safetensors"])
    table = layer.pop("topk_indices", None)

    m = DSAAttention(cfg, mode)
    m.load_hf(weights)
    x = torch.tensor(inp["hidden_states"], requires_grad=True)
    y, loss = m(x, cu_seqlens=torch.tensor(cu, dtype=torch.int32),
                row_mask=torch.from_numpy(inp["input_ids"] != 0))
    L = (y * torch.tensor(inp["grad_output"])).sum() + (loss if loss is not None else 0)
    L.backward()
    got = {"output": y.detach().double().numpy(), "grad.hidden_states": x.grad.double().numpy()}
    for name, p in m.named_parameters():
        got["grad." + HF_NAME.get(name, name)] = p.grad.double().numpy()
    if loss is not None:
        got["indexer_loss"] = np.array([float(loss)])
    ok = True
    if mode == "dsa_sparse":
        same = np.array_equal(m.last_table.numpy(), table)
        print(f"{'ok  ' if same else 'FAIL'} {mode:20s} the selection table is hmla layer's")
        ok &= same
    doc_start = layout_doc_start(b, s, cu, None)
    ref64 = reference(cfg, weights, inp, doc_start, mode, torch.float64, False, table)
    ref32 = reference(cfg, weights, inp, doc_start, mode, torch.float32, False, table)
    ref64.pop("I", None)
    ref32.pop("I", None)
    layer.pop("I", None)
    ok &= check_by_rule("example " + mode, got, ref64, ref32)
    ok &= check_by_rule("hmla layer " + mode, layer, ref64, ref32)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hmla", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    rng = np.random.default_rng(11)
    ok = all([run_mode(mode, args.hmla, args.workdir, rng) for mode in MODES])
    print("torch example vs hmla layer:", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
