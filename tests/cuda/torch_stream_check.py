#!/usr/bin/env python3
"""hmla.torch is ordered on torch's current stream (scripts/device-check --with-app, issue 27).

Each iteration, a torch kernel poisons q, k and v (NaN), a slow torch product holds the stream
back, and a torch copy writes the iteration's inputs, right before hmla reads them: on the current
stream ("current"), or on a side stream that the current one then waits for (`with
torch.cuda.stream(side)` ... `current_stream().wait_stream(side)`, the legitimate cross-stream
use: "side"). The output gradient is written the same way right before the backward. A third case
("fresh") gives hmla new torch tensors and drops them right after the forward and backward, then
fills new NaN tensors of their sizes (torch's caching allocator hands the same blocks out again on
the current stream): hmla must have read its inputs before those writes. If hmla ran on a stream
of its own, it would read poison or the previous iteration's inputs.

Every iteration's results (hmla.torch's dense attention forward and backward, and sparse_mla
forward and backward; four input sets, cycled, so that a stale read is a wrong result) must
(1) equal bit for bit what the same call gives with the device synchronised before and after it
(the kernels are deterministic: any difference is an ordering error), and (2) be within the rule's
bound of a float64 reference: at most twice the error of the naive implementation in the inputs'
precision (f32 sums, every stored intermediate, scores and probabilities and their gradients,
rounded to that precision, as hmla_cuda_check's naive bf16) plus one rounding of the output (half
an ulp: 2^-8 relative in bf16; 8 ulps in float32 as the CPU rule) of the largest reference
magnitude. One JSON line per op, case and
quantity; exit status 1 on any failure.

--rehearse runs the same plumbing on the CPU (float32, no streams: the cases differ only in where
the inputs come from), where no GPU is."""
import argparse
import contextlib
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hmla.torch as ht  # noqa: E402

SETS = 4


def causal_docs(s, cu):
    t = torch.arange(s)
    start = torch.zeros(s, dtype=torch.long)
    for a, e in zip(cu[:-1], cu[1:]):
        start[a:e] = a
    return (t[None, :] <= t[:, None]) & (t[None, :] >= start[:, None])


class _Round(torch.autograd.Function):
    """x rounded to dtype and back, and so its gradient: a stored intermediate of the naive arm."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype).to(g.dtype), None


def attention_ref(q, k, v, scale, mask, rdtype=None):
    r = (lambda x: _Round.apply(x, rdtype)) if rdtype is not None else (lambda x: x)  # noqa: E731
    logits = r(torch.einsum("bthd,bjhd->bhtj", q, k)) * scale
    p = r(torch.softmax(logits.masked_fill(~mask, -math.inf), -1))
    return torch.einsum("bhtj,bjhd->bthd", p, v)


def reference(f, inputs, dout, dtype):
    """f's output and input gradients in float64, and the naive arm: f32 sums on the inputs rounded
    to dtype, every stored intermediate and the results rounded to dtype."""
    def run(xs, d, wdtype, rdtype):
        xs = [x.detach().to(wdtype).requires_grad_(True) for x in xs]
        out = f(*xs, rdtype)
        out.backward(d.to(wdtype))
        return [out.detach()] + [x.grad for x in xs]
    ref = run(inputs, dout, torch.float64, None)
    naive = [t.to(dtype) for t in run([x.to(dtype) for x in inputs], dout.to(dtype), torch.float32, dtype)]
    return ref, naive


class Result:
    """The two checks over the iterations of one (op, case, quantity)."""

    def __init__(self, dtype):
        # One rounding of a bf16 output; in float32 (--rehearse, hmla's CPU kernels) the CPU rule's 8 ulps.
        self.rounding = 2.0 ** -8 if dtype == torch.bfloat16 else 8 * torch.finfo(dtype).eps
        self.iters, self.failures, self.unlike_synchronised, self.worst = 0, 0, 0, (-1.0, 0.0, 0.0)

    def add(self, got, synchronised, ref64, naive):
        got = got.detach().cpu()
        self.iters += 1
        self.unlike_synchronised += not torch.equal(got, synchronised)
        got = got.double()
        err = float((got - ref64).abs().max()) if torch.isfinite(got).all() else math.inf
        bound = 2 * float((naive.double() - ref64).abs().max()) + self.rounding * float(ref64.abs().max())
        self.failures += not err <= bound
        ratio = err / bound if bound > 0 else (0.0 if err == 0 else math.inf)
        if ratio > self.worst[0]:
            self.worst = (ratio, err, bound)


class Streams:
    """Where the writes before hmla's reads go: the current stream, or a side stream it waits for."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"
        self.side = torch.cuda.Stream(dev) if self.cuda else None
        n, dt = (4096, torch.bfloat16) if self.cuda else (8, torch.float32)
        # One product's operands per stream, never freed (no cross-stream reuse of theirs to order).
        self.work = {case: [torch.randn(n, n, device=dev, dtype=dt) / n ** 0.5 for _ in range(2)]
                     for case in ("current", "side")}

    @contextlib.contextmanager
    def writing(self, case):
        """The writes inside run after a slow product, on the case's stream; hmla comes after."""
        use_side = case == "side" and self.cuda
        if use_side:  # the side stream writes what the current stream's earlier work read
            self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side) if use_side else contextlib.nullcontext():
            a, c = self.work["side" if use_side else "current"]
            for _ in range(4):  # about 0.5 ms of work ahead of the writes on an H200
                torch.matmul(a, a, out=c)
            yield
        if use_side:
            torch.cuda.current_stream().wait_stream(self.side)


