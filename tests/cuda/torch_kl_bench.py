#!/usr/bin/env python3
"""The materialised PyTorch indexer KL on the GPU: the baseline of `hmla bench indexer --cuda`
(scripts/device-check). One causal document of s rows, the same shapes and input scales as hmla's
bench (H attention heads of width Dqk, HI index heads of width DI), f32. It is written as a
memory-aware PyTorch user would: the [s, s] score and probability matrices materialised, the heads
summed into them one at a time, and the backward written by hand (autograd would keep one [s, s]
relu mask per index head), so its peak is a few [s, s] f32 matrices. Prints one JSON line per s:
time of forward + backward, peak bytes above the inputs and gradients (torch's allocator).

  --rehearse   tiny s on the CPU in float64: the hand-written backward against autograd."""
import argparse
import json
import math
import time

import torch


def kl_forward_backward(qI, kI, w, q, k, scale, rw, coeff):
    """Dense KL over A(t) = [0, t] and its gradients in qI, kI, w (DESIGN.md section 6)."""
    s, HI, _ = qI.shape
    H = q.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=qI.device).tril()
    I = torch.zeros(s, s, dtype=qI.dtype, device=qI.device)
    for h in range(HI):
        I += w[:, h, None] * torch.relu(qI[:, h] @ kI.T)
    P = torch.zeros_like(I)
    for h in range(H):
        P += torch.softmax(((q[:, h] @ k[:, h].T) * scale).masked_fill(~causal, -math.inf), -1)
    P /= H
    logQ = torch.log_softmax(I.masked_fill(~causal, -math.inf), -1)
    kl_rows = torch.where(P > 0, P * (torch.log(P) - logQ), torch.zeros_like(P)).sum(-1)
    kl = (rw * kl_rows).sum()
    del I
    dI = (coeff * rw)[:, None] * (torch.exp(logQ) - P)
    del P, logQ
    dqI, dkI, dw = torch.zeros_like(qI), torch.zeros_like(kI), torch.zeros_like(w)
    for h in range(HI):
        S = qI[:, h] @ kI.T
        dw[:, h] = (dI * torch.relu(S)).sum(-1)
        dS = torch.where(S > 0, dI * w[:, h, None], torch.zeros_like(S))
        del S
        dqI[:, h] = dS @ kI
        dkI += dS.T @ qI[:, h]
    return kl, dqI, dkI, dw


def inputs(s, H, Dqk, HI, DI, dtype, device, seed=7):
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *shape, sd: (torch.randn(*shape, generator=g) * sd).to(dtype).to(device)  # noqa: E731
    return (r(s, HI, DI, sd=0.3), r(s, DI, sd=0.3), r(s, HI, sd=0.1), r(s, H, Dqk, sd=1.0), r(s, H, Dqk, sd=1.0),
            1.0 / math.sqrt(Dqk), torch.full((s,), 1.0 / s, dtype=dtype, device=device), 0.01)


def rehearse():
    """The hand-written backward equals autograd's (float64, tiny shapes)."""
    qI, kI, w, q, k, scale, rw, coeff = inputs(24, 2, 8, 3, 4, torch.float64, "cpu")
    kl, dqI, dkI, dw = kl_forward_backward(qI, kI, w, q, k, scale, rw, coeff)
    a = [t.clone().requires_grad_(True) for t in (qI, kI, w)]
    s = qI.shape[0]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    I = sum(a[2][:, h, None] * torch.relu(a[0][:, h] @ a[1].T) for h in range(qI.shape[1]))
    P = sum(torch.softmax(((q[:, h] @ k[:, h].T) * scale).masked_fill(~causal, -math.inf), -1)
            for h in range(q.shape[1])) / q.shape[1]
    logQ = torch.log_softmax(I.masked_fill(~causal, -math.inf), -1)
    ref = (rw * torch.where(P > 0, P * (torch.log(P) - logQ), torch.zeros_like(P)).sum(-1)).sum()
    (coeff * ref).backward()
    for name, got, want in (("kl", kl, ref), ("dqI", dqI, a[0].grad), ("dkI", dkI, a[1].grad), ("dw", dw, a[2].grad)):
        err = float((got - want).abs().max())
        assert err <= 1e-12 * max(1.0, float(want.abs().max())), f"{name}: {err}"
    print(json.dumps({"bench": "torch-kl", "rehearse": True, "backward_matches_autograd": True}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--s", default="8192,32768,65536")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dqk", type=int, default=192)
    ap.add_argument("--index-heads", type=int, default=64)
    ap.add_argument("--index-dim", type=int, default=128)
    ap.add_argument("--rehearse", action="store_true")
    o = ap.parse_args()
    if o.rehearse:
        return rehearse()
    for s in (int(x) for x in o.s.split(",")):
        args = inputs(s, o.heads, o.dqk, o.index_heads, o.index_dim, torch.float32, "cuda")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated() + 4 * (args[0].numel() + args[1].numel() + args[2].numel())
        torch.cuda.reset_peak_memory_stats()
        line = {"bench": "torch-kl", "s": s, "H": o.heads, "dqk": o.dqk, "HI": o.index_heads, "DI": o.index_dim}
        try:
            t0 = time.perf_counter()
            kl = kl_forward_backward(*args)[0]
            torch.cuda.synchronize()
            line.update(materialized_kl_ms=(time.perf_counter() - t0) * 1e3, kl=float(kl),
                        materialized_kl_workspace_bytes=torch.cuda.max_memory_allocated() - base)
        except getattr(torch, "OutOfMemoryError", RuntimeError) as e:  # the point of the comparison at long s
            line.update(materialized_kl_ms=None, error="out of memory: " + str(e).split("\n")[0][:120])
        print(json.dumps(line), flush=True)
        del args
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
