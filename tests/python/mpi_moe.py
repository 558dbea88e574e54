#!/usr/bin/env python3
"""MoE models over MPI: `mpirun -np 2 hmla train` (DP = 2), `--cp 2`, a 2 x 2 CP x DP grid and
expert parallelism (`--ep 2` over DP = 4, `--ep 4`, `--cp 2 --ep 2`) against one rank, through all four phases on configs/demo_moe_model.json (a dense layer, then MoE
layers with group-limited routing and a shared expert): per-step losses and gradient norms, each
phase's gradient moments and the final weights (the correction biases included), by
harness.compare_training's bounds; rank 0 alone writes. Load balancing runs as by default (the
bias update and the balance loss): the imbalance and the biases equal one rank's exactly, the
balance loss by the LM loss's rule (balancing below).

Why the start is a prepared checkpoint: the runs differ by f32 reassociation of the gradient sums,
and an O(1e-7) weight difference would flip a routing decision whose margin is that small,
sending a token to another expert (an O(1) difference that no rounding bound covers; not a bug).
So the gate starts small (router logits ~0.02) and the correction biases 0.1 apart: every
decision is decided by the bias with margins ~0.05, far above what the runs' differences and 7
steps at lr 0.05 can move (the routing itself is tested token by token elsewhere:
tests/python/step_twin.py, tests/model/test_moe.cpp)."""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, compare_training, parse_args  # noqa: E402
from step_twin import weights  # noqa: E402
from train_twin import is_moe_layer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = f"{HERE}/../../configs/demo_moe_model.json"
LR = 0.05


def mpirun(n):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)]


def prepare_routers(w, cfg, rng):
    """Every MoE layer's router made decisive (why: the docstring): a small gate and correction
    biases 0.1 apart, drawn layer by layer from rng."""
    E = cfg["n_routed_experts"]
    for L in range(cfg["num_hidden_layers"]):
        if is_moe_layer(cfg, L):
            pre = f"model.layers.{L}.mlp.gate."
            w[pre + "weight"] = (0.002 * rng.standard_normal((E, cfg["hidden_size"]))).astype(np.float32)
            w[pre + "e_score_correction_bias"] = (0.1 * rng.permutation(E)).astype(np.float32)


def init_checkpoint(path):
    cfg = json.load(open(MODEL))
    rng = np.random.default_rng(28)
    w = weights(cfg, rng)
    prepare_routers(w, cfg, rng)
    st.save(path, w)


