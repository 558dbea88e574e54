#!/usr/bin/env python3
"""PyTorch twin of hmla's MLA attention layer (modes mha, mqa_full_causal and dsa_warmup; DESIGN.md
sections 2-6): q path with or without q LoRA, kv_a split into the RMSNorm'd latent and the shared
rope key, interleaved RoPE with YaRN, the dense per-document core, o_proj; in dsa_warmup also the
lightning indexer (rotate-half RoPE, LayerNorm'd key) on detached inputs, its top-k selection,
and the dense KL against the detached attention, by autograd through materialised tensors. Written from the
definitions, independently of hmla's C++. For each case it writes a config, weights and inputs,
runs `hmla layer`, and compares the output and every gradient by the STYLE.md rule (float64
reference; twice the float32 twin's error plus 8 ulps). Exit status 1 on any mismatch."""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from attn_twin import check_by_rule, layout_doc_start, torch_attention  # noqa: E402


def yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_freqs(cfg):
    """inv_freq [Dr/2] and the factor on cos/sin, as transformers' YaRN computes them."""
    dim, base = cfg["qk_rope_head_dim"], cfg.get("rope_theta", 10000.0)
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    base = rp.get("rope_theta", base)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if rp.get("rope_type", rp.get("type", "default")) != "yarn":
        return 1.0 / pos_freqs, 1.0
    factor = rp["factor"]
    mscale, mscale_all = rp.get("mscale"), rp.get("mscale_all_dim")
    if rp.get("attention_factor") is not None:
        af = rp["attention_factor"]
    elif mscale and mscale_all:
        af = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
    else:
        af = yarn_mscale(factor, 1.0)
    max_pos = rp.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
    beta_fast, beta_slow = rp.get("beta_fast", 32), rp.get("beta_slow", 1)

    def corr_dim(rot):
        return (dim * math.log(max_pos / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra_factor = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra_factor) + (1.0 / pos_freqs) * extra_factor
    return inv, af


def softmax_scale(cfg):
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    m = 1.0
    if rp.get("rope_type", rp.get("type")) == "yarn" and rp.get("mscale_all_dim") and rp["factor"] > 1:
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0
    return m * m / math.sqrt(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_interleaved(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2)


def rope_half(x, cos, sin, dr):
    x1, x2, rest = x[..., : dr // 2], x[..., dr // 2 : dr], x[..., dr:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def allowed_mask(doc_start, s):
    t = torch.arange(s).view(1, s, 1)
    j = torch.arange(s).view(1, 1, s)
    return (j <= t) & (j >= doc_start.view(-1, s, 1))  # [b, t, j]


def indexer_scores(cfg, w, x, cq, cos, sin):
    b, s, _ = x.shape
    HI, DI, Dr = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    qI = rope_half((cq @ w["indexer.wq_b.weight"].T).view(b, s, HI, DI), cos[:, None, :], sin[:, None, :], Dr)
    kI = torch.nn.functional.layer_norm(x @ w["indexer.wk.weight"].T, (DI,), w["indexer.k_norm.weight"],
                                        w["indexer.k_norm.bias"], eps=1e-6)
    kI = rope_half(kI, cos, sin, Dr)
    wts = (x @ w["indexer.weights_proj.weight"].T) * HI ** -0.5 * DI ** -0.5
    return (torch.einsum("bthd,bjd->bthj", qI, kI).relu() * wts[..., None]).sum(2)  # [b, t, j]


def table_mask(table, s, lo, hi):
    """[b, t, j]: j is listed in table[b, t, lo:hi]."""
    b = table.shape[0]
    m = torch.zeros(b, s, s + 1, dtype=torch.bool)
    idx = torch.from_numpy(table[..., lo:hi]).long()
    m.scatter_(2, torch.where(idx >= 0, idx, torch.full_like(idx, s)), True)
    return m[..., :s]


def indexer_kl(cfg, I, q, k, allowed, scale, row_weight):
    """coeff * sum_t rw[t] kl(t), P from the detached attention logits, over the candidate sets."""
    b, s = I.shape[:2]
    row_ok = allowed.any(-1)
    neg = torch.tensor(-float("inf"), dtype=I.dtype)
    logits = torch.einsum("bthd,bjhd->bhtj", q, k) * scale
    logits = torch.where(allowed[:, None] & row_ok[:, None, :, None], logits, neg)
    logits = torch.where(row_ok[:, None, :, None], logits, torch.zeros_like(logits))
    P = torch.softmax(logits, dim=-1).mean(1) * row_ok[..., None]
    Im = torch.where(allowed, I, neg)
    Im = torch.where(row_ok[..., None], Im, torch.zeros_like(Im))
    logQ = torch.log_softmax(Im, dim=-1)
    terms = torch.where(P > 0, P * (torch.log(torch.where(P > 0, P, torch.ones_like(P))) - logQ), torch.zeros_like(P))
    kl = terms.sum(-1)
    return cfg.get("indexer_loss_coeff", 0.01) * (kl * row_weight).sum()


def topk_table(I, doc_start, K, W):
    b, s = I.shape[:2]
    out = -np.ones((b, s, K + W), dtype=np.int64)
    gaps_ok = np.ones((b, s), dtype=bool)
    for r in range(b):
        for t in range(s):
            lo = int(doc_start[r, t])
            if lo > t:
                continue
            r_end = max(lo, t + 1 - W)
            js = sorted(range(lo, r_end), key=lambda j: (-I[r, t, j], j))
            n = min(K, len(js))
            out[r, t, :n] = js[:n]
            if len(js) > K and I[r, t, js[K - 1]] - I[r, t, js[K]] < 1e-4:
                gaps_ok[r, t] = False
            out[r, t, K : K + (t + 1 - r_end)] = range(r_end, t + 1)
    return out, gaps_ok


def mla_layer(cfg, w, x, doc_start, mode, extras=None):
    b, s, _ = x.shape
    H, Dn, Dr, Dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    Rkv, eps = cfg["kv_lora_rank"], cfg["rms_norm_eps"]
    if cfg.get("q_lora_rank"):
        cq = rms(x @ w["q_a_proj.weight"].T, w["q_a_layernorm.weight"], eps)
        q = cq @ w["q_b_proj.weight"].T
    else:
        q = x @ w["q_proj.weight"].T
    q = q.view(b, s, H, Dn + Dr)
    q_nope, q_pe = q[..., :Dn], q[..., Dn:]
    kva = x @ w["kv_a_proj_with_mqa.weight"].T
    c = rms(kva[..., :Rkv], w["kv_a_layernorm.weight"], eps)
    inv, af = rope_freqs(cfg)
    ang = torch.from_numpy(np.arange(s, dtype=np.float64)[:, None] * inv[None, :])
    cos, sin = (torch.cos(ang) * af).to(x.dtype), (torch.sin(ang) * af).to(x.dtype)
    q_pe = rope_interleaved(q_pe, cos[:, None, :], sin[:, None, :])
    k_pe = rope_interleaved(kva[..., Rkv:], cos, sin)
    scale = softmax_scale(cfg)
    sink = w.get("softmax_offset")
    if mode in ("mha", "dsa_warmup"):
        kv = (c @ w["kv_b_proj.weight"].T).view(b, s, H, Dn + Dv)
        k = torch.cat([kv[..., :Dn], k_pe[:, :, None, :].expand(b, s, H, Dr)], dim=-1)
        qq = torch.cat([q_nope, q_pe], -1)
        o, _ = torch_attention(qq, k, kv[..., Dn:], doc_start, sink, scale)
        if mode == "dsa_warmup":  # the indexer on detached inputs, the KL on detached q/k
            extras["I"] = indexer_scores(cfg, w, x.detach(), cq.detach(), cos, sin)
            extras["loss"] = indexer_kl(cfg, extras["I"], qq.detach(), k.detach(), allowed_mask(doc_start, s), scale,
                                        extras["rw"])
    else:
        kvb = w["kv_b_proj.weight"].view(H, Dn + Dv, Rkv)
        qa = torch.cat([torch.einsum("bshd,hdr->bshr", q_nope, kvb[:, :Dn]), q_pe], dim=-1)
        ka = torch.cat([c, k_pe], dim=-1)[:, :, None, :]
        attended = None
        if mode == "dsa_sparse":  # over hmla's selection (checked separately) and the window
            K, table = cfg["index_topk"], extras["table"]
            attended = table_mask(table, s, 0, table.shape[-1])
            extras["I"] = indexer_scores(cfg, w, x.detach(), cq.detach(), cos, sin)
            extras["loss"] = indexer_kl(cfg, extras["I"], qa.detach(), ka.detach(), table_mask(table, s, 0, K), scale,
                                        extras["rw"])
        oa, _ = torch_attention(qa, ka, c[:, :, None, :], doc_start, sink, scale, attended)
        o = torch.einsum("bshr,hvr->bshv", oa, kvb[:, Dn:])
    return o.reshape(b, s, H * Dv) @ w["o_proj.weight"].T


def row_weights(cfg, inp, doc_start):
    b, s = inp["hidden_states"].shape[:2]
    nonempty = (doc_start <= torch.arange(s)).numpy()
    mask = (inp["input_ids"] != (cfg.get("pad_token_id") or 0)) & nonempty
    return torch.from_numpy(mask / max(mask.sum(), 1))


def reference(cfg, weights, inp, doc_start, mode, dtype, indexer_only=False, table=None):
    w = {n: torch.tensor(a, dtype=dtype, requires_grad=True) for n, a in weights.items()}
    x = torch.tensor(inp["hidden_states"], dtype=dtype, requires_grad=True)
    extras = {"rw": row_weights(cfg, inp, doc_start).to(dtype), "table": table}
    y = mla_layer(cfg, w, x, doc_start, mode, extras)
    L = (y * torch.tensor(inp["grad_output"], dtype=dtype)).sum()
    if mode.startswith("dsa"):
        L = extras["loss"] if indexer_only else L + extras["loss"]
    L.backward()
    res = {"output": y.detach()}
    if not indexer_only:
        res["grad.hidden_states"] = x.grad
    res.update({"grad." + n: t.grad for n, t in w.items() if not indexer_only or n.startswith("indexer.")})
    if mode.startswith("dsa"):
        res["indexer_loss"] = extras["loss"].detach().reshape(1)
        res["I"] = extras["I"].detach()
    return {n: t.double().numpy() for n, t in res.items()}


def base_config(q_lora, yarn, sink, indexer=False):
    cfg = {
        "model_type": "deepseek_v32", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
        "q_lora_rank": 24 if q_lora else None, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 12, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
        "rope_theta": 10000.0, "pad_token_id": None, "attention_sink": sink,
        # MoE routing fields transformers writes: accepted and ignored.
        "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 3,
    }
    if indexer:
        cfg.update({"index_n_heads": 4, "index_head_dim": 16, "index_topk": 6, "index_window": 2,
                    "indexer_loss_coeff": 0.3})
    if yarn:
        cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}
    return cfg


def make_weights(cfg, rng):
    H, Dn, Dr, Dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    hid, Rq, Rkv = cfg["hidden_size"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    shapes = {"kv_a_proj_with_mqa.weight": (Rkv + Dr, hid), "kv_b_proj.weight": (H * (Dn + Dv), Rkv),
              "o_proj.weight": (hid, H * Dv)}
    if Rq:
        shapes.update({"q_a_proj.weight": (Rq, hid), "q_b_proj.weight": (H * (Dn + Dr), Rq)})
    else:
        shapes["q_proj.weight"] = (H * (Dn + Dr), hid)
    w = {n: (rng.standard_normal(sh) / math.sqrt(sh[1])).astype(np.float32) for n, sh in shapes.items()}
    w["kv_a_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(Rkv)).astype(np.float32)
    if Rq:
        w["q_a_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(Rq)).astype(np.float32)
    if cfg["attention_sink"]:
        w["softmax_offset"] = rng.standard_normal(H).astype(np.float32)
    if cfg.get("index_n_heads"):
        HI, DI = cfg["index_n_heads"], cfg["index_head_dim"]
        w["indexer.wq_b.weight"] = (rng.standard_normal((HI * DI, Rq)) / math.sqrt(Rq)).astype(np.float32)
        w["indexer.wk.weight"] = (rng.standard_normal((DI, hid)) / math.sqrt(hid)).astype(np.float32)
        w["indexer.k_norm.weight"] = (1 + 0.1 * rng.standard_normal(DI)).astype(np.float32)
        w["indexer.k_norm.bias"] = (0.1 * rng.standard_normal(DI)).astype(np.float32)
        w["indexer.weights_proj.weight"] = (rng.standard_normal((HI, hid)) / math.sqrt(hid)).astype(np.float32)
    return w


CASES = [
    # name, mode, q_lora, yarn, sink, split (settings), layout, train_indexer_only
    ("mha_docs", "mha", True, False, False, False, [0, 17, 18, 33], False),
    ("mqa_docs", "mqa_full_causal", True, False, False, False, [0, 17, 18, 33], False),
    ("mha_yarn_qproj", "mha", False, True, False, False, None, False),
    ("mqa_yarn_sink_split", "mqa_full_causal", True, True, True, True, [0, 1, 25, 36], False),
    ("warmup_docs", "dsa_warmup", True, True, False, False, [0, 17, 18, 33], False),
    ("warmup_sink_indexer_only", "dsa_warmup", True, False, True, False, [0, 1, 25, 36], True),
    ("sparse_docs", "dsa_sparse", True, True, False, False, [0, 17, 18, 33], False),
    ("sparse_sink_split", "dsa_sparse", True, False, True, True, [0, 1, 25, 36], False),
]


def run_case(case, hmla, workdir, rng):
    name, mode, q_lora, yarn, sink, split, cu, indexer_only = case
    cfg = base_config(q_lora, yarn, sink, indexer=mode.startswith("dsa"))
    b, s = 1, 40
    weights = make_weights(cfg, rng)
    inp = {"hidden_states": rng.standard_normal((b, s, cfg["hidden_size"])).astype(np.float32),
           "grad_output": rng.standard_normal((b, s, cfg["hidden_size"])).astype(np.float32),
           "input_ids": rng.integers(0, 6, (b, s)).astype(np.int64)}  # some pad tokens (id 0)
    if cu is not None:
        inp["cu_seqlens"] = np.array(cu, dtype=np.int32)
    paths = {k: os.path.join(workdir, f"{name}.{k}") for k in ("config.json", "w.safetensors", "in.safetensors",
                                                              "out.safetensors", "settings.yaml")}
    with open(paths["config.json"], "w") as f:
        json.dump(cfg, f)
    st.save(paths["w.safetensors"], weights)
    st.save(paths["in.safetensors"], inp)
    cmd = [hmla, "layer", "--config", paths["config.json"], "--mode", mode, "--weights", paths["w.safetensors"],
           "--inputs", paths["in.safetensors"], "--out", paths["out.safetensors"]]
    if split:
        with open(paths["settings.yaml"], "w") as f:
            f.write("mqa_split_kv_b_proj: true\n")
        cmd += ["--settings", paths["settings.yaml"]]
    if indexer_only:
        cmd += ["--train-indexer-only"]
    subprocess.run(cmd, check=True)
    got = st.load(paths["out.safetensors"])
    doc_start = layout_doc_start(b, s, cu, None)
    table = got.get("topk_indices")
    ref64 = reference(cfg, weights, inp, doc_start, mode, torch.float64, indexer_only, table)
    ref32 = reference(cfg, weights, inp, doc_start, mode, torch.float32, indexer_only, table)
    ok = True
    if "I" in ref64:  # the selection: window exact, top-k as sets where the K-th gap is clear
        I = ref64.pop("I")
        ref32.pop("I")
        K, W = cfg["index_topk"], cfg["index_window"]
        want, gaps_ok = topk_table(I, doc_start.numpy(), K, W)
        have = got.pop("topk_indices")
        good = np.array_equal(have[..., K:], want[..., K:])
        for r, t in zip(*np.nonzero(gaps_ok)):
            good &= set(have[r, t, :K].tolist()) == set(want[r, t, :K].tolist())
        print(f"{'ok  ' if good else 'FAIL'} {name:20s} topk_indices ({int(gaps_ok.sum())} rows compared as sets)")
        ok &= bool(good)
    return check_by_rule(name, got, ref64, ref32) and ok


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hmla", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    rng = np.random.default_rng(7)
    ok = all([run_case(c, args.hmla, args.workdir, rng) for c in CASES])
    print("twin mla layer:", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