def poison_then_write(streams, case, bufs, values):
    with torch.no_grad(), streams.writing(case):
        for b in bufs:
            b.fill_(math.nan if b.is_floating_point() else -1)  # a table of no keys
        for b, x in zip(bufs, values):
            b.copy_(x)


def dense_sets(dev, dtype, s, H, D):
    g = torch.Generator().manual_seed(27)
    cu = [0, s // 3, s // 3 + 1, s]
    mask = causal_docs(s, cu)
    scale = D ** -0.5
    f = lambda q, k, v, r: attention_ref(q, k, v, scale, mask, r)  # noqa: E731
    sets = []
    for _ in range(SETS):
        x = [torch.randn(1, s, H, D, generator=g) for _ in range(3)]
        dout = torch.randn(1, s, H, D, generator=g)
        ref, naive = reference(f, x, dout, dtype)
        sets.append(([t.to(dev, dtype) for t in x], dout.to(dev, dtype), ref, naive))
    call = lambda q, k, v: ht.attention(q, k, v, scale=scale, cu_seqlens=torch.tensor(cu, dtype=torch.int32))[0]  # noqa
    return sets, call, ("out", "dq", "dk", "dv")


def sparse_sets(dev, dtype, s, H, Dqk, dv, N):
    g = torch.Generator().manual_seed(28)
    scale = Dqk ** -0.5
    sets = []
    for _ in range(SETS):
        idx = torch.stack([torch.cat([torch.randperm(t + 1, generator=g)[:N], torch.full((max(0, N - t - 1),), -1)])[:N]
                           for t in range(s)])[None].to(torch.int32)
        sel = torch.zeros(1, s, s, dtype=torch.bool)
        for t in range(s):
            sel[0, t, idx[0, t][idx[0, t] >= 0].long()] = True
        f = lambda q, kv, r: attention_ref(q, kv[:, :, None], kv[:, :, None, :dv], scale, sel[:, None], r)  # noqa
        x = [torch.randn(1, s, H, Dqk, generator=g), torch.randn(1, s, Dqk, generator=g)]
        dout = torch.randn(1, s, H, dv, generator=g)
        ref, naive = reference(f, x, dout, dtype)
        sets.append(([t.to(dev, dtype) for t in x] + [idx.to(dev)], dout.to(dev, dtype), ref, naive))
    call = lambda q, kv, idx: ht.sparse_mla(q, kv, idx, scale=scale, dv=dv)[0]  # noqa: E731
    return sets, call, ("out", "dq", "dkv")


def synchronised(call, xs, dout, diff):
    """The call's results with nothing else in flight (the device synchronised before and after)."""
    if xs[0].is_cuda:
        torch.cuda.synchronize()
    ins = [x.clone().requires_grad_(i < diff) for i, x in enumerate(xs)]
    out = call(*ins)
    out.backward(dout)
    if xs[0].is_cuda:
        torch.cuda.synchronize()
    return [out.detach().cpu()] + [x.grad.cpu() for x in ins[:diff]]


def one_fresh(call, xs, dout, diff):
    """Inputs in new torch tensors, dropped after the call; their blocks refilled with NaN at once."""
    ins = [x.clone().requires_grad_(i < diff) for i, x in enumerate(xs)]
    out = call(*ins)
    d = dout.clone()
    out.backward(d)
    grads = [x.grad for x in ins[:diff]]
    shapes = [(x.shape, x.dtype) for x in ins + [d]]
    out = out.detach()  # drops the graph, which holds the inputs
    del ins, d
    junk = [torch.full(sh, math.nan if dt.is_floating_point else -1, dtype=dt, device=xs[0].device)
            for sh, dt in shapes]
    return [out] + grads, junk


def iterate(op, sets, call, names, case, streams, iters, dtype):
    """iters forward and backward passes of call, inputs written right before each (the case's way)."""
    results = {n: Result(dtype) for n in names}
    diff = len(names) - 1  # the differentiable inputs come first; the rest (a table) stays as given
    golden = [synchronised(call, xs, dout, diff) for xs, dout, _, _ in sets]
    bufs = [x.detach().clone().requires_grad_(i < diff) for i, x in enumerate(sets[0][0])]
    dbuf = sets[0][1].clone()
    for it in range(iters):
        xs, dout, ref, naive = sets[it % SETS]
        if case == "fresh":
            got, junk = one_fresh(call, xs, dout, diff)  # noqa: F841  (junk: alive while hmla may run)
        else:
            for b in bufs[:diff]:
                b.grad = None
            poison_then_write(streams, case, bufs, xs)
            out = call(*bufs)
            poison_then_write(streams, case, [dbuf], [dout])
            out.backward(dbuf)
            got = [out] + [b.grad for b in bufs[:diff]]
        for name, g, gold, r, n in zip(names, got, golden[it % SETS], ref, naive):
            results[name].add(g, gold, r, n)
    ok = True
    for name, r in results.items():
        good = r.failures == 0 and r.unlike_synchronised == 0 and r.iters == iters
        ok &= good
        print(json.dumps({"check": "torch-stream", "op": op, "case": case, "quantity": name, "iters": r.iters,
                          "unlike_synchronised": r.unlike_synchronised, "over_bound": r.failures,
                          "worst_error": r.worst[1], "bound": r.worst[2], "ok": good}), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rehearse", action="store_true", help="the CPU, float32, small shapes")
    ap.add_argument("--iters", type=int, default=100)
    o = ap.parse_args()
    dev = torch.device("cpu" if o.rehearse else "cuda")
    dtype = torch.float32 if o.rehearse else torch.bfloat16
    streams = Streams(dev)
    s = 64 if o.rehearse else 512
    dense = dense_sets(dev, dtype, s, 4, 64)
    sparse = sparse_sets(dev, dtype, s, 8, 64, 48, 16)
    ok = True
    for case in ("current", "side", "fresh"):
        ok &= iterate("attention", *dense, case, streams, o.iters, dtype)
        ok &= iterate("sparse_mla", *sparse, case, streams, o.iters, dtype)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
