#!/usr/bin/env python3
"""ZeRO-1 over MPI (`hmla train --shard-optimizer`, docs/scale_out.md): the sharded optimizer equals
the unsharded one on the same rank grid, each rank keeps the moments of its own tensors only, and a
checkpoint resumes on another rank count or sharding.

What equality to expect, and why:
- one rank: the plan owns every tensor, the reduce-scatter and all-gather are copies and the sums
  of squares run over the same tensors in the same order: bit-identical metrics and weights.
- two ranks (AdamW and Muon): a two-term sum is commutative, so the reduce-scatter gives each
  owner the very bits the all-reduce gave every rank, and each whole tensor's update (Muon's
  Newton-Schulz included) runs on those bits: losses and weights bit-identical. The gradient norms
  are two partial f64 sums added instead of one running sum: they agree to n 2^-53 relative (n the
  values summed); the f32 clip scale float(clip / norm) could round the other way only when
  clip / norm lies within that of a rounding midpoint (about 1e-9 per clipped step).
- four ranks (AdamW): MPI's reduce-scatter and all-reduce may add the four terms in other orders,
  so the runs agree up to reassociation: harness.compare_training's bounds.
- resume 4 -> 2, 2 -> 4, sharded -> one unsharded rank and back: the trajectory of the
  uninterrupted run, up to the reassociation of the other grid (the same bounds).
- memory: rank 0's peak drops by exactly the moments it no longer keeps, less its gradient block
  and the blocks' padding (the exact-byte allocator); the per-rank files hold disjoint tensors
  whose union is what the phase trains, balanced within the largest tensor.
A missing all-gather breaks the equalities (the other ranks' tensors never move on rank 0); a rank
that kept or updated every tensor breaks the memory and per-rank file checks."""
import glob
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, check_refused, compare_training, parse_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np"]
ROWS, SEQ, STEPS = 8 * 48, 48, 8


