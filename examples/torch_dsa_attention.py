#!/usr/bin/env python3
"""A DeepSeek-V3.2 attention module (MLA + the lightning indexer) in plain PyTorch on hmla.torch's
four operators, in the four modes of DESIGN.md (mha, mqa_full_causal, dsa_warmup, dsa_sparse),
with Hugging Face's parameter names (so a checkpoint's `self_attn.*` tensors load as they are).

    python3 examples/torch_dsa_attention.py     # trains a tiny LM around it on data/demo:
                                                # a few steps of dsa_warmup, then of dsa_sparse

Needs hmla.torch (`pip install --no-build-isolation ./python`, or PYTHONPATH=build/python after
`make build`). On the CPU everything is float32; RoPE here is the plain (non-YaRN) one.
tests/python/torch_example.py checks that on the same weights and inputs this module gives
`hmla layer`'s output, gradients and indexer loss.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import hmla.torch as ht

MODES = ("mha", "mqa_full_causal", "dsa_warmup", "dsa_sparse")


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(s, dim, theta, dtype):
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope_interleaved(x, cos, sin):  # pairs (x0, x1), (x2, x3), ...: MLA's layout
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)


def rope_half(x, cos, sin):  # pairs (x_i, x_{i + d/2}): the indexer's layout
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class DSAAttention(nn.Module):
    """One MLA layer's attention with its lightning indexer. forward(x, cu_seqlens=None, row_mask=None)
    returns (y, indexer_loss): the loss (coeff * the KL of DESIGN.md section 6) in the dsa modes,
    else None. The indexer sees detached inputs and trains only through its loss."""

    def __init__(self, cfg, mode="mha"):
        super().__init__()
        assert mode in MODES, mode
        self.cfg, self.mode = cfg, mode
        H, Dn, Dr, Dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        hid, Rq, Rkv = cfg["hidden_size"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
        lin = lambda i, o: nn.Linear(i, o, bias=False)  # noqa: E731
        self.q_a_proj, self.q_b_proj = lin(hid, Rq), lin(Rq, H * (Dn + Dr))
        self.q_a_layernorm = nn.Parameter(torch.ones(Rq))
        self.kv_a_proj_with_mqa, self.kv_b_proj = lin(hid, Rkv + Dr), lin(Rkv, H * (Dn + Dv))
        self.kv_a_layernorm = nn.Parameter(torch.ones(Rkv))
        self.o_proj = lin(H * Dv, hid)
        self.softmax_offset = nn.Parameter(torch.zeros(H)) if cfg.get("attention_sink") else None
        if cfg.get("index_n_heads"):
            HI, DI = cfg["index_n_heads"], cfg["index_head_dim"]
            self.indexer = nn.Module()
            self.indexer.wq_b, self.indexer.wk = lin(Rq, HI * DI), lin(hid, DI)
            self.indexer.k_norm = nn.LayerNorm(DI, eps=1e-6)
            self.indexer.weights_proj = lin(hid, HI)

    def load_hf(self, tensors):
        """Loads a layer's tensors by their HF names ("q_a_proj.weight", "indexer.wk.weight", ...)."""
        own = dict(self.named_parameters())
        with torch.no_grad():
            for name, t in tensors.items():
                key = name.replace("q_a_layernorm.weight", "q_a_layernorm").replace(
                    "kv_a_layernorm.weight", "kv_a_layernorm")
                own[key].copy_(torch.as_tensor(t))

    def scale(self):
        c = self.cfg
        return 1.0 / math.sqrt(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])

    def indexer_inputs(self, x, cq, cos, sin):
        c = self.cfg
        b, s, _ = x.shape
        HI, DI, Dr = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"]
        ind = self.indexer
        qI = ind.wq_b(cq).view(b, s, HI, DI)
        qI = torch.cat([rope_half(qI[..., :Dr], cos[:, None, :], sin[:, None, :]), qI[..., Dr:]], -1)
        kI = ind.k_norm(ind.wk(x))
        kI = torch.cat([rope_half(kI[..., :Dr], cos, sin), kI[..., Dr:]], -1)
        w = ind.weights_proj(x) * (HI ** -0.5 * DI ** -0.5)
        return qI.contiguous(), kI.contiguous(), w.contiguous()

    def forward(self, x, cu_seqlens=None, row_mask=None):
        c = self.cfg
        b, s, _ = x.shape
        H, Dn, Dr, Dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        Rkv, eps = c["kv_lora_rank"], c.get("rms_norm_eps", 1e-6)
        cq = rms(self.q_a_proj(x), self.q_a_layernorm, eps)
        q = self.q_b_proj(cq).view(b, s, H, Dn + Dr)
        kva = self.kv_a_proj_with_mqa(x)
        latent = rms(kva[..., :Rkv], self.kv_a_layernorm, eps)
        cos, sin = rope_tables(s, Dr, c.get("rope_theta", 10000.0), x.dtype)
        q = torch.cat([q[..., :Dn], rope_interleaved(q[..., Dn:], cos[:, None, :], sin[:, None, :])], -1)
        k_pe = rope_interleaved(kva[..., Rkv:], cos, sin)
        scale, sink, loss = self.scale(), self.softmax_offset, None
        if self.mode in ("mha", "dsa_warmup"):  # per-head keys and values from kv_b_proj
            kv = self.kv_b_proj(latent).view(b, s, H, Dn + Dv)
            k = torch.cat([kv[..., :Dn], k_pe[:, :, None, :].expand(b, s, H, Dr)], -1)
            o, _ = ht.attention(q, k, kv[..., Dn:], scale=scale, cu_seqlens=cu_seqlens, sink=sink)
            if self.mode == "dsa_warmup":  # the dense KL against this attention
                qI, kI, w = self.indexer_inputs(x.detach(), cq.detach(), cos, sin)
                loss = ht.indexer_kl(qI, kI, w, q, k, scale=scale, cu_seqlens=cu_seqlens, row_mask=row_mask,
                                     coeff=c.get("indexer_loss_coeff", 1.0))
        else:  # latent MQA: absorbed queries against the shared key [latent ; k_pe]
            kvb = self.kv_b_proj.weight.view(H, Dn + Dv, Rkv)
            qa = torch.cat([torch.einsum("bshd,hdr->bshr", q[..., :Dn], kvb[:, :Dn]), q[..., Dn:]], -1)
            ka = torch.cat([latent, k_pe], -1)
            if self.mode == "mqa_full_causal":
                oa, _ = ht.attention(qa, ka[:, :, None, :], scale=scale, cu_seqlens=cu_seqlens, sink=sink,
                                     v_from_k=Rkv)
            else:  # dsa_sparse: over the indexer's top-k and the window
                qI, kI, w = self.indexer_inputs(x.detach(), cq.detach(), cos, sin)
                K, W = c["index_topk"], c.get("index_window", 0)
                table = ht.indexer_topk(qI, kI, w, topk=K, window=W, cu_seqlens=cu_seqlens)
                oa, _ = ht.sparse_mla(qa, ka, table, scale=scale, dv=Rkv, sink=sink)
                loss = ht.indexer_kl(qI, kI, w, qa, ka[:, :, None, :], scale=scale, cu_seqlens=cu_seqlens,
                                     topk_indices=table, window=W, row_mask=row_mask,
                                     coeff=c.get("indexer_loss_coeff", 1.0))
                self.last_table = table
            o = torch.einsum("bshr,hvr->bshv", oa, kvb[:, Dn:])
        return self.o_proj(o.reshape(b, s, H * Dv)), loss


