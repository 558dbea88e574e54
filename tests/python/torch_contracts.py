#!/usr/bin/env python3
"""hmla.torch's contracts (issue 24): every tensor argument in any layout, the argument rules, the
index-table contract of DESIGN.md section 4, the sink's edge cases and second derivatives.

The property test runs every operator on random views of its inputs (expanded over batch, rows or
heads; transposed storage; sliced along rows, heads and the last dimension; one-element
dimensions with strides of 2^31 and more) and compares outputs and gradients with the call on
contiguous copies of the same values. The rule is bit equality, and it is an argument, not a
measurement: the binding either hands the kernel the view (strides it takes: the same values, read
in the same order, with other addresses; BLAS packs its operands before it computes, so its
leading dimension changes no arithmetic) or a contiguous copy (the same call exactly). On CUDA
(where built and a device is present) the same cases run in bfloat16 with the kernels' widths.

Run with PYTHONPATH=BUILD/python and Debian's python3."""
import math
import os
import sys
import tempfile

import torch

import hmla.torch as ht

ok = True


def expect(name, cond, detail=""):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {name} {detail}")


def raises(name, f, needle, exc=ValueError):
    try:
        f()
    except exc as e:
        expect(name, needle in str(e), f"({type(e).__name__}: {e})")
        return
    except Exception as e:  # noqa: BLE001
        expect(name, False, f"(raised {type(e).__name__}: {e}, not {exc.__name__})")
        return
    expect(name, False, "(no error)")


def same(name, got, want):
    """Bit equality of two tensor lists (None where both are None); infinities and NaN positions too."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a is None or b is None:
            expect(f"{name} [{i}]", a is None and b is None, "(one is None)")
            continue
        eq = a.shape == b.shape and bool(torch.equal(a.detach().cpu().view(-1).view(torch.uint8) if a.dtype == torch.bool
                                                     else a.detach().cpu().contiguous().view(-1),
                                                     b.detach().cpu().contiguous().view(-1)))
        if not eq:
            d = (a.detach().double() - b.detach().double()).abs()
            expect(f"{name} [{i}]", False, f"(max difference {float(d[torch.isfinite(d)].max()) if torch.isfinite(d).any() else 'nan'})")
            return
    expect(name, True)


class StdoutCapture:
    """Captures file descriptor 1 (OpenBLAS reports bad arguments with printf, not an exception)."""

    def __enter__(self):
        sys.stdout.flush()
        self.tmp = tempfile.TemporaryFile()
        self.saved = os.dup(1)
        os.dup2(self.tmp.fileno(), 1)
        return self

    def __exit__(self, *exc):
        os.dup2(self.saved, 1)
        os.close(self.saved)
        self.tmp.seek(0)
        self.text = self.tmp.read().decode(errors="replace")
        self.tmp.close()


# ---- views ----------------------------------------------------------------------------------------

def views(x, g):
    """Views of x's values (same shape) in other layouts: (name, view), each built from a fresh base."""
    shape, out = tuple(x.shape), []
    nd = x.dim()
    # expanded along each dimension of size > 1 whose values are made equal along it
    for d in range(nd - 1):
        if shape[d] > 1:
            one = x.narrow(d, 0, 1)
            out.append((f"expand{d}", one, lambda base, d=d: base.expand(shape)))
    # transposed storage: the values live with dimensions d and d + 1 swapped
    for d in range(nd - 1):
        out.append((f"transposed{d}", x, lambda base, d=d: base.transpose(d, d + 1).contiguous().transpose(d, d + 1)))
    # sliced out of a larger tensor along each dimension (strides larger than contiguous)
    for d in range(nd):
        out.append((f"sliced{d}", x, lambda base, d=d: torch.cat([base, torch.zeros_like(base)], d).narrow(d, 0, shape[d])))
    # one-element dimensions at strides of 2^31 and more (cheap: such a stride is never multiplied)
    ones = [d for d in range(nd) if shape[d] == 1]
    if ones:
        def huge(base):
            st = list(base.contiguous().stride())
            for d in ones:
                st[d] = 1 << (31 + d)
            return base.contiguous().as_strided(shape, st)
        out.append(("stride2^31", x, huge))
    return out


