#!/usr/bin/env python3
"""Data parallelism over MPI: `mpirun -np 2 hmla train` equals one rank with the same global batch
(each step's micro-batches dealt to the ranks; rows carry different amounts of padding), rank 0
alone writes, and a failing rank ends the whole job with its message instead of hanging. Context
parallelism (and CP x DP grids) is tests/reference/mpi_cp.py's."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, parse_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    def write(path, micro):
        with open(path, "w") as f:
            f.write(f"""model: {HERE}/../train/tiny_model.json
data: {HERE}/../../data/demo
seed: 4
base: {{batch: 8, micro_batches: {micro}, seq_len: 48, lr: 3.0e-3, log_every: 1, eval_rows: 2}}
phases:
  - {{name: pre, mode: mha, steps: 3}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")

    prog, prog2 = f"{w}/p.yaml", f"{w}/p2.yaml"
    write(prog, 4)
    write(prog2, 2)
    one = subprocess.run([a.hmla, "train", prog, "--out", f"{w}/one"], capture_output=True, text=True, timeout=300)
    # The same rows as 2 micro-batches instead of 4: only the grouping of the gradient sums differs.
    regroup = subprocess.run([a.hmla, "train", prog2, "--out", f"{w}/regroup"], capture_output=True, text=True,
                             timeout=300)
    two = subprocess.run(MPIRUN + [a.hmla, "train", prog, "--out", f"{w}/two"], capture_output=True, text=True,
                         timeout=300)
    check("single rank", one.returncode == 0, one.stderr[-300:])
    check("two ranks", two.returncode == 0, two.stderr[-300:])
    if one.returncode == 0 and two.returncode == 0 and regroup.returncode == 0:
        w1, w2, wr = (st.load(f"{w}/{d}/model.safetensors") for d in ("one", "two", "regroup"))

        def rel(x, y):
            return max(float(np.abs(x[n] - y[n]).max() / max(np.abs(x[n]).max(), 1e-30)) for n in x)

        # The rule: DP may differ from one rank by at most twice what regrouping the same sums does.
        dp_diff, regroup_diff = rel(w1, w2), rel(w1, wr)
        check("DP = 2 equals one rank", set(w1) == set(w2) and dp_diff <= 2 * regroup_diff + 1e-6,
              f"(max relative difference {dp_diff:.2e}; regrouping the micro-batches alone: {regroup_diff:.2e})")
        lines1 = open(f"{w}/one/metrics.jsonl").read().count("\n")
        lines2 = open(f"{w}/two/metrics.jsonl").read().count("\n")
        check("rank 0 alone writes", lines1 == lines2 and two.stdout.count("[pre] step 3/3") == 1,
              f"({lines1} vs {lines2} metric lines)")
    bad = subprocess.run(MPIRUN + ["-x", "HMLA_TEST_FAIL_RANK=1", a.hmla, "train", prog, "--out", f"{w}/bad"],
                         capture_output=True, text=True, timeout=120)
    check("a failing rank ends the job", bad.returncode != 0 and "injected failure on rank 1" in bad.stderr,
          f"exit {bad.returncode}")
    check.exit()


if __name__ == "__main__":
    main()
