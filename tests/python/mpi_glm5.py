#!/usr/bin/env python3
"""IndexShare under context parallelism: `mpirun -np 2 hmla train --cp 2` against one rank through
the four phases on configs/glm5_tiny.json (glm_moe_dsa: interleaved indexer RoPE, indexer_types
full/shared/shared/full), its MLPs made dense (first_k_dense_replace = num_hidden_layers) so that
no routing decision can flip under reassociation (tests/python/mpi_moe.py covers MoE under CP).
Each rank builds its rows' top-k table in global positions, and a shared layer reuses that row
slice of its source's table, so the runs agree by harness.compare_training's bounds."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, compare_training, parse_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def mpirun(n):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)]


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    cfg = json.load(open(f"{HERE}/../../configs/glm5_tiny.json"))
    cfg["first_k_dense_replace"] = cfg["num_hidden_layers"]
    with open(f"{w}/glm5_dense.json", "w") as f:
        json.dump(cfg, f)
    with open(f"{w}/p.yaml", "w") as f:
        f.write(f"""model: {w}/glm5_dense.json
data: {HERE}/../../data/demo
seed: 5
base: {{batch: 4, micro_batches: 2, seq_len: 64, lr: 1.0, indexer_lr: 1.0, eps: 1.0, log_every: 1,
        eval_rows: 2}}
phases:
  - {{name: pre, mode: mha, steps: 2}}
  - {{name: mqa, mode: mqa_full_causal, steps: 1}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")
    prog = f"{w}/p.yaml"
    runs = {"one": [a.hmla, "train", prog, "--out", f"{w}/one"],
            "cp2": mpirun(2) + [a.hmla, "train", prog, "--out", f"{w}/cp2", "--cp", "2"]}
    res = {k: subprocess.run(c, capture_output=True, text=True, timeout=300) for k, c in runs.items()}
    for k, r in res.items():
        check(f"GLM-5 train {k} runs", r.returncode == 0, r.stderr[-400:])
    if any(r.returncode for r in res.values()):
        check.exit()
    compare_training(check, "GLM-5 train cp2", f"{w}/one", f"{w}/cp2", rows=4 * 64, lr_over_eps=1.0, steps=7,
                     seq_len=64)
    check.exit()


if __name__ == "__main__":
    main()
