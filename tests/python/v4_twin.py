"""PyTorch twin of a DeepSeek-V4 model (model_type deepseek_v4; DESIGN.md section 10,
docs/deepseek_v4_math.md), written as a PyTorch user writes a V4 trainer: autograd through torch ops
on the whole batch, a dense [s, s + T] mask per attention layer, the routed experts looped per
expert over their tokens. It reads DeepSeek's checkpoint names (model.layers.L.attn.wq_a.weight,
...; ffn.gate.tid2eid an integer table) and runs in the parameters' dtype (f32 for train_twin.py).

Packed documents follow hmla's rules (include/hmla/ops/compress.h, compressed_attention.h): the
compressors cut each document into windows of m tokens from its start and drop its trailing partial
window; CSA's a-slots never reach into the previous document; a query sees the window keys and the
entries of its own document only; RoPE positions are row indices in the packed row. With one
document per row from row 0 this is transformers 5.24's DeepseekV4ForCausalLM.
CSA layers attend either over the indexer's top-k ("topk": transformers' forward; ties to the
smaller entry) or over every visible entry ("dense": hmla's mha mode, no indexer)."""
import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from mla_twin import rope_freqs, rope_interleaved

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"


def v4_config(raw):
    """A deepseek_v4 config.json read as transformers' DeepseekV4Config (and hmla's config_v4.cpp)
    reads it: its defaults (DeepSeek-V4-Flash), the legacy names folded in, both RoPEs' inverse
    frequencies. Returns a flat dict of what the twin uses."""
    def get(k, d):
        return raw[k] if raw.get(k) is not None else d

    n = get("num_hidden_layers", 43)
    c = {k: get(k, d) for k, d in [
        ("vocab_size", 129280), ("hidden_size", 4096), ("num_attention_heads", 64), ("head_dim", 512),
        ("q_lora_rank", 1024), ("o_groups", 8), ("o_lora_rank", 1024), ("sliding_window", 128), ("hc_mult", 4),
        ("hc_sinkhorn_iters", 20), ("hc_eps", 1e-6), ("rms_norm_eps", 1e-6), ("index_n_heads", 64),
        ("index_head_dim", 128), ("index_topk", 512), ("moe_intermediate_size", 2048), ("num_experts_per_tok", 6),
        ("routed_scaling_factor", 1.5), ("scoring_func", "sqrtsoftplus"), ("swiglu_limit", 10.0),
        ("pad_token_id", 0), ("tie_word_embeddings", False), ("max_position_embeddings", 1048576)]}
    c["num_hidden_layers"] = n
    c["n_routed_experts"] = get("n_routed_experts", get("num_local_experts", 256))
    if raw.get("layer_types") is not None:
        c["layer_types"] = list(raw["layer_types"][:n])
    elif raw.get("compress_ratios") is not None:
        c["layer_types"] = [{0: SLIDING, 4: CSA, 128: HCA}[r] for r in raw["compress_ratios"][:n]]
    else:
        c["layer_types"] = [HCA if L < 2 or (L - 2) % 2 == 0 else CSA for L in range(n)]
    if raw.get("mlp_layer_types") is not None:
        c["hash"] = [t == "hash_moe" for t in raw["mlp_layer_types"][:n]]
    else:
        c["hash"] = [L < get("num_hash_layers", 3) for L in range(n)]
    rates = {CSA: 4, HCA: 128}
    rates.update(raw.get("compress_rates") or {})
    rates[CSA], rates[HCA] = get("compress_rate_csa", rates[CSA]), get("compress_rate_hca", rates[HCA])
    c["rates"] = rates
    prf = raw.get("partial_rotary_factor")
    if prf is None:
        prf = raw["qk_rope_head_dim"] / c["head_dim"] if raw.get("qk_rope_head_dim") is not None else 64 / 512
    c["rope_dim"] = r = int(c["head_dim"] * prf)
    main = {"rope_type": "default", "rope_theta": get("rope_theta", 10000.0)}
    comp = {"rope_type": "default", "rope_theta": get("compress_rope_theta", 160000.0)}
    rp = raw.get("rope_parameters") if raw.get("rope_parameters") is not None else raw.get("rope_scaling")
    if isinstance(rp, dict) and isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        main.update(rp["main"])
        comp.update(rp["compress"])
    elif isinstance(rp, dict):  # flat: the compress RoPE's scaling (YaRN: attention_factor 1 unless given)
        comp.update({k: v for k, v in rp.items() if k not in ("main", "compress", "rope_theta")})
        if comp.get("rope_type", comp.get("type")) == "yarn" and comp.get("attention_factor") is None:
            comp["attention_factor"] = 1.0
    c["rope"] = {}
    for kind, p in (("main", main), ("compress", comp)):
        p = dict(p, truncate=True)  # V4 nests rope_parameters: transformers' YaRN always truncates
        c["rope"][kind] = rope_freqs({"qk_rope_head_dim": r, "rope_theta": p["rope_theta"], "rope_parameters": p,
                                      "max_position_embeddings": c["max_position_embeddings"]})
    return c


