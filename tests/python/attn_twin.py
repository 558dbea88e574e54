#!/usr/bin/env python3
"""PyTorch twin of hmla's dense per-document causal attention (DESIGN.md section 4).

For each case it writes random inputs, runs `hmla attention`, and recomputes the same attention
in PyTorch with autograd as a masked dense softmax: in float64 (the reference) and in float32
(the naive error the STYLE.md rule allows twice over). Exit status 1 on any mismatch."""
import argparse
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402

F32_EPS = float(np.finfo(np.float32).eps)


def layout_doc_start(b, s, cu=None, end_rows=None):
    """doc_start[b, s] in hmla's convention (padding rows: t + 1)."""
    ds = np.tile(np.arange(1, s + 1), (b, 1))
    if cu is None and end_rows is None:
        ds[:] = 0
    elif cu is not None:
        for i in range(len(cu) - 1):
            ds[0, cu[i] : cu[i + 1]] = cu[i]
    else:
        for r in range(b):
            t = 0
            while t < s:
                e = end_rows[r, t]
                if e <= t:
                    t += 1
                    continue
                ds[r, t:e] = t
                t = e
    return torch.from_numpy(ds)


def torch_attention(q, k, v, doc_start, sink, scale, allowed=None):
    """q [b,s,H,D], k/v [b,s,Hkv,.] -> out [b,s,H,Dv], lse [b,H,s]. `allowed` [b,t,j] overrides the
    document-causal key sets (sparse attention as a masked dense softmax)."""
    b, s, H, _ = q.shape
    group = H // k.shape[2]
    kk = k.repeat_interleave(group, dim=2)
    vv = v.repeat_interleave(group, dim=2)
    logits = torch.einsum("bthd,bjhd->bhtj", q, kk) * scale
    t = torch.arange(s).view(1, s, 1)
    j = torch.arange(s).view(1, 1, s)
    if allowed is None:
        allowed = (j <= t) & (j >= doc_start.view(b, s, 1))  # [b, t, j]
    allowed = allowed.unsqueeze(1).expand(b, H, s, s)
    row_ok = allowed.any(-1)  # [b, H, t]
    logits = torch.where(allowed, logits, torch.full_like(logits, -float("inf")))
    logits = torch.where(row_ok.unsqueeze(-1), logits, torch.zeros_like(logits))  # keep empty rows finite
    if sink is not None:
        col = sink.view(1, H, 1, 1).expand(b, H, s, 1)
        full = torch.cat([logits, col], dim=-1)
    else:
        full = logits
    lse = torch.logsumexp(full, dim=-1)
    p = torch.exp(full - lse.unsqueeze(-1))[..., :s]
    out = torch.einsum("bhtj,bjhd->bthd", p, vv) * row_ok.permute(0, 2, 1).unsqueeze(-1)
    lse = torch.where(row_ok, lse, torch.full_like(lse, float("inf")))
    return out, lse


def reference(inp, doc_start, scale, v_from_k, dtype):
    leaves = {n: torch.tensor(inp[n], dtype=dtype, requires_grad=True) for n in ("q", "k", "v", "sink") if n in inp}
    v = leaves["k"][..., :v_from_k] if v_from_k else leaves["v"]
    out, lse = torch_attention(leaves["q"], leaves["k"], v, doc_start, leaves.get("sink"), scale)
    (out * torch.tensor(inp["grad_output"], dtype=dtype)).sum().backward()
    res = {"output": out.detach(), "lse": lse.detach()}
    for n, t in leaves.items():
        res["grad." + n] = t.grad
    return {n: x.double().numpy() for n, x in res.items()}


def max_err(x, ref):
    x = np.asarray(x, dtype=np.float64)
    inf = np.isinf(ref) | np.isinf(x)
    if np.any(x[inf] != ref[inf]) or np.any(np.isnan(x)):
        return float("inf"), 0.0
    fin = ~inf
    if not fin.any():
        return 0.0, 0.0
    return float(np.max(np.abs(x[fin] - ref[fin]))), float(np.max(np.abs(ref[fin])))


