# The v4_mtp_hybrid fixture (tests/hf/fixtures/v4_mtp_hybrid; read by tests/hf/test_v4_mtp.cpp): the
# v4_hybrid fixture's stack (layer_types [HCA, hybrid_mla, CSA, hybrid_mla], its weights and ids) with
# one multi-token-prediction layer of kind hybrid_mla (the seed's pattern), computed by the float64
# oracle: v4_oracle.py's hybrid_mla attention (written from DESIGN.md sections 2-6) inside the MTP
# depth of docs/deepseek_v4_math.md section 14 (written from the doc, as v4_mtp_oracle.py). The MTP
# layer runs the phase's mode like the stack's hybrid layers (DESIGN.md section 10). Per mode (mha,
# dsa_warmup, dsa_sparse) it stores, float64 as hi + lo float32 pairs with the float32 instance
# (every op in float32: STYLE.md's naive implementation): the LM loss, the MTP loss CE_0 (mean over
# the b (s - 2) targets two ahead), the KLs of the hybrid layers 1, 3 and the MTP layer (sum_t kl /
# valid_rows each) and the gradient of
#   L = CE_LM + LAM CE_0 + indexer_loss_coeff (KL_1 + KL_3 + KL_mtp)
# (KL targets and indexer inputs detached: the backbone's gradient is the two CE's); dsa_warmup
# stores its indexer gradients only (its backbone's are mha's and hmla's warmup computes none),
# dsa_sparse the MTP layer's selections S(t).
#
# Checks before writing, and by ctest oracle.v4_mtp_hybrid (which recomputes the committed fixture: a
# stale one fails): central differences in float64 against autograd on one element of every MTP
# tensor (the backbone's of the two CE's, the indexer's of the whole objective); the smallest gaps at
# the K-th place of every selection (hybrid top-k and relu margins, the CSA top-k, the routers) far
# above float32's error, and float32 selecting what float64 does.
#
# /usr/bin/python3 tests/python/v4_mtp_hybrid_fixture.py          check the committed fixture
# /usr/bin/python3 tests/python/v4_mtp_hybrid_fixture.py --write  (re)make it
import json, os, sys
import numpy as np, torch
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_lite as st
import v4_oracle as O
import v4_hybrid_fixture as VH

SRC = HERE + "/../hf/fixtures/v4_hybrid/"
OUT = HERE + "/../hf/fixtures/v4_mtp_hybrid/"
LAM = 0.3  # mtp_loss_coeff
MODES = ("mha", "dsa_warmup", "dsa_sparse")
HYBRID = (1, 3)
MTP = 4  # the MTP layer computes as layer num_hidden_layers + 0
P = "mtp.0."


def make_config():
    c = json.load(open(SRC + "config.json"))
    c.update(num_nextn_predict_layers=1, layer_types=c["layer_types"] + ["hybrid_mla"],
             mlp_layer_types=c["mlp_layer_types"] + ["moe"])
    return c


def mtp_weights(c, stack, seed):
    """mtp.0.*: DeepSeek's MTP names (section 14); the block's mixers, norms and MoE shaped as the stack's
    learned layer 1's, its attention self_attn.* as a hybrid layer's (v4_hybrid_fixture.hybrid_tensors)."""
    rng, D, n, W = np.random.default_rng(seed), c["hidden_size"], c["hc_mult"], {}
    shapes = {"e_proj.weight": (D, D), "enorm.weight": (D,), "h_proj.weight": (D, D), "hnorm.weight": (D,),
              "hc_head_fn": (n, n * D), "hc_head_base": (n,), "hc_head_scale": (1,), "norm.weight": (D,)}
    for name, t in stack.items():
        pre = "model.layers.1."
        if name.startswith(pre) and not name.startswith(pre + "self_attn."): shapes[name[len(pre):]] = t.shape
    for name, sh in sorted(shapes.items()):
        if name.endswith("_base"): v = rng.normal(0, 0.3, sh)
        elif name.endswith("_scale") or ("norm" in name and len(sh) == 1): v = 1 + rng.normal(0, 0.2, sh)
        elif name.endswith("gate.bias"): v = rng.normal(0, 0.1, sh)
        else: v = rng.normal(0, c["initializer_range"], sh)
        W[P + name] = v.astype(np.float32)
    for name, t in VH.hybrid_tensors(c, rng).items(): W[P + "self_attn." + name] = t.astype(np.float32)
    return W