def split_weights(arrays, dtype, device, requires_grad=True):
    """Checkpoint arrays -> (parameters, integer tables). tid2eid is an integer table whatever
    dtype it was stored in; every other tensor is a parameter in `dtype`."""
    p, tabs = {}, {}
    for n, a in arrays.items():
        if n.endswith("tid2eid"):
            tabs[n] = torch.from_numpy(np.rint(a).astype(np.int64) if a.dtype.kind == "f" else a.astype(np.int64)).to(device)
        else:
            p[n] = torch.tensor(a, dtype=dtype, device=device, requires_grad=requires_grad)
    return p, tabs


def norm(x, eps, w=None):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope_cs(c, kind, pos, dtype):
    """cos, sin [..., r/2] at integer positions pos (a tensor), angles in float64."""
    inv, af = c["rope"][kind]
    ang = pos.to(torch.float64)[..., None] * torch.from_numpy(inv).to(pos.device)
    return (torch.cos(ang) * af).to(dtype), (torch.sin(ang) * af).to(dtype)


def rope_last(x, cs, r, sign=1.0):
    """Interleaved RoPE on the LAST r channels of x; sign -1: the inverse rotation."""
    cos, sin = cs
    return torch.cat([x[..., :-r], rope_interleaved(x[..., -r:], cos, sign * sin)], dim=-1)


def entries(ds, de, m):
    """The compressed entries of every row for windows of m tokens cut from each document's start
    (a trailing partial window has none), in row order. Returns first [b, n] (the window's first
    row, -1 pads shorter rows), valid [b, n], doc [b, n] (the entry's document start), has_prev
    [b, n] (a previous window of the same document exists: CSA's a-slots)."""
    b, s = ds.shape
    t = np.arange(s)[None, :]
    starts = (ds <= t) & ((t - ds) % m == 0) & (t + m <= de)
    n = int(starts.sum(1).max()) if b else 0
    first = -np.ones((b, n), dtype=np.int64)
    for r in range(b):
        f = np.nonzero(starts[r])[0]
        first[r, : len(f)] = f
    valid = first >= 0
    safe = np.where(valid, first, 0)
    doc = np.where(valid, np.take_along_axis(ds, safe, 1), -1)
    return first, valid, doc, valid & (safe - m >= doc)