# ---- the demo: a tiny LM around the module, on data/demo -------------------------------------

def load_tokens(path):
    """data/demo's train.safetensors: its tokens and document offsets (a dozen lines of safetensors)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, blob = json.loads(f.read(n)), f.read()
    dt = {"I32": np.int32, "I64": np.int64, "U8": np.uint8, "I16": np.int16}
    out = {}
    for name, h in header.items():
        if name != "__metadata__":
            a, e = h["data_offsets"]
            out[name] = np.frombuffer(blob[a:e], dtype=dt[h["dtype"]]).reshape(h["shape"])
    return out


class TinyLM(nn.Module):
    def __init__(self, cfg, mode):
        super().__init__()
        self.embed = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.attn = DSAAttention(cfg, mode)
        self.head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, ids):
        y, kl = self.attn(self.embed(ids))
        logits = self.head(y)
        lm = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        return lm, kl


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    cfg = {"vocab_size": 260, "hidden_size": 64, "num_attention_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
           "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "index_n_heads": 4,
           "index_head_dim": 16, "index_topk": 16, "index_window": 4, "indexer_loss_coeff": 1.0}
    data = load_tokens(os.path.join(root, "data", "demo", "train.safetensors"))
    tokens = torch.from_numpy(data["tokens"].astype(np.int64))
    torch.manual_seed(0)
    model = TinyLM(cfg, "dsa_warmup")
    s, b = 64, 4
    for mode, steps, params in (("dsa_warmup", 5, model.attn.indexer.parameters()), ("dsa_sparse", 5, model.parameters())):
        model.attn.mode = mode
        opt = torch.optim.AdamW(list(params), lr=3e-3)
        for step in range(steps):
            starts = torch.randint(0, len(tokens) - s, (b,))
            ids = torch.stack([tokens[i:i + s] for i in starts])
            lm, kl = model(ids)
            loss = kl if mode == "dsa_warmup" else lm + kl  # warmup: the indexer alone learns
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"[{mode}] step {step + 1}/{steps}  lm {float(lm):.4f}  kl {float(kl):.4f}")
    print("hmla.torch memory:", ht.memory_stats())
    return 0


if __name__ == "__main__":
    sys.exit(main())
