#!/usr/bin/env python3
"""hmla.torch's operators (CPU, float32) against float64 PyTorch implementations written here
(materialised, small shapes), values and every gradient, by the STYLE.md rule: the operator's max
error against the float64 reference is at most twice that of the same reference run in float32,
plus 8 float32 ulps of the largest magnitude that enters (the cancelled terms where a result
cancels). Coverage as the C++ tables: documents, one-token documents, padding rows, GQA and MQA,
192/128 and 576/512 heads, a sink, a window, exact ties in the indexer, K larger than a
document, -1 entries; bad input raises ValueError; the dense KL's workspace is linear in s.

Run with PYTHONPATH=BUILD/python (where `make build` assembles the package) and Debian's python3."""
import math
import sys

import torch

import hmla.torch as ht

EPS32 = torch.finfo(torch.float32).eps
ok = True


def check(name, got, ref64, naive32, cancelled=0.0):
    """The rule on one tensor; infinities (lse of rows with no key) must match exactly."""
    global ok
    got, naive32 = got.detach().double(), naive32.detach().double()
    ref64 = ref64.detach()
    fin = torch.isfinite(ref64)
    same_inf = bool(torch.equal(torch.isfinite(got), fin)) and bool(torch.equal(got[~fin], ref64[~fin]))
    err = float((got[fin] - ref64[fin]).abs().max()) if fin.any() else 0.0
    nerr = float((naive32[fin] - ref64[fin]).abs().max()) if fin.any() else 0.0
    mag = float(ref64[fin].abs().max()) if fin.any() else 0.0
    bound = 2 * nerr + 8 * EPS32 * max(mag, cancelled)
    good = same_inf and err <= bound and not torch.isnan(got).any()
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name}: error {err:.3g} <= {bound:.3g}" + ("" if same_inf else " (inf mismatch)"))


def expect(name, cond, detail=""):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {name} {detail}")


def raises(name, f, needle):
    try:
        f()
    except ValueError as e:
        expect(name, needle in str(e), f"(ValueError: {e})")
        return
    except Exception as e:  # noqa: BLE001
        expect(name, False, f"(raised {type(e).__name__}: {e}, not ValueError)")
        return
    expect(name, False, "(no error)")


# ---- layouts: the allowed keys A(t) = [doc_start[t], t], as a [b, s, s] mask --------------------

def allowed(b, s, cu_seqlens=None, end_rows=None):
    t = torch.arange(s)
    if cu_seqlens is not None:
        cu = cu_seqlens.tolist()
        start = torch.full((s,), s + 1)  # padding rows after the last document: no key
        for a, e in zip(cu[:-1], cu[1:]):
            start[a:e] = a
        start = start.view(1, s)
    elif end_rows is not None:
        start = torch.empty(b, s, dtype=torch.long)
        for r in range(b):
            for i in range(s):
                e = int(end_rows[r, i])
                if e <= i:
                    start[r, i] = s + 1
                else:
                    j = i
                    while j > 0 and int(end_rows[r, j - 1]) == e and e > j - 1:
                        j -= 1
                    start[r, i] = j
    else:
        start = torch.zeros(b, s, dtype=torch.long)
    return (t.view(1, 1, s) <= t.view(1, s, 1)) & (t.view(1, 1, s) >= start.view(-1, s, 1))


# ---- attention ----------------------------------------------------------------------------------

def attention_ref(q, k, v, scale, mask, sink):
    """Materialised: logits [b, H, s, s] over A(t) (and the sink), out and lse; rows with no key give
    out 0 and lse +inf, with or without a sink."""
    b, s, H, _ = q.shape
    g = H // k.shape[2]
    kk, vv = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    logits = torch.einsum("bthd,bjhd->bhtj", q, kk) * scale
    logits = logits.masked_fill(~mask.unsqueeze(1), -math.inf)
    if sink is not None:
        logits = torch.cat([logits, sink.view(1, H, 1, 1).expand(b, H, s, 1).to(logits.dtype)], -1)
    lse = torch.logsumexp(logits, -1)
    p = torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0)
    if sink is not None:
        p = p[..., :-1]
    empty = ~mask.any(-1).unsqueeze(1).expand(b, H, s)  # no key: out 0, lse +inf (a sink alone is no key)
    p = p.masked_fill(empty.unsqueeze(-1), 0.0)
    out = torch.einsum("bhtj,bjhd->bthd", p, vv)
    return out, lse.masked_fill(empty | ~torch.isfinite(lse), math.inf)


