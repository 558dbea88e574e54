#!/usr/bin/env python3
"""Builds a tiny random DeepseekV4ForCausalLM (model_type deepseek_v4) with Hugging Face transformers
and writes the fixtures hmla's DeepSeek-V4 checks read (DESIGN.md section 10). One model, every
layer kind: layers sliding / CSA (m 4) / HCA (m 8) / CSA, MLPs hash_moe / moe / hash_moe / moe,
hc_mult 2, YaRN on the compress RoPE, index_head_dim 16 > qk_rope_head_dim 8, nonzero sinks, ape,
mHC base and e_score_correction_bias, swiglu_limit 1.5 (some gates and ups clamp), b 2, s 36:

  tests/hf/fixtures/v4/          the checkpoint as transformers saves it (config.json,
                                 generation_config.json, model.safetensors: f32, DeepSeek's names,
                                 e.g. model.layers.0.attn.wq_a.weight, head.weight), and
                                 fixture.safetensors: input_ids [b, s] (i64); the logits in float64
                                 (logits_hi + logits_lo, two f32 tensors as in make_fixtures.py);
                                 the float32 model's logits (logits_f32, the naive-f32 error of the
                                 tolerance rule); per CSA layer L: layer{L}.topk [b, s, k] (i32, as
                                 the indexer returns it: entry indices w in 0..T-1 of that row's
                                 compressed entries, ordered by descending score, -1 where fewer
                                 than k entries are visible), layer{L}.index_scores_{hi,lo}
                                 [b, s, T] (the scorer's output, -inf on entries the query may not
                                 see); per MoE layer L: layer{L}.experts [b * s, k] (i32, each row
                                 ascending) and layer{L}.expert_weights_{hi,lo} [b * s, k] (the
                                 gating weights, in the same order; already times
                                 routed_scaling_factor).
  tests/hf/fixtures/v4_modules/  modules.safetensors: float64 module inputs and outputs, batch row
                                 0 only (a module test runs b = 1 on input_ids[0]), each as _hi/_lo:
                                 layer{L}.streams [s, hc, D] for L = 0..layers (layer L's input;
                                 L = layers is the last layer's output = hc_head's input);
                                 layer{L}.{attn,ffn}_hc.{post [s, hc], comb [s, hc, hc],
                                 collapsed [s, D]}; layer{L}.attn_out [s, D] (self_attn's
                                 output, before post); layer{L}.mlp_out [s, D]; layer{L}.entries
                                 [T, head_dim] (the compressor's entries, RoPE'd);
                                 layer{L}.index_entries [T, index_head_dim] (the CSA indexer's
                                 own entries); hc_head [s, D] (hc_head's output, before the final
                                 norm). Every tensor X also has X_f32err [1]: max |f32 - f64| of
                                 the same tensor in the float32 forward (the error propagated from
                                 upstream included: an upper bound on a module's own error).
  tests/hf/fixtures/v4_grads/    grads.safetensors: float64 gradients of every parameter, under the
                                 checkpoint's names (the experts' fused gate_up_proj split back to
                                 experts.E.w1 / w3, down_proj to w2), as NAME_hi / NAME_lo, plus
                                 NAME_f32err [1] (max |f32 grad - f64 grad|) and loss_hi / loss_lo /
                                 loss_f32 [1]. The loss: L = (1 / (b (s - 1))) sum_{b, t < s - 1}
                                 CE(logits[b, t], input_ids[b, t + 1]), natural log, mean over the
                                 b (s - 1) predicted tokens (transformers' ForCausalLMLoss with
                                 labels = input_ids; checked equal). No aux loss. The indexer's
                                 parameters get exactly zero (the top-k indices carry no gradient:
                                 the LM loss does not reach the indexer in transformers): they are
                                 left out of the file and listed in made_with.json
                                 ("zero-gradient parameters").

Float64: transformers' module code casts to float32 in several places even under model.double()
(every RMSNorm's statistics, the interleaved RoPE's x.float(), the f32 angles of the rotary,
the compressor softmax dtype=float32, mHC's .float(), the indexer scorer's .float()), so
model.double() alone is float32-accurate in spots. The float64 results here are transformers'
code run with those casts lifted to float64 (its modules' `torch.float32` / `torch.float` and
`Tensor.float` read as float64 during the float64 passes, and the inverse frequencies
recomputed in float64); made_with.json records how far plain model.double() lands from it.

Seeds: torch.topk breaks ties its own way; seeds with a near-tie at an indexer's k-th place
(< 1e-3) or a router's k-th place (< 1e-4), or whose float32 run selects differently from the
float64 run, are skipped.

Needs a virtual environment outside the tree (not part of the default suite):
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers==5.24.0
    /tmp/hfvenv/bin/python tests/hf/make_v4_fixtures.py
"""
import contextlib
import json
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers import modeling_rope_utils
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdv4

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import safetensors_lite as st  # noqa: E402
from make_fixtures import PINNED, split64  # noqa: E402

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