def compress(c, x, p, pre, m, width, overlap, meta):
    """The entries [b, n, width] of compressor `pre` (HCA: m slots; CSA, overlap: the previous
    window's a-series and the window's b-series, 2m slots), weighted RMSNorm, compress RoPE at the
    window's first row."""
    first, valid, _, has_prev = meta
    b, n = first.shape
    kv, gate = x @ p[pre + "wkv.weight"].T, x @ p[pre + "wgate.weight"].T  # [b, s, C]
    ape = p[pre + "ape"]  # [m, C]
    rows = torch.arange(b, device=x.device)[:, None, None]
    j = torch.arange(m, device=x.device)
    safe = torch.where(valid, first, torch.zeros_like(first))
    tok = safe[..., None] + j  # [b, n, m]; padding entries read rows 0..m-1 and are never visible
    kvs, zs = kv[rows, tok], gate[rows, tok] + ape
    if overlap:
        prev = torch.where(has_prev, safe - m, torch.zeros_like(safe))[..., None] + j
        gone = ~has_prev[..., None, None]
        kva = kv[rows, prev][..., :width].masked_fill(gone, 0.0)
        za = (gate[rows, prev] + ape)[..., :width].masked_fill(gone, -math.inf)
        kvs, zs = torch.cat([kva, kvs[..., width:]], 2), torch.cat([za, zs[..., width:]], 2)
    e = norm((torch.softmax(zs, dim=2) * kvs).sum(2), c["rms_norm_eps"], p[pre + "norm.weight"])
    return rope_last(e, rope_cs(c, "compress", safe, x.dtype), c["rope_dim"])


def attention(c, p, L, x, lay, csa_mode, trace):
    """The V4 attention block of layer L on x [b, s, D] (the attn_norm output)."""
    b, s, _ = x.shape
    H, d, r, eps = c["num_attention_heads"], c["head_dim"], c["rope_dim"], c["rms_norm_eps"]
    pre, kind = f"model.layers.{L}.attn.", c["layer_types"][L]
    ds, t = lay["ds"], lay["pos"]
    cs = rope_cs(c, "main" if kind == SLIDING else "compress", t, x.dtype)  # [s, r/2]
    qr = norm(x @ p[pre + "wq_a.weight"].T, eps, p[pre + "q_norm.weight"])
    q = rope_last(norm((qr @ p[pre + "wq_b.weight"].T).view(b, s, H, d), eps), (cs[0][:, None], cs[1][:, None]), r)
    kv = rope_last(norm(x @ p[pre + "wkv.weight"].T, eps, p[pre + "norm.weight"]), cs, r)  # [b, s, d]: K = V
    u = t.view(1, 1, s)
    tt = t.view(1, s, 1)
    allowed = (u <= tt) & (u > tt - c["sliding_window"]) & (u >= ds.view(b, s, 1))  # [b, t, u]
    keys = kv
    if kind != SLIDING:
        m = c["rates"][kind]
        meta = lay["entries"][m]
        ent = compress(c, x, p, pre + "compressor.", m, d, kind == CSA, meta)
        first, valid, doc = meta[:3]
        vis = (valid[:, None, :] & (doc[:, None, :] == ds[:, :, None])
               & (first[:, None, :] + m - 1 <= t.view(1, s, 1)))  # [b, s, n]
        if kind == CSA and csa_mode == "topk":
            vis = indexer(c, p, pre, x, qr, vis, meta, L, trace)
        keys = torch.cat([kv, ent], 1)
        allowed = torch.cat([allowed, vis], -1)
    logits = torch.einsum("bshd,bjd->bhsj", q, keys) * d ** -0.5
    logits = logits.masked_fill(~allowed[:, None], -math.inf)
    sink = p[pre + "attn_sink"].to(logits.dtype).view(1, H, 1, 1).expand(b, H, s, 1)
    prob = torch.softmax(torch.cat([logits, sink], -1), dim=-1)[..., :-1]  # padding rows: all sink, output 0
    o = rope_last(torch.einsum("bhsj,bjd->bshd", prob, keys), (cs[0][:, None], cs[1][:, None]), r, -1.0)
    G = c["o_groups"]
    wa = p[pre + "wo_a.weight"].view(G, c["o_lora_rank"], -1)
    y = torch.einsum("bsgi,goi->bsgo", o.reshape(b, s, G, -1), wa).flatten(2)
    return y @ p[pre + "wo_b.weight"].T


