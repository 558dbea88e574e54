#!/usr/bin/env python3
"""The DeepSeek-V4 PyTorch twin (v4_twin.py) against independent references: (1) its f32 logits,
CSA top-k sets and MoE experts on transformers 5.24's fixture (tests/hf/fixtures/v4); (2) its f32
loss and every parameter gradient against the fixture's float64 gradients (v4_grads); (3) packed
documents: two rows of two documents each (and a padded tail) against each document run alone, in
float64 and in f32; (4) train_twin.py --serve on a V4 config, the bench's protocol; (5) the config
reader against the configs transformers wrote back (tests/hf/fixtures/config_v4.json).

Tolerances by STYLE.md's rule: the twin is an f32 evaluation of the same function as transformers'
f32 model, with the same operations in the same depth, so its error against float64 has the scale
of that model's (the fixture's *_f32err, max |f32 - f64| of transformers' f32 run): it may be at
most twice that, plus 8 f32 ulps of the magnitudes that enter (the final product's sum_k |h_k||W_vk|
for logits; the largest reference value of the group for a gradient). A gradient shares the
rounding scale of its layer (its group): one small tensor's error is one draw that can fall near 0.
Discrete choices must be equal: the fixture's seed has no k-th place gap under 5e-4 (made_with.json),
far above f32 rounding of O(1) scores (~1e-6). Exit status 1 on any failure.
Runs on Debian's python3-torch: /usr/bin/python3 tests/python/v4_twin_check.py --workdir DIR"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_lite as st  # noqa: E402
import v4_twin as v4  # noqa: E402
from train_twin import batch_masks  # noqa: E402

FIX = os.path.join(HERE, "..", "hf", "fixtures")
U = float(np.finfo(np.float32).eps)  # 2^-23: one f32 ulp at 1
FAILS = []


def report(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILS.append(what)


def f64(d, n):
    """A fixture's float64 tensor stored as hi + lo."""
    hi = d[n + "_hi"].astype(np.float64)
    return hi + np.where(np.isinf(hi), 0, d[n + "_lo"].astype(np.float64))


def load_model(dtype, requires_grad=True):
    return v4.split_weights(st.load(os.path.join(FIX, "v4", "model.safetensors")), dtype, "cpu", requires_grad)


def one_doc_layout(c, b, s):
    return v4.layout(c, torch.zeros(b, s, dtype=torch.int64), torch.full((b, s), s, dtype=torch.int64))


def logit_magnitude(c, ids, lay):
    """max over (token, vocab) of sum_k |h_k| |W_vk| (float64): the magnitudes entering the final
    product, the rounding term's scale."""
    head = P64["head.weight"]
    p = dict(P64, **{"head.weight": torch.eye(head.shape[1], dtype=head.dtype)})  # an identity head gives h
    with torch.no_grad():
        h = v4.logits(c, p, TABS64, ids, lay, "topk")
    return float((h.abs() @ head.abs().T).max())


def sets_equal(a, b):
    return np.array_equal(np.sort(a, -1), np.sort(b, -1))


def check_fixture(c):
    F = st.load(os.path.join(FIX, "v4", "fixture.safetensors"))
    ids = torch.from_numpy(F["input_ids"].astype(np.int64))
    b, s = ids.shape
    lay = one_doc_layout(c, b, s)
    ref = f64(F, "logits")
    e_hf = np.abs(F["logits_f32"].astype(np.float64) - ref).max()
    bound = 2 * e_hf + 8 * U * logit_magnitude(c, ids, lay)
    p, tabs = load_model(torch.float32)
    trace = {}
    with torch.no_grad():
        lg = v4.logits(c, p, tabs, ids, lay, "topk", trace).double().numpy()
    e = np.abs(lg - ref).max()
    report(e <= bound, f"fixture logits f32: max err {e:.3e}, transformers f32 {e_hf:.3e}, bound {bound:.3e}")
    for L, kind in enumerate(c["layer_types"]):
        if kind == v4.CSA:
            report(sets_equal(trace[f"layer{L}.topk"].numpy(), F[f"layer{L}.topk"]), f"fixture layer{L}.topk sets")
        report(sets_equal(trace[f"layer{L}.experts"].numpy(), F[f"layer{L}.experts"]), f"fixture layer{L}.experts")


