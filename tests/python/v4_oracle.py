# An independent float64 DeepseekV4ForCausalLM (written from docs/deepseek_v4_math.md, not from
# transformers' code), reading the checkpoint by DeepSeek's names: the float64 oracle for hmla's V4
# layers. Checked here against the fixtures of tests/hf/make_v4_fixtures.py (transformers 5.24 with
# its f32 casts lifted to float64): logits, each module's output, CSA top-k, MoE experts, loss and
# every parameter's gradient. Two float64 evaluations of the same function in different operation
# orders differ by a few hundred ulps of the largest intermediate at this depth; the bound 1e-9
# (relative to each tensor's max) is far above that and far below any real error (f32: ~1e-6).
# hmla's hybrid_mla layers (DESIGN.md sections 2-6 and 10: the MLA layer in its mode, the lightning
# indexer and its KL) are here too, written from DESIGN.md; tests/python/v4_hybrid_fixture.py runs
# them (the module's functions, after setup()) and checks them by finite differences.
# Runs on Debian's python3-torch: /usr/bin/python3 tests/python/v4_oracle.py; the MTP layers'
# oracle (v4_mtp_oracle.py) runs after it on the same model (--write-mtp-fixture: makes its fixture).
import json, math, sys
import numpy as np, torch
HERE = __import__("os").path.dirname(__import__("os").path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_lite as st
torch.set_default_dtype(torch.float64)
D = HERE + "/../hf/fixtures/"
j = lambda d, n: d[n + "_hi"].astype(np.float64) + np.where(np.isinf(d[n + "_hi"]), 0, d[n + "_lo"].astype(np.float64))
def setup(config, weights, input_ids, dtype=torch.float64):
    """The model the functions below compute: config (a dict), weights (name -> numpy; floating ones
    become leaf tensors of `dtype` that require grad), input_ids [b, s]. float32 is the naive instance
    STYLE.md's rule measures (every op in it); float64 the oracle."""
    global c, W, ids, b, s, Dm, H, hd, rd, eps, hc, hce, IF, DT, MODES
    torch.set_default_dtype(dtype)
    DT, c = dtype, config
    W = {k: torch.tensor(v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in weights.items()}
    for k, v in W.items():
        if v.is_floating_point(): W[k] = v.to(dtype).requires_grad_(True)
    ids = torch.tensor(input_ids); b, s = ids.shape
    Dm, H, hd, rd = c["hidden_size"], c["num_attention_heads"], c["head_dim"], int(c["head_dim"] * c["partial_rotary_factor"])
    eps, hc, hce = c["rms_norm_eps"], c["hc_mult"], c["hc_eps"]
    IF = {k: inv_freq(p) for k, p in c["rope_parameters"].items()}
    if "hybrid_mla_qk_rope_head_dim" in c: IF["hybrid"] = inv_freq(c["rope_parameters"]["main"], c["hybrid_mla_qk_rope_head_dim"])
    MODES = c.get("hmla_layer_modes", ["mha"] * c["num_hidden_layers"])
def rms(x, w=None):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w
def inv_freq(p, dim=None):
    base, dim = p["rope_theta"], dim or rd
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if p["rope_type"] == "default": return 1.0 / pos
    f, om, bf, bs = p["factor"], p["original_max_position_embeddings"], p["beta_fast"], p["beta_slow"]
    cd = lambda r: dim * math.log(om / (r * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = max(math.floor(cd(bf)), 0), min(math.ceil(cd(bs)), dim - 1)
    if lo == hi: hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    ext = 1 - ramp
    return (1 / (f * pos)) * (1 - ext) + (1 / pos) * ext
def rope(x, pos, kind, sign=1.0, r=None):  # interleaved pairs on the LAST r (rd) channels; x [..., n, d], pos [n]
    r = r or rd
    ang = pos[:, None].double() * IF[kind][None]  # [n, r/2], in float64, then the model's dtype
    co, si = torch.cos(ang).to(x.dtype), (sign * torch.sin(ang)).to(x.dtype)  # a no-op but in the f32 evaluation
    z = x[..., -r:]; x0, x1 = z[..., 0::2], z[..., 1::2]
    o = torch.stack([x0 * co - x1 * si, x1 * co + x0 * si], -1).flatten(-2)
    return torch.cat([x[..., :-r], o], -1)
def lin(x, w): return x @ w.T
cap = {}
def hcmix(X, p):  # X [b,s,hc,D]
    fn, base, sc = W[p + "_fn"], W[p + "_base"], W[p + "_scale"]
    z = lin(rms(X.flatten(2)), fn)
    pre = torch.sigmoid(z[..., :hc] * sc[0] + base[:hc]) + hce
    post = 2 * torch.sigmoid(z[..., hc:2 * hc] * sc[1] + base[hc:2 * hc])
    comb = torch.softmax(z[..., 2 * hc:].unflatten(-1, (hc, hc)) * sc[2] + base[2 * hc:].view(hc, hc), -1) + hce
    comb = comb / (comb.sum(-2, keepdim=True) + hce)
    for _ in range(c["hc_sinkhorn_iters"] - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hce); comb = comb / (comb.sum(-2, keepdim=True) + hce)
    return pre, post, comb, (pre[..., None] * X).sum(2)
def compress(x, p, m, d, overlap, kind="compress"):
    kv, g = lin(x, W[p + "wkv.weight"]), lin(x, W[p + "wgate.weight"])
    n = s // m
    kv = kv[:, :n * m].unflatten(1, (n, m)); g = g[:, :n * m].unflatten(1, (n, m)) + W[p + "ape"]
    if overlap:  # slots: [a-series of window w-1 (first d) | b-series of window w (last d)]
        za = torch.zeros(b, 1, m, d, dtype=DT); ninf = torch.full((b, 1, m, d), -math.inf, dtype=DT)
        kv = torch.cat([torch.cat([za, kv[:, :-1, :, :d]], 1), kv[..., d:]], 2)
        g = torch.cat([torch.cat([ninf, g[:, :-1, :, :d]], 1), g[..., d:]], 2)
    e = rms((kv * torch.softmax(g, 2)).sum(2), W[p + "norm.weight"])
    return rope(e, torch.arange(n) * m, kind)  # [b, n, d]
def rope_half(x, pos, r):  # rotate-half on the FIRST r channels (the MLA indexer's layout, DESIGN.md section 4)
    ang = pos[:, None].double() * IF["hybrid"][None]
    co, si = torch.cos(ang).to(DT), torch.sin(ang).to(DT)
    x1, x2 = x[..., :r // 2], x[..., r // 2:r]
    return torch.cat([x1 * co - x2 * si, x2 * co + x1 * si, x[..., r:]], -1)
NEG = -1e30  # a masked score: exp underflows to exactly 0, and a row without candidates stays finite
def index_scores(x, cq, L, pos, p=None):  # DESIGN.md section 5 on detached x, cq: I [b, s, s] (every key)
    p, HI, DI, r = (p or f"model.layers.{L}.self_attn.") + "indexer.", c["index_n_heads"], c["index_head_dim"], c["hybrid_mla_qk_rope_head_dim"]
    qi = rope_half(lin(cq, W[p + "wq_b.weight"]).unflatten(-1, (HI, DI)).transpose(1, 2), pos, r)  # [b,HI,s,DI]
    k = lin(x, W[p + "wk.weight"]); mu = k.mean(-1, keepdim=True); var = ((k - mu) ** 2).mean(-1, keepdim=True)
    ki = rope_half((k - mu) / torch.sqrt(var + 1e-6) * W[p + "k_norm.weight"] + W[p + "k_norm.bias"], pos, r)  # [b,s,DI]
    w = lin(x, W[p + "weights_proj.weight"]) * HI ** -0.5 * DI ** -0.5  # [b,s,HI]
    dots = qi @ ki[:, None].transpose(-1, -2); cap[f"layer{L}.index_dots"] = dots  # [b,HI,s,s]
    return (torch.relu(dots) * w.transpose(1, 2)[..., None]).sum(1)
def indexer_kl(lg, I, cand):  # DESIGN.md section 6: sum_t kl(t) / valid_rows (no padding: b s rows)
    lgm = lg.detach().masked_fill(~cand[:, None], NEG)  # the target from detached logits, no sink
    P = torch.exp(lgm - torch.logsumexp(lgm, -1, keepdim=True)).mean(1)
    Im = I.masked_fill(~cand, NEG); logq = Im - torch.logsumexp(Im, -1, keepdim=True)
    term = torch.where(cand, P * (torch.log(torch.where(cand, P, 1.0)) - logq), torch.zeros((), dtype=DT))
    return term.sum() / (b * s)
def hybrid_attention(x, L, mode, p=None):  # DESIGN.md sections 2-6 (MHA form: latent MQA's scores are the same)
    p, Hh = p or f"model.layers.{L}.self_attn.", c["hybrid_mla_num_attention_heads"]  # p: an MTP layer's self_attn.
    Dn, Dr, Dv, Rkv = (c["hybrid_mla_" + k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
    K, Wn, pos = c.get("hybrid_mla_index_topk", 2048), c["sliding_window"], torch.arange(s)
    cq = rms(lin(x, W[p + "q_a_proj.weight"]), W[p + "q_a_layernorm.weight"])
    q = lin(cq, W[p + "q_b_proj.weight"]).unflatten(-1, (Hh, Dn + Dr)).transpose(1, 2)  # [b,Hh,s,Dn+Dr]
    q = rope(q, pos, "hybrid", r=Dr)
    kva = lin(x, W[p + "kv_a_proj_with_mqa.weight"])
    kpe = rope(kva[..., Rkv:], pos, "hybrid", r=Dr)  # [b,s,Dr], shared by the heads
    kvb = lin(rms(kva[..., :Rkv], W[p + "kv_a_layernorm.weight"]), W[p + "kv_b_proj.weight"]).unflatten(-1, (Hh, Dn + Dv)).transpose(1, 2)
    k = torch.cat([kvb[..., :Dn], kpe[:, None].expand(b, Hh, s, Dr)], -1)
    lg = (q @ k.transpose(-1, -2)) * (Dn + Dr) ** -0.5  # [b,Hh,s,s]; default main RoPE: m = 1
    t, u = pos[:, None], pos[None, :]
    allowed = (u <= t).expand(b, s, s)  # A(t): one document per row
    if mode in ("dsa_warmup", "dsa_sparse"):
        I = index_scores(x.detach(), cq.detach(), L, pos, p); cap[f"layer{L}.index_scores"] = I
        cand = allowed
        if mode == "dsa_sparse":  # S(t): the top K of A(t) without its last Wn keys, ties to the smaller j
            R = (u <= t - Wn).expand(b, s, s)
            order = torch.sort(I.detach().masked_fill(~R, -math.inf), stable=True, dim=-1, descending=True).indices[..., :K]
            cand = torch.zeros(b, s, s, dtype=torch.bool).scatter_(-1, order, True) & R
            cap[f"layer{L}.selected"] = cand
            allowed = cand | ((u <= t) & (u > t - Wn))
        cap[f"layer{L}.kl"] = indexer_kl(lg, I, cand)
    sink = W[p + "softmax_offset"].view(1, Hh, 1, 1).expand(b, Hh, s, 1)
    pr = torch.softmax(torch.cat([lg.masked_fill(~allowed[:, None], -math.inf), sink], -1), -1)[..., :-1]
    o = (pr @ kvb[..., Dn:]).transpose(1, 2).flatten(2)  # [b,s,Hh Dv]
    return lin(o, W[p + "o_proj.weight"])
def attention(x, L, kind, ltype, p=None, kvn="norm.weight"):  # p: the block's "attn." prefix (an MTP layer's)
    if ltype == "hybrid_mla": return hybrid_attention(x, L, MODES[L])
    p = p or f"model.layers.{L}.attn."
    qr = rms(lin(x, W[p + "wq_a.weight"]), W[p + "q_norm.weight"])
    pos = torch.arange(s); rk = "main" if ltype == "sliding_attention" else "compress"
    q = rope(rms(lin(qr, W[p + "wq_b.weight"]).unflatten(-1, (H, hd))).transpose(1, 2), pos, rk)  # [b,H,s,hd]
    kv = rope(rms(lin(x, W[p + "wkv.weight"]), W[p + kvn]), pos, rk)  # [b,s,hd]
    t, u = pos[:, None], pos[None, :]
    mask = torch.where((u <= t) & (u > t - c["sliding_window"]), 0.0, -math.inf).expand(b, s, s)
    keys = kv
    if ltype != "sliding_attention":
        m = c["compress_rates"][ltype]; csa = ltype == "compressed_sparse_attention"
        ent = compress(x, p + "compressor.", m, hd, csa); cap[f"layer{L}.entries"] = ent
        T = ent.shape[1]; vis = torch.arange(T)[None, :] < ((pos + 1) // m)[:, None]  # [s,T]
        if csa:
            ie = compress(x, p + "indexer.compressor.", m, c["index_head_dim"], True); cap[f"layer{L}.index_entries"] = ie
            qi = rope(lin(qr, W[p + "indexer.wq_b.weight"]).unflatten(-1, (c["index_n_heads"], c["index_head_dim"])).transpose(1, 2), pos, "compress")
            sc = torch.relu(qi @ ie[:, None].transpose(-1, -2)) * c["index_head_dim"] ** -0.5  # [b,h,s,T]
            w = lin(x, W[p + "indexer.weights_proj.weight"]) * c["index_n_heads"] ** -0.5  # [b,s,h]
            score = (sc * w.transpose(1, 2)[..., None]).sum(1).masked_fill(~vis, -math.inf)
            k = min(c["index_topk"], T)
            top = score.detach().topk(k, -1).indices
            top = torch.where(torch.gather(vis.expand(b, s, T), 2, top), top, -1)
            cap[f"layer{L}.topk"] = top; cap[f"layer{L}.index_scores"] = score
            sel = torch.zeros(b, s, T + 1, dtype=torch.bool).scatter_(2, torch.where(top >= 0, top, T), True)[..., :T]
            cm = torch.where(sel, 0.0, -math.inf)
        else:
            cm = torch.where(vis, 0.0, -math.inf).expand(b, s, T)
        keys = torch.cat([kv, ent], 1); mask = torch.cat([mask, cm], -1)
    lg = (q @ keys[:, None].transpose(-1, -2)) * hd ** -0.5 + mask[:, None]
    sink = W[p + "attn_sink"].view(1, H, 1, 1).expand(b, H, s, 1)
    pr = torch.softmax(torch.cat([lg, sink], -1), -1)[..., :-1]
    o = rope(pr @ keys[:, None], pos, rk, -1.0)  # [b,H,s,hd]
    o = o.transpose(1, 2).reshape(b, s, c["o_groups"], -1)
    wa = W[p + "wo_a.weight"].view(c["o_groups"], c["o_lora_rank"], -1)
    o = torch.einsum("bsgi,goi->bsgo", o, wa).flatten(2)
    return lin(o, W[p + "wo_b.weight"])
def swiglu(x, p, lim):
    g = lin(x, W[p + "w1.weight"]).clamp(max=lim); u = lin(x, W[p + "w3.weight"]).clamp(-lim, lim)
    return lin(torch.nn.functional.silu(g) * u, W[p + "w2.weight"])
def moe(x, L, mtype, p=None):
    p = p or f"model.layers.{L}.ffn."; lim = c["swiglu_limit"]; E, k = c["n_routed_experts"], c["num_experts_per_tok"]
    fl = x.reshape(-1, Dm); sc = torch.sqrt(torch.nn.functional.softplus(lin(fl, W[p + "gate.weight"])))
    if mtype != "hash_moe": cap[f"layer{L}.router"] = cap[f"layer{L}.choice"] = (sc + W[p + "gate.bias"]).detach()
    idx = W[p + "gate.tid2eid"][ids.reshape(-1)] if mtype == "hash_moe" else (sc + W[p + "gate.bias"]).detach().topk(k, -1).indices
    wts = sc.gather(1, idx); wts = wts / (wts.sum(-1, keepdim=True) + 1e-20) * c["routed_scaling_factor"]
    cap[f"layer{L}.experts"] = idx.sort(-1).values
    out = torch.zeros_like(fl)
    for e in range(E):
        hit = (idx == e)
        out = out + hit.any(-1, keepdim=True) * (wts * hit).sum(-1, keepdim=True) * swiglu(fl, p + f"experts.{e}.", lim)
    return out.view(b, s, Dm) + swiglu(x, p + "shared_experts.", lim)
def model_logits():
    X = W["model.embed_tokens.weight"][ids][:, :, None].expand(b, s, hc, Dm)
    for L in range(c["num_hidden_layers"]):
        cap[f"layer{L}.streams"] = X
        pre, post, comb, col = hcmix(X, f"model.layers.{L}.hc_attn")
        cap[f"layer{L}.attn_hc.collapsed"], cap[f"layer{L}.attn_hc.comb"] = col, comb
        a = attention(rms(col, W[f"model.layers.{L}.attn_norm.weight"]), L, None, c["layer_types"][L]); cap[f"layer{L}.attn_out"] = a
        X = post[..., None] * a[:, :, None] + torch.einsum("bsik,bsid->bskd", comb, X)
        pre, post, comb, col = hcmix(X, f"model.layers.{L}.hc_ffn"); cap[f"layer{L}.ffn_hc.collapsed"] = col
        mo = moe(rms(col, W[f"model.layers.{L}.ffn_norm.weight"]), L, c["mlp_layer_types"][L]); cap[f"layer{L}.mlp_out"] = mo
        X = post[..., None] * mo[:, :, None] + torch.einsum("bsik,bsid->bskd", comb, X)
    cap[f"layer{c['num_hidden_layers']}.streams"] = X
    z = rms(X.flatten(2)) @ W["model.hc_head.hc_fn"].T
    pre = torch.sigmoid(z * W["model.hc_head.hc_scale"] + W["model.hc_head.hc_base"]) + hce
    hh = (pre[..., None] * X).sum(2); cap["hc_head"] = hh
    return lin(rms(hh, W["model.norm.weight"]), W["head.weight"])
def mean_ce():  # hmla's LM loss: mean CE over the b (s - 1) next tokens (one document per row, no padding)
    lg = model_logits(); v = lg.shape[-1]
    return torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
def main():
    F = st.load(D + "v4/fixture.safetensors"); M = st.load(D + "v4_modules/modules.safetensors"); G = st.load(D + "v4_grads/grads.safetensors")
    setup(json.load(open(D + "v4/config.json")), st.load(D + "v4/model.safetensors"), F["input_ids"])
    logits = model_logits()
    failures = []
    def near(name, got, ref, tol=1e-9):
        d = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
        print(name, d)
        if not d <= tol: failures.append(f"{name}: relative difference {d}")
    near("logits", logits.detach().numpy(), j(F, "logits"))
    for n in [f"layer{L}.{x}" for L in range(4) for x in ("attn_hc.collapsed","attn_out","ffn_hc.collapsed","mlp_out")]:
        near(n, cap[n].detach().numpy()[0], j(M, n))
    for L in (1, 3):
        if not np.array_equal(cap[f"layer{L}.topk"].numpy(), F[f"layer{L}.topk"]): failures.append(f"layer{L}.topk differs")
    for L in range(4):
        if not np.array_equal(cap[f"layer{L}.experts"].numpy(), F[f"layer{L}.experts"]): failures.append(f"layer{L}.experts differ")
    v = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
    print("loss", loss.item(), j(G, "loss")[0])
    loss.backward()
    worst = 0
    for k, t in W.items():
        if not t.is_floating_point() or k.endswith("gate.bias"): continue
        g = t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
        if k + "_hi" not in G: assert t.grad is None or not t.grad.any(), k; continue
        ref = j(G, k); d = np.abs(g - ref).max() / max(np.abs(ref).max(), 1e-30)
        worst = max(worst, d)
        if not d <= 1e-9: failures.append(f"grad {k}: relative difference {d}")
    print("worst relative grad diff", worst)
    # The oracle's own gradients by central differences in float64 (h = 1e-5: truncation ~h^2 times the
    # third derivative and rounding 2^-52 |L| / h are both ~1e-10, far below the 1e-7 allowed): one
    # element of a tensor of every kind. Top-k and router choices are piecewise constant; the fixture's
    # smallest gaps (made_with.json) are far above the perturbation.
    def mean_ce():
        with torch.no_grad():
            lg = model_logits()
            return torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1)).item()
    fd_worst, rng = 0.0, np.random.default_rng(0)
    for k in ["model.embed_tokens.weight", "model.layers.0.hc_attn_fn", "model.layers.1.hc_attn_scale",
              "model.layers.1.attn.wq_a.weight", "model.layers.1.attn.q_norm.weight", "model.layers.1.attn.wkv.weight",
              "model.layers.2.attn.attn_sink", "model.layers.2.attn.compressor.ape", "model.layers.3.attn.compressor.wgate.weight",
              "model.layers.3.attn.wo_a.weight", "model.layers.0.attn.wo_b.weight", "model.layers.1.ffn.gate.weight",
              "model.layers.3.ffn.experts.1.w1.weight", "model.layers.0.ffn.shared_experts.w3.weight",
              "model.layers.2.ffn_norm.weight", "model.hc_head.hc_scale", "model.norm.weight", "head.weight"]:
        t = W[k]; i = tuple(int(rng.integers(0, n)) for n in t.shape)
        with torch.no_grad():
            x0 = t[i].item(); t[i] = x0 + 1e-5; up = mean_ce(); t[i] = x0 - 1e-5; dn = mean_ce(); t[i] = x0
        fd, g = (up - dn) / 2e-5, t.grad[i].item()
        fd_worst = max(fd_worst, abs(fd - g))
        if not abs(fd - g) <= 1e-7: failures.append(f"finite difference {k}{list(i)}: {fd} vs autograd {g}")
    print("worst |finite difference - autograd|", fd_worst)
    near("loss", np.array([loss.item()]), j(G, "loss"))
    import v4_mtp_oracle  # the MTP layers (docs/deepseek_v4_math.md section 14) on this model
    global W0
    W0 = W  # the checkpoint's weights; the MTP oracle evaluates with its own W (float64, then float32)
    if "--write-mtp-fixture" in sys.argv: v4_mtp_oracle.write(sys.modules[__name__])
    else: failures += v4_mtp_oracle.check(sys.modules[__name__])
    for f in failures: print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__": main()
