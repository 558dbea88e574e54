#!/usr/bin/env python3
"""Context parallelism over MPI (DESIGN.md section 8).

Layer: `mpirun -np 2 hmla layer --cp 2` against one rank, in every mode (with a sink, the split
kv_b_proj form, train_indexer_only), on layouts with a document straddling the rank boundary,
tail padding all on the last rank, a last rank holding only padding, and b = 2. Both runs are held
to the STYLE.md rule against the float64 PyTorch twin (tests/python/mla_twin.py: twice the f32
twin's error plus 8 ulps); the selection table must be identical, and the bytes each rank reports
sending must equal the model's count (mla_cp_traffic).

Train: `mpirun -np 2 hmla train --cp 2` and `mpirun -np 4 ... --cp 2` (a 2 x 2 grid with data
parallelism) against one rank through all four phases: per-step losses and gradient norms, each
phase's gradient moments and the final weights (harness.compare_training states each bound); rank 0 alone
writes; --cp not dividing the ranks or the sequence is a clear error."""
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from attn_twin import check_by_rule, layout_doc_start  # noqa: E402
from harness import Checker, compare_training, parse_args  # noqa: E402
from mla_twin import base_config, make_weights, reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def mpirun(n):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)]


LAYER_CASES = [
    # name, mode, sink, split, b, cu_seqlens (b = 1), train_indexer_only
    ("mha_straddle_tailpad", "mha", False, False, 1, [0, 17, 18, 33], False),
    ("mha_b2_sink", "mha", True, False, 2, None, False),
    ("mqa_rank1_all_padding", "mqa_full_causal", False, False, 1, [0, 12, 20], False),
    ("mqa_sink_split", "mqa_full_causal", True, True, 1, [0, 1, 25, 36], False),
    ("warmup_straddle", "dsa_warmup", False, False, 1, [0, 17, 18, 33], False),
    ("warmup_sink_indexer_only", "dsa_warmup", True, False, 1, [0, 1, 25, 36], True),
    ("sparse_straddle", "dsa_sparse", False, False, 1, [0, 17, 18, 33], False),
    ("sparse_b2_sink_split", "dsa_sparse", True, True, 2, None, False),
    ("sparse_rank1_all_padding", "dsa_sparse", False, False, 1, [0, 12, 20], False),
]


def layer_case(case, a, check, rng):
    name, mode, sink, split, b, cu, indexer_only = case
    cfg = base_config(True, mode != "mha", sink, indexer=mode.startswith("dsa"))
    s = 40
    weights = make_weights(cfg, rng)
    inp = {"hidden_states": rng.standard_normal((b, s, cfg["hidden_size"])).astype(np.float32),
           "grad_output": rng.standard_normal((b, s, cfg["hidden_size"])).astype(np.float32),
           "input_ids": rng.integers(0, 6, (b, s)).astype(np.int64)}  # some pad tokens (id 0)
    if cu is not None:
        inp["cu_seqlens"] = np.array(cu, dtype=np.int32)
    p = {k: os.path.join(a.workdir, f"{name}.{k}") for k in ("config.json", "w.st", "in.st", "one.st", "two.st",
                                                               "settings.yaml")}
    with open(p["config.json"], "w") as f:
        json.dump(cfg, f)
    st.save(p["w.st"], weights)
    st.save(p["in.st"], inp)
    cmd = [a.hmla, "layer", "--config", p["config.json"], "--mode", mode, "--weights", p["w.st"], "--inputs", p["in.st"]]
    if split:
        with open(p["settings.yaml"], "w") as f:
            f.write("mqa_split_kv_b_proj: true\n")
        cmd += ["--settings", p["settings.yaml"]]
    if indexer_only:
        cmd += ["--train-indexer-only"]
    one = subprocess.run(cmd + ["--out", p["one.st"]], capture_output=True, text=True, timeout=120)
    two = subprocess.run(mpirun(2) + cmd + ["--out", p["two.st"], "--cp", "2"], capture_output=True, text=True,
                         timeout=120)
    check(f"{name}: one rank runs", one.returncode == 0, one.stderr[-300:])
    check(f"{name}: --cp 2 runs", two.returncode == 0, two.stderr[-300:])
    if one.returncode or two.returncode:
        return
    g1, g2 = st.load(p["one.st"]), st.load(p["two.st"])
    stats = json.loads(two.stdout.strip().splitlines()[-1])
    check(f"{name}: bytes sent = the model's count", stats["bytes_sent_per_rank"] == [stats["model_bytes"]] * 2,
          f"({stats['bytes_sent_per_rank']} vs {stats['model_bytes']})")
    table = g1.get("topk_indices")
    if table is not None:
        check(f"{name}: the same selection table", np.array_equal(g1.pop("topk_indices"), g2.pop("topk_indices")))
    diff = max(float(np.abs(g1[k] - g2[k]).max() / max(np.abs(g1[k]).max(), 1e-30)) for k in g1)
    print(f"     {name}: max relative |cp2 - cp1| over {len(g1)} tensors {diff:.2e}")
    doc_start = layout_doc_start(b, s, cu, None)
    ref64 = reference(cfg, weights, inp, doc_start, mode, torch.float64, indexer_only, table)
    ref32 = reference(cfg, weights, inp, doc_start, mode, torch.float32, indexer_only, table)
    for r in (ref64, ref32):
        r.pop("I", None)
    check(f"{name}: one rank within the rule", check_by_rule(name + "/cp1", g1, ref64, ref32))
    check(f"{name}: --cp 2 within the rule", check_by_rule(name + "/cp2", g2, ref64, ref32))