def make(values, build, requires_grad):
    """The view `build` makes of a leaf holding `values`; the view takes part in autograd."""
    base = values.detach().clone().requires_grad_(requires_grad and values.is_floating_point())
    v = build(base)
    return v, base


def run_op(op, args, diff):
    """Runs op(*args) -> outputs (tensors); returns outputs and the gradients with respect to the
    differentiable args (the tensors handed to the op) of sum(out * fixed random weights)."""
    outs = op(*args)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    grads = []
    if diff:
        gen = torch.Generator().manual_seed(99)
        loss = sum((o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)).sum()
                   for o in outs if o.is_floating_point() and o.requires_grad)
        wrt = [args[i] for i in diff]
        grads = list(torch.autograd.grad(loss, wrt, allow_unused=True))
    return list(outs), grads


def property_case(name, op, args, diff):
    """Each argument in turn through each of its views; outputs and gradients bit-equal to the
    contiguous call's."""
    ref_args = [a.detach().clone().requires_grad_(i in diff) if isinstance(a, torch.Tensor) else a
                for i, a in enumerate(args)]
    want_out, want_grad = run_op(op, ref_args, diff)
    g = torch.Generator().manual_seed(7)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or a.dim() == 0:
            continue
        for vname, values, build in views(a, g):
            if values is not a:  # an expanded view: its values are the first slice broadcast
                v_args = list(ref_args)
                v_args[i] = values.expand(a.shape).contiguous()
                v_args = [x.detach().clone().requires_grad_(j in diff) if isinstance(x, torch.Tensor) else x
                          for j, x in enumerate(v_args)]
                w_out, w_grad = run_op(op, v_args, diff)
            else:
                w_out, w_grad = want_out, want_grad
            t_args = [x.detach().clone().requires_grad_(j in diff) if isinstance(x, torch.Tensor) else x
                      for j, x in enumerate(ref_args)]
            view, _ = make(values if values is not a else a, build, i in diff)
            t_args[i] = view
            try:
                with StdoutCapture() as cap:
                    got_out, got_grad = run_op(op, t_args, diff)
            except Exception as e:  # noqa: BLE001
                expect(f"{name}: arg {i} {vname}", False, f"(raised {type(e).__name__}: {e})")
                continue
            expect(f"{name}: arg {i} {vname}: nothing printed", cap.text == "", repr(cap.text[:120]))
            same(f"{name}: arg {i} {vname}", got_out + got_grad, w_out + w_grad)


