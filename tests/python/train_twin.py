#!/usr/bin/env python3
"""PyTorch twin of hmla's whole training step, for `hmla bench train` (the baseline arm): the same
model (DESIGN.md section 2: embedding, per layer RMSNorm -> MLA attention -> residual, RMSNorm ->
MLP -> residual; final norm, lm_head; the MLP a SwiGLU or, on MoE layers, DeepSeekMoE: the
group-limited sigmoid router, the routed experts looped over their tokens, the shared experts;
docs/moe.md), the same weights and batch, written as a PyTorch user would: autograd, torch's scaled_dot_product_attention with a boolean document mask (a masked
softmax where torch predates it, as Debian 12's 1.13 does; the answer says which) (dsa_sparse:
the mask of hmla's selection table in the latent MQA form), the materialised indexer KL, and
torch.optim.AdamW after a per-group norm clip. f32, the bench's thread count; with "device": "cuda"
(`hmla bench train --device cuda`) on the GPU, its products and attention under bf16 autocast (the
baseline a PyTorch user would run), timed with the device synchronised.

DeepSeek-V4 configs (model_type deepseek_v4) run v4_twin.py's model instead (DESIGN.md section 10:
mHC, the V4 attention block with its compressors, the V4 MoE), with the same protocol, batch and
optimizer: weights in DeepSeek's checkpoint names (the hash layers' ffn.gate.tid2eid an integer
table, not a parameter), modes mha and mqa_full_causal (hmla trains V4 stacks densely: CSA layers
attend over every visible entry); twin.json's optional "csa_selection": "topk" attends over the
CSA indexer's top-k instead (transformers' forward; no indexer loss).

Protocol (--serve DIR): reads DIR/twin.json, DIR/weights.safetensors and DIR/batch.safetensors,
then for each line "step" on stdin runs one training step and answers one line
{"ms": wall time of the step, "loss": its LM loss, "attention", "torch"}; "quit" ends it."""
import contextlib
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
import v4_twin  # noqa: E402
from mla_twin import indexer_kl, indexer_scores, rms, rope_freqs, rope_interleaved, softmax_scale, table_mask  # noqa: E402


def sdpa(q, k, v, allowed, scale):
    """q [b,s,H,D], k/v [b,s,Hk,.] (Hk = 1 or H), allowed [b,t,j]; rows with no key attend to
    themselves (padding: no loss reads them)."""
    s = q.shape[1]
    eye = torch.eye(s, dtype=torch.bool, device=q.device).unsqueeze(0)
    mask = allowed | (eye & ~allowed.any(-1, keepdim=True))
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if k.shape[1] != q.shape[1]:
        k, v = k.expand(-1, q.shape[1], -1, -1), v.expand(-1, q.shape[1], -1, -1)
    if ATTENTION == "sdpa":  # its default scale is D^-1/2: fold ours into q (no `scale` before 2.1)
        q = q * (scale * math.sqrt(q.shape[-1]))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1)).transpose(1, 2)
    logits = (q @ k.transpose(-1, -2)) * scale  # torch < 2.0 (Debian 12's 1.13): masked softmax
    logits = logits.masked_fill(~mask.unsqueeze(1), -float("inf"))
    return (torch.softmax(logits, dim=-1) @ v).transpose(1, 2)


ATTENTION = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "matmul"


