"""hmla's DSA kernels as differentiable torch operators (docs/torch.md).

Layouts everywhere as `hmla attention` takes them: `cu_seqlens` (int32/int64 [n + 1], b = 1) or
`end_rows` (int32 [b, s]); neither means one causal document per row (DESIGN.md section 3).
Tensors are [b, s, ...]. On the CPU the kernels take float32; on CUDA bfloat16 for `attention`,
`indexer_topk` and `sparse_mla`, float32 for `indexer_kl`. Every call is zero-copy on its inputs
where the kernel takes strides (the last dimension contiguous); where it does not (noted per op)
the binding makes one contiguous copy. Bad input raises ValueError with hmla's message.
"""
import torch

from .. import _C
from ._ops import kernels

__all__ = ["attention", "indexer_topk", "indexer_kl", "sparse_mla", "memory_stats"]

# The kernels the functions below call: hmla._C itself, or, where torch has torch.library custom
# ops (2.4 and later), the same calls registered as opaque ops hmla::* with shape functions, so
# torch.compile traces through them instead of breaking the graph (_ops.py).
_K = kernels(_C)


def _last_contiguous(t):
    """t itself when its last dimension is contiguous, else the smallest copy that makes it so."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, scale, cu_seqlens, end_rows, v_from_k):
        vv = k[..., :v_from_k] if v_from_k else v
        out, lse = _K.attention_fwd(q, k, vv, scale, cu_seqlens, end_rows, sink)
        ctx.save_for_backward(q, k, v, sink, out, lse, cu_seqlens, end_rows)
        ctx.scale, ctx.v_from_k = scale, v_from_k
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, sink, out, lse, cu_seqlens, end_rows = ctx.saved_tensors
        vv = k[..., :ctx.v_from_k] if ctx.v_from_k else v
        dq, dk, dv, dsink = _K.attention_bwd(q, k, vv, ctx.scale, cu_seqlens, end_rows, sink, out, lse,
                                             dout.contiguous())
        if ctx.v_from_k:  # the value is k's first Dv channels: its gradient lands there
            dk[..., :ctx.v_from_k] += dv
            dv = None
        return dq, dk, dv, dsink, None, None, None, None


def attention(q, k, v=None, *, scale, cu_seqlens=None, end_rows=None, sink=None, v_from_k=None):
    """Per-document causal attention: out, lse = softmax(scale q k^T + mask) v.

    q [b, s, H, Dqk], k [b, s, Hkv, Dqk] (Hkv divides H), v [b, s, Hkv, Dv], or v=None with
    v_from_k=Dv (the value is the first Dv channels of k: latent MQA). sink [H] float32 optional
    (an extra logit per head in every denominator). Returns out [b, s, H, Dv] and lse [b, H, s]
    float32 (+inf on rows with no key). Differentiable in q, k, v and sink. Strided inputs are
    read in place when their last dimension is contiguous.
    """
    if (v is None) == (v_from_k is None):
        raise ValueError("attention: give v or v_from_k, not both and not neither")
    q, k, v = _last_contiguous(q), _last_contiguous(k), _last_contiguous(v)
    return _Attention.apply(q, k, v, sink, float(scale), cu_seqlens, end_rows, int(v_from_k or 0))


def indexer_topk(q_idx, k_idx, weights, *, topk, window=0, cu_seqlens=None, end_rows=None):
    """The selection table [b, s, topk + window] int32 of DESIGN.md section 5: per row t the topk
    keys of A(t) minus its last `window` keys by I(t, j) = sum_h weights[t, h] relu(q_idx[t, h] .
    k_idx[j]) (descending; ties to the smaller j), then the window keys ascending, then -1.
    q_idx [b, s, HI, DI] and k_idx [b, s, DI] already roped, weights [b, s, HI] already scaled.
    Not differentiable; never materialises [s, s]. Inputs are made contiguous (one copy if not)."""
    return _K.indexer_topk(q_idx.contiguous(), k_idx.contiguous(), weights.contiguous(), int(topk), int(window),
                           cu_seqlens, end_rows)


class _IndexerKl(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_idx, k_idx, weights, q, k, scale, cu_seqlens, end_rows, topk_indices, window, row_mask,
                coeff):
        loss, dq, dk, dw = _K.indexer_kl(q_idx, k_idx, weights, q, k, scale, cu_seqlens, end_rows, topk_indices,
                                         window, row_mask, coeff)
        ctx.save_for_backward(dq, dk, dw)
        return loss

    @staticmethod
    def backward(ctx, g):
        dq, dk, dw = ctx.saved_tensors
        return g * dq, g * dk, g * dw, None, None, None, None, None, None, None, None, None


def indexer_kl(q_idx, k_idx, weights, q, k, *, scale, cu_seqlens=None, end_rows=None, topk_indices=None, window=0,
               row_mask=None, coeff=1.0):
    """The indexer loss of DESIGN.md section 6 against the attention distribution of (q, k, scale):
    P = mean over heads of softmax(scale q_h k^T) over the candidates, Q = softmax(I) over them;
    the candidates are A(t) (the dense KL) when topk_indices is None, else the keys listed in the
    table's columns before its last `window` (those are window keys, not candidates).
    row_mask [b, s] bool (default: every row) is the loss-row mask before the empty-row rule.
    Returns coeff * sum_t mask[t] kl(t) / valid_rows, a 0-dim float32 tensor, differentiable in
    q_idx, k_idx and weights (q [b, s, H, Dqk] and k [b, s, Hkv, Dqk] are the constant target).
    Fused: the workspace is O(s (H + HI)), never [s, s]. q_idx, k_idx, weights, topk_indices are
    made contiguous (one copy if not); q and k are read in place (last dimension contiguous)."""
    tk = None if topk_indices is None else topk_indices.contiguous()
    return _IndexerKl.apply(q_idx.contiguous(), k_idx.contiguous(), weights.contiguous(), _last_contiguous(q.detach()),
                            _last_contiguous(k.detach()), float(scale), cu_seqlens, end_rows, tk, int(window),
                            row_mask, float(coeff))


class _SparseMla(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, indices, sink, scale, dv):
        out, lse, lse_c = _K.sparse_mla_fwd(q, kv, indices, scale, dv, sink)
        ctx.save_for_backward(q, kv, indices, sink, out, lse, lse_c)
        ctx.scale, ctx.dv = scale, dv
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, kv, indices, sink, out, lse, lse_c = ctx.saved_tensors
        dq, dkv, dsink = _K.sparse_mla_bwd(q, kv, indices, ctx.scale, ctx.dv, sink, out, lse, lse_c,
                                           dout.contiguous())
        return dq, dkv, None, dsink, None, None


def sparse_mla(q, kv, indices, *, scale, dv, sink=None):
    """Latent MQA over listed keys: for each row, softmax over the keys in `indices` (and the sink)
    of scale q_h . kv[j], times kv[j][:dv]. q [b, s, H, Dqk], kv [b, s, Dqk] (the value is its
    first dv channels), indices [b, s, N] int32 with -1 for no key; a duplicate or out-of-range
    entry raises ValueError. Returns out [b, s, H, dv] and lse [b, H, s]. Differentiable in q, kv
    and sink. kv and indices are made contiguous (one copy if not); q is read in place."""
    return _SparseMla.apply(_last_contiguous(q), kv.contiguous(), indices.contiguous(), sink, float(scale), int(dv))


def memory_stats(reset_peak=False):
    """hmla's allocator counters per device: {"cpu": {"live_bytes", "peak_bytes"}, "cuda": ...}
    (exact bytes of what hmla allocated: its outputs and workspaces). reset_peak=True restarts the
    peaks from what is live."""
    return _C.memory_stats(reset_peak)