def property_tests(dev):
    cuda = dev == "cuda"
    lp = torch.bfloat16 if cuda else torch.float32  # what attention, topk and sparse_mla take there
    H, D, Dv = (16, 32, 16) if cuda else (4, 16, 8)
    g = torch.Generator().manual_seed(1)

    def rnd(*shape, dtype=lp):
        return torch.randn(*shape, generator=g).to(dtype).to(dev)

    b, s = 2, 12
    docs = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=dev)  # a zero-length document at 5
    att = lambda q, k, v, sink: ht.attention(q, k, v, scale=0.3, sink=sink)  # noqa: E731
    property_case(f"{dev} attention", att, [rnd(b, s, H, D), rnd(b, s, H // 2, D), rnd(b, s, H // 2, Dv),
                                            rnd(H, dtype=torch.float32)], diff=[0, 1, 2, 3])
    att_docs = lambda q, k: ht.attention(q, k, None, v_from_k=Dv, scale=0.3, cu_seqlens=docs)  # noqa: E731
    property_case(f"{dev} attention v_from_k documents", att_docs, [rnd(1, s, H, D), rnd(1, s, 1, D)], diff=[0, 1])

    HI, DI, K = (16, 16, 4) if cuda else (2, 8, 4)
    topk = lambda qI, kI, w: ht.indexer_topk(qI, kI, w, topk=K, window=1)  # noqa: E731
    property_case(f"{dev} indexer_topk", topk, [rnd(b, s, HI, DI), rnd(b, s, DI), rnd(b, s, HI, dtype=torch.float32)],
                  diff=[])
    f32 = torch.float32
    kl = lambda qI, kI, w, q, k: ht.indexer_kl(qI, kI, w, q, k, scale=0.3, coeff=0.5)  # noqa: E731
    kl_args = [rnd(b, s, HI, DI, dtype=f32), rnd(b, s, DI, dtype=f32), rnd(b, s, HI, dtype=f32),
               rnd(b, s, H, D, dtype=f32), rnd(b, s, 2, D, dtype=f32)]
    property_case(f"{dev} indexer_kl dense", kl, kl_args, diff=[0, 1, 2])
    table = ht.indexer_topk(kl_args[0].to(lp), kl_args[1].to(lp), kl_args[2], topk=K, window=1)
    kls = lambda qI, kI, w, q, k, t: ht.indexer_kl(qI, kI, w, q, k, scale=0.3, topk_indices=t, window=1)  # noqa: E731
    property_case(f"{dev} indexer_kl sparse", kls, kl_args + [table], diff=[0, 1, 2])

    Dqk = 32 if cuda else 24
    sp = lambda q, kv, idx, sink: ht.sparse_mla(q, kv, idx, scale=0.2, dv=16, sink=sink)  # noqa: E731
    idx = torch.full((b, s, 5), -1, dtype=torch.int32)
    for r in range(b):
        for t in range(s):
            keys = torch.randperm(t + 1, generator=g)[:4].to(torch.int32)
            idx[r, t, :len(keys)] = keys
    property_case(f"{dev} sparse_mla", sp, [rnd(b, s, H, Dqk), rnd(b, s, Dqk), idx.to(dev), rnd(H, dtype=f32)],
                  diff=[0, 1, 3])


# ---- the reproductions ----------------------------------------------------------------------

def reproductions():
    torch.manual_seed(0)
    q, k = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    v = torch.randn(1, 1, 2, 8).expand(1, 8, 2, 8)
    with StdoutCapture() as cap:
        got = ht.attention(q, k, v, scale=.25)[0]
    expect("expanded v rows: no SGEMM complaint", "SGEMM" not in cap.text, repr(cap.text[:80]))
    same("expanded v rows: equals the contiguous v", [got], [ht.attention(q, k, v.contiguous(), scale=.25)[0]])

    # the sink's stride: [::2] and expand(H)
    qs, kv = torch.randn(1, 8, 4, 16), torch.randn(1, 8, 16)
    idx = torch.tensor([[[j for j in range(t + 1)][:3] + [-1] * (3 - min(t + 1, 3))] for t in range(8)],
                       dtype=torch.int32).view(1, 8, 3)
    views_of_sink = (("[::2]", torch.randn(8)[::2].clone(), lambda base: torch.stack([base, 0 * base], 1).view(8)[::2]),
                     ("expand(4)", torch.tensor([.5]), lambda base: base.expand(4)))
    for sname, values, build in views_of_sink:
        res = []
        for sk in (build(values.clone().requires_grad_(True)), values.expand(4).clone().requires_grad_(True)):
            out, lse = ht.sparse_mla(qs, kv, idx, scale=0.25, dv=8, sink=sk)
            dsink, = torch.autograd.grad((out * torch.arange(out.numel()).view(out.shape).sin()).sum(), [sk])
            res.append([out, lse, dsink])
        same(f"sparse_mla sink {sname}: out, lse, dsink equal the contiguous sink's", res[0], res[1])

    # an infinite sink: zero gradients, never NaN (FlashMLA's gradient cases), in both operators
    sink = torch.tensor([0.3, math.inf, -0.2, math.inf]).requires_grad_(True)
    qq, kk = qs.clone().requires_grad_(True), kv.clone().requires_grad_(True)
    out, lse = ht.sparse_mla(qq, kk, idx, scale=0.25, dv=8, sink=sink)
    dq, dkv, ds = torch.autograd.grad((out * torch.randn_like(out)).sum(), [qq, kk, sink])
    finite = all(bool(torch.isfinite(x).all()) for x in (out, dq, dkv, ds))
    expect("sparse_mla +inf sink: out and gradients finite", finite, f"(dsink {ds.tolist()})")
    expect("sparse_mla +inf sink: the head's dsink and dq are 0", float(ds[1]) == 0 and float(ds[3]) == 0
           and bool((dq[:, :, 1] == 0).all()))
    qa = qs.clone().requires_grad_(True)
    out, _ = ht.attention(qa, kv.unsqueeze(2), None, v_from_k=8, scale=0.25, sink=sink)
    dq, ds = torch.autograd.grad((out * torch.randn_like(out)).sum(), [qa, sink])
    expect("attention +inf sink: gradients finite, the head's dsink 0",
           bool(torch.isfinite(dq).all()) and float(ds[1]) == 0 and float(ds[3]) == 0)

    # second derivatives raise (once_differentiable), never a silent None
    qI, kI, w = (torch.randn(1, 8, 2, 4, requires_grad=True), torch.randn(1, 8, 4, requires_grad=True),
                 torch.randn(1, 8, 2, requires_grad=True))
    loss = ht.indexer_kl(qI, kI, w, qs, qs, scale=0.3)
    gq, = torch.autograd.grad(loss, [qI], create_graph=True)
    raises("indexer_kl: double backward raises", lambda: gq.sum().backward(), "no second derivative", RuntimeError)
    raises("indexer_kl: hessian raises", lambda: torch.autograd.functional.hessian(
        lambda x: ht.indexer_kl(x, kI, w, qs, qs, scale=0.3), qI.detach()), "no second derivative", RuntimeError)
    qa = qs.clone().requires_grad_(True)
    out, _ = ht.attention(qa, qs, qs, scale=.25)
    gq, = torch.autograd.grad(out.sum(), [qa], create_graph=True)
    raises("attention: double backward raises", lambda: gq.sum().backward(), "no second derivative", RuntimeError)
    qa = qs.clone().requires_grad_(True)
    out, _ = ht.sparse_mla(qa, kv, idx, scale=.25, dv=8)
    gq, = torch.autograd.grad(out.sum(), [qa], create_graph=True)
    raises("sparse_mla: double backward raises", lambda: gq.sum().backward(), "no second derivative", RuntimeError)


def argument_rules():
    q = torch.randn(1, 8, 2, 16)
    kv = torch.randn(1, 8, 16)
    qI, kI, w = torch.randn(1, 8, 2, 4), torch.randn(1, 8, 4), torch.randn(1, 8, 2)
    att = lambda **kw: ht.attention(q, q, q, scale=.25, **kw)  # noqa: E731
    raises("cu_seqlens float", lambda: att(cu_seqlens=torch.tensor([0., 3.7, 8.])), "cu_seqlens must be an int32")
    raises("cu_seqlens bool", lambda: att(cu_seqlens=torch.tensor([False, True])), "cu_seqlens must be an int32")
    raises("cu_seqlens requiring grad", lambda: att(cu_seqlens=torch.tensor([0., 8.], requires_grad=True)),
           "must not require grad")
    raises("end_rows f32", lambda: att(end_rows=torch.full((1, 8), 8.)), "end_rows must be an int32")
    raises("end_rows i64", lambda: att(end_rows=torch.full((1, 8), 8, dtype=torch.int64)), "end_rows must be an int32")
    raises("row_mask float", lambda: ht.indexer_kl(qI, kI, w, q, q, scale=.3, row_mask=torch.ones(1, 8)),
           "row_mask must be a bool")
    raises("topk 3.9", lambda: ht.indexer_topk(qI, kI, w, topk=3.9), "topk must be an integer")
    raises("topk True", lambda: ht.indexer_topk(qI, kI, w, topk=True), "topk must be an integer")
    raises("q shorter than k", lambda: ht.attention(q[:, :4], q, q, scale=.25), "has [b, s]")
    raises("kv longer than q", lambda: ht.sparse_mla(q[:, :4], kv, torch.full((1, 4, 2), -1, dtype=torch.int32),
                                                     scale=.25, dv=8), "has [b, s]")
    raises("v_from_k -3", lambda: ht.attention(q, q, None, v_from_k=-3, scale=.25), "v_from_k = -3")
    raises("v_from_k 1000", lambda: ht.attention(q, q, None, v_from_k=1000, scale=.25), "v_from_k = 1000")
    raises("indexer_kl scale inf", lambda: ht.indexer_kl(qI, kI, w, q, q, scale=math.inf), "scale = inf")
    raises("indexer_kl coeff inf", lambda: ht.indexer_kl(qI, kI, w, q, q, scale=.3, coeff=math.inf), "coeff = inf")
    raises("attention scale nan", lambda: ht.attention(q, q, q, scale=math.nan), "scale = nan")
    raises("attention backend flash", lambda: ht.attention(q, q, q, scale=.25, backend="flash"),
           "backend must be one of auto, cudnn, hmla, got 'flash'")
    raises("attention backend cudnn on the CPU", lambda: ht.attention(q, q, q, scale=.25, backend="cudnn"),
           "backend cudnn needs CUDA tensors")
    same("attention backend hmla is auto's on the CPU", ht.attention(q, q, q, scale=.25, backend="hmla")[0],
         ht.attention(q, q, q, scale=.25)[0])
    raises("indexer_kl window without a table", lambda: ht.indexer_kl(qI, kI, w, q, q, scale=.3, window=2),
           "needs topk_indices")
    raises("sparse_mla dv 3.5", lambda: ht.sparse_mla(q, kv, torch.full((1, 8, 2), -1, dtype=torch.int32), scale=.25,
                                                      dv=3.5), "dv must be an integer")
    raises("invalid mode", lambda: ht.sparse_mla(q, kv, torch.full((1, 8, 2), -1, dtype=torch.int32), scale=.25, dv=8,
                                                 invalid="clamp"), "invalid must be")


def table_contract():
    torch.manual_seed(3)
    q, kv = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 16)
    qI, kI, w = torch.randn(1, 8, 2, 4), torch.randn(1, 8, 4), torch.randn(1, 8, 2)
    base = torch.full((1, 8, 3), -1, dtype=torch.int32)
    for t in range(8):
        base[0, t, 0] = t
    sp = lambda idx, **kw: ht.sparse_mla(q, kv, idx, scale=.25, dv=8, **kw)  # noqa: E731
    kl = lambda idx, **kw: ht.indexer_kl(qI, kI, w, q, q, scale=.3, topk_indices=idx, **kw)  # noqa: E731
    docs = torch.tensor([0, 4, 8], dtype=torch.int32)
    for what, val, row, layout in (("-5", -5, 3, {}), ("a later position", 6, 3, {}), ("s", 8, 3, {}),
                                   ("another document", 1, 5, {"cu_seqlens": docs})):
        bad = base.clone()
        bad[0, row, 1] = val
        for opname, op in (("sparse_mla", sp), ("indexer_kl", kl)):
            raises(f"{opname}: {what} in the table", lambda: op(bad, **layout), f"= {val} is neither -1")
            got, want = op(bad, invalid="skip", **layout), op(base, **layout)  # base: -1 where bad is invalid
            same(f"{opname}: {what} with invalid='skip' equals -1 there",
                 list(got) if isinstance(got, tuple) else [got], list(want) if isinstance(want, tuple) else [want])
    dup = base.clone()
    dup[0, 4, 1] = 4
    for opname, op in (("sparse_mla", sp), ("indexer_kl", kl)):
        raises(f"{opname}: a duplicate with invalid='skip'", lambda: op(dup, invalid="skip"), "twice")
    # zero-length documents (repeated offsets) are accepted and change nothing
    zl = torch.tensor([0, 0, 4, 4, 4, 8, 8], dtype=torch.int32)
    same("attention: zero-length documents in cu_seqlens",
         list(ht.attention(q, q, q, scale=.25, cu_seqlens=zl)), list(ht.attention(q, q, q, scale=.25, cu_seqlens=docs)))
    same("sparse_mla: zero-length documents in cu_seqlens", list(sp(base, cu_seqlens=zl)), list(sp(base, cu_seqlens=docs)))


def main():
    reproductions()
    argument_rules()
    table_contract()
    property_tests("cpu")
    if torch.cuda.is_available() and "cuda" in ht.memory_stats():
        property_tests("cuda")
    else:
        print("skip cuda: no device or hmla without CUDA")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