B, S = 2, 36  # s = 9 CSA windows of 4, 4 HCA windows of 8 plus a trailing partial window of 4
CONFIG = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, head_dim=16, qk_rope_head_dim=8,
    q_lora_rank=16, o_groups=2, o_lora_rank=8, index_n_heads=4, index_head_dim=16, index_topk=3, sliding_window=4,
    hc_mult=2, hc_sinkhorn_iters=20, hc_eps=1e-6, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    moe_intermediate_size=8, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=1.5,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "compressed_sparse_attention"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    mlp_layer_types=["hash_moe", "moe", "hash_moe", "moe"],
    rope_theta=10000.0, compress_rope_theta=160000.0,
    # YaRN on the compress RoPE only (the config folds these keys into rope_parameters["compress"]
    # and adds attention_factor 1.0); original 16 < s so that the ramp matters.
    rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=32.0,
                         beta_slow=1.0),
    max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.2, tie_word_embeddings=False,
    pad_token_id=None, bos_token_id=0, eos_token_id=1, num_nextn_predict_layers=0)


class _Float64Torch:
    """`torch` as seen by a patched module: float32 (and its alias float) read as float64."""
    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def exact_float64():
    """Lifts transformers' float32 casts (module-level `torch.float32` / `torch.float` and
    Tensor.float()) to float64 for the deepseek_v4 and rope modules."""
    saved = (mdv4.torch, modeling_rope_utils.torch, torch.Tensor.float)
    mdv4.torch = modeling_rope_utils.torch = _Float64Torch()
    torch.Tensor.float = lambda self, *a, **k: self.double()
    try:
        yield
    finally:
        mdv4.torch, modeling_rope_utils.torch, torch.Tensor.float = saved


def recompute_inv_freq_f64(model):
    """Every rotary module's inverse frequencies, recomputed in float64 (inside exact_float64)."""
    for mod in model.modules():
        if isinstance(mod, mdv4.DeepseekV4RotaryEmbedding):
            for lt in mod.layer_types:
                fn = mod.compute_default_rope_parameters
                if mod.rope_type[lt] != "default":
                    fn = modeling_rope_utils.ROPE_INIT_FUNCTIONS[mod.rope_type[lt]]
                inv, scale = fn(mod.config, layer_type=lt)
                assert inv.dtype == torch.float64 and scale == 1.0
                getattr(mod, f"{lt}_inv_freq").copy_(inv)
                getattr(mod, f"{lt}_original_inv_freq").copy_(inv)


def randomise(model, cfg, gen):
    """Nonzero values where transformers initialises constants (sinks, ape, mHC base / scale, norm
    weights, e_score_correction_bias) and a tid2eid table with distinct experts per token."""
    def rn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(rn(*p.shape, std=0.5))
            elif name.endswith("position_bias"):
                p.copy_(rn(*p.shape, std=0.3))
            elif name.endswith(("hc.base", "hc_base")):
                p.copy_(rn(*p.shape, std=0.3))
            elif name.endswith(("hc.scale", "hc_scale")):
                p.copy_(1.0 + rn(*p.shape, std=0.2))
            elif "norm" in name and p.dim() == 1:
                p.copy_(1.0 + rn(*p.shape, std=0.2))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(rn(*b.shape, std=0.1))
            elif name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[: cfg.num_experts_per_tok]
                                     for _ in range(cfg.vocab_size)]))


