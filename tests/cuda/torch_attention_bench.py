#!/usr/bin/env python3
"""PyTorch's side of scripts/device-check. The indexer (scores + top-k) and sparse MLA forward
against chunked torch versions (gathers, FLOPs over valid slots) on the shapes hmla measured. Dense per-document causal attention forward and
forward+backward on the GPU in bf16, on exactly the shapes hmla_cuda_check --bench measured
(Dqk/Dv = 192/128: s = 8192, H = 16, one document and 8 documents of 1024; s = 32768, H = 16;
s = 8192, H = 128), each through hmla's kernels and through hmla's cuDNN path: cuDNN SDPA where it
applies (one causal document) and flex attention with a document mask (every layout). Useful FLOPs
as hmla counts them (FlashAttention's convention: 2 (Dqk + Dv) per allowed (query, key) pair and
head forward, 3.5x that forward+backward). Reads hmla's JSON lines and prints one merged line per
shape. --rehearse checks the script's imports and arithmetic without a GPU."""
import argparse
import json
import sys


def allowed_pairs(s, docs):
    n = s // docs
    return docs * n * (n + 1) // 2


def timed(fn, reps):
    import torch
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def measure(shape, reps):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    s, H, dqk, dv, docs = shape["s"], shape["H"], shape["dqk"], shape["dv"], shape["docs"]
    dev = "cuda"
    torch.manual_seed(0)
    q = torch.randn(1, H, s, dqk, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, H, s, dqk, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, H, s, dv, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(1, H, s, dv, device=dev, dtype=torch.bfloat16)
    scale = dqk ** -0.5
    fwd_flops = 2.0 * allowed_pairs(s, docs) * H * (dqk + dv)
    res = {}

    def both(f, name):
        def fwd():
            with torch.no_grad():
                f()

        def fwdbwd():
            f().backward(dout)

        try:
            res[f"torch_{name}_fwd_tflops"] = fwd_flops / (timed(fwd, reps) * 1e-3) / 1e12
            res[f"torch_{name}_fwdbwd_tflops"] = 3.5 * fwd_flops / (timed(fwdbwd, reps) * 1e-3) / 1e12
        except Exception as e:  # a backend that does not take these shapes: say so, keep going
            res[f"torch_{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"

    if docs == 1:
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        both(cudnn, "cudnn")
    block_mask = create_block_mask(doc_mask(s, docs, dev), 1, 1, s, s, device=dev)
    flex = torch.compile(flex_attention)
    both(lambda: flex(q, k, v, block_mask=block_mask, scale=scale), "flex")
    return res


def indexer_chunked(qI, kI, w, K, chunk):
    """The chunked PyTorch indexer: per chunk of query rows, relu(qI kI^T) weighted over heads,
    the causal mask, then torch.topk; the [s, s] scores never exist whole. Returns the last
    chunk's (values, indices)."""
    import torch
    s = kI.shape[0]
    cols = torch.arange(s, device=kI.device)
    out = None
    for r0 in range(0, s, chunk):
        r1 = min(s, r0 + chunk)
        sc = torch.relu(torch.einsum("thd,jd->thj", qI[r0:r1], kI)).float()
        I = torch.einsum("thj,th->tj", sc, w[r0:r1])
        I = I.masked_fill(cols[None, :] > torch.arange(r0, r1, device=kI.device)[:, None], float("-inf"))
        out = torch.topk(I, min(K, s), dim=-1)
    return out


def measure_indexer(h, reps):
    import torch
    s, HI, DI, K = h["s"], h["HI"], h["DI"], h["K"]
    torch.manual_seed(0)
    qI = torch.randn(s, HI, DI, device="cuda", dtype=torch.bfloat16)
    kI = torch.randn(s, DI, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(s, HI, device="cuda", dtype=torch.float32)
    chunk = max(1, (1 << 30) // (HI * s * 2))  # about 1 GB of bf16 head scores per chunk
    return {"torch_chunked_ms": timed(lambda: indexer_chunked(qI, kI, w, K, chunk), reps), "torch_chunk_rows": chunk}


def sparse_table(s, K, dev):
    """hmla_cuda_check's table: row t lists K keys evenly spread over [0, t] (all while t < K), -1 after."""
    import torch
    t = torch.arange(s, device=dev)[:, None]
    i = torch.arange(K, device=dev)[None, :]
    j = torch.where(t + 1 <= K, i, i * (t + 1) // K)
    return torch.where(i <= t, j, torch.full_like(j, -1))


def sparse_chunked(q, kv, idx, dv, scale, chunk):
    """Chunked gather sparse MLA: per chunk of rows, gather the listed keys, masked softmax, P V."""
    import torch
    outs = []
    for r0 in range(0, q.shape[0], chunk):
        ix = idx[r0:r0 + chunk]
        g = kv[ix.clamp(min=0)]                                   # [c, K, Dqk]
        sc = torch.einsum("chd,ckd->chk", q[r0:r0 + chunk], g).float() * scale
        sc = sc.masked_fill((ix < 0)[:, None, :], float("-inf"))
        p = torch.softmax(sc, -1).nan_to_num(0.0).to(q.dtype)
        outs.append(torch.einsum("chk,ckv->chv", p, g[..., :dv]))
    return torch.cat(outs)


def measure_sparse(h, reps):
    import torch
    s, H, K, dqk, dv = h["s"], h["H"], h["K"], h["dqk"], h["dv"]
    torch.manual_seed(0)
    q = torch.randn(s, H, dqk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(s, dqk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    idx = sparse_table(s, K, "cuda")
    valid = int((idx >= 0).sum())
    flops = 2.0 * valid * H * (dqk + dv)
    chunk = 64
    res = {}
    with torch.no_grad():
        fwd = timed(lambda: sparse_chunked(q, kv, idx, dv, dqk ** -0.5, chunk), reps)
    res["torch_fwd_tflops"] = flops / (fwd * 1e-3) / 1e12
    dout = torch.randn(s, H, dv, device="cuda", dtype=torch.bfloat16)
    try:
        fb = timed(lambda: sparse_chunked(q, kv, idx, dv, dqk ** -0.5, chunk).backward(dout), max(2, reps // 5))
        res["torch_fwdbwd_tflops"] = 3.5 * flops / (fb * 1e-3) / 1e12
    except Exception as e:
        res["torch_fwdbwd_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    res["torch_valid_pairs"] = valid
    return res


def doc_mask(s, docs, dev):
    doc = __import__("torch").arange(s, device=dev) // (s // docs)
    return lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki)


def rehearse():
    """On the CPU, small: the document mask through flex attention equals a masked softmax (where
    this torch has flex attention: 2.5 and later; Debian's 1.13 rehearses the rest), and the
    chunked baselines equal brute force."""
    import torch
    assert allowed_pairs(8192, 8) == 8 * 1024 * 1025 // 2
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        flex_attention = None
    err = None
    if flex_attention is not None:
        s, docs, H, dqk, dv = 256, 2, 2, 32, 16
        q, k = torch.randn(1, H, s, dqk), torch.randn(1, H, s, dqk)
        v = torch.randn(1, H, s, dv)
        mask = doc_mask(s, docs, "cpu")
        got = flex_attention(q, k, v, block_mask=create_block_mask(mask, 1, 1, s, s, device="cpu"), scale=dqk ** -0.5)
        i = torch.arange(s)
        allowed = mask(0, 0, i[:, None], i[None, :])
        want = torch.softmax((q @ k.transpose(-1, -2) * dqk ** -0.5).masked_fill(~allowed, float("-inf")), -1) @ v
        err = float((got - want).abs().max())
    # The chunked indexer's last chunk against brute force.
    qI, kI, w = torch.randn(40, 4, 8), torch.randn(40, 8), torch.randn(40, 4)
    vals, _ = indexer_chunked(qI, kI, w, 5, 16)
    full = torch.einsum("thj,th->tj", torch.relu(torch.einsum("thd,jd->thj", qI, kI)), w)
    full = full.masked_fill(torch.arange(40)[None, :] > torch.arange(40)[:, None], float("-inf"))
    ind_err = float((vals - torch.topk(full[32:], 5, dim=-1).values).abs().max())
    # The chunked sparse gather against a dense masked softmax over the same table.
    qs, kvs = torch.randn(20, 2, 16), torch.randn(20, 16)
    tab = sparse_table(20, 6, "cpu")
    got_s = sparse_chunked(qs, kvs, tab, 8, 0.25, 7)
    allow = torch.zeros(20, 20, dtype=torch.bool)
    for r in range(20):
        for j in tab[r].tolist():
            if j >= 0:
                allow[r, j] = True
    ls = (torch.einsum("thd,jd->thj", qs, kvs) * 0.25).masked_fill(~allow[:, None, :], float("-inf"))
    sparse_err = float((got_s - torch.einsum("thj,jv->thv", torch.softmax(ls, -1), kvs[:, :8])).abs().max())
    assert int((tab >= 0).sum()) == sum(min(6, t + 1) for t in range(20))
    print(json.dumps({"rehearse": "torch_attention_bench", "torch": torch.__version__,
                      "cuda": torch.cuda.is_available(), "flex_doc_mask_max_err": err,
                      "chunked_indexer_max_err": ind_err, "chunked_sparse_max_err": sparse_err}))
    return 0 if (err is None or err < 1e-4) and ind_err < 1e-4 and sparse_err < 1e-4 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hmla", help="hmla_cuda_check --bench output (JSON lines)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rehearse", action="store_true")
    a = ap.parse_args()
    if a.rehearse:
        return rehearse()
    lines = [json.loads(x) for x in open(a.hmla) if x.startswith("{") and '"bench"' in x]
    if not lines:
        print("torch_attention_bench: no hmla bench lines in " + a.hmla, file=sys.stderr)
        return 1
    for h in (x for x in lines if x["bench"] == "cuda-indexer"):
        t = measure_indexer(h, a.reps)
        print(json.dumps({"bench": "cuda-indexer", "s": h["s"], "HI": h["HI"], "DI": h["DI"], "K": h["K"],
                          "hmla_scores_topk_ms": h["hmla_scores_topk_ms"], **t,
                          "speedup": t["torch_chunked_ms"] / h["hmla_scores_topk_ms"], "peak_bytes": h["peak_bytes"]}))
    for h in (x for x in lines if x["bench"] == "cuda-sparse-mla"):
        t = measure_sparse(h, a.reps)
        print(json.dumps({"bench": "cuda-sparse-mla", "s": h["s"], "H": h["H"], "K": h["K"],
                          "valid_pairs": h["valid_pairs"], "hmla_fwd_tflops": h["hmla_fwd_tflops"],
                          "hmla_bwd_tflops": h["hmla_bwd_tflops"], "torch_fwd_tflops": t.get("torch_fwd_tflops"),
                          "torch_fwdbwd_tflops": t.get("torch_fwdbwd_tflops"), "peak_bytes": h["peak_bytes"],
                          **{k: v for k, v in t.items() if k.startswith("torch_") and k not in
                             ("torch_fwd_tflops", "torch_fwdbwd_tflops")}}))
    # One merged line per shape: hmla through each backend (hmla_cuda_check measured both), torch's
    # cuDNN SDPA and flex attention, and the ratios the targets are on.
    shapes = {}
    for h in (x for x in lines if x["bench"] == "cuda-attention"):
        shapes.setdefault((h["s"], h["H"], h["dqk"], h["dv"], h["docs"]), {})[h.get("backend", "hmla")] = h
    for (s_, H, dqk, dv, docs), by in shapes.items():
        t = measure({"s": s_, "H": H, "dqk": dqk, "dv": dv, "docs": docs}, a.reps)
        merged = {"bench": "cuda-attention", "s": s_, "H": H, "dqk": dqk, "dv": dv, "docs": docs}
        for be, h in by.items():
            if "declined" in h:
                merged[f"{be}_declined"] = h["declined"]
                continue
            merged[f"{be}_fwd_tflops"] = h["hmla_fwd_tflops"]
            merged[f"{be}_fwdbwd_tflops"] = h["hmla_fwdbwd_tflops"]
            merged[f"{be}_peak_bytes"] = h["peak_bytes"]
        merged.update(t)
        for be in ("cudnn", "hmla"):  # hmla's over torch's: cuDNN SDPA (one document), flex (documents)
            for ref in ("cudnn", "flex"):
                mine, theirs = merged.get(f"{be}_fwdbwd_tflops"), t.get(f"torch_{ref}_fwdbwd_tflops")
                if mine and theirs:
                    merged[f"{be}_over_torch_{ref}_fwdbwd"] = mine / theirs
        print(json.dumps(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
