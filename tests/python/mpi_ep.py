#!/usr/bin/env python3
"""Expert parallelism's storage over MPI (`hmla train --ep`, docs/scale_out.md "Expert parallel"):
each rank holds only its block of the routed experts, the checkpoints written from such a run hold
the whole model and one optimizer file per rank, and a checkpoint resumes on another expert split.

On configs/demo_moe_model.json from mpi_moe's prepared start (why: mpi_moe.py's docstring), through
all four phases (the mqa phase's equivalence check and the held-out losses run their forwards over
the EP group too):
- ep2 (`--ep 2`, 2 ranks) against one rank: harness.compare_training's reassociation bounds on
  losses, norms, every phase's moments and the final weights. The one-rank reference runs with
  --shard-optimizer so that both write per-rank optimizer files (one rank sharded equals unsharded
  bit for bit: mpi_zero.py).
- what each rank holds: the console's count equals the replicated values plus 1/2 of the experts',
  both counted here from the saved model; each checkpoint's two optimizer files are disjoint, hold
  together what the phase trains, and rank 1's holds only its own experts [E/2, E) (every copy of a
  replicated tensor's moments is the same; rank 0 alone writes them).
- resume: ep2's step-2 checkpoint on 4 ranks with --ep 4, on one rank without EP (sharded over
  itself, so that its moments are per-rank files like the reference's), and the
  reference's on 2 ranks with --ep 2 --shard-optimizer: each continues the uninterrupted run (the
  same bounds).
A rank that kept every expert fails the count; one that wrote the replicated moments too fails the
disjointness (and the loader refuses such a checkpoint); a gather that misplaced a block fails the
weights; an initialisation or load that gave a rank another block fails all of it. The same
comparison runs on GLM-5 (glm5 below)."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, compare_training, parse_args  # noqa: E402
from mpi_moe import LR, MODEL, init_checkpoint, mpirun, prepare_routers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, SEQ, STEPS = 8 * 48, 48, 8


def expert_of(name):
    m = re.search(r"\.experts\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def programme(path, model, seed, init, batch, micro, seq, pre_steps, checkpoint_every):
    """The four phases from `init` at lr LR (the pre phase's checkpoint_every: 0 for none); its path."""
    ck = f", checkpoint_every: {checkpoint_every}" if checkpoint_every else ""
    with open(path, "w") as f:
        f.write(f"""model: {model}
data: {HERE}/../../data/demo
seed: {seed}
init_checkpoint: {init}
base: {{batch: {batch}, micro_batches: {micro}, seq_len: {seq}, lr: {LR}, indexer_lr: {LR}, eps: 1.0, log_every: 1,
        eval_rows: 2}}
phases:
  - {{name: pre, mode: mha, steps: {pre_steps}{ck}}}
  - {{name: mqa, mode: mqa_full_causal, steps: 1}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")
    return path


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    init_checkpoint(f"{w}/init.safetensors")
    prog = programme(f"{w}/p.yaml", MODEL, 6, f"{w}/init.safetensors", 8, 4, SEQ, 3, 2)
    E = json.load(open(MODEL))["n_routed_experts"]

    def train(ranks, out, *extra):
        cmd = ([] if ranks == 1 else mpirun(ranks)) + [a.hmla, "train", prog, "--out", f"{w}/{out}", *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        check(f"{out}: {ranks} rank(s) {' '.join(extra)}", r.returncode == 0, r.stderr[-400:])
        return r if r.returncode == 0 else None

    def compare(label, run):
        compare_training(check, label, f"{w}/one", f"{w}/{run}", rows=ROWS, lr_over_eps=LR, steps=STEPS, seq_len=SEQ)

    one = train(1, "one", "--shard-optimizer")
    ep2 = train(2, "ep2", "--ep", "2")
    if not (one and ep2):
        check.exit()
    compare("ep2 vs one rank", "ep2")

    model = st.load(f"{w}/ep2/model.safetensors")
    start = st.load(f"{w}/ep2/checkpoints/0-pre-end/model.safetensors")  # the model as it starts (no indexers yet)
    experts = sum(t.size for n, t in start.items() if expert_of(n) >= 0)
    replicated = sum(t.size for n, t in start.items() if expert_of(n) < 0)
    said = re.search(r"each rank holds (\d+) parameter values \((\d+) replicated", ep2.stdout)
    check("ep2: each rank holds the replicated values and half of the experts'", said is not None and
          int(said.group(1)) == replicated + experts // 2 and int(said.group(2)) == replicated,
          f"({said.group(0) if said else 'no count printed'}; expected {replicated} + {experts} / 2)")
    check("ep2: the saved model holds every expert", sorted({expert_of(n) for n in model} - {-1}) == list(range(E)))
    for ck, trained in (("0-pre-end", lambda n: True), ("2-warm-end", lambda n: "indexer." in n)):
        files = sorted(glob.glob(f"{w}/ep2/checkpoints/{ck}/optimizer-*-of-*.safetensors"))
        names = [sorted(k[2:] for k in st.load(f) if k.startswith("m.")) for f in files]
        union = sorted(sum(names, []))
        held = st.load(f"{w}/ep2/checkpoints/{ck}/model.safetensors")
        want = sorted(k for k in held if trained(k) and not k.endswith("e_score_correction_bias"))
        check(f"ep2 {ck}: two optimizer files, disjoint, together what the phase trains",
              len(files) == 2 and union == want and len(set(union)) == len(union),
              f"({len(files)} files, {len(union)} tensors vs {len(want)})")
        check(f"ep2 {ck}: rank 1's file holds its own experts only",
              len(names) == 2 and all(E // 2 <= expert_of(n) < E for n in names[1]),
              f"({[n for n in names[1] if not E // 2 <= expert_of(n) < E][:3]})")

    def resume(src, dst, ranks, *extra):
        shutil.rmtree(f"{w}/{dst}", ignore_errors=True)
        shutil.copytree(f"{w}/{src}", f"{w}/{dst}")
        with open(f"{w}/{dst}/checkpoints/latest", "w") as f:
            f.write("0-pre-step2\n")
        return train(ranks, dst, "--resume", *extra)

    # Both groups at once: --cp 2 --ep 2 with ZeRO-1 on four ranks (the experts sharded over the two
    # CP ranks holding their block, the rest over all four).
    if train(4, "cp2ep2z", "--cp", "2", "--ep", "2", "--shard-optimizer"):
        compare("cp2 ep2 ZeRO-1 vs one rank", "cp2ep2z")
    # A rank that fails ends the whole EP job with its message (app/cmd_train.cpp's test seam).
    bad = subprocess.run(mpirun(2) + ["-x", "HMLA_TEST_FAIL_RANK=1", a.hmla, "train", prog, "--out", f"{w}/bad",
                                      "--ep", "2"], capture_output=True, text=True, timeout=120)
    check("ep2: a failing rank ends the job with its message",
          bad.returncode != 0 and "injected failure on rank 1" in bad.stderr, f"exit {bad.returncode}")
    glm5(check, a)
    for src, dst, ranks, extra in (("ep2", "ep2to4", 4, ["--ep", "4"]), ("ep2", "ep2to1", 1, ["--shard-optimizer"]),
                                   ("one", "oneto2", 2, ["--ep", "2", "--shard-optimizer"])):
        if resume(src, dst, ranks, *extra):
            compare(f"resume {src} -> {ranks} rank(s) {' '.join(extra)}", dst)
    check.exit()


def glm5(check, a):
    """GLM-5 (glm_moe_dsa: IndexShare, group-limited routing over 4 groups) under `--ep 2` on two
    ranks against one, from `hmla init`'s draw with mpi_moe's prepared router (a small gate and
    correction biases 0.1 apart, so no routing decision can flip under reassociation; the groups
    too, which are picked by their experts' biased scores)."""
    w = a.workdir
    cfg = f"{HERE}/../../configs/glm5_tiny.json"
    r = subprocess.run([a.hmla, "init", "--config", cfg, "--out", f"{w}/glm5_init", "--seed", "3"],
                       capture_output=True, text=True, timeout=120)
    check("GLM-5: hmla init", r.returncode == 0, r.stderr[-300:])
    if r.returncode:
        return
    import numpy as np
    init = st.load(f"{w}/glm5_init/model.safetensors")
    prepare_routers(init, json.load(open(cfg)), np.random.default_rng(29))
    st.save(f"{w}/glm5_init.safetensors", init)
    prog = programme(f"{w}/glm5.yaml", cfg, 5, f"{w}/glm5_init.safetensors", 4, 2, 64, 2, 0)
    runs = {"glm5_one": [a.hmla, "train", prog, "--out", f"{w}/glm5_one", "--shard-optimizer"],
            "glm5_ep2": mpirun(2) + [a.hmla, "train", prog, "--out", f"{w}/glm5_ep2", "--ep", "2"]}
    res = {k: subprocess.run(cmd, capture_output=True, text=True, timeout=300) for k, cmd in runs.items()}
    for k, r in res.items():
        check(f"GLM-5 {k} runs", r.returncode == 0, r.stderr[-400:])
    if not any(r.returncode for r in res.values()):
        compare_training(check, "GLM-5 ep2 vs one rank", f"{w}/glm5_one", f"{w}/glm5_ep2", rows=4 * 64,
                         lr_over_eps=LR, steps=7, seq_len=64)


if __name__ == "__main__":
    main()
