#!/usr/bin/env python3
"""hmla.torch's custom-op layer (python/hmla/torch/_ops.py) on a torch that has
torch.library.custom_op (2.4 and later): the operators registered as hmla::*, eager calls with
autograd, and torch.compile(fullgraph=True) tracing through all four without a graph break. It
runs the package's Python files from the source tree over a stand-in for hmla._C written in plain
torch (right shapes, simple values), because hmla._C is built against one torch and this check is
about the registration. Debian's torch 1.13 has no custom ops: there the script says so and exits 0.

    python tests/python/torch_custom_ops.py     # with a torch >= 2.4"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


class StandIn:
    """hmla._C's calls with their shapes (the last argument: the stream, None for CPU tensors)."""

    @staticmethod
    def attention_fwd(q, k, v, scale, cu, er, sink, backend, stream):
        b, s, H, _ = q.shape
        kk, vv = k.repeat_interleave(H // k.shape[2], 2), v.repeat_interleave(H // v.shape[2], 2)
        logits = torch.einsum("bthd,bjhd->bhtj", q.float(), kk.float()) * scale
        logits = logits.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), -float("inf"))
        return torch.einsum("bhtj,bjhd->bthd", torch.softmax(logits, -1), vv.float()).to(q.dtype), torch.logsumexp(logits, -1)

    @staticmethod
    def attention_bwd(q, k, v, scale, cu, er, sink, out, lse, dout, backend, stream):
        return torch.ones_like(q), torch.ones_like(k), torch.ones_like(v), None if sink is None else torch.ones_like(sink)

    @staticmethod
    def indexer_topk(qI, kI, w, K, W, cu, er, stream):
        return torch.full((qI.shape[0], qI.shape[1], K + W), -1, dtype=torch.int32)

    @staticmethod
    def indexer_kl(qI, kI, w, q, k, scale, cu, er, topk, W, rm, coeff, stream):
        return torch.tensor(0.5), torch.ones_like(qI), torch.ones_like(kI), torch.ones_like(w)

    @staticmethod
    def sparse_mla_fwd(q, kv, idx, scale, dv, sink, stream):
        b, s, H, _ = q.shape
        return q.new_zeros(b, s, H, dv), q.new_zeros(b, H, s), q.new_zeros(b, H, s)

    @staticmethod
    def sparse_mla_bwd(q, kv, idx, scale, dv, sink, out, lse, lse_c, dout, stream):
        return torch.ones_like(q), torch.ones_like(kv), None if sink is None else torch.ones_like(sink)

    @staticmethod
    def index_table(idx, s, cu, er, skip, stream):
        return idx

    @staticmethod
    def memory_stats(reset_peak=False):
        return {}


def main():
    if not hasattr(torch.library, "custom_op"):
        print(f"torch {torch.__version__} has no torch.library.custom_op: hmla.torch calls hmla._C directly")
        return 0
    import hmla
    sys.modules["hmla._C"] = hmla._C = StandIn
    import hmla.torch as ht
    ok = type(ht._K).__name__ == "_Registered" and hasattr(torch.ops.hmla, "attention_fwd")
    q, k, v = (torch.randn(1, 8, 2, 16, requires_grad=True) for _ in range(3))
    qI, kI, w = torch.randn(1, 8, 2, 4, requires_grad=True), torch.randn(1, 8, 4, requires_grad=True), \
        torch.randn(1, 8, 2, requires_grad=True)
    kv, sink = torch.randn(1, 8, 16, requires_grad=True), torch.zeros(2, requires_grad=True)

    def step(q, k, v, qI, kI, w, kv, sink):
        out, _ = ht.attention(q, k, v, scale=0.25, sink=sink)
        lat, _ = ht.attention(q, k, None, scale=0.25, v_from_k=8)
        table = ht.indexer_topk(qI, kI, w, topk=4, window=1)
        o, _ = ht.sparse_mla(q, kv, table, scale=0.25, dv=8)
        kl = ht.indexer_kl(qI, kI, w, q, k, scale=0.25, topk_indices=table, window=1)
        return out.sum() + lat.sum() + o.sum() + kl

    args = (q, k, v, qI, kI, w, kv, sink)
    step(*args).backward()
    grads = [a.grad.clone() for a in args]
    for a in args:
        a.grad = None
    torch.compile(step, fullgraph=True, backend="aot_eager")(*args).backward()  # a graph break raises here
    ok &= all(torch.equal(g, a.grad) for g, a in zip(grads, args))
    print(f"{'ok  ' if ok else 'FAIL'} torch {torch.__version__}: hmla::* registered; eager and "
          "torch.compile(fullgraph=True) give the same gradients")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