def checkpoint_names(model, saved):
    """transformers' parameter name -> [(checkpoint name, slice)] by value (every value is random,
    so each match is unique); the fused experts split as save_pretrained splits them."""
    out = {}
    I = model.config.moe_intermediate_size
    for name, p in model.named_parameters():
        v = p.detach().numpy()
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            parts = []
            for e in range(v.shape[0]):
                pieces = ([(v[e, :I], "w1", (e, slice(0, I))), (v[e, I:], "w3", (e, slice(I, 2 * I)))]
                          if name.endswith("gate_up_proj") else [(v[e], "w2", (e,))])
                for arr, w, idx in pieces:
                    hits = [k for k, t in saved.items() if t.shape == arr.shape and np.array_equal(t, arr)]
                    assert len(hits) == 1 and hits[0].endswith(f"experts.{e}.{w}.weight"), (name, e, w, hits)
                    parts.append((hits[0], idx))
            out[name] = parts
        else:
            hits = [k for k, t in saved.items() if t.shape == v.shape and np.array_equal(t, v)]
            assert len(hits) == 1, (name, hits)
            out[name] = [(hits[0], ())]
    used = {k for parts in out.values() for k, _ in parts}
    assert used | {k for k in saved if k.endswith(("tid2eid", "gate.bias"))} == set(saved), set(saved) - used
    return out


def lm_loss(logits, ids):
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1), reduction="mean")


