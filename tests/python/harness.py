"""Shared scaffolding of the CLI-level test scripts: arguments (--hmla, --workdir, the workdir
made afresh) and a checker that prints one ok/FAIL line per property and sets the exit status."""
import argparse
import hashlib
import os
import shutil
import stat
import subprocess
import sys


def parse_args(doc):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--hmla", required=True, help="path to the hmla binary")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    return a


class Checker:
    def __init__(self):
        self.ok = True

    def __call__(self, name, cond, detail=""):
        self.ok &= bool(cond)
        print(f"{'ok  ' if cond else 'FAIL'} {name} {detail}")

    def exit(self):
        sys.exit(0 if self.ok else 1)


def tree_digest(root):
    """Every entry under root (symlinks not followed): files by a hash of their bytes, symlinks by
    their target, anything else by its type. Equal digests: nothing was created, changed or removed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                out[os.path.relpath(p, root)] = "link " + os.readlink(p)
            elif stat.S_ISREG(mode):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[os.path.relpath(p, root)] = "type %o" % stat.S_IFMT(mode)
    return out


def check_refused(check, name, cmd, needle, root, one_line=True, timeout=120):
    """`cmd` must fail with an `hmla: error:` line containing `needle` (the only stderr line unless
    one_line is False: mpirun adds its own) and leave every file under `root` byte-identical."""
    before = tree_digest(root)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    after = tree_digest(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    lines = r.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("hmla: error:") and needle in ln]
    good = r.returncode != 0 and errors and (len(lines) == 1 or not one_line) and not changed
    check(name, good, f"exit {r.returncode}: {(errors or lines or [''])[0][:220]}" +
          (f" CHANGED: {changed[:6]}" if changed else ""))
    return r


F32_EPS = 2.0 ** -23


def compare_training(check, label, ref_dir, run_dir, rows, lr_over_eps, steps, seq_len, moments=True):
    """Two runs of one programme whose gradient sums are grouped differently (another rank grid, or
    other micro-batches) agree up to f32 reassociation. Each tolerance comes from the computation:
    a step's loss, gradients and moments are sums over its `rows` (batch x seq_len) tokens, so
    regrouping moves them by at most rows * eps relative to the magnitude of the summed terms.
    - loss and gradient norms: sums of same-sign terms, so rtol = rows * eps of the value.
    - indexer KL: sum P (log P - log Q) cancels; its terms are bounded by H(P, Q) + H(P) <=
      kl + 2 ln(seq_len), so atol = rows * eps * (kl + 2 ln seq_len).
    - the indexers' gradient norm: the KL's gradient is sum_rows J^T (Q - P), a difference of two
      distributions of unit mass per row that nearly cancel. Reassociation moves the terms (P, Q) by
      rows * eps, which relative to Q - P is larger by kappa = |P + Q|_1 / |Q - P|_1 >= 2 / sqrt(2 kl)
      (Pinsker: |Q - P|_1 <= sqrt(2 kl), near equality for near distributions), so rtol = rows * eps
      * max(1, sqrt(2 / kl)). At initialisation kl ~ 1e-4 and kappa ~ 100; a wrong row slice or a
      missing term is an O(1) relative error, still far outside.
    - each phase's Adam first moment (a linear image of the gradients): rows * eps of its largest entry,
      x kappa in a phase that trains only the indexers (its m is theirs). Where both train, the
      indexers' entries sit below the largest by their norm ratio (up to sqrt(len m) entry-wise), so
      kappa enters scaled by that share.
    - weights: with AdamW's eps >= 1 and gradients clipped to norm <= 1, the update
      lr m / (sqrt(v) + eps) is 2 lr/eps-Lipschitz in the gradient, so each step moves a weight by
      at most 2 (lr/eps) rows * eps more; x2 for the second-order effect of earlier differences.
      (With eps = 1e-8 an element whose gradient cancels to the f32 floor moves by a whole +-lr
      either way: weights are comparable only where the update is well-conditioned.)
    A run's moments are its optimizer.safetensors arena, or (sharded or expert-parallel runs) its
    per-rank files' tensors in name order: compared like with like only (a reference run with
    --shard-optimizer on one rank writes per-rank files, and equals the unsharded run bit for bit,
    tests/python/mpi_zero.py). moments=False skips them."""
    import glob
    import json
    import numpy as np
    import safetensors_lite as st

    def steps_of(path):
        return [r for r in map(json.loads, open(path)) if "step" in r]

    def metrics(path):
        return np.array([[r[k] or 0.0 for k in ("lm_loss", "indexer_kl", "grad_norm_backbone", "grad_norm_indexer")]
                         for r in steps_of(path)])

    tol = rows * F32_EPS
    m1, m2 = metrics(f"{ref_dir}/metrics.jsonl"), metrics(f"{run_dir}/metrics.jsonl")
    same = m1.shape == m2.shape
    d = np.abs(m1 - m2) if same else np.ones((1, 4))
    bound = np.abs(m1) * tol if same else np.zeros((1, 4))
    kl = m1[:, 1]
    kappa = np.where(kl > 0, np.maximum(1.0, np.sqrt(2.0 / np.maximum(kl, 1e-300))), 1.0)
    if same:
        bound[:, 1] = tol * (np.abs(m1[:, 1]) + 2 * np.log(seq_len))
        bound[:, 3] *= kappa
    check(f"{label}: per-step loss, KL and gradient norms equal the reference's", same and (d <= bound).all(),
          "(max difference / bound: loss %.2f, kl %.2f, norms %.2f / %.2f)" %
          tuple((d / np.maximum(bound, 1e-300)).max(axis=0)))

    def rel(x, y):
        return float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-30))

    import os
    names = [r["phase"] for r in steps_of(f"{ref_dir}/metrics.jsonl")]
    phases = sorted(p for p in os.listdir(f"{ref_dir}/checkpoints") if p.endswith("-end"))
    worst = 0.0  # the largest difference / bound over the phases
    def first_moment(d, p):
        f = f"{d}/checkpoints/{p}/optimizer.safetensors"
        if os.path.exists(f):
            return "arena", st.load(f)["optimizer.m"]
        parts = {}
        for g in sorted(glob.glob(f"{d}/checkpoints/{p}/optimizer-*-of-*.safetensors")):
            parts.update(st.load(g))
        names = sorted(k for k in parts if k.startswith("m."))
        return "per-rank", np.concatenate([parts[k].ravel() for k in names]) if names else np.zeros(0, np.float32)

    for p in phases if moments else []:
        (ka, a), (kb, b) = first_moment(ref_dir, p), first_moment(run_dir, p)
        if ka != kb or a.shape != b.shape:
            check(f"{label}: {p}'s moments are comparable", False, f"({ka} {a.shape} vs {kb} {b.shape})")
            continue
        mine = [i for i, n in enumerate(names) if same and n == p.split("-", 1)[1][: -len("-end")]]
        # The indexers' share of m's largest entry; 1 where only they train.
        share = [1.0 if m1[i, 2] == 0 else min(1.0, np.sqrt(a.size) * m1[i, 3] / m1[i, 2]) for i in mine]
        k = max([1.0] + [kappa[i] * sh for i, sh in zip(mine, share)])
        worst = max(worst, rel(a, b) / (tol * k))
    if moments:
        check(f"{label}: every phase's gradient moments equal the reference's", worst <= 1.0,
              f"(max relative difference / bound {worst:.2f}, bound {tol:.2e} x kappa, {len(phases)} phases)")
    w1, w2 = st.load(f"{ref_dir}/model.safetensors"), st.load(f"{run_dir}/model.safetensors")
    wbound = 2 * 2 * lr_over_eps * steps * tol
    dw = max(float(np.abs(w1[n] - w2[n]).max()) for n in w1) if set(w1) == set(w2) else float("inf")
    check(f"{label}: final weights equal the reference's", dw <= wbound,
          f"(max |difference| {dw:.2e}, bound {wbound:.2e})")
