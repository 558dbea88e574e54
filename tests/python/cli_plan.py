#!/usr/bin/env python3
"""`hmla plan` (docs/scale_out.md, "The plan"): a rank's plan for the tiny V4 stack and a
programme, its verdict against --device-memory, --search's table, and every bad argument a one-line
`hmla: error:` that writes nothing."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, check_refused, parse_args  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "deepseek_v4_tiny.json")
PROGRAMME = os.path.join(ROOT, "configs", "demo_v4.yaml")


def run(hmla, args):
    return subprocess.run([hmla, "plan"] + args, capture_output=True, text=True, timeout=120)


def main():
    a = parse_args(__doc__)
    check = Checker()

    r = run(a.hmla, [TINY, "--ranks", "8", "--ep", "4", "--cp", "2", "--shard-optimizer", "--seq-len", "64",
                     "--device-memory", "1GiB"])
    out = r.stdout
    check("runs", r.returncode == 0 and not r.stderr, r.stderr[-300:])
    check("heading", "plan [deepseek_v4_tiny.json] (seq_len 64, micro-batch 1 row, cuda): 8 ranks = cp 2 x dp 4, ep 4 "
          "(2 routed experts per MoE layer per rank), optimizer sharded over cp x dp (ZeRO-1)" in out, out[:300])
    for row in ("the parameters (f32)", "their gradients (f32)", "the optimizer's moments (f32, 2 per parameter)",
                "the weights' bf16 compute copy", "the EP dispatch and combine buffers (balanced routing",
                "32 rows of each sequence", "total (at least)"):
        check(f"row: {row}", row in out)
    # 32 tokens x k 2 x 3 / 4 = 48 rows leave, 4 exchanges of 128 bf16 values: 49152 B per layer.
    check("all-to-all", "4 exchanges x 48 rows leaving" in out and "(49152 B) per MoE layer per micro-batch" in out
          and "x 4 MoE layers x 1 micro-batch =" in out and "(196608 B) per step" in out, out[-600:])
    check("fits 1 GiB", "device memory 1.074 GB (1.0 GiB): fits, " in out, out[-200:])
    r = run(a.hmla, [TINY, "--device-memory", "1MB"])
    check("does not fit 1 MB", r.returncode == 0 and ": does not fit, " in r.stdout and "all-to-all: none (ep 1)"
          in r.stdout, r.stdout[-300:])

    r = run(a.hmla, [PROGRAMME, "--ranks", "2", "--cp", "2", "--device", "cpu"])
    check("a programme: its phase at its seq_len and rows, f32 on the CPU", r.returncode == 0 and
          r.stdout.count("plan [") == 1 and "plan [pretrain] (mha, seq_len 128, micro-batch 8 rows, cpu): 2 ranks = cp 2"
          in r.stdout and "64 rows of each sequence" in r.stdout and "compute copy" not in r.stdout,
          (r.stderr or r.stdout)[-300:])

    r = run(a.hmla, [TINY, "--search", "--seq-len", "64,128", "--device-memory", "10MiB"])
    lines = r.stdout.splitlines()
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| ranks")]
    check("search: a table per seq_len, ranks 8..1024", r.returncode == 0 and len(rows) == 16 and
          [ln.split(" | ")[0] for ln in rows[:8]] == ["| " + str(8 << i) for i in range(8)], r.stdout[-400:])
    check("search: layouts named", any("ep " in ln and " cp " in ln for ln in rows), r.stdout[-400:])

    for name, args, needle in (
            ("--ranks 0", [TINY, "--ranks", "0"], "--ranks: must be an integer in [1, 1048576], got '0'"),
            ("--ep x", [TINY, "--ep", "x"], "--ep: must be an integer"),
            ("--cp does not divide --ranks", [TINY, "--ranks", "6", "--cp", "4"], "--cp 4 does not divide --ranks 6"),
            ("--cp does not divide seq_len", [TINY, "--ranks", "3", "--cp", "3", "--seq-len", "64"],
             "--cp 3 does not divide seq_len 64"),
            ("--ep does not divide dp", [TINY, "--ranks", "8", "--cp", "4", "--ep", "4"],
             "--ep 4 does not divide the 2 data-parallel ranks"),
            ("--ep does not divide the experts", [TINY, "--ranks", "48", "--ep", "3"],
             "--ep 3 does not divide n_routed_experts = 8"),
            ("--device-memory 12XB", [TINY, "--device-memory", "12XB"], "--device-memory '12XB': use a positive byte"),
            ("--device gpu", [TINY, "--device", "gpu"], "--device"),
            ("--seq-len 1", [TINY, "--seq-len", "1"], "--seq-len: must be an integer"),
            ("--micro-batch with a programme", [PROGRAMME, "--micro-batch", "2"], "--micro-batch is a model config's"),
            ("--search with a layout", [TINY, "--search", "--ep", "2"], "--search tries every layout"),
            ("a config of neither kind", [os.path.join(ROOT, "README.md")], "use a programme (.yaml) or a model config"),
            ("no such file", [os.path.join(a.workdir, "nope.json")], "nope.json"),
    ):
        check_refused(check, f"refused: {name}", [a.hmla, "plan"] + args, needle, a.workdir)
    check.exit()


if __name__ == "__main__":
    main()