def attention(cfg, w, x, allowed, mode, table, rw):
    b, s, _ = x.shape
    H, Dn, Dr, Dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    Rkv, eps = cfg["kv_lora_rank"], cfg.get("rms_norm_eps", 1e-6)
    cq = rms(x @ w["q_a_proj.weight"].T, w["q_a_layernorm.weight"], eps)
    q = (cq @ w["q_b_proj.weight"].T).view(b, s, H, Dn + Dr)
    q_nope, q_pe = q[..., :Dn], q[..., Dn:]
    kva = x @ w["kv_a_proj_with_mqa.weight"].T
    c = rms(kva[..., :Rkv], w["kv_a_layernorm.weight"], eps)
    inv, af = rope_freqs(cfg)
    ang = torch.from_numpy(np.arange(s, dtype=np.float64)[:, None] * inv[None, :])
    cos, sin = (torch.cos(ang) * af).to(x.dtype).to(x.device), (torch.sin(ang) * af).to(x.dtype).to(x.device)
    q_pe = rope_interleaved(q_pe, cos[:, None, :], sin[:, None, :])
    k_pe = rope_interleaved(kva[..., Rkv:], cos, sin)
    scale = softmax_scale(cfg)
    kl = None
    if mode == "mha":
        kv = (c @ w["kv_b_proj.weight"].T).view(b, s, H, Dn + Dv)
        k = torch.cat([kv[..., :Dn], k_pe[:, :, None, :].expand(b, s, H, Dr)], dim=-1)
        o = sdpa(torch.cat([q_nope, q_pe], -1), k, kv[..., Dn:], allowed, scale)
    else:  # dsa_sparse: latent MQA over hmla's selection, the sparse KL trains the indexer
        kvb = w["kv_b_proj.weight"].view(H, Dn + Dv, Rkv)
        qa = torch.cat([torch.einsum("bshd,hdr->bshr", q_nope, kvb[:, :Dn]), q_pe], dim=-1)
        ka = torch.cat([c, k_pe], dim=-1)[:, :, None, :]
        selected = table_mask(table, s, 0, table.shape[-1])
        oa = sdpa(qa, ka, c[:, :, None, :], selected, scale)
        o = torch.einsum("bshr,hvr->bshv", oa, kvb[:, Dn:])
        I = indexer_scores(cfg, w, x.detach(), cq.detach(), cos, sin)
        kl = indexer_kl(cfg, I, qa.detach(), ka.detach(), table_mask(table, s, 0, cfg["index_topk"]), scale, rw)
    return o.reshape(b, s, H * Dv) @ w["o_proj.weight"].T, kl


def swiglu(p, pre, x):
    return (F.silu(x @ p[pre + "gate_proj.weight"].T) * (x @ p[pre + "up_proj.weight"].T)) @ p[pre + "down_proj.weight"].T


def is_moe_layer(cfg, L):
    """transformers' rule: mlp_layer_types[L] == "sparse", else L >= first_k_dense_replace (3)."""
    types = cfg.get("mlp_layer_types")
    return types[L] == "sparse" if types else L >= cfg.get("first_k_dense_replace", 3)


