#!/usr/bin/env python3
"""hmla's whole training step on MoE models against the PyTorch twin (train_twin.py, written from
the definitions): `hmla backward` writes the LM loss, the gradient of every parameter and each MoE
layer's chosen experts; the twin computes the same in float64 and float32 by autograd. Each value
is checked by the STYLE.md rule (within twice the float32 twin's error against float64, plus 8 f32
ulps) and the chosen experts must equal the float64 twin's, which the test can require because it
first asserts that every routing decision's float64 margin exceeds twice the f32 bound of the
choice values (so no rounding within the rule can flip one). Cases: a dense layer then MoE layers
(group-limited routing, shared experts, a nonzero correction bias), the unnormalised variant
without shared experts and one group, and the first with DeepSeek-V3's sequence-wise balance loss
(`hmla backward --moe-aux-loss-coeff`, docs/moe.md): its value per layer and its gradient, through
the gates and x into every earlier tensor, against float64 autograd of train_twin.balance_loss.
Exit status 1 on any failure."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from attn_twin import check_by_rule  # noqa: E402
from harness import Checker, check_refused, parse_args  # noqa: E402
from mla_twin import make_weights  # noqa: E402
from train_twin import batch_masks, is_moe_layer, step_loss  # noqa: E402

F32_EPS = 2.0 ** -23

BASE = {"model_type": "deepseek_v32", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40,
        "num_hidden_layers": 3, "num_attention_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "max_position_embeddings": 64,
        "pad_token_id": None, "attention_sink": False, "hmla_layer_modes": ["mha"] * 3,
        "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 3, "n_group": 4,
        "topk_group": 2, "moe_intermediate_size": 12, "n_shared_experts": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 2.5}
# (name, config overrides, the balance loss's alpha): alpha 0.5 makes the balance loss's gradient
# a sizeable part of the gates' (so a wrong term in it is far outside the rule's bound; DeepSeek-V3's
# 1e-4 would hide one), and pad tokens (id 0, drawn at random) test its mask.
CASES = [("grouped_shared", {}, 0.0),
         ("ungrouped_unnormalised", {"n_group": 1, "topk_group": 1, "n_shared_experts": 0,
                                     "norm_topk_prob": False, "routed_scaling_factor": 1.0,
                                     "mlp_layer_types": ["sparse", "dense", "sparse"]}, 0.0),
         ("grouped_shared_balance_loss", {}, 0.5)]


def weights(cfg, rng):
    hid, V, E = cfg["hidden_size"], cfg["vocab_size"], cfg["n_routed_experts"]
    dense = lambda *sh: (rng.standard_normal(sh) / np.sqrt(sh[-1])).astype(np.float32)  # noqa: E731
    norm = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    w = {"model.embed_tokens.weight": dense(V, hid), "model.norm.weight": norm(hid), "lm_head.weight": dense(V, hid)}
    for L in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{L}."
        w.update({pre + "self_attn." + n: t for n, t in make_weights(dict(cfg, index_n_heads=0), rng).items()})
        w.update({pre + "input_layernorm.weight": norm(hid), pre + "post_attention_layernorm.weight": norm(hid)})
        swiglu = lambda at, I: {at + "gate_proj.weight": dense(I, hid), at + "up_proj.weight": dense(I, hid),  # noqa
                                at + "down_proj.weight": dense(hid, I)}
        if not is_moe_layer(cfg, L):
            w.update(swiglu(pre + "mlp.", cfg["intermediate_size"]))
            continue
        # Router logits of spread ~2 and a bias of ~0.1: decisions far apart next to f32 rounding.
        w[pre + "mlp.gate.weight"] = 2 * dense(E, hid)
        w[pre + "mlp.gate.e_score_correction_bias"] = (0.1 * rng.standard_normal(E)).astype(np.float32)
        for e in range(E):
            w.update(swiglu(f"{pre}mlp.experts.{e}.", cfg["moe_intermediate_size"]))
        if cfg["n_shared_experts"]:
            w.update(swiglu(pre + "mlp.shared_experts.", cfg["n_shared_experts"] * cfg["moe_intermediate_size"]))
    return w


def twin(cfg, w, ids, dtype, alpha=0.0):
    p = {n: torch.tensor(a, dtype=dtype, requires_grad=not n.endswith("e_score_correction_bias")) for n, a in w.items()}
    b, s = ids.shape
    ids_t = torch.from_numpy(ids.astype(np.int64))
    ds, de = torch.zeros(b, s, dtype=torch.int64), torch.full((b, s), s, dtype=torch.int64)
    allowed, targets, keep, rw = batch_masks(cfg, ids_t, ds, de, dtype)
    trace, aux = {}, []
    lm, _ = step_loss(cfg, p, ids_t, allowed, targets, keep, "mha", {}, rw, trace, alpha, aux)
    (lm + sum(aux)).backward()
    out = {"lm_loss": lm.detach().double().numpy().reshape(1)}
    if aux:
        out["moe_aux_loss"] = torch.stack([a.detach() for a in aux]).double().numpy()
    # An expert no token chose has no autograd gradient: 0, as hmla's arena holds.
    out.update({"grad." + n: (t.grad if t.grad is not None else torch.zeros_like(t)).double().numpy()
                for n, t in p.items() if t.requires_grad})
    return out, trace


def run_case(check, hmla, root, name, over, alpha, rng):
    cfg = dict(BASE, **over)
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    w = weights(cfg, rng)
    st.save(os.path.join(d, "model.safetensors"), w)
    ids = rng.integers(0, cfg["vocab_size"], size=(2, 12)).astype(np.int32)
    if alpha:
        ids[0, -3:] = 0  # tail padding (pad_token_id null: 0): the balance loss counts loss rows only
    st.save(os.path.join(d, "inputs.safetensors"), {"input_ids": ids})
    out = os.path.join(d, "out.safetensors")
    r = subprocess.run([hmla, "backward", "--checkpoint", d, "--inputs", os.path.join(d, "inputs.safetensors"),
                        "--out", out] + (["--moe-aux-loss-coeff", str(alpha)] if alpha else []),
                       capture_output=True, text=True)
    check(f"{name}: hmla backward runs", r.returncode == 0, r.stderr.strip()[-300:])
    if r.returncode != 0:
        return
    got = st.load(out)
    ref64, tr64 = twin(cfg, w, ids, torch.float64, alpha)
    ref32, tr32 = twin(cfg, w, ids, torch.float32, alpha)
    check(f"{name}: the MoE layers are the config's", sorted(tr64) == [L for L in range(3) if is_moe_layer(cfg, L)])
    for L in sorted(tr64):
        idx64, c64, margin = tr64[L]
        err_c = float((tr32[L][1].double() - c64).abs().max())
        need = 2 * (2 * err_c + 8 * F32_EPS * float(c64.abs().max()))
        check(f"{name}: layer {L}'s routing decisions are far from ties", margin > need,
              f"(float64 margin {margin:.3e}, needs > {need:.3e})")
        check(f"{name}: layer {L}'s chosen experts equal the twin's",
              np.array_equal(got.pop(f"experts.{L}"), idx64.numpy()))
    check(f"{name}: no indexer KL in mha", float(got.pop("indexer_kl")[0]) == 0.0)
    # The rule composed over the step: each of the 2 L stages (attention, MLP per layer) is held to
    # twice its naive error by its own tests (mla_twin.py, test_moe.cpp), and stage errors add
    # along the backward. The naive twin's L' = 2 L independent stage errors add in quadrature
    # (about sqrt(L') e), while hmla's are bounded stage by stage (up to 2 L' e), so the ratio of
    # the totals is about 2 sqrt(L'): measured on this model, hmla's whole-step error is 2-3 times
    # the twin's on dense models as on MoE ones (its attention's exp and online softmax), 1-2 times
    # on one layer. A wrong term (a missing gradient path, a mis-weighted expert) is an O(1)
    # relative error, orders above this bound. One layer's routed experts form one group of the
    # rule (attn_twin.check_by_rule): their gradients are computed from the same x and the same
    # output gradient, whose errors hmla carries into every expert, so their rounding scale is the
    # group's; an expert given few tokens can draw a twin error far below it (under the built-in
    # sgemm, one expert's gate_proj measured 9x its own twin error and 0.7x the group's).
    factor = 2 * (2 * cfg["num_hidden_layers"]) ** 0.5
    check(f"{name}: every gradient by the STYLE.md rule composed over the step",
          check_by_rule(name, got, ref64, ref32, factor, group=lambda key: re.sub(r"experts\.\d+\.", "experts.*.", key)))
    check(f"{name}: the gate's gradient is not zero (it flows through the weights)",
          all(np.abs(got[f"grad.model.layers.{L}.mlp.gate.weight"]).max() > 0 for L in tr64))
    if alpha:
        for bad in ("-1", "nan", "inf"):
            check_refused(check, f"{name}: --moe-aux-loss-coeff {bad} is a one-line error",
                          [hmla, "backward", "--checkpoint", d, "--inputs", os.path.join(d, "inputs.safetensors"),
                           "--out", os.path.join(d, "bad.safetensors"), "--moe-aux-loss-coeff", bad],
                          "--moe-aux-loss-coeff", d)
        # The balance loss moves each gate's gradient (and x's, hence the first layer's) by far more
        # than the rule's bound, so a wrong term in its gradient could not pass.
        plain, _ = twin(cfg, w, ids, torch.float64)
        for key in [f"grad.model.layers.{L}.mlp.gate.weight" for L in tr64] + ["grad.model.embed_tokens.weight"]:
            moved = float(np.abs(ref64[key] - plain[key]).max())
            bound = 2 * factor * float(np.abs(ref32[key] - ref64[key]).max()) + 16 * F32_EPS * float(np.abs(ref64[key]).max())
            check(f"{name}: the balance loss moves {key} by more than 100 bounds", moved > 100 * bound,
                  f"(moved {moved:.3e}, bound {bound:.3e})")


def main():
    a = parse_args(__doc__)
    check = Checker()
    torch.manual_seed(0)
    rng = np.random.default_rng(2812)
    for name, over, alpha in CASES:
        run_case(check, a.hmla, a.workdir, name, over, alpha, rng)
    check.exit()


if __name__ == "__main__":
    main()