def programme(path, optimizer, lr):
    with open(path, "w") as f:
        f.write(f"""model: {HERE}/../train/tiny_model.json
data: {HERE}/../../data/demo
seed: 4
base: {{batch: 8, micro_batches: 4, seq_len: {SEQ}, lr: {lr}, indexer_lr: {lr}, eps: 1.0, log_every: 1,
        eval_rows: 2, checkpoint_every: 2, optimizer: {optimizer}}}
phases:
  - {{name: pre, mode: mha, steps: 4}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    import numpy as np
    import safetensors_lite as st

    def train(ranks, prog, out, *extra):
        cmd = ([] if ranks == 1 else MPIRUN + [str(ranks)]) + [a.hmla, "train", prog, "--out", f"{w}/{out}", *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        check(f"{out}: {ranks} rank(s) {' '.join(extra)}", r.returncode == 0, r.stderr[-400:])
        return r.returncode == 0

    def steps(d):
        return [r for r in map(json.loads, open(f"{w}/{d}/metrics.jsonl")) if "step" in r]

    def identical(label, ref, run):
        """Losses, KL, lr and every weight bit-identical; the norms to n 2^-53 relative."""
        s1, s2 = steps(ref), steps(run)
        exact = len(s1) == len(s2) and all(x.get(k) == y.get(k) for x, y in zip(s1, s2)
                                           for k in ("phase", "step", "lm_loss", "indexer_kl", "lr"))
        w1, w2 = st.load(f"{w}/{ref}/model.safetensors"), st.load(f"{w}/{run}/model.safetensors")
        n = sum(t.size for t in w1.values())
        norms = max((abs(x[k] - y[k]) / max(abs(x[k]), 1e-300) for x, y in zip(s1, s2)
                     for k in ("grad_norm_backbone", "grad_norm_indexer") if x.get(k)), default=0.0)
        check(f"{label}: losses and KL bit-identical", exact)
        check(f"{label}: gradient norms to n 2^-53", norms <= n * 2.0 ** -53,
              f"(relative difference {norms:.2e}, bound {n * 2.0 ** -53:.2e})")
        same = set(w1) == set(w2) and all(np.array_equal(w1[k], w2[k]) for k in w1)
        dw = max(float(np.abs(w1[k] - w2[k]).max()) for k in w1) if set(w1) == set(w2) else float("inf")
        check(f"{label}: every weight bit-identical", same, f"(max |difference| {dw:.2e})")

    def shards(run, ck):
        files = sorted(glob.glob(f"{w}/{run}/checkpoints/{ck}/optimizer-*-of-*.safetensors"))
        return [st.load(f) for f in files]

    def per_rank_state(label, run, ranks):
        """Each checkpoint's per-rank files: one per rank, disjoint, together the trained tensors,
        balanced by size; rank 0's peak memory lower by exactly the moments it does not keep."""
        for ck, trained in (("0-pre-end", lambda n: True), ("1-warm-end", lambda n: "indexer." in n)):
            sh = shards(run, ck)
            model = st.load(f"{w}/{run}/checkpoints/{ck}/model.safetensors")
            names = [sorted(k[2:] for k in s if k.startswith("m.")) for s in sh]
            union = sorted(sum(names, []))
            want = sorted(k for k in model if trained(k))
            loads = [sum(s["m." + k].size for k in ns) for s, ns in zip(sh, names)]
            largest = max(model[k].size for k in want)
            check(f"{label} {ck}: {ranks} files, disjoint, together the trained tensors", len(sh) == ranks and
                  union == want and len(set(union)) == len(union), f"({len(sh)} files, {len(union)} vs {len(want)})")
            check(f"{label} {ck}: balanced within the largest tensor", max(loads) - min(loads) <= largest,
                  f"(loads {loads}, largest {largest})")
        return names

    def peak_drop(label, ref, run, ranks):
        """pre phase: every tensor trained, so the block is the largest load."""
        sh = shards(run, "0-pre-end")
        loads = [sum(t.size for k, t in s.items() if k.startswith("m.")) for s in sh]
        total, block = sum(loads), max(loads)
        want = 8 * (total - loads[0]) - 4 * block - 4 * (ranks * block - total)
        p1 = [r["peak_bytes"] for r in steps(ref) if r["phase"] == "pre"]
        p2 = [r["peak_bytes"] for r in steps(run) if r["phase"] == "pre"]
        got = sorted(set(x - y for x, y in zip(p1, p2)))
        check(f"{label}: rank 0's peak drops by the moments it does not keep, less its block", got == [want],
              f"(drop {got}, expected {want} bytes)")

    adamw, muon = f"{w}/adamw.yaml", f"{w}/muon.yaml"
    programme(adamw, "adamw", 1.0)
    programme(muon, "muon", 0.02)  # Muon's lr: at 1.0 it amplifies even another DP grid's rounding
    Z = "--shard-optimizer"
    if train(1, adamw, "one") and train(1, adamw, "one_z", Z):
        identical("1 rank, sharded vs not", "one", "one_z")
    if train(2, adamw, "two") and train(2, adamw, "two_z", Z):
        identical("2 ranks AdamW, sharded vs not", "two", "two_z")
        per_rank_state("2 ranks", "two_z", 2)
        peak_drop("2 ranks", "two", "two_z", 2)
    if train(2, muon, "mtwo") and train(2, muon, "mtwo_z", Z):
        identical("2 ranks Muon, sharded vs not", "mtwo", "mtwo_z")
    if train(4, adamw, "four") and train(4, adamw, "four_z", Z):
        compare_training(check, "4 ranks AdamW, sharded vs not", f"{w}/four", f"{w}/four_z", rows=ROWS,
                         lr_over_eps=1.0, steps=STEPS, seq_len=SEQ, moments=False)
        per_rank_state("4 ranks", "four_z", 4)
        peak_drop("4 ranks", "four", "four_z", 4)

    def resume(src, dst, ranks, *extra):
        """A copy of run `src` stopped after its step-2 checkpoint, resumed on `ranks`."""
        shutil.rmtree(f"{w}/{dst}", ignore_errors=True)
        shutil.copytree(f"{w}/{src}", f"{w}/{dst}")
        with open(f"{w}/{dst}/checkpoints/latest", "w") as f:
            f.write("0-pre-step2\n")
        return train(ranks, adamw, dst, "--resume", *extra)

    for src, dst, ranks, extra in (("four_z", "r4to2", 2, [Z]), ("two_z", "r2to4", 4, [Z]),
                                   ("two_z", "r2to1", 1, []), ("one", "r1to2", 2, [Z])):
        if os.path.isdir(f"{w}/{src}") and resume(src, dst, ranks, *extra):
            compare_training(check, f"resume {dst[1:]}", f"{w}/{src}", f"{w}/{dst}", rows=ROWS, lr_over_eps=1.0,
                             steps=STEPS, seq_len=SEQ, moments=False)

    if os.path.isdir(f"{w}/two_z"):
        shutil.rmtree(f"{w}/torn", ignore_errors=True)
        shutil.copytree(f"{w}/two_z", f"{w}/torn")
        with open(f"{w}/torn/checkpoints/latest", "w") as f:
            f.write("0-pre-step2\n")
        os.remove(f"{w}/torn/checkpoints/0-pre-step2/optimizer-00002-of-00002.safetensors")
        check_refused(check, "a checkpoint missing a rank's optimizer file is refused",
                      MPIRUN + ["2", a.hmla, "train", adamw, "--out", f"{w}/torn", "--resume", Z],
                      "optimizer-00002-of-00002.safetensors is missing", f"{w}/torn", one_line=False)
    check.exit()


if __name__ == "__main__":
    main()