def check_grads(c):
    F = st.load(os.path.join(FIX, "v4", "fixture.safetensors"))
    G = st.load(os.path.join(FIX, "v4_grads", "grads.safetensors"))
    ids = torch.from_numpy(F["input_ids"].astype(np.int64))
    b, s = ids.shape
    lay = one_doc_layout(c, b, s)
    ds, de = torch.zeros(b, s, dtype=torch.int64), torch.full((b, s), s, dtype=torch.int64)
    _, targets, keep, _ = batch_masks({"pad_token_id": c["pad_token_id"]}, ids, ds, de)
    report(int(keep.sum()) == b * (s - 1), f"loss targets: {int(keep.sum())} kept of b(s-1) = {b * (s - 1)}")
    p, tabs = load_model(torch.float32)
    loss = v4.step_loss(c, p, tabs, ids, lay, targets, keep, "topk")
    loss.backward()
    ref = f64(G, "loss")[0]
    e_hf = abs(float(G["loss_f32"][0]) - ref)
    bound = 2 * e_hf + 8 * U * abs(ref)
    report(abs(loss.item() - ref) <= bound, f"loss {loss.item():.9f} vs {ref:.9f}: err {abs(loss.item() - ref):.3e}, "
                                           f"transformers f32 {e_hf:.3e}, bound {bound:.3e}")

    def group(n):
        return n.split(".")[2] if n.startswith("model.layers.") else "top"
    scale = {}
    for n in p:
        if n + "_hi" in G:
            g = group(n)
            old = scale.get(g, (0.0, 0.0))
            scale[g] = (max(old[0], float(G[n + "_f32err"][0])), max(old[1], np.abs(f64(G, n)).max()))
    worst = 0.0
    for n, t in sorted(p.items()):
        got = t.grad.double().numpy() if t.grad is not None else np.zeros(t.shape)
        if n + "_hi" not in G:  # the indexer's and the router bias: no gradient in transformers
            report(not got.any(), f"grad {n}: none (as transformers)")
            continue
        e = np.abs(got - f64(G, n)).max()
        e_hf, mref = scale[group(n)]
        bound = 2 * e_hf + 8 * U * mref
        worst = max(worst, e / bound)
        if e > bound:
            report(False, f"grad {n}: max err {e:.3e}, bound {bound:.3e}")
    missing = [n for n in G if n.endswith("_hi") and n[:-3] not in p and n != "loss_hi"]
    report(not missing, f"every fixture gradient has a parameter {missing}")
    report(worst <= 1, f"{sum(n + '_hi' in G for n in p)} gradients within their bounds (worst err / bound {worst:.2f})")


# Two packed rows: (fixture row, start, length) per document, then padding (id 0) to s = 36. The
# documents' starts and lengths are off the rates' multiples (CSA 4, HCA 8), so windows must start
# at each document's start; every document has a trailing partial window and a first window.
PACKED = [[(0, 0, 20), (1, 0, 13)], [(1, 13, 23), (0, 20, 13)]]


def check_packed(c):
    F = st.load(os.path.join(FIX, "v4", "fixture.safetensors"))
    fid = F["input_ids"].astype(np.int64)
    s = fid.shape[1]
    b = len(PACKED)
    ids, ds, de = np.zeros((b, s), np.int64), np.arange(1, s + 1)[None].repeat(b, 0), np.zeros((b, s), np.int64)
    for r, docs in enumerate(PACKED):  # padding rows: doc_start = t + 1 > t (hmla's convention)
        at = 0
        for fr, st0, n in docs:
            ids[r, at : at + n] = fid[fr, st0 : st0 + n]
            ds[r, at : at + n], de[r, at : at + n] = at, at + n
            at += n
    t_ids, t_ds, t_de = (torch.from_numpy(a) for a in (ids, ds, de))
    for dtype in (torch.float64, torch.float32):
        p, tabs = load_model(dtype, requires_grad=False)
        lay = v4.layout(c, t_ds, t_de)
        trace = {}
        with torch.no_grad():
            lg = v4.logits(c, p, tabs, t_ids, lay, "topk", trace).double().numpy()
        err, mag, choices = 0.0, 0.0, True
        for r, docs in enumerate(PACKED):
            at = 0
            for fr, st0, n in docs:
                one = torch.from_numpy(fid[fr : fr + 1, st0 : st0 + n].copy())
                tr1 = {}
                with torch.no_grad():
                    ref = v4.logits(c, p, tabs, one, one_doc_layout(c, 1, n), "topk", tr1).double().numpy()[0]
                err, mag = max(err, np.abs(lg[r, at : at + n] - ref).max()), max(mag, np.abs(ref).max())
                for L, kind in enumerate(c["layer_types"]):
                    choices &= sets_equal(trace[f"layer{L}.experts"].view(b, s, -1)[r, at : at + n].numpy(),
                                          tr1[f"layer{L}.experts"].numpy())
                    if kind == v4.CSA:  # packed entry e -> its window's first row in the document
                        m = c["rates"][kind]
                        first = lay["entries"][m][0][r].numpy()
                        pk = trace[f"layer{L}.topk"][r, at : at + n].numpy()
                        pk = np.where(pk >= 0, first[np.maximum(pk, 0)] - at, -1)
                        al = tr1[f"layer{L}.topk"][0].numpy()
                        choices &= sets_equal(pk, np.where(al >= 0, al * m, -1))
                at += n
        report(choices, f"packed {dtype}: every document's top-k sets and experts as when run alone")
        report(np.isfinite(lg).all(), f"packed {dtype}: logits finite (padding rows included)")
        if dtype == torch.float64:
            # Two float64 evaluations in different orders (RoPE at other angles, other reductions):
            # a few hundred ulps of O(1) values at this depth; 1e-9 is far above, far below any
            # real error (a wrong window or entry changes logits at O(1e-2)).
            report(err <= 1e-9 * mag, f"packed float64 vs alone: max err {err:.3e} (bound {1e-9 * mag:.3e})")
        else:
            # Each f32 evaluation is within check 1's bound of the exact value (the same model and
            # tokens): their difference within twice it.
            e_hf = np.abs(F["logits_f32"].astype(np.float64) - f64(F, "logits")).max()
            bound = 2 * (2 * e_hf + 8 * U * logit_magnitude(c, torch.from_numpy(fid), one_doc_layout(c, 2, s)))
            report(err <= bound, f"packed f32 vs alone: max err {err:.3e} (bound {bound:.3e})")
    # The packed batch trains: the loss over the documents' own targets, finite gradients everywhere.
    p, tabs = load_model(torch.float32)
    _, targets, keep, _ = batch_masks({"pad_token_id": c["pad_token_id"]}, t_ids, t_ds, t_de)
    want = sum(n - 1 for docs in PACKED for _, _, n in docs)
    report(int(keep.sum()) == want, f"packed targets: {int(keep.sum())} (each document's n - 1: {want})")
    for mode in ("dense", "topk"):
        for t in p.values():
            t.grad = None
        v4.step_loss(c, p, tabs, t_ids, v4.layout(c, t_ds, t_de), targets, keep, mode).backward()
        report(all(t.grad is None or torch.isfinite(t.grad).all() for t in p.values()),
               f"packed {mode}: every gradient finite")
        idx_grad = any(t.grad is not None and t.grad.any() for n, t in p.items() if "indexer." in n)
        report(not idx_grad, f"packed {mode}: the indexer gets no gradient from the LM loss")
    return ids, ds, de


