#!/usr/bin/env python3
"""The DSA programme on a hybrid DeepSeek-V4 stack over MPI: `mpirun -np 2 hmla train` against one
rank through the phases mha, mqa_full_causal, dsa_warmup and dsa_sparse on
configs/deepseek_v4_tiny_hybrid.json (HCA, hybrid_mla, CSA, hybrid_mla; hash and learned MoE; mHC),
as data parallelism (DP = 2), expert parallelism (--ep 2; --cp 2 --ep 2 on 4 ranks) and as context
parallelism (--cp 2, DESIGN.md section 8) on the same
stack with a CSA MTP layer trained by mtp_loss_coeff: per-step losses (LM, the indexer KL and the
MTP loss), gradient norms, each phase's moments and the final weights by harness.compare_training's
bounds (the runs differ by the f32 reassociation of the gradient sums; AdamW's eps 1 keeps the
update well-conditioned, lr 0.05 keeps every routing decision where it was). The CP run's seq_len 24
gives each rank 12 rows: an HCA window (16 rows) straddles the ranks and its halo (15 rows) reaches
past the neighbour's whole shard; CSA windows (4) and their halo (7) straddle them too; --cp 4 (6
rows a rank) sends halos further back still. The runs log the attention mass as the mean over
every rank's loss rows."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, compare_training, parse_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def mpirun(n):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)]


def attention_mass(check, label, one, other, tol):
    """The attention mass (docs/v4_attention.md "Attention mass") is the mean over every rank's loss
    rows: both runs log the same keys on every step (log_every 1), and on the run's first step (the
    same weights; each micro-batch's f64 sums are the same numbers, only their order of addition
    differs) the same values to `tol`. Rank 0's micro-batch alone differs by 8e-3 here."""
    import json

    def rows(d):
        with open(f"{d}/metrics.jsonl") as f:
            steps = [r for r in map(json.loads, f) if "step" in r]
        return [{k: v for k, v in r.items() if k.startswith("attn_mass")} for r in steps]

    a, b = rows(one), rows(other)
    check(f"V4 {label}: the same attention mass keys on every step",
          len(a) == len(b) and all(x.keys() == y.keys() and x for x, y in zip(a, b)), [sorted(x) for x in a[:1]])
    if a and b:
        diff = max((abs(a[0][k] - b[0][k]) for k in a[0] if k in b[0]), default=1.0)
        check(f"V4 {label}: the first step's attention mass is the one-rank run's (all ranks' rows)", diff <= tol, diff)


def programme(path, model, seed, seq_len, extra=""):
    with open(path, "w") as f:
        f.write(f"""model: {model}
data: {HERE}/../../data/demo
seed: {seed}
base: {{batch: 4, micro_batches: 2, seq_len: {seq_len}, lr: 0.05, indexer_lr: 0.05, eps: 1.0, log_every: 1,
        eval_rows: 2, moe_aux_loss_coeff: 0, warmup_steps: 1{extra}}}
phases:
  - {{name: pre, mode: mha, steps: 2}}
  - {{name: mqa, mode: mqa_full_causal, steps: 1}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")
    return path


def ep_bytes(check, label, run):
    """An expert-parallel run's rank 0 sends rows to its EP group on every step (the forward's
    exchanges run in dsa_warmup too)."""
    import json
    sent = [json.loads(x).get("ep_bytes") for x in open(f"{run}/metrics.jsonl") if '"step"' in x]
    check(f"V4 train {label}: every step sent rows to its EP group", sent and all((b or 0) > 0 for b in sent), str(sent))


def train_pair(check, a, prog, label, ref, run, flags=(), ranks=2):
    """One rank into `ref` (unless it is there) and `ranks` (mpirun, `flags`) into `run`; True when both ran."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {} if os.path.exists(f"{ref}/metrics.jsonl") else {"one": [a.hmla, "train", prog, "--out", ref]}
    runs[label] = mpirun(ranks) + [a.hmla, "train", prog, "--out", run, *flags]
    res = {k: subprocess.run(c, capture_output=True, text=True, timeout=300, env=env) for k, c in runs.items()}
    for k, r in res.items():
        check(f"V4 train {k} runs", r.returncode == 0, r.stderr[-400:])
    return not any(r.returncode for r in res.values())


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    prog = programme(f"{w}/p.yaml", f"{HERE}/../../configs/deepseek_v4_tiny_hybrid.json", 3, 32)
    if train_pair(check, a, prog, "dp2", f"{w}/one", f"{w}/dp2"):
        compare_training(check, "V4 train dp2", f"{w}/one", f"{w}/dp2", rows=4 * 32, lr_over_eps=0.05, steps=7,
                         seq_len=32)
        attention_mass(check, "dp2", f"{w}/one", f"{w}/dp2", 1e-12)
    # Expert parallelism (--ep 2 over the two replicas): each rank computes 4 of the 8 experts of
    # every MoE layer, hash layers included, over both ranks' rows.
    if train_pair(check, a, prog, "ep2", f"{w}/one", f"{w}/ep2", ("--ep", "2")):
        # Its moments are per-rank files (the reference's one arena): compared in mpi_moe.py and
        # mpi_ep.py; here the losses, norms and weights, which the moments drive.
        compare_training(check, "V4 train ep2", f"{w}/one", f"{w}/ep2", rows=4 * 32, lr_over_eps=0.05, steps=7,
                         seq_len=32, moments=False)
        ep_bytes(check, "ep2", f"{w}/ep2")
    context_parallel(check, a)
    check.exit()