def programme(path, micro, seq_len=48):
    with open(path, "w") as f:
        f.write(f"""model: {HERE}/../train/tiny_model.json
data: {HERE}/../../data/demo
seed: 5
base: {{batch: 4, micro_batches: {micro}, seq_len: {seq_len}, lr: 1.0, indexer_lr: 1.0, eps: 1.0, log_every: 1,
        eval_rows: 2}}
phases:
  - {{name: pre, mode: mha, steps: 2}}
  - {{name: mqa, mode: mqa_full_causal, steps: 1}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")


def train_cases(a, check):
    w = a.workdir
    prog = f"{w}/p.yaml"
    programme(prog, 2)
    runs = {"one": [a.hmla, "train", prog, "--out", f"{w}/t_one"],
            "cp2": mpirun(2) + [a.hmla, "train", prog, "--out", f"{w}/t_cp2", "--cp", "2"],
            "cp2dp2": mpirun(4) + [a.hmla, "train", prog, "--out", f"{w}/t_cp2dp2", "--cp", "2"]}
    res = {k: subprocess.run(c, capture_output=True, text=True, timeout=300) for k, c in runs.items()}
    for k, r in res.items():
        check(f"train {k} runs", r.returncode == 0, r.stderr[-400:])
    if any(r.returncode for r in res.values()):
        return
    for k in ("cp2", "cp2dp2"):
        compare_training(check, f"train {k}", f"{w}/t_one", f"{w}/t_{k}", rows=4 * 48, lr_over_eps=1.0, steps=7,
                         seq_len=48)
        check(f"train {k}: rank 0 alone writes", res[k].stdout.count("[pre] step 2/2") == 1)

    bad = subprocess.run(mpirun(2) + [a.hmla, "train", prog, "--out", f"{w}/t_bad", "--cp", "3"],
                         capture_output=True, text=True, timeout=120)
    check("--cp 3 on 2 ranks is a clear error", bad.returncode != 0 and "--cp 3" in bad.stderr, bad.stderr[-200:])
    programme(f"{w}/p_odd.yaml", 2, seq_len=47)
    odd = subprocess.run(mpirun(2) + [a.hmla, "train", f"{w}/p_odd.yaml", "--out", f"{w}/t_odd", "--cp", "2"],
                         capture_output=True, text=True, timeout=120)
    check("--cp 2 with seq_len 47 is a clear error", odd.returncode != 0 and "must divide" in odd.stderr,
          odd.stderr[-200:])


def main():
    a = parse_args(__doc__)
    check = Checker()
    rng = np.random.default_rng(11)
    for c in LAYER_CASES:
        layer_case(c, a, check, rng)
    train_cases(a, check)
    check.exit()


if __name__ == "__main__":
    main()