def check_serve(c, workdir, ids, ds, de):
    """train_twin.py --serve on the packed batch, as bench/train_bench.cpp drives it (tid2eid
    written as I32, the batch's tensors as I32): the first step's loss is the twin's loss."""
    os.makedirs(workdir, exist_ok=True)
    w = st.load(os.path.join(FIX, "v4", "model.safetensors"))
    w = {n: a.astype(np.int32) if n.endswith("tid2eid") else a for n, a in w.items()}
    st.save(os.path.join(workdir, "weights.safetensors"), w)
    st.save(os.path.join(workdir, "batch.safetensors"),
            {"input_ids": ids.astype(np.int32), "doc_start": ds.astype(np.int32), "doc_end": de.astype(np.int32)})
    with open(os.path.join(workdir, "twin.json"), "w") as f:
        json.dump({"config": os.path.abspath(os.path.join(FIX, "v4", "config.json")), "mode": "mha", "threads": 1,
                   "lr": 1e-3, "device": "cpu"}, f)
    out = subprocess.run([sys.executable, os.path.join(HERE, "train_twin.py"), "--serve", workdir],
                         input="step\nstep\nstep\nquit\n", capture_output=True, text=True, timeout=300)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or len(lines) != 3:
        report(False, f"train_twin --serve: rc {out.returncode}, {len(lines)} replies; {out.stderr[-400:]}")
        return
    p, tabs = load_model(torch.float32)
    t_ids, t_ds, t_de = (torch.from_numpy(a) for a in (ids, ds, de))
    _, targets, keep, _ = batch_masks({"pad_token_id": c["pad_token_id"]}, t_ids, t_ds, t_de)
    with torch.no_grad():
        want = v4.step_loss(c, p, tabs, t_ids, v4.layout(c, t_ds, t_de), targets, keep, "dense").item()
    losses = [x["loss"] for x in lines]
    report(losses[0] == want, f"train_twin --serve: first loss {losses[0]:.7f} = the twin's {want:.7f}")
    report(losses[2] < losses[0], f"train_twin --serve: AdamW lowers the loss {losses}")


def check_configs():
    """v4_config on each config of tests/hf/fixtures/config_v4.json (defaults, legacy names, legacy
    rates, modern) resolves as on the config transformers wrote back from it."""
    cases = json.load(open(os.path.join(FIX, "config_v4.json")))["cases"]
    for name, case in sorted(cases.items()):
        a, b = v4.v4_config(case["config"]), v4.v4_config(case["written"])
        bad = [f for f in a if f != "rope" and a[f] != b[f]]
        bad += [k for k in a["rope"] if not (np.array_equal(a["rope"][k][0], b["rope"][k][0])
                                             and a["rope"][k][1] == b["rope"][k][1])]
        report(not bad, f"config {name}: read as transformers wrote it back {bad}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    c = v4.v4_config(json.load(open(os.path.join(FIX, "v4", "config.json"))))
    global P64, TABS64
    P64, TABS64 = load_model(torch.float64, requires_grad=False)
    check_configs()
    check_fixture(c)
    check_grads(c)
    ids, ds, de = check_packed(c)
    check_serve(c, args.workdir, ids, ds, de)
    print("twin v4:", "FAILED" if FAILS else "PASSED")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
