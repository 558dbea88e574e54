#!/usr/bin/env python3
"""The model commands at the CLI (forward, generate, layer): generate's continuation is the full
forward's greedy choice at every step in every layer mode (it decodes from a KV cache), a prompt
longer than the model's positions is refused before any compute, a failed write to stdout is an
error, a checkpoint tensor the config would ignore is an error (forward, a programme's
init_checkpoint), and `hmla layer` refuses non-finite weights as forward and train do."""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, check_refused, parse_args  # noqa: E402
from mla_twin import base_config, make_weights  # noqa: E402

F32_EPS = 2.0 ** -23


def model_config(modes, **over):
    """A tiny byte-level model (vocab 259: every id is a byte, EOS or a special) in `modes`."""
    cfg = {"model_type": "deepseek_v32", "vocab_size": 259, "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": len(modes), "num_attention_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
           "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "index_n_heads": 2,
           "index_head_dim": 8, "index_topk": 4, "max_position_embeddings": 64, "pad_token_id": None,
           "attention_sink": False, "hmla_layer_modes": modes}
    cfg.update(over)
    return cfg


def model_weights(cfg, rng):
    hid, inter, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    dense = lambda *sh: (rng.standard_normal(sh) / math.sqrt(sh[-1])).astype(np.float32)  # noqa: E731
    norm = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    # Logits spread well apart (x3), so a greedy choice is rarely a near tie.
    w = {"model.embed_tokens.weight": dense(V, hid), "model.norm.weight": norm(hid),
         "lm_head.weight": 3 * dense(V, hid)}
    # BOS (id 1) prints nothing, so the test could not tell where it was generated: its logit is 0,
    # below the largest of the other 258 (an argmax of 0 over them is practically impossible).
    w["lm_head.weight"][1] = 0
    for L, mode in enumerate(cfg["hmla_layer_modes"]):
        pre = f"model.layers.{L}."
        attn = make_weights(dict(cfg, index_n_heads=cfg["index_n_heads"] if mode.startswith("dsa") else 0), rng)
        w.update({pre + "self_attn." + n: t for n, t in attn.items()})
        w.update({pre + "input_layernorm.weight": norm(hid), pre + "post_attention_layernorm.weight": norm(hid),
                  pre + "mlp.gate_proj.weight": dense(inter, hid), pre + "mlp.up_proj.weight": dense(inter, hid),
                  pre + "mlp.down_proj.weight": dense(hid, inter)})
    return w


def write_checkpoint(d, cfg, weights):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    st.save(os.path.join(d, "model.safetensors"), weights)