def indexer(c, p, pre, x, qr, vis, meta, L, trace):
    """CSA's lightning indexer (no gradient: its output is a selection): scores over the visible
    entries, the top index_topk (ties to the smaller entry), as a mask [b, s, n]."""
    b, s, _ = x.shape
    nI, dI = c["index_n_heads"], c["index_head_dim"]
    with torch.no_grad():
        ie = compress(c, x, p, pre + "indexer.compressor.", c["rates"][CSA], dI, True, meta)  # [b, n, dI]
        cs = rope_cs(c, "compress", torch.arange(s, device=x.device), x.dtype)
        qi = rope_last((qr @ p[pre + "indexer.wq_b.weight"].T).view(b, s, nI, dI), (cs[0][:, None], cs[1][:, None]),
                       c["rope_dim"])
        w = (x @ p[pre + "indexer.weights_proj.weight"].T) * nI ** -0.5  # [b, s, nI]
        sc = torch.einsum("bshd,bnd->bshn", qi, ie).relu() * dI ** -0.5
        score = (sc * w[..., None]).sum(2).masked_fill(~vis, -math.inf)  # [b, s, n]
        n = score.shape[-1]
        k = min(c["index_topk"], n)
        top = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :k]
        top = torch.where(torch.gather(vis, 2, top), top, torch.full_like(top, -1))
        sel = torch.zeros(b, s, n + 1, dtype=torch.bool, device=x.device)
        sel.scatter_(2, torch.where(top >= 0, top, torch.full_like(top, n)), True)
    if trace is not None:
        trace[f"layer{L}.topk"] = top
    return sel[..., :n]


def f32_island(x):
    """mHC runs in f32 on every device (DESIGN.md section 10; transformers' .float()): under
    autocast (the GPU's bf16 arm) it is switched off inside."""
    on = torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()
    return torch.autocast(x.device.type, enabled=False) if on else contextlib.nullcontext()


def wide(t):
    """At least f32 (a float64 twin stays float64)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def hc_mix(c, X, fn, base, scale):
    """mHC on the streams X [b, s, N, D]: post [b,s,N], comb [b,s,N,N] (Sinkhorn) and the sublayer
    input sum_i pre_i X_i."""
    N, eps = c["hc_mult"], c["hc_eps"]
    with f32_island(X):
        X, fn, base, scale = wide(X), wide(fn), wide(base), wide(scale)
        z = norm(X.flatten(2), c["rms_norm_eps"]) @ fn.T
        pre = torch.sigmoid(z[..., :N] * scale[0] + base[:N]) + eps
        post = 2 * torch.sigmoid(z[..., N : 2 * N] * scale[1] + base[N : 2 * N])
        comb = torch.softmax(z[..., 2 * N :].unflatten(-1, (N, N)) * scale[2] + base[2 * N :].view(N, N), dim=-1) + eps
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + eps)
            comb = comb / (comb.sum(-2, keepdim=True) + eps)
        return post, comb, (pre[..., None] * X).sum(2)


def hc_post(X, post, comb, y):
    """X'_k = post_k y + sum_i comb[i, k] X_i."""
    return post[..., None] * y[:, :, None] + torch.einsum("bsik,bsid->bskd", comb, X)


def swiglu(c, p, pre, x):
    lim = c["swiglu_limit"]
    g = (x @ p[pre + "w1.weight"].T).clamp(max=lim)
    u = (x @ p[pre + "w3.weight"].T).clamp(-lim, lim)
    return (F.silu(g) * u) @ p[pre + "w2.weight"].T