CASES = [
    # name, b, s, H, Hkv, Dqk, Dv, layout, sink, v_from_k
    ("one_doc", 1, 67, 2, 2, 16, 8, None, False, 0),
    ("docs_1tok_tailpad", 1, 300, 2, 1, 24, 16, {"cu": [0, 1, 90, 91, 260]}, True, 0),
    ("end_rows_b2", 2, 80, 4, 2, 16, 16, {"end_rows": True}, False, 0),
    ("dqk192_dv128", 1, 130, 2, 2, 192, 128, {"cu": [0, 70, 130]}, True, 0),
    ("latent_576_512", 1, 90, 2, 1, 576, 512, {"cu": [0, 50, 85]}, True, 512),
]


def end_rows_table(b, s, rng):
    e = np.zeros((b, s), dtype=np.int32)
    for r in range(b):
        t = 0
        while t < s:
            if rng.random() < 0.1:  # a padding row
                e[r, t] = 0
                t += 1
                continue
            n = int(rng.integers(1, 30))
            end = min(s, t + n)
            e[r, t:end] = end
            t = end
    return e


def run_case(case, hmla, workdir, rng):
    name, b, s, H, Hkv, Dqk, Dv, lay, sink, v_from_k = case
    inp = {
        "q": rng.standard_normal((b, s, H, Dqk), dtype=np.float32),
        "k": rng.standard_normal((b, s, Hkv, Dqk), dtype=np.float32),
        "grad_output": rng.standard_normal((b, s, H, Dv), dtype=np.float32),
    }
    if not v_from_k:
        inp["v"] = rng.standard_normal((b, s, Hkv, Dv), dtype=np.float32)
    if sink:
        inp["sink"] = rng.standard_normal((H,), dtype=np.float32)
    cu = end_rows = None
    if lay and "cu" in lay:
        cu = lay["cu"]
        inp["cu_seqlens"] = np.array(cu, dtype=np.int32)
    elif lay and "end_rows" in lay:
        end_rows = end_rows_table(b, s, rng)
        inp["end_rows"] = end_rows
    scale = 1.0 / np.sqrt(Dqk) * 1.3
    in_path = os.path.join(workdir, name + ".in.safetensors")
    out_path = os.path.join(workdir, name + ".out.safetensors")
    st.save(in_path, inp)
    cmd = [hmla, "attention", "--inputs", in_path, "--out", out_path, "--scale", repr(float(np.float32(scale)))]
    if v_from_k:
        cmd += ["--v-from-k", str(v_from_k)]
    subprocess.run(cmd, check=True)
    got = st.load(out_path)
    doc_start = layout_doc_start(b, s, cu, end_rows)
    scale32 = float(np.float32(scale))
    ref64 = reference(inp, doc_start, scale32, v_from_k, torch.float64)
    ref32 = reference(inp, doc_start, scale32, v_from_k, torch.float32)
    return check_by_rule(name, got, ref64, ref32)


def check_by_rule(name, got, ref64, ref32, factor=2.0, group=None):
    """Every tensor hmla wrote, and nothing else, within `factor` (twice) the float32 twin's error
    (against the float64 twin) plus 8 f32 ulps of the largest reference value. `group` maps a name
    to its group: tensors computed from the same inputs (one layer's routed experts, fed one x and
    one output gradient) share the group's largest twin error and reference value as their rounding
    scale, since a single small tensor's twin error is one draw that can fall near zero."""
    if set(got) != set(ref64):
        print(f"FAIL {name}: hmla wrote {sorted(got)}, expected {sorted(ref64)}")
        return False
    group = group or (lambda key: key)
    scale = {}  # group -> (largest twin error, largest reference value)
    for key in ref64:
        e_t, mref = max_err(ref32[key], ref64[key])
        old = scale.get(group(key), (0.0, 0.0))
        scale[group(key)] = (max(old[0], e_t), max(old[1], mref))
    ok = True
    for key in sorted(ref64):
        e_h, _ = max_err(got[key], ref64[key])
        e_t, mref = scale[group(key)]
        bound = factor * e_t + 8 * F32_EPS * mref
        good = e_h <= bound
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {name:20s} {key:36s} hmla {e_h:.3e}  torch-f32 {e_t:.3e}  bound {bound:.3e}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hmla", required=True, help="path to the hmla binary")
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(2024)
    ok = all([run_case(c, args.hmla, args.workdir, rng) for c in CASES])
    print("twin attention:", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