def generate_matches_forward(a, check, w, rng):
    """Greedy generate decodes from the KV cache; every token it prints must be the argmax of the
    full forward's logits (`hmla forward` over the prompt and what came before) at its position, up
    to the two computations' f32 rounding (the test's tolerance: 1e-4 of the largest logit, the
    programme's f32 equivalence_rtol, DESIGN.md section 7, for a near tie)."""
    cases = {
        "mha": model_config(["mha", "mha"]),
        "mha, no q LoRA, sink, YaRN": model_config(
            ["mha"], q_lora_rank=None, attention_sink=True,
            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
        "mqa_full_causal + dsa_warmup": model_config(["mqa_full_causal", "dsa_warmup"], attention_sink=True),
        "dsa_sparse, s > index_topk": model_config(["dsa_sparse", "dsa_sparse"]),
        "mha + dsa_sparse with a window": model_config(["mha", "dsa_sparse"], index_window=2, attention_sink=True),
    }
    prompt = "the cache keeps c and k_pe"
    for i, (name, cfg) in enumerate(cases.items()):
        d = os.path.join(w, f"gen{i}")
        write_checkpoint(d, cfg, model_weights(cfg, rng))
        r = subprocess.run([a.hmla, "generate", "--checkpoint", d, "--prompt", prompt, "--tokens", "24"],
                           capture_output=True, timeout=120)
        out = r.stdout
        if r.returncode != 0 or not out.startswith(prompt.encode()) or not out.endswith(b"\n"):
            check(f"generate ({name})", False, f"exit {r.returncode}: {r.stderr.decode()[:200]}")
            continue
        text = out[len(prompt):-1]
        ids = [b + 3 for b in prompt.encode() + text]
        st.save(os.path.join(w, "ids.safetensors"), {"input_ids": np.array([ids], dtype=np.int32)})
        r = subprocess.run([a.hmla, "forward", "--checkpoint", d, "--inputs", os.path.join(w, "ids.safetensors"),
                            "--out", os.path.join(w, "logits.safetensors")], capture_output=True, text=True)
        if r.returncode != 0:
            check(f"generate ({name}): forward", False, r.stderr[:200])
            continue
        logits = st.load(os.path.join(w, "logits.safetensors"))["logits"][0]
        P, bad = len(prompt), []
        for k, tok in enumerate(ids[P:]):
            row = logits[P + k - 1]
            if row[tok] < row.max() - 1e-4 * np.abs(row).max():
                bad.append((k, tok, int(row.argmax())))
        # A continuation that ended early ended on EOS or pad: the forward's choice after it.
        stopped = len(text) < 24
        end_ok = not stopped or int(logits[-1].argmax()) in (0, 2)
        check(f"generate ({name}) = the full forward's greedy choice", not bad and end_ok and len(text) > 0,
              f"{len(text)} tokens; mismatches (step, got, forward's argmax): {bad[:4]}")
    return os.path.join(w, "gen0")


def generate_v4(a, check, w):
    """generate on a DeepSeek-V4 model (its KV cache: v4_decode.cpp, checked token by token against
    the forward in tests/hf/test_v4_decode.cpp): the transformers fixture (vocab 64) has no
    tokenizer.json and bytes cannot be its tokens, a clear error; widened to the byte vocabulary
    (259 ids: the fixture's rows, then new ones) it continues a prompt past several windows."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hf", "fixtures", "v4")
    refused(check, "generate (deepseek_v4 fixture): bytes do not fit vocab_size 64",
            [a.hmla, "generate", "--checkpoint", src, "--prompt", "hi"],
            "bytes cannot be this model's tokens; pass --tokenizer", w)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    weights = st.load(os.path.join(src, "model.safetensors"))
    rng = np.random.default_rng(5)
    V = 259
    for name, t in list(weights.items()):
        if name in ("model.embed_tokens.weight", "head.weight"):
            new = (rng.standard_normal((V, t.shape[1])) * t.std()).astype(np.float32)
        elif name.endswith("tid2eid"):  # the new ids reuse the fixture's (distinct) expert pairs
            new = t[rng.integers(0, t.shape[0], V)].astype(np.int64)
        else:
            continue
        new[:t.shape[0]] = t
        weights[name] = new
    cfg["vocab_size"] = V
    d = os.path.join(w, "gen_v4")
    write_checkpoint(d, cfg, weights)
    prompt = "a window, entries"
    r = subprocess.run([a.hmla, "generate", "--checkpoint", d, "--prompt", prompt, "--tokens", "30"],
                       capture_output=True, timeout=120)
    check("generate (deepseek_v4, bytes) runs", r.returncode == 0 and r.stdout.startswith(prompt.encode()) and
          r.stdout.endswith(b"\n") and len(r.stdout) > len(prompt) + 1, f"exit {r.returncode}: {r.stderr[:200]}")


def forward_v4(a, check, w):
    """hmla forward and backward on the transformers-saved DeepSeek-V4 fixture (tests/hf/fixtures/v4):
    the logits within STYLE.md's rule of transformers' float64 (twice transformers' own f32 error plus
    8 ulps of max|logits|), topk.<L> of each CSA layer the fixture's sets (padded with -1), experts.<L>
    of each layer the fixture's, no topk for the sliding and HCA layers; backward's lm_loss within the
    same rule of transformers' float64 loss and a gradient per parameter but the router biases."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hf", "fixtures")
    src = os.path.join(root, "v4")
    fx = st.load(os.path.join(src, "fixture.safetensors"))
    inp, out = os.path.join(w, "v4_ids.safetensors"), os.path.join(w, "v4_out.safetensors")
    st.save(inp, {"input_ids": fx["input_ids"]})
    r = subprocess.run([a.hmla, "forward", "--checkpoint", src, "--inputs", inp, "--out", out], capture_output=True,
                       timeout=120)
    check("forward (deepseek_v4 fixture) runs", r.returncode == 0, r.stderr.decode()[:300])
    if r.returncode != 0:
        return
    o = st.load(out)
    ref = fx["logits_hi"].astype(np.float64) + fx["logits_lo"].astype(np.float64)
    e32 = np.abs(fx["logits_f32"].astype(np.float64) - ref).max()
    err, bound = np.abs(o["logits"].astype(np.float64) - ref).max(), 2 * e32 + 8 * F32_EPS * np.abs(ref).max()
    check("forward (deepseek_v4): logits within the rule of transformers' float64", err <= bound,
          f"max error {err:.3g}, bound {bound:.3g}")
    with open(os.path.join(src, "config.json")) as f:
        kinds = json.load(f)["layer_types"]
    for L, kind in enumerate(kinds):
        if kind != "compressed_sparse_attention":
            check(f"forward (deepseek_v4): no topk.{L} for a {kind} layer", f"topk.{L}" not in o)
            continue
        got, want = o.get(f"topk.{L}"), fx[f"layer{L}.topk"]
        same = got is not None and all(set(g[g >= 0]) == set(x[x >= 0]) for g, x in
                                       zip(got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])))
        check(f"forward (deepseek_v4): topk.{L} is transformers' selection", same)
    for L in range(len(kinds)):
        exp = o.get(f"experts.{L}")
        check(f"forward (deepseek_v4): experts.{L} are transformers'", exp is not None and
              np.array_equal(np.sort(exp, 1), fx[f"layer{L}.experts"]))
    r = subprocess.run([a.hmla, "backward", "--checkpoint", src, "--inputs", inp, "--out", out], capture_output=True,
                       timeout=120)
    check("backward (deepseek_v4 fixture) runs", r.returncode == 0, r.stderr.decode()[:300])
    if r.returncode != 0:
        return
    o, g = st.load(out), st.load(os.path.join(root, "v4_grads", "grads.safetensors"))
    loss = float(g["loss_hi"][0]) + float(g["loss_lo"][0])
    bound = 2 * abs(float(g["loss_f32"][0]) - loss) + 8 * F32_EPS * loss
    check("backward (deepseek_v4): lm_loss within the rule of transformers' float64",
          abs(float(o["lm_loss"][0]) - loss) <= bound, f"{float(o['lm_loss'][0])} vs {loss}")
    names = {k[5:] for k in o if k.startswith("grad.")}
    check("backward (deepseek_v4): a gradient per parameter, none for the router biases",
          "head.weight" in names and "model.layers.1.attn.wq_a.weight" in names and
          not any(n.endswith(".ffn.gate.bias") for n in names))


