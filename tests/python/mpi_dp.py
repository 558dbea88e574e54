#!/usr/bin/env python3
"""Data parallelism over MPI: `mpirun -np 2 hmla train` equals one rank with the same global batch
(each step's micro-batches dealt to the ranks; rows carry different amounts of padding), rank 0
alone writes, and a failing rank ends the whole job with its message instead of hanging (so does
a run directory another process holds: rank 0 alone takes the lock, the others wait for its verdict). Context
parallelism (and CP x DP grids) is tests/python/mpi_cp.py's."""
import fcntl
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, check_refused, compare_training, parse_args  # noqa: E402

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
base: {{batch: 8, micro_batches: {micro}, seq_len: 48, lr: 1.0, indexer_lr: 1.0, eps: 1.0, log_every: 1,
        eval_rows: 2}}
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
    check("regrouped", regroup.returncode == 0, regroup.stderr[-300:])
    if one.returncode == 0 and two.returncode == 0 and regroup.returncode == 0:
        for label, d in (("DP = 2", "two"), ("2 micro-batches instead of 4", "regroup")):
            compare_training(check, label, f"{w}/one", f"{w}/{d}", rows=8 * 48, lr_over_eps=1.0, steps=7,
                             seq_len=48)
        lines1 = open(f"{w}/one/metrics.jsonl").read().count("\n")
        lines2 = open(f"{w}/two/metrics.jsonl").read().count("\n")
        check("rank 0 alone writes", lines1 == lines2 and two.stdout.count("[pre] step 3/3") == 1,
              f"({lines1} vs {lines2} metric lines)")
    bad = subprocess.run(MPIRUN + ["-x", "HMLA_TEST_FAIL_RANK=1", a.hmla, "train", prog, "--out", f"{w}/bad"],
                         capture_output=True, text=True, timeout=120)
    check("a failing rank ends the job", bad.returncode != 0 and "injected failure on rank 1" in bad.stderr,
          f"exit {bad.returncode}")
    os.makedirs(f"{w}/held")
    with open(f"{w}/held/hmla-run.lock", "w") as lock:
        lock.write("pid 4242 on host elsewhere since 2000-01-01T00:00:00Z (hmla train p.yaml)\n")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX)
        check_refused(check, "a held run directory ends the whole job", MPIRUN + [a.hmla, "train", prog, "--out",
                      f"{w}/held"], "in use by pid 4242 on host elsewhere", w, one_line=False)
    check.exit()


if __name__ == "__main__":
    main()
