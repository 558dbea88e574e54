#!/usr/bin/env python3
"""Labelled live check (not in the default suite; needs torch + transformers in a virtual
environment outside the tree): loads a checkpoint hmla wrote into transformers'
DeepseekV32ForCausalLM without conversion and compares its logits with `hmla forward`, and on
MoE layers the experts each token chose (as sets: transformers' topk(sorted=False) has no order).
torch.topk breaks exact ties arbitrarily while hmla gives them to the smaller key (DESIGN.md
section 5), and relu makes exact ties (scores of 0) common in a small indexer; so the input is
drawn until no layer has a tie within 1e-6 at the K-th place and no router decision is within
1e-5 of a tie (the choice values are sigmoid scores + bias, O(1), whose f32 rounding and the two
implementations' logits differences are below 1e-6); the seed and the gaps are printed. A MoE
checkpoint: `hmla train configs/demo_moe.yaml --out runs/demo_moe`, then --checkpoint runs/demo_moe.

    /tmp/hfvenv/bin/python tests/hf/live_check.py --hmla build/bin/hmla --checkpoint runs/demo-dense
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import DeepseekV32ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import safetensors_lite as st  # noqa: E402
from train_twin import moe_route  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hmla", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    model = DeepseekV32ForCausalLM.from_pretrained(a.checkpoint, attn_implementation="eager").float().eval()
    cfg = model.config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
    scores = []

    def hook(mod, args, out):  # the indexer's scores, as the module computes them
        hidden, q_resid, (cos, sin) = args[0], args[1], args[2]
        b, s, _ = hidden.shape
        q = mod.wq_b(q_resid).view(b, s, mod.n_heads, mod.head_dim)
        k = mod.k_norm(mod.wk(hidden)).unsqueeze(2)
        r = mod.qk_rope_head_dim
        qr, kr = apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim=2)
        q, k = torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1).squeeze(2)
        sc = torch.relu(torch.einsum("bshd,btd->bhst", q, k) * mod.softmax_scale)
        w = mod.weights_proj(hidden) * mod.n_heads ** -0.5
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores.append(torch.einsum("bsh,bhst->bst", w, sc).masked_fill(~causal, float("-inf")).numpy())

    routers = {}  # MoE layer -> (logits, bias, transformers' chosen experts)

    def router_hook(L):
        def f(mod, args, out):
            routers[L] = (out[0].double(), mod.e_score_correction_bias.double(), out[2].numpy())
        return f

    for L, layer in enumerate(model.model.layers):
        layer.self_attn.indexer.register_forward_hook(hook)
        if hasattr(layer.mlp, "gate") and hasattr(layer.mlp.gate, "e_score_correction_bias"):
            layer.mlp.gate.register_forward_hook(router_hook(L))
    rcfg = {n: getattr(cfg, n) for n in ("num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob",
                                         "routed_scaling_factor")}
    K = cfg.index_topk
    for seed in range(100):
        ids = np.random.default_rng(seed).integers(3, 259, (2, a.seq_len)).astype(np.int64)
        scores.clear()
        routers.clear()
        with torch.no_grad():
            ref = model(torch.from_numpy(ids)).logits.numpy()
        gap = np.inf
        for sc in scores:
            for row in sc.reshape(-1, sc.shape[-1]):
                fin = np.sort(row[np.isfinite(row)])[::-1]
                if len(fin) > K:
                    gap = min(gap, fin[K - 1] - fin[K])
        rgap = min([moe_route(rcfg, u, bias)[3] for u, bias, _ in routers.values()], default=np.inf)
        if gap > 1e-6 and rgap > 1e-5:
            break
    print(f"input seed {seed}: smallest K-th/(K+1)-th index score gap {gap:.2e}, router decision gap {rgap:.2e}")
    with tempfile.TemporaryDirectory() as d:
        st.save(f"{d}/in.safetensors", {"input_ids": ids})
        subprocess.run([a.hmla, "forward", "--checkpoint", a.checkpoint, "--inputs", f"{d}/in.safetensors", "--out",
                        f"{d}/out.safetensors"], check=True)
        out = st.load(f"{d}/out.safetensors")
    got = out["logits"]
    experts_ok = sorted(routers) == sorted(int(n.split(".")[1]) for n in out if n.startswith("experts."))
    for L, (_, _, idx) in routers.items():
        same = experts_ok and np.array_equal(np.sort(out[f"experts.{L}"], -1), np.sort(idx, -1))
        print(f"layer {L}: the chosen experts {'equal' if same else 'DIFFER from'} transformers'")
        experts_ok &= same
    diff, mag = float(np.abs(got - ref).max()), float(np.abs(ref).max())
    print(f"checkpoint {a.checkpoint}: layers {cfg.num_hidden_layers}, index_topk {cfg.index_topk}, s {a.seq_len} "
          f"(sparse: {a.seq_len > cfg.index_topk})")
    print(f"max |logits_hmla - logits_transformers| = {diff:.3e}, max |logits| = {mag:.3f}, ratio {diff / mag:.2e}")
    ok = diff <= a.rtol * mag and experts_ok
    print("live check:", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
