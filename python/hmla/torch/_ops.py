"""hmla._C's kernels as torch.library custom ops where torch has them (torch.library.custom_op,
torch 2.4 and later): each call becomes an opaque op hmla::<name> with a shape function
(register_fake), so torch.compile traces through hmla.torch's operators instead of breaking the
graph; autograd stays with hmla.torch's autograd.Functions, which call these. Older torch (Debian
12's 1.13) calls hmla._C directly. Custom ops return tensors only: an absent optional output
(dsink without a sink) crosses as an empty tensor and comes back as None.

Every call into hmla._C passes the stream it runs on: torch's current stream of its first tensor's
CUDA device, read when the kernel runs (inside the custom op's body, not when a graph is traced),
or None for CPU tensors. hmla's kernels, copies and allocations of the call are ordered on it like
any torch op's (docs/torch.md, "Streams")."""
from typing import List, Optional

import torch

Tensor = torch.Tensor


def _on_stream(C, name):
    """hmla._C's call `name` with the stream of its first tensor argument appended: torch's current
    stream of that tensor's CUDA device as an int, on that device (hmla allocates on the current
    device), or None for a CPU tensor."""
    def call(*a):
        if not a[0].is_cuda:
            return getattr(C, name)(*a, None)
        with torch.cuda.device(a[0].device):
            return getattr(C, name)(*a, torch.cuda.current_stream(a[0].device).cuda_stream)
    return call


def _none_if_empty(t):
    return None if t is None or t.numel() == 0 else t


def _empty_if_none(t, like):
    return like.new_empty(0, dtype=torch.float32) if t is None else t


_NAMES = ("attention_fwd", "attention_bwd", "indexer_topk", "indexer_kl", "sparse_mla_fwd", "sparse_mla_bwd",
          "index_table")


class _Direct:
    """hmla._C's calls, each on the stream of its first tensor (_on_stream)."""

    def __init__(self, C):
        self.__dict__.update({n: _on_stream(C, n) for n in _NAMES})


class _Registered:
    """The same calls through torch.ops.hmla.*."""

    def __init__(self, ops):
        self.ops = ops

    def attention_fwd(self, *a):
        return tuple(self.ops.attention_fwd(*a))

    def attention_bwd(self, *a):
        dq, dk, dv, dsink = self.ops.attention_bwd(*a)
        return dq, dk, dv, _none_if_empty(dsink)

    def indexer_topk(self, *a):
        return self.ops.indexer_topk(*a)

    def indexer_kl(self, *a):
        return tuple(self.ops.indexer_kl(*a))

    def sparse_mla_fwd(self, *a):
        return tuple(self.ops.sparse_mla_fwd(*a))

    def sparse_mla_bwd(self, *a):
        dq, dkv, dsink = self.ops.sparse_mla_bwd(*a)
        return dq, dkv, _none_if_empty(dsink)

    def index_table(self, *a):
        return self.ops.index_table(*a)