def mtp_ce(mode):
    """CE_0 of the MTP depth on the stack's last streams (O's forward just ran), its layer in `mode`."""
    W, ids, s, n = O.W, O.ids, O.s, O.c["num_hidden_layers"]
    u = torch.zeros_like(ids)  # the token one ahead; past the row's end pad (0)
    u[:, :s - 1] = ids[:, 1:]
    Y = O.lin(O.rms(W["model.embed_tokens.weight"][u], W[P + "enorm.weight"]), W[P + "e_proj.weight"])[:, :, None] + \
        O.lin(O.rms(O.cap[f"layer{n}.streams"], W[P + "hnorm.weight"]), W[P + "h_proj.weight"])  # every stream
    pre, post, comb, col = O.hcmix(Y, P + "hc_attn")
    a = O.hybrid_attention(O.rms(col, W[P + "attn_norm.weight"]), MTP, mode, P + "self_attn.")
    X = post[..., None] * a[:, :, None] + torch.einsum("bsik,bsid->bskd", comb, Y)
    pre, post, comb, col = O.hcmix(X, P + "hc_ffn")
    mo = O.moe(O.rms(col, W[P + "ffn_norm.weight"]), MTP, "moe", P + "ffn.")
    X = post[..., None] * mo[:, :, None] + torch.einsum("bsik,bsid->bskd", comb, X)
    z = O.rms(X.flatten(2)) @ W[P + "hc_head_fn"].T
    hpre = torch.sigmoid(z * W[P + "hc_head_scale"] + W[P + "hc_head_base"]) + O.hce
    lg = O.lin(O.rms((hpre[..., None] * X).sum(2), W[P + "norm.weight"]), W["head.weight"])
    return torch.nn.functional.cross_entropy(lg[:, :s - 2].reshape(-1, lg.shape[-1]), ids[:, 2:].reshape(-1))


def objective(c, mode, with_kl=True):
    O.cap.clear()
    lm = O.mean_ce()
    ce = mtp_ce(mode)
    kls = [O.cap[f"layer{L}.kl"] for L in HYBRID + (MTP,)] if mode != "mha" else []
    total = lm + LAM * ce + (c["indexer_loss_coeff"] * sum(kls) if kls and with_kl else 0)
    return lm, ce, kls, total


def run(c, w, ids, mode, dtype):
    cfg = dict(c, hmla_layer_modes=[mode if L in HYBRID else "mha" for L in range(4)])
    O.setup(cfg, w, ids, dtype)
    lm, ce, kls, total = objective(c, mode)
    total.backward()
    grads = {k: (t.grad if t.grad is not None else torch.zeros_like(t)).detach().double().numpy()
             for k, t in O.W.items() if t.is_floating_point()}
    torch.set_default_dtype(torch.float64)
    return {"lm": lm.item(), "mtp": ce.item(), "kl": [k.item() for k in kls], "grads": grads,
            "cap": {k: v.detach() for k, v in O.cap.items()}}


def gaps(c, r):
    """v4_hybrid_fixture's gaps of the stack, and the MTP layer's: its top-k and relu margin, its router."""
    out, cap = VH.gaps(c, r), r["cap"]
    s = cap["layer0.streams"].shape[1]
    t, u = np.arange(s)[:, None], np.arange(s)[None, :]
    if f"layer{MTP}.selected" in cap:
        R = np.broadcast_to(u <= t - c["sliding_window"], cap[f"layer{MTP}.index_scores"].shape)
        out["hybrid mtp"] = VH.kth_gap(cap[f"layer{MTP}.index_scores"].double().numpy(), R, c["hybrid_mla_index_topk"], True)
        out["hybrid mtp relu margin"] = float(np.abs(cap[f"layer{MTP}.index_dots"].double().numpy())[..., u <= t].min())
    rt = cap[f"layer{MTP}.router"].double().numpy()
    out["router mtp"] = VH.kth_gap(rt, np.ones(rt.shape, bool), c["num_experts_per_tok"])
    return out