def balancing(check, w, k):
    """Load balancing (on by default: docs/moe.md) is a function of the step's global counts,
    which are sums of integers: every grid counts the same tokens' same choices, so each step's
    imbalance is the one rank's exactly and the correction biases move bit for bit as one rank's
    (each rank applies the update from the same all-reduced counts, so the ranks agree too). The
    balance loss is a sum of positive terms over the step's rows: regrouped by the grid, it moves
    by at most rows * eps of its value, the harness's rule for the LM loss."""
    def steps(d):
        return [json.loads(x) for x in open(f"{d}/metrics.jsonl") if '"step"' in x]
    one, other = steps(f"{w}/one"), steps(f"{w}/{k}")
    check(f"MoE train {k}: every step's load imbalance equals one rank's exactly",
          len(one) == len(other) and all(a["moe_imbalance"] == b["moe_imbalance"] for a, b in zip(one, other)))
    tol = 8 * 48 * 2.0 ** -23
    aux = [(a, b) for x, y in zip(one, other) for a, b in zip(x.get("moe_aux_loss", []), y.get("moe_aux_loss", []))]
    check(f"MoE train {k}: the balance loss equals one rank's (rows * eps)",
          aux and all(abs(a - b) <= tol * abs(a) for a, b in aux), f"({len(aux)} values)")
    ck = sorted(p for p in os.listdir(f"{w}/one/checkpoints") if p.endswith("-end"))
    same = True
    for p in ck:
        a, b = st.load(f"{w}/one/checkpoints/{p}/model.safetensors"), st.load(f"{w}/{k}/checkpoints/{p}/model.safetensors")
        same &= all(a[n].tobytes() == b[n].tobytes() for n in a if n.endswith("e_score_correction_bias"))
    moved = any(st.load(f"{w}/one/checkpoints/{ck[0]}/model.safetensors")[n].tobytes()
                != st.load(f"{w}/init.safetensors")[n].tobytes()
                for n in st.load(f"{w}/init.safetensors") if n.endswith("e_score_correction_bias"))
    check(f"MoE train {k}: the correction biases move and equal one rank's bit for bit at every phase end",
          same and moved, f"({len(ck)} checkpoints)")


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    init_checkpoint(f"{w}/init.safetensors")
    with open(f"{w}/p.yaml", "w") as f:
        f.write(f"""model: {MODEL}
data: {HERE}/../../data/demo
seed: 6
init_checkpoint: {w}/init.safetensors
base: {{batch: 8, micro_batches: 4, seq_len: 48, lr: {LR}, indexer_lr: {LR}, eps: 1.0, log_every: 1,
        eval_rows: 2}}
phases:
  - {{name: pre, mode: mha, steps: 2}}
  - {{name: mqa, mode: mqa_full_causal, steps: 1}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")
    prog = f"{w}/p.yaml"
    runs = {"one": [a.hmla, "train", prog, "--out", f"{w}/one"],
            "one_z": [a.hmla, "train", prog, "--out", f"{w}/one_z", "--shard-optimizer"],
            "dp2": mpirun(2) + [a.hmla, "train", prog, "--out", f"{w}/dp2"],
            "cp2": mpirun(2) + [a.hmla, "train", prog, "--out", f"{w}/cp2", "--cp", "2"],
            "cp2dp2": mpirun(4) + [a.hmla, "train", prog, "--out", f"{w}/cp2dp2", "--cp", "2"],
            "ep2dp4": mpirun(4) + [a.hmla, "train", prog, "--out", f"{w}/ep2dp4", "--ep", "2"],
            "ep4": mpirun(4) + [a.hmla, "train", prog, "--out", f"{w}/ep4", "--ep", "4"],
            "cp2ep2": mpirun(4) + [a.hmla, "train", prog, "--out", f"{w}/cp2ep2", "--cp", "2", "--ep", "2"],
            "ep2zero": mpirun(4) + [a.hmla, "train", prog, "--out", f"{w}/ep2zero", "--ep", "2", "--shard-optimizer"]}
    res = {k: subprocess.run(c, capture_output=True, text=True, timeout=300) for k, c in runs.items()}
    for k, r in res.items():
        check(f"MoE train {k} runs", r.returncode == 0, r.stderr[-400:])
    if any(r.returncode for r in res.values()):
        check.exit()
    for k in ("dp2", "cp2", "cp2dp2", "ep2dp4", "ep4", "cp2ep2", "ep2zero"):
        # Expert-parallel and sharded runs write their moments per rank: against one rank's, sharded
        # over itself (which equals the unsharded run bit for bit: mpi_zero.py).
        ref = "one_z" if "ep" in k else "one"
        compare_training(check, f"MoE train {k}", f"{w}/{ref}", f"{w}/{k}", rows=8 * 48, lr_over_eps=LR, steps=7,
                         seq_len=48)
        check(f"MoE train {k}: rank 0 alone writes", res[k].stdout.count("[pre] step 2/2") == 1)
        balancing(check, w, k)
    for k in ("dp2", "cp2", "cp2dp2", "ep2dp4", "ep4", "cp2ep2", "ep2zero"):  # the exchange ran, only under --ep
        sent = [json.loads(x).get("ep_bytes") for x in open(f"{w}/{k}/metrics.jsonl") if '"step"' in x]
        ep = k.startswith("ep") or "ep" in k[3:]
        check(f"MoE train {k}: " + ("every step sent rows to its EP group" if ep else "no step logs EP bytes"),
              all((b or 0) > 0 for b in sent) if ep else all(b is None for b in sent), str(sent[:3]))
    # --ep must divide the data-parallel replicas (and the experts): one line, nothing trained.
    for n, ep, want in ((4, "3", "--ep 3 does not divide the 4 data-parallel replicas"),
                        (1, "2", "--ep 2 does not divide the 1 data-parallel replicas")):
        r = subprocess.run((mpirun(n) if n > 1 else []) + [a.hmla, "train", prog, "--out", f"{w}/bad{ep}", "--ep", ep],
                           capture_output=True, text=True, timeout=120)
        check(f"MoE train --ep {ep} on {n} ranks is refused in one line", r.returncode != 0 and want in r.stderr
              and not os.path.exists(f"{w}/bad{ep}/metrics.jsonl"), r.stderr[-300:])
    check.exit()


if __name__ == "__main__":
    main()