def moe_route(cfg, u, bias):
    """DeepseekV32TopkRouter from its definition: scores s = sigmoid(u), choice c = s + bias, groups
    ranked by the sum of their top-2 c, the topk_group best kept, the k experts of largest c among
    them (by descending c). Returns the chosen experts [N, k], their weights, c, and the smallest
    gap at any decision (a group's second vs third value, the last kept vs first dropped group,
    the k-th vs (k+1)-th expert, consecutive chosen experts: what must not flip under rounding)."""
    E, k = u.shape[-1], cfg.get("num_experts_per_tok", 8)
    G, TG = cfg.get("n_group", 8), cfg.get("topk_group", 4)
    s = torch.sigmoid(u)
    c = s.detach() + bias
    top2 = c.view(-1, G, E // G).topk(2, dim=-1).values
    gscore = top2.sum(-1)
    gs = gscore.sort(dim=-1, descending=True).values
    kept = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, gscore.topk(TG, dim=-1).indices, True)
    cm = c.masked_fill(~kept.repeat_interleave(E // G, dim=1), -float("inf"))
    cs = cm.sort(dim=-1, descending=True).values
    idx = cm.topk(k, dim=-1).indices  # sorted: descending c
    margins = [top2[..., 1] - c.view(-1, G, E // G).sort(dim=-1, descending=True).values[..., 2]
               if E // G > 2 else torch.full_like(gscore, float("inf"))]
    if TG < G:
        margins.append(gs[:, TG - 1 : TG] - gs[:, TG : TG + 1])
    margins.append(cs[:, k - 1 : k] - cs[:, k : k + 1])
    margins.append((cs[:, : k - 1] - cs[:, 1:k]) if k > 1 else torch.full_like(cs[:, :1], float("inf")))
    w = s.gather(1, idx)
    if cfg.get("norm_topk_prob", True):
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * cfg.get("routed_scaling_factor", 2.5), c, min(float(m.min()) for m in margins)


def balance_loss(cfg, u, idx, mask, alpha):
    """DeepSeek-V3's sequence-wise balance loss (its eq. 17-20) over the batch's rows: per row
    (sequence) with T > 0 loss rows (mask [b, s]), f_i = E / (k T) * (the row's loss rows choosing
    i), P_i = 1/T sum_t s'_{i,t} with s' the sigmoid scores normalised over all E experts, L = alpha
    sum_i f_i P_i; the mean over the rows that have loss rows. f is a constant (counts), so the
    gradient flows through P into the logits u [b*s, E]."""
    b, s = mask.shape
    E, k = u.shape[-1], idx.shape[-1]
    sc = torch.sigmoid(u).view(b, s, E)
    sp = sc / sc.sum(-1, keepdim=True)
    m = mask.to(u.dtype).unsqueeze(-1)
    T = mask.sum(-1).to(u.dtype)
    chosen = torch.zeros(b * s, E, dtype=u.dtype, device=u.device).scatter(1, idx, 1.0).view(b, s, E) * m
    f = E / (k * T.clamp(min=1)).unsqueeze(-1) * chosen.sum(1)
    P = (sp * m).sum(1) / T.clamp(min=1).unsqueeze(-1)
    per_row = alpha * (f * P).sum(-1)
    return per_row[T > 0].sum() / (T > 0).sum().clamp(min=1)


def moe(cfg, p, pre, x, balance=None):
    """DeepSeekMoE on x [b, s, hidden] (dropless): returns y, the router's (idx, c, margin) and,
    with balance = (alpha, loss-row mask [b, s]), the balance loss (else None)."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    u = x @ p[pre + "gate.weight"].T
    idx, w, c, margin = moe_route(cfg, u, p[pre + "gate.e_score_correction_bias"].detach())
    aux = balance_loss(cfg, u, idx, balance[1], balance[0]) if balance else None
    y = torch.zeros_like(x)
    for e in range(p[pre + "gate.weight"].shape[0]):
        tok, slot = torch.nonzero(idx == e, as_tuple=True)
        if tok.numel():
            y = y.index_add(0, tok, swiglu(p, f"{pre}experts.{e}.", x[tok]) * w[tok, slot, None])
    if pre + "shared_experts.gate_proj.weight" in p:
        y = y + swiglu(p, pre + "shared_experts.", x)
    return y.view(shape), (idx, c, margin), aux


def step_loss(cfg, p, ids, allowed, targets, keep, mode, tables, rw, trace=None, aux_coeff=0.0, aux=None):
    """The step's LM loss and indexer KL; `trace` (a dict) gets each MoE layer's router (idx, c,
    margin); with aux_coeff > 0, `aux` (a list) gets each MoE layer's balance loss over the loss
    rows (rw > 0), which the caller adds to what it differentiates."""
    eps = cfg.get("rms_norm_eps", 1e-6)
    h = p["model.embed_tokens.weight"][ids]
    kls = []
    for L in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{L}."
        w = {n[len(pre) + 10:]: t for n, t in p.items() if n.startswith(pre + "self_attn.")}
        a, kl = attention(cfg, w, rms(h, p[pre + "input_layernorm.weight"], eps), allowed, mode,
                          tables.get(L), rw)
        h = h + a
        if kl is not None:
            kls.append(kl)
        m = rms(h, p[pre + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(cfg, L):
            y, router, bal = moe(cfg, p, pre + "mlp.", m, (aux_coeff, rw > 0) if aux_coeff > 0 else None)
            if trace is not None:
                trace[L] = router
            if bal is not None:
                aux.append(bal)
            h = h + y
        else:
            h = h + swiglu(p, pre + "mlp.", m)
    logits = rms(h, p["model.norm.weight"], eps) @ p["lm_head.weight"].T
    ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), reduction="none")
    lm = (ce * keep.view(-1)).sum() / keep.sum().clamp(min=1)
    return lm, sum(kls) if kls else None


def batch_masks(cfg, ids, ds, de, dtype=torch.float32):
    """From input_ids and each position's document [start, end): the causal document mask
    allowed [b, t, j], the LM targets and their keep weights (DESIGN.md section 3), the KL's row
    weights."""
    b, s = ids.shape
    dev = ids.device
    t = torch.arange(s, device=dev)
    allowed = (t.view(1, 1, s) <= t.view(1, s, 1)) & (t.view(1, 1, s) >= ds.view(b, s, 1))
    pad = cfg.get("pad_token_id") or 0
    nxt = torch.cat([ids[:, 1:], torch.full((b, 1), pad, device=dev)], 1)
    keep = ((ds <= t) & (t + 1 < de) & (nxt != pad)).to(dtype)
    targets = torch.where(keep > 0, nxt, torch.zeros_like(nxt))
    rowmask = ((ids != pad) & (ds <= t)).double().cpu().numpy()
    rw = torch.from_numpy(rowmask / max(rowmask.sum(), 1)).to(dtype).to(dev)
    return allowed, targets, keep, rw


def main():
    d = sys.argv[sys.argv.index("--serve") + 1]
    opt = json.load(open(f"{d}/twin.json"))
    torch.set_num_threads(opt["threads"])
    cfg = json.load(open(opt["config"]))
    mode = opt["mode"]
    dev = torch.device(opt.get("device", "cpu"))
    v4 = cfg.get("model_type") == "deepseek_v4"
    if v4:
        if mode not in ("mha", "mqa_full_causal"):
            sys.exit(f"train_twin: mode {mode} on a deepseek_v4 model: hmla trains V4 stacks in mha only")
        v4cfg = v4_twin.v4_config(cfg)
        csa = opt.get("csa_selection", "dense")
        if csa not in ("dense", "topk"):
            sys.exit(f"train_twin: csa_selection = {csa!r}: use \"dense\" (hmla's mha) or \"topk\" (the indexer's)")
        p, v4tabs = v4_twin.split_weights(st.load(f"{d}/weights.safetensors"), torch.float32, dev)
    else:
        p = {n: torch.tensor(a, dtype=torch.float32, device=dev, requires_grad=True)
             for n, a in st.load(f"{d}/weights.safetensors").items()}
    bt = st.load(f"{d}/batch.safetensors")
    ids = torch.from_numpy(bt["input_ids"].astype(np.int64)).to(dev)
    ds = torch.from_numpy(bt["doc_start"].astype(np.int64)).to(dev)
    de = torch.from_numpy(bt["doc_end"].astype(np.int64)).to(dev)
    allowed, targets, keep, rw = batch_masks(cfg, ids, ds, de)
    tables = {int(n.split(".")[1]): a for n, a in bt.items() if n.startswith("table.")}
    attention_kind = ATTENTION
    if v4:
        v4lay = v4_twin.layout(v4cfg, ds, de)
        attention_kind = "masked softmax"  # window + entries + sink in one softmax: no sdpa form
    backbone = [x for n, x in p.items() if "indexer." not in n]
    indexer = [x for n, x in p.items() if "indexer." in n]
    optim = torch.optim.AdamW(list(p.values()), lr=opt["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        t0 = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext():
            if v4:
                lm, kl = v4_twin.step_loss(v4cfg, p, v4tabs, ids, v4lay, targets, keep, csa), None
            else:
                lm, kl = step_loss(cfg, p, ids, allowed, targets, keep, mode, tables, rw)
        (lm + kl if kl is not None else lm).backward()
        torch.nn.utils.clip_grad_norm_(backbone, 1.0)
        if indexer:
            torch.nn.utils.clip_grad_norm_(indexer, 1.0)
        optim.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        print(json.dumps({"ms": ms, "loss": float(lm), "attention": attention_kind, "torch": torch.__version__}),
              flush=True)


if __name__ == "__main__":
    main()