def moe(c, p, tabs, L, x, ids, trace):
    """V4's MoE on x [b, s, D]: scores sqrtsoftplus (or sigmoid) of the router logits, experts by
    top-k of score + bias (hash layers: tid2eid[input_id]), weights the chosen scores normalised
    (+1e-20) times routed_scaling_factor; clamped SwiGLU routed experts, looped per expert over
    its tokens, plus the shared expert."""
    pre = f"model.layers.{L}.ffn."
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    u = x @ p[pre + "gate.weight"].T
    sc = torch.sqrt(F.softplus(u)) if c["scoring_func"] == "sqrtsoftplus" else torch.sigmoid(u)
    if c["hash"][L]:
        idx = tabs[pre + "gate.tid2eid"][ids.reshape(-1)]
    else:
        idx = (sc.detach() + p[pre + "gate.bias"].detach()).topk(c["num_experts_per_tok"], dim=-1).indices
    w = sc.gather(1, idx)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * c["routed_scaling_factor"]
    if trace is not None:
        trace[f"layer{L}.experts"] = idx
    y = torch.zeros_like(x)
    for e in range(c["n_routed_experts"]):
        tok, slot = torch.nonzero(idx == e, as_tuple=True)
        if tok.numel():
            y = y.index_add(0, tok, (swiglu(c, p, f"{pre}experts.{e}.", x[tok]) * w[tok, slot, None]).to(y.dtype))
    return (y + swiglu(c, p, pre + "shared_experts.", x)).view(shape)


def layout(c, ds, de):
    """The batch's document metadata (built once per batch): doc_start [b, s], the row positions,
    each compress rate's entries (first, valid, doc, has_prev)."""
    dsn, den = ds.cpu().numpy(), de.cpu().numpy()
    rates = {c["rates"][k] for k in c["layer_types"] if k != SLIDING}
    ent = {m: tuple(torch.from_numpy(a).to(ds.device) for a in entries(dsn, den, m)) for m in rates}
    return {"ds": ds, "pos": torch.arange(ds.shape[1], device=ds.device), "entries": ent}


def logits(c, p, tabs, ids, lay, csa_mode="dense", trace=None):
    """The model's logits [b, s, V] for input_ids [b, s]; `trace` (a dict) gets each CSA layer's
    top-k table and each layer's experts."""
    eps = c["rms_norm_eps"]
    e = p["model.embed_tokens.weight"][ids]
    X = e[:, :, None].expand(-1, -1, c["hc_mult"], -1)
    for L in range(c["num_hidden_layers"]):
        pre = f"model.layers.{L}."
        post, comb, col = hc_mix(c, X, p[pre + "hc_attn_fn"], p[pre + "hc_attn_base"], p[pre + "hc_attn_scale"])
        a = attention(c, p, L, norm(col, eps, p[pre + "attn_norm.weight"]), lay, csa_mode, trace)
        X = hc_post(X, post, comb, a)
        post, comb, col = hc_mix(c, X, p[pre + "hc_ffn_fn"], p[pre + "hc_ffn_base"], p[pre + "hc_ffn_scale"])
        X = hc_post(X, post, comb, moe(c, p, tabs, L, norm(col, eps, p[pre + "ffn_norm.weight"]), ids, trace))
    with f32_island(X):
        X = wide(X)
        z = norm(X.flatten(2), eps) @ wide(p["model.hc_head.hc_fn"]).T
        hpre = torch.sigmoid(z * wide(p["model.hc_head.hc_scale"]) + wide(p["model.hc_head.hc_base"])) + c["hc_eps"]
        h = (hpre[..., None] * X).sum(2)
    h = norm(h, eps, p["model.norm.weight"])
    return h @ p.get("head.weight", p["model.embed_tokens.weight"]).T


def step_loss(c, p, tabs, ids, lay, targets, keep, csa_mode="dense"):
    """The LM loss: cross-entropy over the kept targets (train_twin.batch_masks), their mean."""
    lg = logits(c, p, tabs, ids, lay, csa_mode)
    ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), targets.reshape(-1), reduction="none")
    return (ce * keep.reshape(-1)).sum() / keep.sum().clamp(min=1)