def context_parallel(check, a):
    import json
    w = a.workdir
    with open(f"{HERE}/../../configs/deepseek_v4_tiny_hybrid.json") as f:
        cfg = json.load(f)
    cfg["layer_types"].append("compressed_sparse_attention")  # the MTP layer: CSA, its indexer in the programme
    cfg["mlp_layer_types"].append("moe")
    cfg["num_nextn_predict_layers"] = 1
    with open(f"{w}/mtp.json", "w") as f:
        json.dump(cfg, f)
    prog = programme(f"{w}/cp.yaml", f"{w}/mtp.json", 5, 24, ", mtp_loss_coeff: 0.3")
    if not train_pair(check, a, prog, "cp2", f"{w}/cp-one", f"{w}/cp2", ("--cp", "2")):
        return
    rows = 4 * 24
    compare_training(check, "V4 train cp2", f"{w}/cp-one", f"{w}/cp2", rows=rows, lr_over_eps=0.05, steps=7, seq_len=24)

    def mtp(path):
        return [r.get("mtp_loss") for r in map(json.loads, open(path)) if "step" in r]

    m1, m2 = mtp(f"{w}/cp-one/metrics.jsonl"), mtp(f"{w}/cp2/metrics.jsonl")
    trained = [x for x in m1 if x is not None]
    # The MTP loss is a sum over the step's rows like the LM loss: rtol rows * eps.
    check("V4 train cp2: the MTP loss is logged and equals one rank's",
          len(trained) >= 4 and len(m1) == len(m2) and
          all((x is None) == (y is None) and (x is None or abs(x - y) <= rows * 2.0 ** -24 * abs(x)) for x, y in zip(m1, m2)),
          f"{m1} vs {m2}")
    # Under CP the first step's layers after the hybrid one see inputs regrouped by the MLA layer's
    # context parallelism (f32 sums over the 96 rows): lse moves by <= rows eps |logit| (logits of a
    # few units here), and each mass share with it: 16 rows eps bounds it; rank 0's rows alone: 8e-3.
    attention_mass(check, "cp2", f"{w}/cp-one", f"{w}/cp2", 16 * rows * 2.0 ** -24)
    # Four ranks of 6 rows: a CSA halo (7 rows) reaches two ranks back, an HCA halo (15) three.
    if train_pair(check, a, prog, "cp4", f"{w}/cp-one", f"{w}/cp4", ("--cp", "4"), ranks=4):
        compare_training(check, "V4 train cp4", f"{w}/cp-one", f"{w}/cp4", rows=rows, lr_over_eps=0.05, steps=7,
                         seq_len=24)
    # A 2 x 2 grid of CP and EP: the MTP layer's MoE runs expert-parallel too.
    if train_pair(check, a, prog, "cp2ep2", f"{w}/cp-one", f"{w}/cp2ep2", ("--cp", "2", "--ep", "2"), ranks=4):
        compare_training(check, "V4 train cp2ep2", f"{w}/cp-one", f"{w}/cp2ep2", rows=rows, lr_over_eps=0.05, steps=7,
                         seq_len=24, moments=False)  # per-rank moments, as ep2's
        ep_bytes(check, "cp2ep2", f"{w}/cp2ep2")


if __name__ == "__main__":
    main()
