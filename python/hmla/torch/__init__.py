"""hmla's DSA kernels as differentiable torch operators (docs/torch.md).

Layouts everywhere as `hmla attention` takes them: `cu_seqlens` (int32/int64 [n + 1], b = 1) or
`end_rows` (int32 [b, s]); neither means one causal document per row (DESIGN.md section 3).
Tensors are [b, s, ...]. On the CPU the kernels take float32; on CUDA bfloat16 for `attention`,
`indexer_topk` and `sparse_mla`, float32 for `indexer_kl`. Every tensor argument reaches its kernel
in a layout the kernel takes: in place when its strides allow (q, k, v: the last dimension
contiguous, rows and heads at strides in [width, 2^31); every other tensor contiguous), else as the
smallest contiguous copy (expanded, transposed or sliced views give the contiguous call's result).
Integer arguments must be integers in range, layouts integer tensors of the documented dtypes,
[b, s] equal across an op's tensors. Bad input raises ValueError with hmla's message. A second
derivative through any operator raises, never a silent zero.
"""
import math
import numbers

import torch

from .. import _C
from ._ops import kernels

__all__ = ["attention", "indexer_topk", "indexer_kl", "sparse_mla", "memory_stats"]

# The kernels the functions below call: hmla._C itself, or, where torch has torch.library custom
# ops (2.4 and later), the same calls registered as opaque ops hmla::* with shape functions, so
# torch.compile traces through them instead of breaking the graph (_ops.py).
_K = kernels(_C)


def _int(name, x, lo, hi=None):
    """x as a Python int when it is an integer (not a bool, not a float such as 3.9) in [lo, hi]."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {x!r}")
    x = int(x)
    if x < lo or (hi is not None and x > hi):
        raise ValueError(f"{name} = {x} must be in [{lo}, {'inf' if hi is None else hi}]")
    return x


def _float(name, x, *, positive):
    """x as a float when it is a finite real number (> 0 with positive, else >= 0)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a number, got {x!r}")
    x = float(x)
    if not math.isfinite(x) or (x <= 0 if positive else x < 0):
        raise ValueError(f"{name} = {x} must be a finite number {'> 0' if positive else '>= 0'}")
    return x


def _tensor(name, t, optional=False):
    if t is None and optional:
        return None
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _layout(cu_seqlens, end_rows):
    """The layout tensors are integer data, never differentiable inputs (dtypes: checked by hmla._C)."""
    for name, t in (("cu_seqlens", cu_seqlens), ("end_rows", end_rows)):
        if _tensor(name, t, optional=True) is not None and t.requires_grad:
            raise ValueError(f"{name} must not require grad: it is a layout, not an input")
    return cu_seqlens, end_rows


def _invalid(x):
    if x not in ("error", "skip"):
        raise ValueError(f'invalid must be "error" or "skip", got {x!r}')
    return x == "skip"


class _NoSecondDerivative(torch.autograd.Function):
    """Passes first derivatives through (copies); differentiating them raises."""

    @staticmethod
    def forward(ctx, name, anchor, *grads):
        ctx.name = name
        return tuple(g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(f"hmla.torch: {ctx.name} has no second derivative (its backward is a fused kernel); "
                           "differentiate a PyTorch implementation instead")


def _first_derivatives(name, anchors, grads):
    """grads as they are, unless autograd records them (create_graph=True, or a grad_output that
    requires grad): then through a node whose backward raises, so that a second derivative is an
    error (gradgradcheck, hessian, a gradient penalty) and never a silent zero."""
    anchor = next((a for a in anchors if isinstance(a, torch.Tensor) and a.requires_grad), None)
    if not torch.is_grad_enabled() or anchor is None:
        return grads
    idx = [i for i, g in enumerate(grads) if g is not None]
    outs = _NoSecondDerivative.apply(name, anchor, *[grads[i] for i in idx])
    res = list(grads)
    for i, o in zip(idx, outs if isinstance(outs, tuple) else (outs,)):
        res[i] = o
    return tuple(res)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, scale, cu_seqlens, end_rows, v_from_k, backend):
        vv = k[..., :v_from_k] if v_from_k else v
        out, lse = _K.attention_fwd(q, k, vv, scale, cu_seqlens, end_rows, sink, backend)
        ctx.save_for_backward(q, k, v, sink, out, lse, cu_seqlens, end_rows)
        ctx.scale, ctx.v_from_k, ctx.backend = scale, v_from_k, backend
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, sink, out, lse, cu_seqlens, end_rows = ctx.saved_tensors
        vv = k[..., :ctx.v_from_k] if ctx.v_from_k else v
        dq, dk, dv, dsink = _K.attention_bwd(q, k, vv, ctx.scale, cu_seqlens, end_rows, sink, out, lse, dout,
                                             ctx.backend)
        if ctx.v_from_k:  # the value is k's first Dv channels: its gradient lands there
            dk[..., :ctx.v_from_k] += dv
            dv = None
        dq, dk, dv, dsink = _first_derivatives("attention", (q, k, v, sink, dout), (dq, dk, dv, dsink))
        return dq, dk, dv, dsink, None, None, None, None, None


