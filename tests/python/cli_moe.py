#!/usr/bin/env python3
"""The shipped MoE programme (configs/demo_moe.yaml on configs/demo_moe_model.json) through
`hmla train`, with its phases shortened: all four phases run on the MoE model, the MoE layers
train in pretraining and sparse training and are frozen in dsa_warmup (experts, gate and
correction bias bit-identical across the warmup while the indexers move; elsewhere the bias moves by
the load, docs/moe.md), the metrics log each MoE layer's load imbalance and balance loss, the final checkpoint is
written in transformers' per-expert layout with the config's MLP layout, and `hmla forward` reads
it back."""
import json
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, parse_args  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SHORT = {"steps": 6, "log_every": 2, "eval_rows": 4, "batch": 4, "checkpoint_every": 0, "warmup_steps": 2}


def shortened(text):
    """The shipped programme with small step counts and absolute paths (the model beside it)."""
    for key, value in SHORT.items():
        text = re.sub(rf"^(\s*{key}:) [1-9].*$", rf"\1 {value}", text, flags=re.M)  # 0 stays 0
    text = text.replace("model: demo_moe_model.json", f"model: {ROOT}/configs/demo_moe_model.json")
    return text.replace("data: ../data/demo", f"data: {ROOT}/data/demo")


def main():
    a = parse_args(__doc__)
    check = Checker()
    w = a.workdir
    with open(f"{ROOT}/configs/demo_moe.yaml") as f:
        prog = shortened(f.read())
    with open(f"{w}/moe.yaml", "w") as f:
        f.write(prog)
    r = subprocess.run([a.hmla, "train", f"{w}/moe.yaml", "--out", f"{w}/run"], capture_output=True, text=True)
    check("the MoE programme runs", r.returncode == 0, r.stderr.strip()[-400:])
    if r.returncode != 0:
        check.exit()
    rows = [json.loads(x) for x in open(f"{w}/run/metrics.jsonl")]
    steps = [x for x in rows if "lm_loss" in x and "grad_norm_backbone" in x]  # the step rows
    check("pretrain, warmup and sparse steps are logged",
          {x["phase"] for x in steps} == {"pretrain", "warmup", "sparse"}, str({x["phase"] for x in steps}))
    check("every logged loss is finite", all(math.isfinite(x["lm_loss"]) for x in steps))
    # Load balancing is on by default (docs/moe.md): every step logs each MoE layer's imbalance
    # (max / mean load >= 1), and the balance loss wherever it runs (not in dsa_warmup).
    check("every step logs the MoE layers' load imbalance",
          all(x.get("moe_layers") == [1, 2] and len(x["moe_imbalance"]) == 2
              and all(v >= 1 for v in x["moe_imbalance"]) for x in steps))
    check("the balance loss is logged outside dsa_warmup only",
          all(("moe_aux_loss" in x) == (x["phase"] != "warmup") for x in steps)
          and all(v > 0 for x in steps for v in x.get("moe_aux_loss", [])))
    ck = f"{w}/run/checkpoints"
    eq, warm, sparse = (st.load(f"{ck}/{n}/model.safetensors") for n in ("1-equivalence-end", "2-warmup-end",
                                                                          "3-sparse-end"))
    moe = [n for n in warm if ".mlp.gate." in n or ".mlp.experts." in n or ".mlp.shared_experts." in n]
    check("the checkpoint has the MoE layers' per-expert tensors",
          "model.layers.1.mlp.experts.7.down_proj.weight" in warm and "model.layers.1.mlp.gate.weight" in warm
          and "model.layers.0.mlp.gate_proj.weight" in warm and "model.layers.1.mlp.gate_proj.weight" not in warm)
    check("dsa_warmup leaves every MoE tensor bit-identical",
          all(n in eq and eq[n].tobytes() == warm[n].tobytes() for n in moe), f"({len(moe)} tensors)")
    pre = st.load(f"{ck}/0-pretrain-end/model.safetensors")
    biases = [n for n in moe if n.endswith("e_score_correction_bias")]
    check("the correction biases move in pretraining (from 0) and in sparse training",
          len(biases) == 2 and all(pre[n].any() for n in biases)
          and all(warm[n].tobytes() != sparse[n].tobytes() for n in biases))
    check("dsa_warmup trains the indexers",
          any(n not in eq or eq[n].tobytes() != warm[n].tobytes() for n in warm if ".indexer." in n))
    check("dsa_sparse trains the experts and the gates",
          any(warm[n].tobytes() != sparse[n].tobytes() for n in moe if ".experts." in n)
          and any(warm[n].tobytes() != sparse[n].tobytes() for n in moe if n.endswith("mlp.gate.weight")))
    cfg = json.load(open(f"{w}/run/config.json"))
    check("the written config keeps the MLP layout", cfg.get("mlp_layer_types") == ["dense", "sparse", "sparse"]
          and cfg.get("n_routed_experts") == 8, str(cfg.get("mlp_layer_types")))
    st.save(f"{w}/ids.safetensors", {"input_ids": __import__("numpy").arange(16, dtype="int32").reshape(1, 16)})
    r = subprocess.run([a.hmla, "forward", "--checkpoint", f"{w}/run", "--inputs", f"{w}/ids.safetensors",
                        "--out", f"{w}/logits.safetensors"], capture_output=True, text=True)
    check("hmla forward reads the trained MoE checkpoint", r.returncode == 0, r.stderr.strip()[-300:])
    check.exit()


if __name__ == "__main__":
    main()