def finite_differences(c, w, ids, mode, r):
    """Central differences (h = 1e-5) against float64 autograd on one random element of every MTP tensor:
    the two CE's for the backbone's, the whole objective for the indexer's (its KL's target moves with the
    backbone under a difference, which the detached gradient rightly ignores). The worst |difference|."""
    rng, worst = np.random.default_rng(0), 0.0
    for k in sorted(n for n in O.W if n.startswith(P) and O.W[n].is_floating_point()):
        indexer = ".indexer." in k
        if (indexer and mode == "mha") or k.endswith("gate.bias"): continue
        t = O.W[k]; i = tuple(int(rng.integers(0, m)) for m in t.shape)
        def f():
            with torch.no_grad(): return objective(c, mode, indexer)[3].item()
        with torch.no_grad():
            x0 = t[i].item(); t[i] = x0 + 1e-5; up = f(); t[i] = x0 - 1e-5; dn = f(); t[i] = x0
        worst = max(worst, abs((up - dn) / 2e-5 - r["grads"][k][i]))
    return worst


def build(c, w, ids):
    F, made, failures = {"input_ids": ids}, {"torch": torch.__version__, "mtp_loss_coeff": LAM}, []
    K = c["hybrid_mla_index_topk"]
    hi_lo = VH.hi_lo
    for mode in MODES:
        r32, r64 = run(c, w, ids, mode, torch.float32), run(c, w, ids, mode, torch.float64)
        for name in ("lm", "mtp", "kl"):
            if name == "kl" and not r64["kl"]: continue
            F[f"{mode}.{name}_hi"], F[f"{mode}.{name}_lo"] = hi_lo(np.atleast_1d(r64[name]))
            F[f"{mode}.{name}_f32"] = np.atleast_1d(np.array(r32[name], np.float32))
        for k, g in r64["grads"].items():
            indexer = ".self_attn.indexer." in k
            if (mode == "dsa_warmup" and not indexer) or (mode == "mha" and indexer) or not np.any(g): continue
            F[f"{mode}.grad.{k}_hi"], F[f"{mode}.grad.{k}_lo"] = hi_lo(g)
            F[f"{mode}.grad.{k}_f32err"] = np.array([np.abs(r32["grads"][k] - g).max()], np.float32)
        for x in r64["cap"]:
            if x.endswith(("selected", "experts", "topk")) and not np.array_equal(r64["cap"][x].numpy(), r32["cap"][x].numpy()):
                failures.append(f"{mode}: {x}: the float32 instance chooses otherwise")
        if mode == "dsa_sparse":
            sel = r64["cap"][f"layer{MTP}.selected"].numpy()
            tab = np.full(sel.shape[:2] + (K,), -1, np.int32)
            for bi in range(sel.shape[0]):
                for t in range(sel.shape[1]):
                    js = np.nonzero(sel[bi, t])[0]
                    tab[bi, t, :len(js)] = js
            F["dsa_sparse.selected.mtp"] = tab
        g = gaps(c, r64)
        fd = finite_differences(c, w, ids, mode, r64)
        made[mode] = {"lm": r64["lm"], "mtp": r64["mtp"], "kl (layers 1, 3, mtp)": r64["kl"], "min k-th gaps": g,
                      "worst |finite difference - autograd| of the MTP tensors": fd}
        for what, gap in g.items():
            if not gap > 1e-4: failures.append(f"{mode}: {what}: the k-th gap {gap} is within reach of float32's error")
        if not fd <= 1e-7: failures.append(f"{mode}: the finite differences disagree with autograd ({fd})")
    return F, made, failures


def main():
    write = "--write" in sys.argv
    if write:
        c = make_config()
        stack, ids = st.load(SRC + "model.safetensors"), st.load(SRC + "fixture.safetensors")["input_ids"]
        for seed in range(50):
            w = {**stack, **mtp_weights(c, stack, seed)}
            F, made, failures = build(c, w, ids)
            if not failures: break
            print(f"seed {seed}: skipped:", "; ".join(failures))
        else:
            raise SystemExit("v4_mtp_hybrid: no seed without near-ties")
        made["seed"] = seed
    else:
        c = json.load(open(OUT + "config.json"))
        w = {**st.load(SRC + "model.safetensors"), **st.load(OUT + "model.safetensors")}  # the stack's, then mtp.0.*
        ids = st.load(OUT + "fixture.safetensors")["input_ids"]
        F, made, failures = build(c, w, ids)
    print(json.dumps(made, indent=1))
    VH.save_or_check(OUT, c, {k: v for k, v in w.items() if k.startswith(P)}, F, made, failures, write,
                     lambda k: k in ("dsa_sparse.selected.mtp", "input_ids"))
    for f in failures: print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__": main()