def _register(C):
    C = _Direct(C)  # the bodies below run at call time: each reads the current stream then
    lib = torch.library
    f32 = torch.float32

    @lib.custom_op("hmla::attention_fwd", mutates_args=())
    def attention_fwd(q: Tensor, k: Tensor, v: Tensor, scale: float, cu_seqlens: Optional[Tensor],
                      end_rows: Optional[Tensor], sink: Optional[Tensor], backend: str) -> List[Tensor]:
        return list(C.attention_fwd(q, k, v, scale, cu_seqlens, end_rows, sink, backend))

    @attention_fwd.register_fake
    def _(q, k, v, scale, cu_seqlens, end_rows, sink, backend):
        b, s, H, _ = q.shape
        return [q.new_empty(b, s, H, v.shape[-1]), q.new_empty(b, H, s, dtype=f32)]

    @lib.custom_op("hmla::attention_bwd", mutates_args=())
    def attention_bwd(q: Tensor, k: Tensor, v: Tensor, scale: float, cu_seqlens: Optional[Tensor],
                      end_rows: Optional[Tensor], sink: Optional[Tensor], out: Tensor, lse: Tensor,
                      dout: Tensor, backend: str) -> List[Tensor]:
        dq, dk, dv, dsink = C.attention_bwd(q, k, v, scale, cu_seqlens, end_rows, sink, out, lse, dout, backend)
        return [dq, dk, dv, _empty_if_none(dsink, q)]

    @attention_bwd.register_fake
    def _(q, k, v, scale, cu_seqlens, end_rows, sink, out, lse, dout, backend):
        ds = q.new_empty(q.shape[2], dtype=f32) if sink is not None else q.new_empty(0, dtype=f32)
        return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), ds]

    @lib.custom_op("hmla::indexer_topk", mutates_args=())
    def indexer_topk(q_idx: Tensor, k_idx: Tensor, weights: Tensor, topk: int, window: int,
                     cu_seqlens: Optional[Tensor], end_rows: Optional[Tensor]) -> Tensor:
        return C.indexer_topk(q_idx, k_idx, weights, topk, window, cu_seqlens, end_rows)

    @indexer_topk.register_fake
    def _(q_idx, k_idx, weights, topk, window, cu_seqlens, end_rows):
        return q_idx.new_empty(q_idx.shape[0], q_idx.shape[1], topk + window, dtype=torch.int32)

    @lib.custom_op("hmla::indexer_kl", mutates_args=())
    def indexer_kl(q_idx: Tensor, k_idx: Tensor, weights: Tensor, q: Tensor, k: Tensor, scale: float,
                   cu_seqlens: Optional[Tensor], end_rows: Optional[Tensor], topk_indices: Optional[Tensor],
                   window: int, row_mask: Optional[Tensor], coeff: float) -> List[Tensor]:
        return list(C.indexer_kl(q_idx, k_idx, weights, q, k, scale, cu_seqlens, end_rows, topk_indices, window,
                                 row_mask, coeff))

    @indexer_kl.register_fake
    def _(q_idx, k_idx, weights, q, k, scale, cu_seqlens, end_rows, topk_indices, window, row_mask, coeff):
        return [q_idx.new_empty((), dtype=f32), torch.empty_like(q_idx, dtype=f32), torch.empty_like(k_idx, dtype=f32),
                torch.empty_like(weights, dtype=f32)]

    @lib.custom_op("hmla::sparse_mla_fwd", mutates_args=())
    def sparse_mla_fwd(q: Tensor, kv: Tensor, indices: Tensor, scale: float, dv: int,
                       sink: Optional[Tensor]) -> List[Tensor]:
        return list(C.sparse_mla_fwd(q, kv, indices, scale, dv, sink))

    @sparse_mla_fwd.register_fake
    def _(q, kv, indices, scale, dv, sink):
        b, s, H, _ = q.shape
        return [q.new_empty(b, s, H, dv), q.new_empty(b, H, s, dtype=f32), q.new_empty(b, H, s, dtype=f32)]

    @lib.custom_op("hmla::sparse_mla_bwd", mutates_args=())
    def sparse_mla_bwd(q: Tensor, kv: Tensor, indices: Tensor, scale: float, dv: int, sink: Optional[Tensor],
                       out: Tensor, lse: Tensor, lse_c: Tensor, dout: Tensor) -> List[Tensor]:
        dq, dkv, dsink = C.sparse_mla_bwd(q, kv, indices, scale, dv, sink, out, lse, lse_c, dout)
        return [dq, dkv, _empty_if_none(dsink, q)]

    @sparse_mla_bwd.register_fake
    def _(q, kv, indices, scale, dv, sink, out, lse, lse_c, dout):
        ds = q.new_empty(q.shape[2], dtype=f32) if sink is not None else q.new_empty(0, dtype=f32)
        return [torch.empty_like(q), torch.empty_like(kv), ds]

    @lib.custom_op("hmla::index_table", mutates_args=())
    def index_table(idx: Tensor, s: int, cu_seqlens: Optional[Tensor], end_rows: Optional[Tensor],
                    skip: bool) -> Tensor:
        return C.index_table(idx, s, cu_seqlens, end_rows, skip).clone()  # a custom op may not alias its input

    @index_table.register_fake
    def _(idx, s, cu_seqlens, end_rows, skip):
        return torch.empty_like(idx, memory_format=torch.contiguous_format)

    return _Registered(torch.ops.hmla)


def kernels(C):
    """The kernel calls hmla.torch makes: registered custom ops where torch has them, else C."""
    if not hasattr(torch.library, "custom_op"):
        return _Direct(C)
    return _register(C)
