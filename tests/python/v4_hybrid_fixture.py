# The v4_hybrid fixture (tests/hf/fixtures/v4_hybrid; read by tests/hf/test_v4_hybrid.cpp): a tiny
# DeepSeek-V4 stack with hmla's hybrid_mla layers (layer_types [HCA, hybrid_mla, CSA, hybrid_mla]),
# computed by the float64 oracle tests/python/v4_oracle.py (its hybrid_mla layer is written from
# DESIGN.md sections 2-6, not from hmla's code). The V4 parts reuse the transformers-made v4
# fixture's weights and input_ids (layer 0's attention is its HCA layer's, layer 2's its CSA layer's);
# the hybrid layers' MLA and indexer tensors are drawn here. Per mode of the hybrid layers (mha,
# dsa_warmup, dsa_sparse; the other layers run as V4 always does) it stores, in float64 as hi + lo
# float32 pairs: the logits, the LM loss (mean CE over the b (s - 1) next tokens), each hybrid
# layer's KL (sum_t kl / valid_rows, DESIGN.md section 6) and the gradient of LM loss + coeff sum KL
# (the KL's target and the indexer's inputs detached, so the backbone's gradient is the LM loss's),
# and the same run's float32 instance: every op in float32, the naive implementation STYLE.md's
# tolerance rule measures (NAME_f32 values, NAME_f32err = max |f32 - f64| of a gradient); dsa_sparse
# also its selections S(t) per hybrid layer. dsa_warmup's backbone gradients equal mha's (DESIGN.md
# section 1), so only its indexer gradients are stored.
#
# Checks made before writing, and by ctest oracle.v4_hybrid (which recomputes the committed fixture
# from its config, weights and ids: a stale fixture fails loudly): the oracle's gradients against
# central differences in float64 on elements of every hybrid tensor (the backbone's of the LM loss,
# the indexer's of the KL term: the KL's target moves with the backbone under a difference, which
# the detached gradient rightly ignores); the smallest gaps at the K-th place of every selection
# (hybrid top-k, CSA top-k, router top-k) far above float32's error, so no choice flips in f32.
#
# /usr/bin/python3 tests/python/v4_hybrid_fixture.py          check the committed fixture
# /usr/bin/python3 tests/python/v4_hybrid_fixture.py --write  (re)make it
import json, os, sys
import numpy as np, torch
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_lite as st
import v4_oracle as O

SRC = HERE + "/../hf/fixtures/v4/"
OUT = HERE + "/../hf/fixtures/v4_hybrid/"
SEED = 20250
MODES = ("mha", "dsa_warmup", "dsa_sparse")
HYBRID = (1, 3)
GEOMETRY = {"hybrid_mla_q_lora_rank": 16, "hybrid_mla_kv_lora_rank": 12, "hybrid_mla_qk_nope_head_dim": 8,
            "hybrid_mla_qk_rope_head_dim": 4, "hybrid_mla_v_head_dim": 8, "hybrid_mla_num_attention_heads": 2,
            "hybrid_mla_index_topk": 5}


def make_config():
    c = json.load(open(SRC + "config.json"))
    for k in ("transformers_version", "dtype", "architectures"): c.pop(k, None)  # hmla's own config
    c["layer_types"] = ["heavily_compressed_attention", "hybrid_mla", "compressed_sparse_attention", "hybrid_mla"]
    c.update(GEOMETRY)
    c["pad_token_id"] = 0
    c["indexer_loss_coeff"] = 0.1
    c["hmla_layer_modes"] = ["mha"] * 4
    return c


def hybrid_tensors(c, rng):
    """self_attn.* of a hybrid layer (DESIGN.md section 2's names and shapes)."""
    H, Rq, Rkv = c["hybrid_mla_num_attention_heads"], c["hybrid_mla_q_lora_rank"], c["hybrid_mla_kv_lora_rank"]
    Dn, Dr, Dv = c["hybrid_mla_qk_nope_head_dim"], c["hybrid_mla_qk_rope_head_dim"], c["hybrid_mla_v_head_dim"]
    D, HI, DI = c["hidden_size"], c["index_n_heads"], c["index_head_dim"]
    mat = lambda *sh: rng.normal(0, 0.25, sh)
    norm = lambda n: rng.uniform(0.5, 1.5, n)
    return {"q_a_proj.weight": mat(Rq, D), "q_a_layernorm.weight": norm(Rq), "q_b_proj.weight": mat(H * (Dn + Dr), Rq),
            "kv_a_proj_with_mqa.weight": mat(Rkv + Dr, D), "kv_a_layernorm.weight": norm(Rkv),
            "kv_b_proj.weight": mat(H * (Dn + Dv), Rkv), "o_proj.weight": mat(D, H * Dv),
            "softmax_offset": rng.normal(0, 0.5, H), "indexer.wq_b.weight": mat(HI * DI, Rq),
            "indexer.wk.weight": mat(DI, D), "indexer.k_norm.weight": norm(DI), "indexer.k_norm.bias": rng.normal(0, 0.2, DI),
            "indexer.weights_proj.weight": mat(HI, D)}


