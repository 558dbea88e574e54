#!/usr/bin/env python3
"""hmla.torch's operators on a GPU (bf16; indexer_kl f32) next to what a PyTorch user would run
(scripts/device-check --with-app, after building the package against the machine's torch):
  attention   vs SDPA (cuDNN) on one causal document and flex attention with a document mask;
  indexer_kl  vs the materialised KL (tests/cuda/torch_kl_bench.py), time and peak bytes;
  sparse_mla  vs a torch gather implementation, forward and backward TFLOP/s.
Each operator is first checked against float64 torch on a small shape (the bf16 rule: at most
twice the error of the same reference run in bf16, plus 8 bf16 ulps of the largest magnitude).
One JSON line per measurement. --rehearse runs the checks and the timing code on the CPU at tiny
shapes (float32), where no GPU is."""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hmla.torch as ht  # noqa: E402
from torch_kl_bench import kl_forward_backward  # noqa: E402


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(f, dev, reps):
    f()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    sync(dev)
    return (time.perf_counter() - t0) / reps * 1e3


def rule(name, got, ref64, naive, dtype):
    eps = torch.finfo(dtype).eps
    err = float((got.double() - ref64).abs().max())
    nerr = float((naive.double() - ref64).abs().max())
    bound = 2 * nerr + 8 * eps * float(ref64.abs().max())
    print(json.dumps({"check": name, "error": err, "bound": bound, "ok": err <= bound}), flush=True)
    return err <= bound


def causal_docs(s, cu, dev):
    t = torch.arange(s, device=dev)
    start = torch.zeros(s, dtype=torch.long, device=dev)
    for a, e in zip(cu[:-1], cu[1:]):
        start[a:e] = a
    return (t[None, :] <= t[:, None]) & (t[None, :] >= start[:, None])


def attention_ref(q, k, v, scale, mask):
    logits = torch.einsum("bthd,bjhd->bhtj", q, k) * scale
    p = torch.softmax(logits.masked_fill(~mask, -math.inf), -1)
    return torch.einsum("bhtj,bjhd->bthd", p, v)


def check_ops(dev, dtype):
    """Each operator against float64 torch on a small shape; the naive arm is the reference in dtype."""
    g = torch.Generator().manual_seed(0)
    s, H, D = 64, 4, 64
    cu = [0, 20, 21, 64]
    q, k, v = (torch.randn(1, s, H, D, generator=g) for _ in range(3))
    mask = causal_docs(s, cu, "cpu")
    ok = True
    out, _ = ht.attention(q.to(dev, dtype), k.to(dev, dtype), v.to(dev, dtype), scale=D ** -0.5,
                          cu_seqlens=torch.tensor(cu, dtype=torch.int32))
    ok &= rule("attention out", out.cpu(), attention_ref(q.double(), k.double(), v.double(), D ** -0.5, mask),
               attention_ref(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), D ** -0.5, mask).to(dtype), dtype)
    Dqk, dv, N = 64, 48, 8
    kv = torch.randn(1, s, Dqk, generator=g)
    qs = torch.randn(1, s, H, Dqk, generator=g)
    idx = torch.stack([torch.cat([torch.randperm(t + 1, generator=g)[:N], torch.full((max(0, N - t - 1),), -1)])[:N]
                       for t in range(s)])[None].to(torch.int32)
    sel = torch.zeros(1, s, s, dtype=torch.bool)
    for t in range(s):
        for j in idx[0, t].tolist():
            if j >= 0:
                sel[0, t, j] = True
    out, _ = ht.sparse_mla(qs.to(dev, dtype), kv.to(dev, dtype), idx.to(dev), scale=Dqk ** -0.5, dv=dv)
    ref = attention_ref(qs.double(), kv[:, :, None].double(), kv[:, :, None, :dv].double(), Dqk ** -0.5, sel[:, None])
    naive = attention_ref(qs.to(dtype).float(), kv[:, :, None].to(dtype).float(), kv[:, :, None, :dv].to(dtype).float(),
                          Dqk ** -0.5, sel[:, None]).to(dtype)
    ok &= rule("sparse_mla out", out.cpu(), ref, naive, dtype)
    HI, DI = 4, 32
    qI, kI, w = torch.randn(1, s, HI, DI, generator=g) * 0.3, torch.randn(1, s, DI, generator=g) * 0.3, torch.randn(1, s, HI, generator=g) * 0.1
    loss = ht.indexer_kl(qI.to(dev), kI.to(dev), w.to(dev), q.to(dev), k.to(dev), scale=D ** -0.5)
    rw = torch.full((s,), 1.0 / s, dtype=torch.float64)
    ref = kl_forward_backward(qI[0].double(), kI[0].double(), w[0].double(), q[0].double(), k[0].double(), D ** -0.5, rw, 1.0)[0]
    naive = kl_forward_backward(qI[0], kI[0], w[0], q[0], k[0], D ** -0.5, rw.float(), 1.0)[0]
    ok &= rule("indexer_kl loss", loss.cpu().reshape(1), ref.reshape(1), naive.reshape(1), torch.float32)
    return ok