def refused(check, name, cmd, needle, root, timeout=120):
    """check_refused, with a command that runs on (the bug) or prints bytes that are not text
    counted as a failure of its case rather than of the script."""
    try:
        check_refused(check, name, cmd, needle, root, timeout=timeout)
    except subprocess.TimeoutExpired:
        check(name, False, f"still running after {timeout} s")
    except UnicodeDecodeError:
        check(name, False, "ran and printed a continuation")


def main():
    a = parse_args(__doc__)
    w = a.workdir
    p = lambda n: os.path.join(w, n)  # noqa: E731
    check = Checker()
    rng = np.random.default_rng(24)
    ck = generate_matches_forward(a, check, w, rng)
    generate_v4(a, check, w)
    forward_v4(a, check, w)

    # Issue 24: the prompt (and the tokens asked for) must fit max_position_embeddings (64 here),
    # refused before any compute: a 100 KB prompt used to run a whole forward per new token.
    t0 = time.time()
    refused(check, "generate: a 100 KB prompt", [a.hmla, "generate", "--checkpoint", ck, "--prompt", "x" * 100_000],
            "100000 + 200 positions exceed max_position_embeddings = 64", w, timeout=30)
    check("generate: the 100 KB prompt is refused at once", time.time() - t0 < 10, f"{time.time() - t0:.1f} s")
    refused(check, "generate: prompt + --tokens over max_position_embeddings",
                  [a.hmla, "generate", "--checkpoint", ck, "--prompt", "y" * 60, "--tokens", "5"],
                  "pass --tokens 4 or less", w)
    refused(check, "generate: a prompt of max_position_embeddings tokens (bytes)",
                  [a.hmla, "generate", "--checkpoint", ck, "--prompt", "z" * 64, "--tokens", "1"],
                  "shorten the prompt to at most 63 tokens", w)
    r = subprocess.run([a.hmla, "generate", "--checkpoint", ck, "--prompt", "y" * 60, "--tokens", "4"],
                       capture_output=True, timeout=60)
    check("generate: prompt + --tokens = max_position_embeddings runs", r.returncode == 0, r.stderr.decode()[:200])

    # forward --text: the checkpoint has no tokenizer.json, so the text is its bytes + 3; the logits
    # are --inputs' over those ids bit for bit (one computation), and input_ids comes back.
    text = "the cache keeps c"
    st.save(p("text_ids.safetensors"), {"input_ids": np.array([[b + 3 for b in text.encode()]], dtype=np.int32)})
    r1 = subprocess.run([a.hmla, "forward", "--checkpoint", ck, "--text", text, "--out", p("by_text.safetensors")],
                        capture_output=True, text=True)
    r2 = subprocess.run([a.hmla, "forward", "--checkpoint", ck, "--inputs", p("text_ids.safetensors"),
                         "--out", p("by_ids.safetensors")], capture_output=True, text=True)
    if r1.returncode == 0 and r2.returncode == 0:
        t, i = st.load(p("by_text.safetensors")), st.load(p("by_ids.safetensors"))
        check("forward --text = forward --inputs of its bytes + 3",
              np.array_equal(t["input_ids"], st.load(p("text_ids.safetensors"))["input_ids"]) and
              np.array_equal(t["logits"], i["logits"]) and r1.stderr == "", r1.stderr[:200])
    else:
        check("forward --text", False, (r1.stderr + r2.stderr)[:200])
    refused(check, "forward: --text and --inputs together",
            [a.hmla, "forward", "--checkpoint", ck, "--text", "x", "--inputs", p("text_ids.safetensors"),
             "--out", p("never.safetensors")], "excludes", w)
    refused(check, "forward: neither --text nor --inputs",
            [a.hmla, "forward", "--checkpoint", ck, "--out", p("never.safetensors")], "give --inputs or --text", w)

    # Issue 24: a write to stdout that fails is an error, not lost text with exit 0.
    with open("/dev/full", "w") as full:
        r = subprocess.run([a.hmla, "generate", "--checkpoint", ck, "--prompt", "hi", "--tokens", "8"],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    check("generate > /dev/full fails with one error line",
          r.returncode != 0 and len(lines) == 1 and lines[0].startswith("hmla: error: standard output"),
          f"exit {r.returncode}: {lines[:2]}")

    # Issue 24: a checkpoint tensor the config does not have is an error (README), in the loader
    # forward, generate, init_checkpoint and --resume share.
    two = model_config(["mha", "mha"])
    two_w = model_weights(two, rng)
    write_checkpoint(p("two_layers"), two, two_w)
    os.makedirs(p("one_layer"))
    with open(p("one_layer/config.json"), "w") as f:
        json.dump(model_config(["mha"]), f)
    os.symlink(p("two_layers/model.safetensors"), p("one_layer/model.safetensors"))
    st.save(p("ids5.safetensors"), {"input_ids": np.array([[5, 6, 7]], dtype=np.int32)})
    refused(check, "forward: a 1-layer config on a 2-layer checkpoint",
                  [a.hmla, "forward", "--checkpoint", p("one_layer"), "--inputs", p("ids5.safetensors"),
                   "--out", p("never.safetensors")],
                  "tensors the config's model does not have ('model.layers.1.", w)
    sink_w = dict(two_w, **{"model.layers.0.self_attn.softmax_offset": np.zeros(2, np.float32)})
    write_checkpoint(p("extra_sink"), two, sink_w)
    refused(check, "forward: a sink the config does not have",
                  [a.hmla, "forward", "--checkpoint", p("extra_sink"), "--inputs", p("ids5.safetensors"),
                   "--out", p("never.safetensors")],
                  "1 tensor the config's model does not have ('model.layers.0.self_attn.softmax_offset')", w)

    # The same through a programme's init_checkpoint: a 3-layer checkpoint for a 2-layer model.
    with open(p("text.txt"), "w") as f:
        f.write("".join(f"document {i}\n%\n" for i in range(20)))
    r = subprocess.run([a.hmla, "prepare-data", p("text.txt"), "--out", p("data")], capture_output=True, text=True)
    check("prepare-data", r.returncode == 0, r.stderr[:200])
    three = model_config(["mha", "mha", "mha"])
    write_checkpoint(p("three_layers"), three, model_weights(three, rng))
    with open(p("model.json"), "w") as f:
        json.dump(two, f)
    with open(p("init.yaml"), "w") as f:
        f.write(f"model: {p('model.json')}\ndata: {p('data')}\ninit_checkpoint: {p('three_layers')}\n"
                "base: {batch: 2, seq_len: 16}\nphases:\n  - {name: a, mode: mha, steps: 1}\n")
    refused(check, "train: an init_checkpoint with an extra layer",
                  [a.hmla, "train", p("init.yaml"), "--out", p("run")],
                  "tensors the config's model does not have ('model.layers.2.", w)

    # Issue 24: `hmla layer` refuses a non-finite weight, as forward and train do.
    cfg = base_config(True, False, False)
    with open(p("layer.json"), "w") as f:
        json.dump(cfg, f)
    lw = make_weights(cfg, rng)
    lw["o_proj.weight"][3, 5] = np.nan
    flat = 3 * lw["o_proj.weight"].shape[1] + 5
    st.save(p("nan_w.safetensors"), lw)
    x = rng.standard_normal((1, 8, cfg["hidden_size"])).astype(np.float32)
    st.save(p("layer_in.safetensors"), {"hidden_states": x, "grad_output": x})
    refused(check, "layer: a NaN in o_proj.weight",
                  [a.hmla, "layer", "--config", p("layer.json"), "--weights", p("nan_w.safetensors"),
                   "--inputs", p("layer_in.safetensors"), "--out", p("never.safetensors")],
                  f"tensor 'o_proj.weight' holds a non-finite value (nan at flat index {flat})", w)
    check.exit()


if __name__ == "__main__":
    main()