def make_weights(c, seed):
    old = st.load(SRC + "model.safetensors")
    rng = np.random.default_rng(seed)
    w = {}
    attn_from = {0: 2, 2: 1}  # new layer -> the v4 fixture's layer of that kind (HCA, CSA)
    for name, t in old.items():
        if not name.startswith("model.layers."):
            w[name] = t
            continue
        L, rest = int(name.split(".")[2]), ".".join(name.split(".")[3:])
        if not rest.startswith("attn."): w[name] = t
    for L, src in attn_from.items():
        for name, t in old.items():
            if name.startswith(f"model.layers.{src}.attn."): w[name.replace(f"layers.{src}.", f"layers.{L}.", 1)] = t
    for L in HYBRID:
        for n, t in hybrid_tensors(c, rng).items(): w[f"model.layers.{L}.self_attn.{n}"] = t.astype(np.float32)
    return w


def run(c, w, ids, mode, dtype):
    cfg = dict(c, hmla_layer_modes=[mode if L in HYBRID else "mha" for L in range(4)])
    O.setup(cfg, w, ids, dtype)
    O.cap.clear()
    ce = O.mean_ce()
    kls = [O.cap[f"layer{L}.kl"] for L in HYBRID] if mode != "mha" else []
    total = ce + c["indexer_loss_coeff"] * sum(kls) if kls else ce
    total.backward()
    logits = O.model_logits().detach()  # the same forward again, for the logits
    grads = {k: (t.grad if t.grad is not None else torch.zeros_like(t)).detach().double().numpy()
             for k, t in O.W.items() if t.is_floating_point()}
    return {"logits": logits.double().numpy(), "loss": ce.item(), "kl": [k.item() for k in kls], "grads": grads,
            "cap": {k: v.detach() for k, v in O.cap.items()}}


def kth_gap(scores, valid, k, zero_ties=False):
    """The smallest gap between the k-th and (k+1)-th largest valid score over the rows with more than
    k valid scores (exact ties count as 0; with zero_ties, but for two exact zeros: relu's, which both
    precisions make exactly and break to the smaller j alike, given the relu margin below)."""
    sc = np.where(valid, scores, -np.inf)
    srt = -np.sort(-sc, -1)
    rows = valid.sum(-1) > k
    if not rows.any(): return np.inf
    with np.errstate(invalid="ignore"):  # -inf - -inf in the rows left out
        gap = srt[..., k - 1] - srt[..., k]
    if zero_ties: gap = np.where((srt[..., k - 1] == 0) & (srt[..., k] == 0), np.inf, gap)
    return float(gap[rows].min())


def gaps(c, r):
    cap, out = r["cap"], {}
    s = cap["layer0.streams"].shape[1]
    t, u = np.arange(s)[:, None], np.arange(s)[None, :]
    for L in HYBRID:  # dsa_sparse's selections (dsa_warmup's KL is dense: its table selects nothing)
        if f"layer{L}.selected" in cap:
            R = np.broadcast_to(u <= t - c["sliding_window"], cap[f"layer{L}.index_scores"].shape)
            out[f"hybrid {L}"] = kth_gap(cap[f"layer{L}.index_scores"].double().numpy(), R, c["hybrid_mla_index_topk"], True)
            # every q.k that relu reads (causal) far from 0: no score is 0 in one precision and not the other
            dots = cap[f"layer{L}.index_dots"].double().numpy()
            out[f"hybrid {L} relu margin"] = float(np.abs(dots)[..., u <= t].min())
    sc = cap["layer2.index_scores"].double().numpy()
    out["csa 2"] = kth_gap(sc, np.isfinite(sc), c["index_topk"])
    for L in range(4):
        if f"layer{L}.router" in cap:
            rt = cap[f"layer{L}.router"].double().numpy()
            out[f"router {L}"] = kth_gap(rt, np.ones(rt.shape, bool), c["num_experts_per_tok"])
    return out


def finite_differences(c, w, ids, mode):
    """Central differences (h = 1e-5) of the LM loss (backbone tensors) or the whole objective (indexer
    tensors) against float64 autograd, one random element of every hybrid tensor of layer 1: the worst
    |difference| (truncation and rounding both ~1e-10)."""
    r = run(c, w, ids, mode, torch.float64)
    rng, worst = np.random.default_rng(0), 0.0
    def objective(indexer):
        with torch.no_grad():
            O.cap.clear()
            ce = O.mean_ce().item()
            if not indexer or mode == "mha": return ce
            return ce + c["indexer_loss_coeff"] * sum(O.cap[f"layer{L}.kl"].item() for L in HYBRID)
    for n in hybrid_tensors(c, np.random.default_rng(0)):
        indexer = n.startswith("indexer.")
        if indexer and mode == "mha": continue
        k = f"model.layers.1.self_attn.{n}"
        t = O.W[k]; i = tuple(int(rng.integers(0, m)) for m in t.shape)
        with torch.no_grad():
            x0 = t[i].item(); t[i] = x0 + 1e-5; up = objective(indexer); t[i] = x0 - 1e-5; dn = objective(indexer); t[i] = x0
        worst = max(worst, abs((up - dn) / 2e-5 - r["grads"][k][i]))
    return worst


