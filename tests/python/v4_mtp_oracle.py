# DeepSeek-V4's multi-token-prediction layers (docs/deepseek_v4_math.md section 14) in float64, on
# the model of v4_oracle.py (which imports this file and hands itself over as `o`): three MTP depths
# (a CSA, an HCA and a sliding block, learned routing) on the transformers fixture's stack, the loss
#   L = CE_LM + LAM / 3 (CE_0 + CE_1 + CE_2),  CE_k = mean over t < s - k - 2 of CE(logits_k(t), ids[t + k + 2])
# and its autograd gradients. Written from the doc, not from hmla's code. `check` (ctest oracle.v4)
# verifies autograd against central differences and that tests/hf/fixtures/v4_mtp/ is this oracle's
# output; `write` (/usr/bin/python3 tests/python/v4_oracle.py --write-mtp-fixture) makes it: the MTP
# weights (seeded, searched until no CSA top-k or router choice is within 1e-3 / 1e-4 of a tie and
# float32 picks what float64 does), float64 losses and gradients (hi + lo) and each gradient's
# float32 error (the same oracle in float32: STYLE.md's naive instance) for test_v4_mtp.cpp.
import json, os
import numpy as np, torch
import safetensors_lite as st

LAM = 0.3  # the fixture's mtp_loss_coeff (DeepSeek-V3's lambda for its first 10T tokens)
KINDS = ["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"]
HERE = os.path.dirname(os.path.abspath(__file__))
FX = HERE + "/../hf/fixtures/v4_mtp/"


def mtp_shapes(o):
    """hmla's v4_mtp_params for KINDS: each block's attention as the stack's first layer of its kind
    has it (kv norm named attn.kv_norm, DeepSeek's name), mHC, norms and MoE as a learned layer's."""
    c, D, n = o.c, o.Dm, o.hc
    first = {t: L for L, t in reversed(list(enumerate(c["layer_types"])))}
    learned = c["mlp_layer_types"].index("moe")
    out = {}
    for k, kind in enumerate(KINDS):
        p = f"mtp.{k}."
        out.update({p + "e_proj.weight": (D, D), p + "enorm.weight": (D,), p + "h_proj.weight": (D, D),
                    p + "hnorm.weight": (D,), p + "hc_head_fn": (n, n * D), p + "hc_head_base": (n,),
                    p + "hc_head_scale": (1,), p + "norm.weight": (D,)})
        la, lf = f"model.layers.{first[kind]}.", f"model.layers.{learned}."
        for name, t in o.W0.items():
            if name.startswith(la + "attn."):
                rest = name[len(la):]
                out[p + ("attn.kv_norm.weight" if rest == "attn.norm.weight" else rest)] = tuple(t.shape)
            elif name.startswith(lf) and not name.startswith(lf + "attn."):
                out[p + name[len(lf):]] = tuple(t.shape)
    return out


def mtp_weights(o, seed):
    rng, W = np.random.default_rng(seed), {}
    for name, sh in sorted(mtp_shapes(o).items()):
        if name.endswith("attn_sink"): v = rng.normal(0, 0.5, sh)
        elif name.endswith((".ape", "_base")): v = rng.normal(0, 0.3, sh)
        elif name.endswith("_scale") or ("norm" in name and len(sh) == 1): v = 1 + rng.normal(0, 0.2, sh)
        elif name.endswith("gate.bias"): v = rng.normal(0, 0.1, sh)
        else: v = rng.normal(0, o.c["initializer_range"], sh)
        W[name] = v.astype(np.float32)
    return W


def block(o, X, p, kind, L):  # one V4 block (mHC, attention, mHC, MoE) under prefix p
    W = o.W
    pre, post, comb, col = o.hcmix(X, p + "hc_attn")
    a = o.attention(o.rms(col, W[p + "attn_norm.weight"]), L, None, kind, p + "attn.", "kv_norm.weight")
    X = post[..., None] * a[:, :, None] + torch.einsum("bsik,bsid->bskd", comb, X)
    pre, post, comb, col = o.hcmix(X, p + "hc_ffn")
    mo = o.moe(o.rms(col, W[p + "ffn_norm.weight"]), L, "moe", p + "ffn.")
    return post[..., None] * mo[:, :, None] + torch.einsum("bsik,bsid->bskd", comb, X)