def run(model, ids, cfg):
    """One forward + backward with hooks; every captured tensor as float64 numpy."""
    cap, topk, experts, clamped = {}, {}, {}, {}

    def put(name, t):  # returns None: a forward hook that returns something replaces the output
        cap[name] = t.detach().double().numpy().copy()

    hooks = []
    for L, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, a, o, L=L: [put(f"layer{L}.streams", a[0]), put(f"layer{L + 1}.streams", o)] and None))
        for hc in ("attn_hc", "ffn_hc"):
            hooks.append(getattr(layer, hc).register_forward_hook(
                lambda m, a, o, L=L, hc=hc: [put(f"layer{L}.{hc}.{k}", t) for k, t in zip(("post", "comb", "collapsed"), o)] and None))
        hooks.append(layer.self_attn.register_forward_hook(lambda m, a, o, L=L: put(f"layer{L}.attn_out", o[0])))
        hooks.append(layer.mlp.register_forward_hook(lambda m, a, o, L=L: put(f"layer{L}.mlp_out", o)))
        comp = layer.self_attn.compressor
        if comp is not None:
            hooks.append(comp.register_forward_hook(lambda m, a, o, L=L: put(f"layer{L}.entries", o[0][:, 0])))
            if isinstance(comp, mdv4.DeepseekV4CSACompressor):
                def scorer_hook(m, a, o, L=L, rate=comp.compress_rate):
                    put(f"layer{L}.index_entries", a[1])
                    t = a[1].shape[1]
                    vis = torch.arange(t).view(1, 1, -1) < ((torch.arange(o.shape[1]) + 1) // rate).view(1, -1, 1)
                    put(f"layer{L}.index_scores", o.masked_fill(~vis, float("-inf")))
                hooks.append(comp.indexer.scorer.register_forward_hook(scorer_hook))
                hooks.append(comp.indexer.register_forward_hook(
                    lambda m, a, o, L=L: topk.__setitem__(L, o.numpy().astype(np.int32)) and None))
        gate = layer.mlp.gate

        def gate_hook(m, a, o, L=L):
            _, w, idx = o
            order = torch.argsort(idx, dim=-1)
            experts[L] = torch.gather(idx, 1, order).numpy().astype(np.int32)
            put(f"layer{L}.expert_weights", torch.gather(w, 1, order))
            put(f"layer{L}.router_choice", m.score_fn(a[0].reshape(-1, cfg.hidden_size) @ m.weight.T)
                + (m.e_score_correction_bias if hasattr(m, "e_score_correction_bias") else 0))
        hooks.append(gate.register_forward_hook(gate_hook))
        def clamp_hook(m, a, o, L=L):
            x = a[0]
            if isinstance(m, mdv4.DeepseekV4Experts):
                gu = torch.einsum("td,tkfd->tkf", x, m.gate_up_proj[a[1]])
                gate, up = gu.chunk(2, dim=-1)
                key = "routed"
            else:
                gate, up, key = m.gate_proj(x), m.up_proj(x), "shared"
            c = clamped.setdefault(key, [0, 0, 0])
            c[0] += int((gate > m.limit).sum())
            c[1] += int((up.abs() > m.limit).sum())
            c[2] += gate.numel()
        hooks.append(layer.mlp.experts.register_forward_hook(clamp_hook))
        hooks.append(layer.mlp.shared_experts.register_forward_hook(clamp_hook))
    hooks.append(model.model.hc_head.register_forward_hook(lambda m, a, o: put("hc_head", o)))

    tid = torch.from_numpy(ids)
    model.zero_grad(set_to_none=True)
    out = model(tid, labels=tid)
    loss = lm_loss(out.logits, tid)
    assert torch.allclose(loss, out.loss, rtol=1e-12 if loss.dtype == torch.float64 else 1e-6), (loss, out.loss)
    loss.backward()
    for h in hooks:
        h.remove()
    grads = {n: (p.grad.double().numpy().copy() if p.grad is not None else np.zeros(p.shape)) for n, p in model.named_parameters()}
    cap["clamped"] = clamped
    return out.logits.detach().double().numpy(), loss.item(), cap, topk, experts, grads


def margins(cap, topk, cfg):
    """Smallest indexer k-th / (k+1)-th visible-score gap and smallest top-k router gap."""
    igap = np.inf
    for L in topk:
        for row in cap[f"layer{L}.index_scores"].reshape(-1, cap[f"layer{L}.index_scores"].shape[-1]):
            fin = np.sort(row[np.isfinite(row)])[::-1]
            if len(fin) > cfg.index_topk:
                igap = min(igap, fin[cfg.index_topk - 1] - fin[cfg.index_topk])
    rgap = np.inf
    for L, t in enumerate(cfg.mlp_layer_types):
        if t == "moe":
            c = np.sort(cap[f"layer{L}.router_choice"], axis=-1)[:, ::-1]
            rgap = min(rgap, (c[:, cfg.num_experts_per_tok - 1] - c[:, cfg.num_experts_per_tok]).min())
    return igap, rgap


def build(seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cfg = DeepseekV4Config(**CONFIG)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no float64)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomise(model, cfg, gen)
    ids = np.random.default_rng(7).integers(3, cfg.vocab_size, (B, S)).astype(np.int64)

    logits32, loss32, cap32, topk32, exp32, grads32 = run(model, ids, cfg)
    m64 = DeepseekV4ForCausalLM(cfg).eval()
    m64.load_state_dict(model.state_dict())
    m64 = m64.double()
    with torch.no_grad():
        plain64 = m64(torch.from_numpy(ids)).logits.numpy()  # transformers' own casts kept
    with exact_float64():
        with torch.no_grad():
            recompute_inv_freq_f64(m64)
        logits64, loss64, cap64, topk64, exp64, grads64 = run(m64, ids, cfg)
    cap32.pop("clamped")
    igap, rgap = margins(cap64, topk64, cfg)
    same = all(np.array_equal(topk32[L], topk64[L]) for L in topk64) and all(
        np.array_equal(exp32[L], exp64[L]) for L in exp64)
    if igap < 1e-3 or rgap < 1e-4 or not same:
        print(f"seed {seed}: skipped (indexer gap {igap:.1e}, router gap {rgap:.1e}, f32 == f64 choices: {same})")
        return False
    return dict(seed=seed, cfg=cfg, model=model, ids=ids, logits32=logits32, logits64=logits64, plain64=plain64,
                loss32=loss32, loss64=loss64, cap32=cap32, cap64=cap64, topk=topk64, experts=exp64,
                grads32=grads32, grads64=grads64, igap=igap, rgap=rgap, clamped=cap64.pop("clamped"))


def main():
    assert transformers.__version__ == PINNED, f"fixtures are pinned to transformers {PINNED}, found {transformers.__version__}"
    for seed in range(1234, 1334):
        r = build(seed)
        if r:
            break
    else:
        raise SystemExit("v4: no seed without near-ties")
    cfg, model, ids = r["cfg"], r["model"], r["ids"]
    root = os.path.join(HERE, "fixtures")
    dirs = {k: os.path.join(root, k) for k in ("v4", "v4_modules", "v4_grads")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    model.save_pretrained(dirs["v4"], safe_serialization=True)
    saved = st.load(os.path.join(dirs["v4"], "model.safetensors"))
    names = checkpoint_names(model, saved)

    # fixture.safetensors: the whole-model checks.
    t = {"input_ids": ids, "logits_f32": r["logits32"].astype(np.float32)}
    t["logits_hi"], t["logits_lo"] = split64(r["logits64"])
    for L, k in r["topk"].items():
        t[f"layer{L}.topk"] = k
        t[f"layer{L}.index_scores_hi"], t[f"layer{L}.index_scores_lo"] = split64(r["cap64"][f"layer{L}.index_scores"])
    for L, e in r["experts"].items():
        t[f"layer{L}.experts"] = e
        t[f"layer{L}.expert_weights_hi"], t[f"layer{L}.expert_weights_lo"] = split64(r["cap64"][f"layer{L}.expert_weights"])
    st.save(os.path.join(dirs["v4"], "fixture.safetensors"), t)

    # modules.safetensors: batch row 0 of every module's float64 output.
    m = {}
    for name, v in r["cap64"].items():
        if name.endswith(("index_scores", "expert_weights", "router_choice")):
            continue
        m[f"{name}_hi"], m[f"{name}_lo"] = split64(v[0])
        m[f"{name}_f32err"] = np.array([np.abs(r["cap32"][name][0] - v[0]).max()], np.float32)
    st.save(os.path.join(dirs["v4_modules"], "modules.safetensors"), m)

    # grads.safetensors: under the checkpoint's names.
    g = {}
    g["loss_hi"], g["loss_lo"] = split64(np.array([r["loss64"]]))
    g["loss_f32"] = np.array([r["loss32"]], np.float32)
    zero = []
    for name, parts in names.items():
        g64, g32 = r["grads64"][name], r["grads32"][name]
        if not np.any(g64):  # the indexer's: omitted from the file, listed in made_with.json
            zero.append(parts[0][0])
            continue
        for key, idx in parts:
            g[f"{key}_hi"], g[f"{key}_lo"] = split64(np.ascontiguousarray(g64[idx]))
            g[f"{key}_f32err"] = np.array([np.abs(g32[idx] - g64[idx]).max()], np.float32)
    st.save(os.path.join(dirs["v4_grads"], "grads.safetensors"), g)

    info = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": r["seed"],
            "b": B, "s": S, "clamped (gate > limit, |up| > limit) of routed / shared pre-activations": r["clamped"],
            "max|logit|": float(np.abs(r["logits64"]).max()),
            "max|f32 - f64| logits": float(np.abs(r["logits32"] - r["logits64"]).max()),
            "max|model.double() - f64| logits": float(np.abs(r["plain64"] - r["logits64"]).max()),
            "min indexer k-th gap": float(r["igap"]), "min router k-th gap": float(r["rgap"]),
            "loss": r["loss64"], "zero-gradient parameters": zero}
    for d in dirs.values():
        with open(os.path.join(d, "made_with.json"), "w") as f:
            json.dump(info if d == dirs["v4"] else {**info, "checkpoint": "../v4"}, f, indent=1)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