def hi_lo(x):
    x = np.asarray(x, np.float64)
    hi = x.astype(np.float32)
    return hi, (x - hi.astype(np.float64)).astype(np.float32)


def build(c, w, ids):
    F, made, failures = {"input_ids": ids}, {"seed": SEED, "torch": torch.__version__, "b": ids.shape[0], "s": ids.shape[1]}, []
    K = c["hybrid_mla_index_topk"]
    for mode in MODES:
        r64, r32 = run(c, w, ids, mode, torch.float64), run(c, w, ids, mode, torch.float32)
        F[mode + ".logits_hi"], F[mode + ".logits_lo"] = hi_lo(r64["logits"])
        F[mode + ".logits_f32"] = r32["logits"].astype(np.float32)
        F[mode + ".loss_hi"], F[mode + ".loss_lo"] = hi_lo([r64["loss"]])
        F[mode + ".loss_f32"] = np.array([r32["loss"]], np.float32)
        if r64["kl"]:
            F[mode + ".kl_hi"], F[mode + ".kl_lo"] = hi_lo(r64["kl"])
            F[mode + ".kl_f32"] = np.array(r32["kl"], np.float32)
        for k, g in r64["grads"].items():
            if mode == "dsa_warmup" and ".indexer." not in k: continue
            if mode == "mha" and ".self_attn.indexer." in k: continue
            F[f"{mode}.grad.{k}_hi"], F[f"{mode}.grad.{k}_lo"] = hi_lo(g)
            F[f"{mode}.grad.{k}_f32err"] = np.array([np.abs(r32["grads"][k] - g).max()], np.float32)
        if mode == "dsa_sparse":
            for L in HYBRID:
                sel = r64["cap"][f"layer{L}.selected"].numpy()
                if not np.array_equal(sel, r32["cap"][f"layer{L}.selected"].numpy()):
                    failures.append(f"layer {L}: the float32 instance selects other keys")
                tab = np.full(sel.shape[:2] + (K,), -1, np.int32)
                for bi in range(sel.shape[0]):
                    for t in range(sel.shape[1]):
                        js = np.nonzero(sel[bi, t])[0]
                        tab[bi, t, :len(js)] = js
                F[f"dsa_sparse.selected.{L}"] = tab
        g = gaps(c, r64)
        made[mode] = {"max|logit|": float(np.abs(r64["logits"]).max()),
                      "max|f32 - f64| logits": float(np.abs(r32["logits"] - r64["logits"]).max()),
                      "loss": r64["loss"], "kl": r64["kl"], "min k-th gaps": g,
                      "worst |finite difference - autograd| of layer 1's hybrid tensors": finite_differences(c, w, ids, mode)}
        for what, gap in g.items():
            if not gap > 1e-4: failures.append(f"{mode}: {what}: the k-th gap {gap} is within reach of float32's error")
        if not made[mode]["worst |finite difference - autograd| of layer 1's hybrid tensors"] <= 1e-7:
            failures.append(f"{mode}: the finite differences disagree with autograd")
    return F, made, failures


def save_or_check(out, c, weights, F, made, failures, write, exact):
    """--write: the fixture into `out` (config, weights, fixture, made_with) when the oracle found no
    failure; else the committed fixture against this oracle's: float64 values to 1e-9 of each
    tensor's max, the tables `exact(name)` says equal. Failures go into `failures`."""
    if write and not failures:
        os.makedirs(out, exist_ok=True)
        json.dump(c, open(out + "config.json", "w"), indent=2)
        st.save(out + "model.safetensors", weights)
        st.save(out + "fixture.safetensors", F)
        json.dump(made, open(out + "made_with.json", "w"), indent=1)
    if not write:
        old = st.load(out + "fixture.safetensors")
        if set(old) != set(F): failures.append("the fixture's tensors differ from the oracle's: remake it (--write)")
        for k in sorted(set(old) & set(F)):
            if k.endswith("_hi"):
                n = k[:-3]
                got, ref = O.j(F, n), O.j(old, n)
                d = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
                if not d <= 1e-9: failures.append(f"{n}: relative difference {d} from the committed fixture")
            elif exact(k):
                if not np.array_equal(old[k], F[k]): failures.append(f"{k} differs from the committed fixture")


def main():
    write = "--write" in sys.argv
    if write:
        c = make_config()
        w = make_weights(c, SEED)
        ids = st.load(SRC + "fixture.safetensors")["input_ids"]
    else:
        c = json.load(open(OUT + "config.json"))
        w = st.load(OUT + "model.safetensors")
        ids = st.load(OUT + "fixture.safetensors")["input_ids"]
    F, made, failures = build(c, w, ids)
    print(json.dumps(made, indent=1))
    save_or_check(OUT, c, w, F, made, failures, write,
                  lambda k: k.startswith("dsa_sparse.selected") or k == "input_ids")
    for f in failures: print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__": main()