def attention_case(name, b, s, H, Hkv, Dqk, Dv, layout=None, sink=False, v_from_k=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, H, Dqk, generator=g)
    k = torch.randn(b, s, Hkv, Dqk, generator=g)
    v = None if v_from_k else torch.randn(b, s, Hkv, Dv, generator=g)
    sk = torch.randn(H, generator=g) if sink else None
    dout = torch.randn(b, s, H, Dv, generator=g)
    layout = layout or {}
    mask = allowed(b, s, **layout)
    scale = 1.0 / math.sqrt(Dqk)
    leaves = [x for x in (q, k, v, sk) if x is not None]
    for x in leaves:
        x.requires_grad_(True)
    out, lse = ht.attention(q, k, v, scale=scale, sink=sk, v_from_k=Dv if v_from_k else None, **layout)
    (out * dout).sum().backward()
    got = [out, lse] + [x.grad for x in leaves]
    refs = {}
    for dt in (torch.float64, torch.float32):
        xs = [x.detach().to(dt).requires_grad_(True) for x in leaves]
        it = iter(xs)
        qq, kk = next(it), next(it)
        vv = kk[..., :Dv] if v_from_k else next(it)
        ss = next(it) if sink else None
        o, lz = attention_ref(qq, kk, vv, scale, mask, ss)
        (o * dout.to(dt)).sum().backward()
        refs[dt] = [o, lz] + [x.grad for x in xs]
    names = ["out", "lse", "dq", "dk"] + ([] if v_from_k else ["dv"]) + (["dsink"] if sink else [])
    for n, a, r64, r32 in zip(names, got, refs[torch.float64], refs[torch.float32]):
        check(f"attention {name} {n}", a, r64, r32)


# ---- the indexer ---------------------------------------------------------------------------------

def scores_ref(qI, kI, w):  # I [b, s, s]
    return torch.einsum("bth,bthj->btj", w, torch.relu(torch.einsum("bthd,bjd->bthj", qI, kI)))


def topk_ref(I, mask, K, W):
    b, s, _ = I.shape
    out = torch.full((b, s, K + W), -1, dtype=torch.int32)
    for r in range(b):
        for t in range(s):
            keys = mask[r, t].nonzero().flatten().tolist()
            if not keys:
                continue
            win = keys[max(len(keys) - W, 0):] if W else []
            cand = keys[:len(keys) - len(win)]
            cand.sort(key=lambda j: (-float(I[r, t, j]), j))
            row = cand[:K]
            out[r, t, :len(row)] = torch.tensor(row, dtype=torch.int32)
            out[r, t, K:K + len(win)] = torch.tensor(win, dtype=torch.int32)
    return out


def topk_case(name, b, s, HI, DI, K, W, layout=None, seed=0):
    """Integer-valued inputs: every score is exact in float32, so the tables must be equal, ties included."""
    g = torch.Generator().manual_seed(seed)
    qI = torch.randint(-2, 3, (b, s, HI, DI), generator=g).float()
    kI = torch.randint(-2, 3, (b, s, DI), generator=g).float()
    w = torch.randint(0, 3, (b, s, HI), generator=g).float()
    layout = layout or {}
    got = ht.indexer_topk(qI, kI, w, topk=K, window=W, **layout)
    want = topk_ref(scores_ref(qI.double(), kI.double(), w.double()), allowed(b, s, **layout), K, W)
    I = scores_ref(qI, kI, w)
    ties = int(sum(len(set(row.tolist())) < len(row) for row in I.flatten(0, 1)))
    expect(f"indexer_topk {name}: the table equals the reference", torch.equal(got, want), f"({ties} rows with ties)")