def objective(o):
    """The LM loss and each depth's CE mean with o.W (each row one causal document; no pad in ids)."""
    W, ids, s, n = o.W, o.ids, o.s, o.c["num_hidden_layers"]
    ce = torch.nn.functional.cross_entropy
    lg = o.model_logits()
    V = lg.shape[-1]
    lm = ce(lg[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    X, out = o.cap[f"layer{n}.streams"], []  # the stack's last streams, before model.hc_head
    for k, kind in enumerate(KINDS):
        p = f"mtp.{k}."
        u = torch.zeros_like(ids)  # the token k + 1 ahead; past the row's end pad (0)
        u[:, :s - k - 1] = ids[:, k + 1:]
        e = W["model.embed_tokens.weight"][u]
        Y = o.lin(o.rms(e, W[p + "enorm.weight"]), W[p + "e_proj.weight"])[:, :, None] + \
            o.lin(o.rms(X, W[p + "hnorm.weight"]), W[p + "h_proj.weight"])  # every stream
        X = block(o, Y, p, kind, n + k)
        z = o.rms(X.flatten(2)) @ W[p + "hc_head_fn"].T
        pre = torch.sigmoid(z * W[p + "hc_head_scale"] + W[p + "hc_head_base"]) + o.hce
        lgk = o.lin(o.rms((pre[..., None] * X).sum(2), W[p + "norm.weight"]), W["head.weight"])
        a = k + 2
        out.append(ce(lgk[:, :s - a].reshape(-1, V), ids[:, a:].reshape(-1)))
    return lm, out


def evaluate(o, weights, dtype):
    """Losses, gradients of L and the captured choices, with every float tensor in `dtype`."""
    torch.set_default_dtype(dtype)
    o.W = {k: torch.tensor(v).to(dtype) if v.dtype == np.float32 else torch.tensor(v) for k, v in weights.items()}
    for t in o.W.values():
        if t.is_floating_point(): t.requires_grad_(True)
    o.cap.clear()
    lm, ces = objective(o)
    total = lm + LAM / len(ces) * sum(ces)
    total.backward()
    grads = {k: (t.grad.double().numpy() if t.grad is not None else np.zeros(t.shape))
             for k, t in o.W.items() if t.is_floating_point()}
    cap = {k: v.detach().double().numpy() if v.is_floating_point() else v.numpy() for k, v in o.cap.items()}
    torch.set_default_dtype(torch.float64)
    return dict(lm=lm.item(), ce=[x.item() for x in ces], total=total.item(), grads=grads, cap=cap)


def margins(o, cap):
    """Smallest k-th gap of the MTP layers' CSA selections (visible scores) and router choices."""
    n, K, k = o.c["num_hidden_layers"], o.c["index_topk"], o.c["num_experts_per_tok"]
    igap = rgap = np.inf
    for d in range(len(KINDS)):
        sc = cap.get(f"layer{n + d}.index_scores")
        if sc is not None:
            for row in sc.reshape(-1, sc.shape[-1]):
                fin = np.sort(row[np.isfinite(row)])[::-1]
                if len(fin) > K: igap = min(igap, fin[K - 1] - fin[K])
        ch = np.sort(cap[f"layer{n + d}.choice"], -1)[:, ::-1]
        rgap = min(rgap, (ch[:, k - 1] - ch[:, k]).min())
    return igap, rgap


def split64(a):
    hi = a.astype(np.float32)
    return hi, (a - hi.astype(np.float64)).astype(np.float32)


def all_weights(o, mtp):
    return {**{k: v.detach().numpy().astype(np.float32) if v.is_floating_point() else v.numpy() for k, v in o.W0.items()},
            **mtp}


def write(o):
    for seed in range(100):
        mtp = mtp_weights(o, seed)
        r64, r32 = evaluate(o, all_weights(o, mtp), torch.float64), evaluate(o, all_weights(o, mtp), torch.float32)
        igap, rgap = margins(o, r64["cap"])
        n = o.c["num_hidden_layers"]
        same = all(np.array_equal(r64["cap"][x], r32["cap"][x]) for x in r64["cap"]
                   if x.startswith(tuple(f"layer{n + d}." for d in range(3))) and x.endswith(("topk", "experts")))
        if igap >= 1e-3 and rgap >= 1e-4 and same: break
        print(f"mtp seed {seed}: skipped (indexer gap {igap:.1e}, router gap {rgap:.1e}, f32 == f64 choices: {same})")
    else:
        raise SystemExit("v4_mtp: no seed without near-ties")
    os.makedirs(FX, exist_ok=True)
    cfg = json.load(open(o.D + "v4/config.json"))
    cfg.update(num_nextn_predict_layers=len(KINDS), layer_types=cfg["layer_types"] + KINDS,
               mlp_layer_types=cfg["mlp_layer_types"] + ["moe"] * len(KINDS))
    with open(FX + "config.json", "w") as f: json.dump(cfg, f, indent=1, sort_keys=True)
    st.save(FX + "mtp.safetensors", mtp)
    g = {}
    for name, v in [("loss", r64["total"]), ("lm", r64["lm"]), ("mtp", np.mean(r64["ce"]))]:
        g[f"{name}_hi"], g[f"{name}_lo"] = split64(np.array([v]))
    g["mtp_f32"] = np.array([np.mean(r32["ce"])], np.float32)
    zero = []
    for k, v in r64["grads"].items():
        if not np.any(v): zero.append(k); continue  # indexers, router biases
        g[f"{k}_hi"], g[f"{k}_lo"] = split64(v)
        g[f"{k}_f32err"] = np.array([np.abs(r32["grads"][k] - v).max()], np.float32)
    st.save(FX + "grads.safetensors", g)
    info = {"torch": torch.__version__, "mtp seed": seed, "mtp_loss_coeff": LAM, "kinds": KINDS,
            "min indexer k-th gap": float(igap), "min router k-th gap": float(rgap), "loss": r64["total"],
            "lm": r64["lm"], "ce per depth": r64["ce"], "zero-gradient parameters": zero}
    with open(FX + "made_with.json", "w") as f: json.dump(info, f, indent=1)
    print(json.dumps(info, indent=1))


def check(o):
    """Autograd against central differences; fixtures/v4_mtp/ equal to this oracle's output."""
    failures = []
    mtp = st.load(FX + "mtp.safetensors")
    weights = all_weights(o, mtp)
    r = evaluate(o, weights, torch.float64)
    G = st.load(FX + "grads.safetensors")
    j = lambda n: G[n + "_hi"].astype(np.float64) + G[n + "_lo"].astype(np.float64)
    worst = 0.0
    for k, v in r["grads"].items():
        ref = j(k) if k + "_hi" in G else np.zeros_like(v)
        d = np.abs(v - ref).max() / max(np.abs(ref).max(), 1e-30)
        worst = max(worst, d if np.any(ref) else np.abs(v).max())
        if np.any(ref) and not d <= 1e-9: failures.append(f"mtp fixture grad {k}: relative difference {d}")
        if not np.any(ref) and np.any(v): failures.append(f"mtp fixture grad {k}: nonzero where the fixture has none")
    for name, v in [("loss", r["total"]), ("lm", r["lm"]), ("mtp", np.mean(r["ce"]))]:
        if not abs(v - j(name)[0]) <= 1e-12 * abs(v): failures.append(f"mtp fixture {name}: {v} vs {j(name)[0]}")
    print("MTP: loss", r["total"], "CE per depth", r["ce"], "; worst relative difference to the fixture", worst)

    def total():
        with torch.no_grad():
            o.cap.clear()
            lm, ces = objective(o)
            return (lm + LAM / len(ces) * sum(ces)).item()
    torch.set_default_dtype(torch.float64)
    o.W = {k: torch.tensor(v).double() if v.dtype == np.float32 else torch.tensor(v) for k, v in weights.items()}
    rng, fd_worst = np.random.default_rng(1), 0.0
    for k in ["mtp.0.e_proj.weight", "mtp.0.enorm.weight", "mtp.0.h_proj.weight", "mtp.0.hnorm.weight",
              "mtp.0.attn.kv_norm.weight", "mtp.0.attn.compressor.wgate.weight", "mtp.0.hc_head_fn",
              "mtp.1.attn.compressor.ape", "mtp.1.hc_ffn_scale", "mtp.1.ffn.gate.weight", "mtp.2.attn.attn_sink",
              "mtp.2.ffn.experts.2.w3.weight", "mtp.2.norm.weight", "mtp.2.hc_head_scale",
              "model.layers.3.hc_ffn_fn", "model.layers.2.attn.wq_b.weight", "head.weight"]:
        t = o.W[k]; i = tuple(int(rng.integers(0, n)) for n in t.shape)
        with torch.no_grad():
            x0 = t[i].item(); t[i] = x0 + 1e-5; up = total(); t[i] = x0 - 1e-5; dn = total(); t[i] = x0
        fd, g = (up - dn) / 2e-5, r["grads"][k][i]
        fd_worst = max(fd_worst, abs(fd - g))
        if not abs(fd - g) <= 1e-7: failures.append(f"MTP finite difference {k}{list(i)}: {fd} vs autograd {g}")
    # the embedding: an element of a row that only the MTP layers read as the token ahead (ids[:, 1])
    row = int(o.ids[0, 1]); t = o.W["model.embed_tokens.weight"]
    with torch.no_grad():
        x0 = t[row, 3].item(); t[row, 3] = x0 + 1e-5; up = total(); t[row, 3] = x0 - 1e-5; dn = total(); t[row, 3] = x0
    fd, g = (up - dn) / 2e-5, r["grads"]["model.embed_tokens.weight"][row, 3]
    fd_worst = max(fd_worst, abs(fd - g))
    if not abs(fd - g) <= 1e-7: failures.append(f"MTP finite difference embedding[{row}, 3]: {fd} vs autograd {g}")
    print("MTP: worst |finite difference - autograd|", fd_worst)
    return failures