_ATTENTION_BACKENDS = ("auto", "cudnn", "hmla")


def attention(q, k, v=None, *, scale, cu_seqlens=None, end_rows=None, sink=None, v_from_k=None, backend="auto"):
    """Per-document causal attention: out, lse = softmax(scale q k^T + mask) v.

    q [b, s, H, Dqk], k [b, s, Hkv, Dqk] (Hkv divides H), v [b, s, Hkv, Dv], or v=None with
    v_from_k=Dv (the value is the first Dv channels of k: latent MQA). sink [H] float32 optional
    (an extra logit per head in every denominator). Returns out [b, s, H, Dv] and lse [b, H, s]
    float32 (+inf on rows with no key). Differentiable in q, k, v and sink. Strided inputs are
    read in place where their strides allow, else copied. cu_seqlens int32/int64 (equal entries:
    zero-length documents), end_rows int32. backend (CUDA tensors): "auto" runs cuDNN's fused
    attention where it takes the inputs (a build with cuDNN, sm_90, bf16, widths <= 256, no sink)
    and hmla's kernels otherwise, "cudnn" insists on cuDNN (an error naming why it cannot), "hmla"
    never uses it; CPU tensors take "auto" and "hmla".
    """
    q, k = _tensor("q", q), _tensor("k", k)
    if (v is None) == (v_from_k is None):
        raise ValueError("attention: give v or v_from_k, not both and not neither")
    v = _tensor("v", v, optional=True)
    sink = _tensor("sink", sink, optional=True)
    v_from_k = 0 if v_from_k is None else _int("v_from_k", v_from_k, 1, k.shape[-1])
    cu_seqlens, end_rows = _layout(cu_seqlens, end_rows)
    if not isinstance(backend, str) or backend not in _ATTENTION_BACKENDS:
        raise ValueError(f"attention: backend must be one of {', '.join(_ATTENTION_BACKENDS)}, got {backend!r}")
    return _Attention.apply(q, k, v, sink, _float("scale", scale, positive=True), cu_seqlens, end_rows, v_from_k,
                            backend)


def indexer_topk(q_idx, k_idx, weights, *, topk, window=0, cu_seqlens=None, end_rows=None):
    """The selection table [b, s, topk + window] int32 of DESIGN.md section 5: per row t the topk
    keys of A(t) minus its last `window` keys by I(t, j) = sum_h weights[t, h] relu(q_idx[t, h] .
    k_idx[j]) (descending; ties to the smaller j), then the window keys ascending, then -1.
    q_idx [b, s, HI, DI] and k_idx [b, s, DI] already roped, weights [b, s, HI] already scaled.
    Not differentiable; never materialises [s, s]. Inputs are made contiguous (one copy if not)."""
    q_idx, k_idx, weights = _tensor("q_idx", q_idx), _tensor("k_idx", k_idx), _tensor("weights", weights)
    cu_seqlens, end_rows = _layout(cu_seqlens, end_rows)
    return _K.indexer_topk(q_idx, k_idx, weights, _int("topk", topk, 1), _int("window", window, 0), cu_seqlens,
                           end_rows)


class _IndexerKl(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_idx, k_idx, weights, q, k, scale, cu_seqlens, end_rows, topk_indices, window, row_mask,
                coeff):
        loss, dq, dk, dw = _K.indexer_kl(q_idx, k_idx, weights, q, k, scale, cu_seqlens, end_rows, topk_indices,
                                         window, row_mask, coeff)
        ctx.save_for_backward(dq, dk, dw, q_idx, k_idx, weights)
        return loss

    @staticmethod
    def backward(ctx, g):
        dq, dk, dw, q_idx, k_idx, weights = ctx.saved_tensors
        grads = _first_derivatives("indexer_kl", (q_idx, k_idx, weights, g), (g * dq, g * dk, g * dw))
        return grads + (None,) * 9