def bench_attention(dev, dtype, s, H, D, reps):
    q, k, v = (torch.randn(1, s, H, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, s // 4, s // 2, s], dtype=torch.int32)
    flops = 4.0 * H * D * sum((e - a) * (e - a + 1) / 2 for a, e in zip(cu[:-1].tolist(), cu[1:].tolist()))
    line = {"bench": "torch-attention", "s": s, "H": H, "D": D, "docs": 3}
    # hmla.torch's default (auto: cuDNN's fused attention where the build has it), then its own kernels.
    for name, backend in (("hmla", "auto"), ("hmla_kernels", "hmla")):
        f = lambda: ht.attention(q, k, v, scale=D ** -0.5, cu_seqlens=cu, backend=backend)[0].sum().backward()  # noqa
        line[f"{name}_fwdbwd_ms"] = timed(f, dev, reps)
        line[f"{name}_fwdbwd_tflops"] = 3.5 * flops / line[f"{name}_fwdbwd_ms"] / 1e9
    if dev.type == "cuda":
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
        f = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True).sum().backward()  # noqa
        line["sdpa_one_doc_fwdbwd_ms"] = timed(f, dev, reps)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            doc = torch.zeros(s, dtype=torch.int32, device=dev)
            for i, (a, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
                doc[a:e] = i
            bm = create_block_mask(lambda b, h, t, j: (j <= t) & (doc[t] == doc[j]), None, None, s, s, device=dev)
            fa = torch.compile(flex_attention)
            f = lambda: fa(qt, kt, vt, block_mask=bm).sum().backward()  # noqa: E731
            line["flex_docs_fwdbwd_ms"] = timed(f, dev, reps)
        except Exception as e:  # noqa: BLE001  (flex attention needs torch >= 2.5 and a compiler)
            line["flex_error"] = str(e).split("\n")[0][:120]
    print(json.dumps(line), flush=True)


def bench_kl(dev, s, reps):
    H, Dqk, HI, DI = 16, 192, 64, 128
    g = torch.Generator().manual_seed(1)
    qI, kI, w = (torch.randn(1, s, HI, DI, generator=g) * 0.3).to(dev), (torch.randn(1, s, DI, generator=g) * 0.3).to(dev), \
        (torch.randn(1, s, HI, generator=g) * 0.1).to(dev)
    q, k = torch.randn(1, s, H, Dqk, generator=g).to(dev), torch.randn(1, s, H, Dqk, generator=g).to(dev)
    line = {"bench": "torch-indexer-kl", "s": s, "H": H, "HI": HI, "DI": DI}
    ht.memory_stats(reset_peak=True)
    base = ht.memory_stats()[dev.type]["live_bytes"]
    line["hmla_ms"] = timed(lambda: ht.indexer_kl(qI, kI, w, q, k, scale=Dqk ** -0.5), dev, reps)
    line["hmla_peak_bytes"] = ht.memory_stats()[dev.type]["peak_bytes"] - base
    rw = torch.full((s,), 1.0 / s, device=dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    try:
        line["materialized_ms"] = timed(lambda: kl_forward_backward(qI[0], kI[0], w[0], q[0], k[0], Dqk ** -0.5, rw, 1.0),
                                        dev, reps)
        if dev.type == "cuda":
            line["materialized_peak_bytes"] = torch.cuda.max_memory_allocated() - before
    except RuntimeError as e:
        line["materialized_error"] = str(e).split("\n")[0][:120]
    print(json.dumps(line), flush=True)


def bench_sparse(dev, dtype, s, H, Dqk, dv, K, reps):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, s, H, Dqk, generator=g).to(dev, dtype).requires_grad_(True)
    kv = torch.randn(1, s, Dqk, generator=g).to(dev, dtype).requires_grad_(True)
    t = torch.arange(s)[:, None]
    idx = torch.where(torch.arange(K)[None, :] <= t, (t - torch.arange(K)[None, :]), torch.full((s, K), -1))
    idx = idx[None].to(torch.int32).to(dev)
    pairs = float((idx >= 0).sum())
    fwd = 2.0 * H * pairs * (Dqk + dv)
    line = {"bench": "torch-sparse-mla", "s": s, "H": H, "Dqk": Dqk, "dv": dv, "K": K}
    ms_f = timed(lambda: ht.sparse_mla(q, kv, idx, scale=Dqk ** -0.5, dv=dv), dev, reps)
    ms_fb = timed(lambda: ht.sparse_mla(q, kv, idx, scale=Dqk ** -0.5, dv=dv)[0].sum().backward(), dev, reps)
    line.update(hmla_fwd_tflops=fwd / ms_f / 1e9, hmla_bwd_tflops=2.5 * fwd / max(ms_fb - ms_f, 1e-9) / 1e9)

    def gather():  # what a PyTorch user writes: gather the listed keys, masked softmax, weighted sum
        safe = idx.clamp(min=0).long()
        keys = kv[0][safe[0]]  # [s, K, Dqk]
        logits = torch.einsum("shd,skd->shk", q[0], keys) * Dqk ** -0.5
        p = torch.softmax(logits.masked_fill((idx[0] < 0)[:, None, :], -math.inf), -1)
        return torch.einsum("shk,skd->shd", p, keys[..., :dv])
    try:
        gf = timed(gather, dev, reps)
        gfb = timed(lambda: gather().sum().backward(), dev, reps)
        line.update(gather_fwd_tflops=fwd / gf / 1e9, gather_bwd_tflops=2.5 * fwd / max(gfb - gf, 1e-9) / 1e9)
    except RuntimeError as e:
        line["gather_error"] = str(e).split("\n")[0][:120]
    print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rehearse", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    o = ap.parse_args()
    dev = torch.device("cpu" if o.rehearse else "cuda")
    dtype = torch.float32 if o.rehearse else torch.bfloat16
    ok = check_ops(dev, dtype)
    if o.rehearse:  # the timing code at tiny shapes
        bench_attention(dev, dtype, 64, 2, 16, 1)
        bench_kl(dev, 64, 1)
        bench_sparse(dev, dtype, 64, 16, 64, 48, 16, 1)
    else:
        bench_attention(dev, dtype, 8192, 16, 128, o.reps)
        bench_kl(dev, 8192, 1)
        bench_sparse(dev, dtype, 8192, 128, 576, 512, 2048, o.reps)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