def kl_ref(qI, kI, w, q, k, scale, mask, cand, rw, coeff):
    """coeff * sum_t rw[t] KL(P_t || Q_t) over the candidates cand [b, s, s] (a subset of A(t))."""
    H, Hkv = q.shape[2], k.shape[2]
    kk = k.repeat_interleave(H // Hkv, 2)
    logits = torch.einsum("bthd,bjhd->bhtj", q, kk) * scale
    logits = logits.masked_fill(~cand.unsqueeze(1), -math.inf)
    P = torch.softmax(logits, -1).nan_to_num(0.0).mean(1)
    logQ = torch.log_softmax(scores_ref(qI, kI, w).masked_fill(~cand, -math.inf), -1)
    term = torch.where(P > 0, P * (torch.log(P) - logQ), torch.zeros_like(P))
    return coeff * (rw * term.sum(-1)).sum()


def table_mask(table, s, K):
    b = table.shape[0]
    m = torch.zeros(b, s, s, dtype=torch.bool)
    for r in range(b):
        for t in range(s):
            for j in table[r, t, :K].tolist():
                if j >= 0:
                    m[r, t, j] = True
    return m


def kl_case(name, b, s, HI, DI, H, Hkv, Dqk, layout=None, K=None, W=0, row_mask=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    qI = torch.randn(b, s, HI, DI, generator=g) * 0.5
    kI = torch.randn(b, s, DI, generator=g) * 0.5
    w = torch.randn(b, s, HI, generator=g)
    q = torch.randn(b, s, H, Dqk, generator=g)
    k = torch.randn(b, s, Hkv, Dqk, generator=g)
    layout = layout or {}
    mask = allowed(b, s, **layout)
    scale, coeff = 0.3, 0.5
    table = ht.indexer_topk(qI, kI, w, topk=K, window=W, **layout) if K else None
    cand = table_mask(table, s, K) if K else mask
    valid = mask.any(-1) & (row_mask if row_mask is not None else True)
    rw = valid.double() / max(int(valid.sum()), 1)
    leaves = [qI.clone().requires_grad_(True), kI.clone().requires_grad_(True), w.clone().requires_grad_(True)]
    loss = ht.indexer_kl(*leaves, q, k, scale=scale, topk_indices=table, window=W, row_mask=row_mask, coeff=coeff,
                         **layout)
    loss.backward()
    got = [loss] + [x.grad for x in leaves]
    refs = {}
    for dt in (torch.float64, torch.float32):
        xs = [x.detach().to(dt).requires_grad_(True) for x in (qI, kI, w)]
        r = kl_ref(*xs, q.to(dt), k.to(dt), scale, mask, cand, rw.to(dt), coeff)
        r.backward()
        refs[dt] = [r] + [x.grad for x in xs]
    expect(f"indexer_kl {name}: 0-dim float32", loss.dim() == 0 and loss.dtype == torch.float32)
    for n, a, r64, r32 in zip(["loss", "dq_idx", "dk_idx", "dweights"], got, refs[torch.float64], refs[torch.float32]):
        check(f"indexer_kl {name} {n}", a, r64, r32)


# ---- sparse latent MQA ---------------------------------------------------------------------------

def sparse_ref(q, kv, idx, scale, dv, sink):
    b, s, H, _ = q.shape
    m = torch.zeros(b, s, kv.shape[1], dtype=torch.bool)
    for r in range(b):
        for t in range(s):
            for j in idx[r, t].tolist():
                if j >= 0:
                    m[r, t, j] = True
    return attention_ref(q, kv.unsqueeze(2), kv[..., :dv].unsqueeze(2), scale, m, sink)


def sparse_case(name, b, s, H, Dqk, dv, N, sink=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, H, Dqk, generator=g)
    kv = torch.randn(b, s, Dqk, generator=g)
    sk = torch.randn(H, generator=g) if sink else None
    idx = torch.full((b, s, N), -1, dtype=torch.int32)
    for r in range(b):
        for t in range(s):
            keys = torch.randperm(t + 1, generator=g)[:N - 1].to(torch.int32)  # one slot left -1 at least
            idx[r, t, :len(keys)] = keys
    dout = torch.randn(b, s, H, dv, generator=g)
    scale = 1.0 / math.sqrt(Dqk)
    leaves = [x.clone().requires_grad_(True) for x in (q, kv) + ((sk,) if sink else ())]
    out, lse = ht.sparse_mla(leaves[0], leaves[1], idx, scale=scale, dv=dv, sink=leaves[2] if sink else None)
    (out * dout).sum().backward()
    got = [out, lse] + [x.grad for x in leaves]
    refs = {}
    for dt in (torch.float64, torch.float32):
        xs = [x.detach().to(dt).requires_grad_(True) for x in leaves]
        o, lz = sparse_ref(xs[0], xs[1], idx, scale, dv, xs[2] if sink else None)
        (o * dout.to(dt)).sum().backward()
        refs[dt] = [o, lz] + [x.grad for x in xs]
    for n, a, r64, r32 in zip(["out", "lse", "dq", "dkv", "dsink"], got, refs[torch.float64], refs[torch.float32]):
        check(f"sparse_mla {name} {n}", a, r64, r32)


# ---- the cases ----------------------------------------------------------------------------------

def main():
    docs = {"cu_seqlens": torch.tensor([0, 7, 8, 9, 30], dtype=torch.int32)}  # one-token documents, padding after 30
    ends = torch.tensor([[5] * 5 + [12] * 7 + [0] * 4, [16] * 16])  # row 0: two documents, then padding
    attention_case("causal_mha", 2, 16, 4, 4, 16, 16)
    attention_case("documents_gqa", 1, 32, 4, 2, 24, 16, layout=docs, seed=1)
    attention_case("end_rows_mqa_sink", 2, 16, 4, 1, 16, 8, layout={"end_rows": ends.to(torch.int32)}, sink=True,
                   seed=2)
    attention_case("mha_192_128", 1, 12, 2, 2, 192, 128, seed=3)
    attention_case("latent_576_512_v_from_k_sink", 1, 10, 2, 1, 576, 512, sink=True, v_from_k=True, seed=4)
    topk_case("ties_documents", 1, 32, 2, 4, 4, 0, layout=docs, seed=5)
    topk_case("window_k_above_document", 2, 16, 3, 4, 8, 2, layout={"end_rows": ends.to(torch.int32)}, seed=6)
    kl_case("dense_documents_gqa", 1, 32, 2, 8, 4, 2, 12, layout=docs, seed=7)
    kl_case("dense_row_mask_mqa", 2, 16, 3, 8, 2, 1, 8, row_mask=torch.rand(2, 16, generator=torch.Generator().manual_seed(8)) > 0.3,
            seed=8)
    kl_case("sparse_window", 1, 32, 2, 8, 2, 2, 8, layout=docs, K=6, W=2, seed=9)
    sparse_case("latent_h4", 2, 12, 4, 32, 24, 6, seed=10)
    sparse_case("sink_k_above_rows", 1, 8, 2, 16, 16, 12, sink=True, seed=11)

    q = torch.randn(1, 8, 2, 16)
    kv = torch.randn(1, 8, 16)
    dup = torch.zeros(1, 8, 2, dtype=torch.int32)  # key 0 listed twice
    raises("sparse_mla: a duplicate key", lambda: ht.sparse_mla(q, kv, dup, scale=0.25, dv=8), "twice")
    far = torch.full((1, 8, 2), -1, dtype=torch.int32)
    far[0, 3, 0] = 9
    raises("sparse_mla: a key out of range", lambda: ht.sparse_mla(q, kv, far, scale=0.25, dv=8), "9")
    raises("attention: mismatched k", lambda: ht.attention(q, q[:, :4], q, scale=0.25), "has [b, s]")
    raises("attention: both layouts", lambda: ht.attention(q, q, q, scale=0.25, cu_seqlens=torch.tensor([0, 8]),
                                                            end_rows=torch.full((1, 8), 8)), "not both")
    raises("attention: a float64 tensor", lambda: ht.attention(q.double(), q.double(), q.double(), scale=0.25),
           "not one of float32")
    raises("indexer_kl: a bad row_mask", lambda: ht.indexer_kl(torch.randn(1, 8, 2, 4), torch.randn(1, 8, 4),
                                                               torch.randn(1, 8, 2), q, q, scale=0.3,
                                                               row_mask=torch.ones(2, 8, dtype=torch.bool)), "row_mask")

    # The dense KL's workspace: hmla's allocator peak over what the call keeps (its gradients), at
    # s and 2 s: linear in s (an [s, s] buffer would quadruple it).
    peaks = []
    for s in (4096, 8192):
        g = torch.Generator().manual_seed(12)
        args = (torch.randn(1, s, 2, 16, generator=g), torch.randn(1, s, 16, generator=g), torch.randn(1, s, 2, generator=g),
                torch.randn(1, s, 1, 16, generator=g), torch.randn(1, s, 1, 16, generator=g))
        ht.memory_stats(reset_peak=True)
        live = ht.memory_stats()["cpu"]["live_bytes"]
        loss = ht.indexer_kl(*[a.requires_grad_(i < 3) for i, a in enumerate(args)], scale=0.25)
        peaks.append(ht.memory_stats()["cpu"]["peak_bytes"] - live)
        del loss
    expect("indexer_kl: workspace at 8192 <= 2.1 x at 4096", peaks[1] <= 2.1 * peaks[0], f"({peaks[0]} -> {peaks[1]} bytes)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