def indexer_kl(q_idx, k_idx, weights, q, k, *, scale, cu_seqlens=None, end_rows=None, topk_indices=None, window=0,
               row_mask=None, coeff=1.0, invalid="error"):
    """The indexer loss of DESIGN.md section 6 against the attention distribution of (q, k, scale):
    P = mean over heads of softmax(scale q_h k^T) over the candidates, Q = softmax(I) over them;
    the candidates are A(t) (the dense KL) when topk_indices is None, else the keys listed in the
    table's columns before its last `window` (those are window keys, not candidates; a window
    without a table is an error). topk_indices follows DESIGN.md section 4's contract: -1 is no key,
    any other entry outside A(t) or a duplicate raises ValueError; invalid="skip" treats entries
    outside A(t) as no key instead (FlashMLA's and TileLang's convention).
    row_mask [b, s] bool (default: every row) is the loss-row mask before the empty-row rule.
    Returns coeff * sum_t mask[t] kl(t) / valid_rows, a 0-dim float32 tensor, differentiable in
    q_idx, k_idx and weights (q [b, s, H, Dqk] and k [b, s, Hkv, Dqk] are the constant target; a
    second derivative raises). Fused: the workspace is O(s (H + HI)), never [s, s]. q_idx, k_idx,
    weights and topk_indices are made contiguous (one copy if not); q and k are read in place where
    their strides allow (hmla::kernel_strides_ok), else copied."""
    q_idx, k_idx, weights = _tensor("q_idx", q_idx), _tensor("k_idx", k_idx), _tensor("weights", weights)
    q, k = _tensor("q", q), _tensor("k", k)
    cu_seqlens, end_rows = _layout(cu_seqlens, end_rows)
    window = _int("window", window, 0)
    if _tensor("row_mask", row_mask, optional=True) is not None and row_mask.dtype != torch.bool:
        raise ValueError(f"row_mask must be a bool tensor, got {row_mask.dtype}")
    tk = _tensor("topk_indices", topk_indices, optional=True)
    skip = _invalid(invalid)
    if tk is None and window:
        raise ValueError(f"indexer_kl: window = {window} needs topk_indices (the dense KL has no window)")
    if tk is not None:
        tk = _K.index_table(tk, q_idx.shape[1], cu_seqlens, end_rows, skip)
    return _IndexerKl.apply(q_idx, k_idx, weights, q.detach(), k.detach(), _float("scale", scale, positive=True),
                            cu_seqlens, end_rows, tk, window, row_mask, _float("coeff", coeff, positive=False))


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
        dq, dkv, dsink = _K.sparse_mla_bwd(q, kv, indices, ctx.scale, ctx.dv, sink, out, lse, lse_c, dout)
        dq, dkv, dsink = _first_derivatives("sparse_mla", (q, kv, sink, dout), (dq, dkv, dsink))
        return dq, dkv, None, dsink, None, None


def sparse_mla(q, kv, indices, *, scale, dv, sink=None, cu_seqlens=None, end_rows=None, invalid="error"):
    """Latent MQA over listed keys: for each row, softmax over the keys in `indices` (and the sink)
    of scale q_h . kv[j], times kv[j][:dv]. q [b, s, H, Dqk], kv [b, s, Dqk] (the value is its
    first dv channels), indices [b, s, N] int32 under DESIGN.md section 4's contract: -1 is no key;
    any other entry must be a key of A(t) (j <= t, inside t's document when cu_seqlens or end_rows
    give documents) and appear once in its row, else ValueError; invalid="skip" treats entries
    outside A(t) as no key (FlashMLA's and TileLang's convention; duplicates still raise).
    Returns out [b, s, H, dv] and lse [b, H, s] (lse includes the sink; FlashMLA's excludes it).
    Differentiable in q, kv and sink (an infinite sink gives zero gradients). kv, indices and sink
    are made contiguous (one copy if not); q is read in place where its strides allow, else copied."""
    q, kv, indices = _tensor("q", q), _tensor("kv", kv), _tensor("indices", indices)
    sink = _tensor("sink", sink, optional=True)
    cu_seqlens, end_rows = _layout(cu_seqlens, end_rows)
    dv = _int("dv", dv, 1, q.shape[-1])
    table = _K.index_table(indices, q.shape[1], cu_seqlens, end_rows, _invalid(invalid))
    return _SparseMla.apply(q, kv, table, sink, _float("scale", scale, positive=True), dv)


def memory_stats(reset_peak=False):
    """hmla's allocator counters per device: {"cpu": {"live_bytes", "peak_bytes"}, "cuda": ...}
    (exact bytes of what hmla allocated: its outputs and workspaces). reset_peak=True restarts the
    peaks from what is live."""
    return _C.memory_stats(reset_peak)
