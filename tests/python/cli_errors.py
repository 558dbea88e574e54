#!/usr/bin/env python3
"""Bad input at the CLI: each case must exit non-zero with a one-line `hmla: error:` message
naming the problem, and must leave every file already in the work directory byte-identical (and
create none). Output paths: every writer refuses a FIFO, symlink or directory at its --out, phase
names stay one path component, and prepare-data validates its inputs before it creates anything."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, check_refused, parse_args, tree_digest  # noqa: E402
from mla_twin import base_config, make_weights  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def output_path_cases(hmla, w, layer, check):
    """--out FILE of every writer is a regular file or a new path; prepare-data and phase names."""
    d = os.path.join(w, "owned")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    q = lambda n: os.path.join(d, n)  # noqa: E731
    with open(q("target"), "w") as f:
        f.write("the user's file\n")
    os.mkfifo(q("fifo"))
    os.symlink(q("target"), q("link"))
    os.symlink(q("nowhere"), q("dangling"))
    os.makedirs(q("dir"))
    writers = {
        "layer": layer[:-1],  # valid inputs: only the --out is wrong
        # Existing (if unusable) inputs: the --out check comes before any reading.
        "forward": [hmla, "forward", "--checkpoint", q("dir"), "--inputs", q("target"), "--out"],
        "attention": [hmla, "attention", "--inputs", q("target"), "--out"],
    }
    for cmd, argv in writers.items():
        for target, needle in (("fifo", "is a FIFO"), ("link", "symbolic link"), ("dangling", "symbolic link"),
                               ("dir", "is a directory")):
            check_refused(check, f"{cmd} --out {target}", argv + [q(target)], needle, d)
    os.makedirs(q("run"))
    with open(q("run/metrics.jsonl"), "w") as f:
        f.write(json.dumps({"phase": "pre", "step": 1, "lm_loss": 5.0, "indexer_kl": None}) + "\n")
    with open(q("run/hmla-run.json"), "w") as f:  # a run directory, so only the symlink is wrong
        f.write("{}\n")
    os.symlink(q("target"), q("run/report.html"))
    check_refused(check, "report onto a symlinked report.html", [hmla, "report", q("run")], "symbolic link", d)

    # prepare-data: inputs read and checked before the output directory is created.
    with open(q("text.txt"), "w") as f:
        f.write("".join(f"Document {i}.\n%\n" for i in range(10)))
    with open(q("one.txt"), "w") as f:
        f.write("A single document.\n")
    prep = [hmla, "prepare-data", q("text.txt"), "--heldout-every", "2", "--out"]
    check_refused(check, "prepare-data --heldout-every 1", prep[:3] + ["--heldout-every", "1", "--out", q("data")],
                  "--heldout-every", d)
    check_refused(check, "prepare-data with too few documents",
                  [hmla, "prepare-data", q("one.txt"), "--out", q("data")], "found 1 documents", d)
    check_refused(check, "prepare-data --out a file", prep + [q("target")], "not a directory", d)
    os.makedirs(q("data_link"))
    os.symlink(q("target"), q("data_link/train.safetensors"))
    check_refused(check, "prepare-data onto a symlinked token file", prep + [q("data_link")], "symbolic link", d)
    if os.geteuid() != 0:  # root reads a mode-000 file anyway
        os.chmod(q("one.txt"), 0)
        check_refused(check, "prepare-data with an unreadable file", prep[:2] + [q("one.txt")] + prep[2:] + [q("data")],
                      "one.txt", d)
        os.chmod(q("one.txt"), 0o644)

    # Phase names become checkpoint directories: refused when the programme loads.
    for bad in ("../evil", "a/b", ".hidden", "x" * 65, "two words", ""):
        with open(q("names.yaml"), "w") as f:
            f.write(f"model: m.json\ndata: data\nphases:\n  - {{name: {json.dumps(bad)}, steps: 1}}\n")
        check_refused(check, f"phase name {bad[:12]!r}", [hmla, "train", q("names.yaml"), "--out", q("newrun")],
                      "phase" if bad else "needs a name", d)


def main():
    a = parse_args(__doc__)
    p = lambda n: os.path.join(a.workdir, n)  # noqa: E731
    rng = np.random.default_rng(1)
    cfg = base_config(True, False, False)
    write_json(p("config.json"), cfg)
    st.save(p("w.safetensors"), make_weights(cfg, rng))
    x = rng.standard_normal((1, 8, cfg["hidden_size"])).astype(np.float32)
    st.save(p("in.safetensors"), {"hidden_states": x, "grad_output": x})
    st.save(p("noin.safetensors"), {"hidden_states": x})
    st.save(p("short_grad.safetensors"), {"hidden_states": x, "grad_output": x[:, :4]})
    st.save(p("end_rows.safetensors"), {"hidden_states": x, "grad_output": x,
                                        "end_rows": np.full((1, 8), 8, dtype=np.int32)})
    st.save(p("huge_id.safetensors"), {"hidden_states": x, "grad_output": x,
                                       "input_ids": np.array([[1, 2, 3, 2**32 + 4, 5, 6, 7, 8]], dtype=np.int64)})
    write_json(p("bad.json"), dict(cfg, hmla_layer_modes=["dense_mha"]))
    write(p("typo.yaml"), "mqa_split_kvb_proj: true\n")
    write(p("split.yaml"), "mqa_split_kv_b_proj: true\n")
    write(p("dup.yaml"), "train_indexer_only: true\nmqa_split_kv_b_proj: false\ntrain_indexer_only: false\n")
    write(p("seed.yaml"), "seed: 1\n")
    with open(p("dup.json"), "w") as f:  # hidden_size twice: JSON parsers differ on which one wins
        f.write(json.dumps(cfg)[:-1] + ', "hidden_size": 32}')
    write_json(p("mlp_types.json"), dict(cfg, mlp_layer_types=3))
    with open(p("trunc.safetensors"), "wb") as f:
        f.write(open(p("w.safetensors"), "rb").read()[:100])
    with open(p("out.safetensors"), "wb") as f:
        f.write(b"previous output")
    # A layer whose index_topk needs far more than any machine has for its selection table.
    cfg_k = base_config(True, False, False, indexer=True)
    write_json(p("huge_topk.json"), dict(cfg_k, index_topk=10**12))
    st.save(p("w_k.safetensors"), make_weights(cfg_k, rng))
    # Attention inputs.
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    st.save(p("att.safetensors"), {"q": q, "k": q, "v": q, "grad_output": q})
    st.save(p("att_q3.safetensors"), {"q": q[0], "k": q, "v": q, "grad_output": q})
    st.save(p("att_kv.safetensors"), {"q": q, "k": q, "grad_output": q})
    # Checkpoints for forward/generate: the config is read (and the inputs checked) before weights.
    tiny = json.load(open(os.path.join(HERE, "..", "train", "tiny_model.json")))
    v4 = {"model_type": "deepseek_v4", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
          "head_dim": 16, "qk_rope_head_dim": 8, "o_groups": 2, "vocab_size": 64}
    for name, over in (("ck", {}), ("ck_vocab", {"vocab_size": 10**9}), ("ck_overflow", {"vocab_size": 10**18})):
        os.makedirs(p(name))
        write_json(p(f"{name}/config.json"), dict(tiny, **over))
    os.makedirs(p("ck_v4"))
    write_json(p("ck_v4/config.json"), v4)
    st.save(p("ids_huge.safetensors"), {"input_ids": np.array([[5, 2**32 + 41, 41]], dtype=np.int64)})
    st.save(p("ids_neg.safetensors"), {"input_ids": np.array([[5, -1]], dtype=np.int32)})
    st.save(p("ids_ok.safetensors"), {"input_ids": np.array([[5, 6]], dtype=np.int32)})
    st.save(p("ids_mask.safetensors"), {"input_ids": np.array([[5, 6]], dtype=np.int32),
                                        "attention_mask": np.array([[1, 1]], dtype=np.int32)})
    # Programmes.
    write(p("text.txt"), "one document\n%\nanother one\n")
    write(p("many.txt"), "".join(f"document {i}\n%\n" for i in range(30)))
    prog = f"model: {HERE}/../train/tiny_model.json\ndata: {a.workdir}/nodata\n"
    write(p("dup_prog.yaml"), prog + "seed: 1\nseed: 2\nphases:\n  - {name: a, steps: 1}\n")
    write(p("dup_phase.yaml"), prog + "phases:\n  - name: a\n    lr: 0.1\n    steps: 1\n    lr: 0.2\n")
    write(p("type_prog.yaml"), prog + "phases:\n  - {name: a, steps: [1]}\n")
    write(p("key_prog.yaml"), prog + "? [a, b]\n: 1\nphases:\n  - {name: a, steps: 1}\n")
    write(p("huge_seq.yaml"), prog + "phases:\n  - {name: a, steps: 1, seq_len: 1000000000}\n")
    write(p("mtp_prog.yaml"), prog + "phases:\n  - {name: a, steps: 1, mtp_loss_coeff: 0.3}\n")

    layer = [a.hmla, "layer", "--config", p("config.json"), "--weights", p("w.safetensors"),
             "--inputs", p("in.safetensors"), "--out", p("out.safetensors")]
    with_inputs = lambda f: layer[:7] + [p(f)] + layer[8:]  # noqa: E731
    att = [a.hmla, "attention", "--inputs", p("att.safetensors"), "--out", p("out.safetensors")]
    fwd = lambda ck, ids: [a.hmla, "forward", "--checkpoint", p(ck), "--inputs", p(ids),  # noqa: E731
                           "--out", p("out.safetensors")]
    gen = [a.hmla, "generate", "--checkpoint", p("ck"), "--prompt", "hi"]
    train = lambda y: [a.hmla, "train", p(y), "--out", p("run")]  # noqa: E731
    cases = [
        ("unknown mode in config", [a.hmla, "layer", "--config", p("bad.json")] + layer[4:], "unknown mode 'dense_mha'"),
        ("unknown --mode", layer + ["--mode", "sparse"], "unknown mode 'sparse'"),
        ("dsa mode not built", layer + ["--mode", "dsa_warmup"], "dsa_warmup"),
        ("settings typo", layer + ["--settings", p("typo.yaml")], "unknown key 'mqa_split_kvb_proj'"),
        ("split with mha", layer + ["--mode", "mha", "--settings", p("split.yaml")], "mqa_split_kv_b_proj"),
        ("missing grad_output", with_inputs("noin.safetensors"), "grad_output"),
        ("truncated weights", layer[:5] + [p("trunc.safetensors")] + layer[6:], "trunc.safetensors"),
        ("missing config", [a.hmla, "layer", "--config", p("nope.json")] + layer[4:], "nope.json"),
        ("attention without inputs", [a.hmla, "attention", "--inputs", p("nope.safetensors"), "--out",
                                      p("out.safetensors")], "nope.safetensors"),
        ("bench kv heads", [a.hmla, "bench", "attention", "--heads", "4", "--kv-heads", "3"], "must divide"),
        ("bench unknown geometry", [a.hmla, "bench", "warmup-memory", "--geometry", "small,nope"],
         "--geometry nope: no such geometry; the geometries are paddlefleet, small, v4_csa_h2_i8"),
        ("--cp without its ranks", layer + ["--cp", "2"], "--cp 2 needs exactly 2 ranks"),
        ("--cp-split zigzag", layer + ["--cp-split", "zigzag"], "no other split is implemented"),
        ("cp-traffic with --cp not dividing s", [a.hmla, "bench", "cp-traffic", "--config", p("config.json"),
                                                  "--s", "10", "--cp", "3"], "must divide"),
        # Token ids are range-checked in their own dtype before any narrowing.
        ("forward: i64 id 2^32 + 41", fwd("ck", "ids_huge.safetensors"),
         "input_ids[0, 1] = 4294967337 is outside the vocabulary [0, 260)"),
        ("forward: negative id", fwd("ck", "ids_neg.safetensors"), "input_ids[0, 1] = -1 is outside the vocabulary"),
        ("layer: i64 id 2^32 + 4", with_inputs("huge_id.safetensors"), "input_ids[0, 3] = 4294967300 is not a token id"),
        # Every input tensor by name: shape, dtype, nothing silently ignored.
        ("layer: grad_output of the wrong shape", with_inputs("short_grad.safetensors"),
         "grad_output must be f32 [b, s, hidden] = [1, 8, 64], got f32 [1, 4, 64]"),
        ("layer: a tensor it would ignore", with_inputs("end_rows.safetensors"), "unexpected tensor 'end_rows'"),
        ("forward: a tensor it would ignore", fwd("ck", "ids_mask.safetensors"), "unexpected tensor 'attention_mask'"),
        ("attention: 3-D q", [a.hmla, "attention", "--inputs", p("att_q3.safetensors"), "--out", p("out.safetensors")],
         "q must be f32 [b, s, H, Dqk]"),
        ("attention: v next to --v-from-k", att + ["--v-from-k", "8"], "unexpected tensor 'v' (--v-from-k"),
        # Options: validated, with the option and the allowed range in the message.
        ("attention --scale nan", att + ["--scale", "nan"], "--scale: must be a finite number > 0, got 'nan'"),
        ("attention --scale 0", att + ["--scale", "0"], "--scale: must be a finite number > 0"),
        ("attention --scale -1", att + ["--scale", "-1"], "--scale: must be a finite number > 0"),
        ("attention --v-from-k 0", att + ["--v-from-k", "0"], "--v-from-k: must be an integer >= 1, got '0'"),
        ("attention --v-from-k -1", att + ["--v-from-k", "-1"], "--v-from-k: must be an integer >= 1"),
        ("attention --v-from-k past Dqk", [a.hmla, "attention", "--inputs", p("att_kv.safetensors"), "--out",
                                           p("out.safetensors"), "--v-from-k", "17"], "--v-from-k 17: it must be in [1, 16]"),
        ("generate --temperature nan", gen + ["--temperature", "nan"], "--temperature: must be a finite number >= 0"),
        ("generate --temperature -1", gen + ["--temperature", "-1"], "--temperature: must be a finite number >= 0"),
        ("generate --seed -1", gen + ["--seed", "-1"], "--seed: must be an integer >= 0, got '-1'"),
        ("generate --tokens 0", gen + ["--tokens", "0"], "--tokens: must be an integer >= 1, got '0'"),
        ("layer --layer -1", layer + ["--layer", "-1"], "--layer: must be an integer >= 0"),
        ("layer --layer past the last layer", layer + ["--layer", str(cfg["num_hidden_layers"])],
         f"--layer {cfg['num_hidden_layers']}: the config has {cfg['num_hidden_layers']} layers"),
        ("train --cp 0", train("dup_prog.yaml") + ["--cp", "0"], "--cp: must be an integer in [1, 1048576]"),
        ("bench --s 0", [a.hmla, "bench", "attention", "--s", "64,0"], "--s: must be an integer >= 1, got '0'"),
        ("prepare-data --heldout-every 1", [a.hmla, "prepare-data", p("text.txt"), "--out", p("data"),
                                            "--heldout-every", "1"], "--heldout-every: must be an integer >= 2"),
        # A key given twice is an error, not last-wins.
        ("programme: duplicated key", train("dup_prog.yaml"), "key 'seed' appears twice (lines 3 and 4)"),
        ("programme: duplicated phase key", train("dup_phase.yaml"), "phases[0]: key 'lr' appears twice"),
        ("settings: duplicated key", layer + ["--settings", p("dup.yaml")],
         "dup.yaml: key 'train_indexer_only' appears twice"),
        ("settings: seed", layer + ["--settings", p("seed.yaml")], "seed.yaml: unknown key 'seed'"),
        ("config.json: duplicated key", [a.hmla, "layer", "--config", p("dup.json")] + layer[4:],
         "dup.json: key 'hidden_size' appears twice in the top-level object"),
        # Sizes: checked arithmetic and a memory budget before anything is allocated.
        ("forward: vocab_size 1e9", fwd("ck_vocab", "ids_ok.safetensors"), "vocab_size x hidden_size"),
        ("forward: a deepseek_v4 checkpoint without weights", fwd("ck_v4", "ids_ok.safetensors"),
         "ck_v4: neither model.safetensors nor model.safetensors.index.json is there"),
        ("forward: vocab_size 1e18 overflows", fwd("ck_overflow", "ids_ok.safetensors"),
         "vocab_size x hidden_size = 1000000000000000000 x 32 overflows int64"),
        ("train: seq_len 1e9", train("huge_seq.yaml"), "seq_len"),
        ("train: mtp_loss_coeff on a model without MTP layers", train("mtp_prog.yaml"),
         "mtp_loss_coeff = 0.3 needs a deepseek_v4 model with MTP layers"),
        ("layer: index_topk 1e12", [a.hmla, "layer", "--config", p("huge_topk.json"), "--mode", "dsa_sparse",
                                    "--weights", p("w_k.safetensors")] + layer[6:], "for the top-k tables"),
        # Library errors, translated: the file and what was wrong.
        ("prepare-data --out under a file", [a.hmla, "prepare-data", p("many.txt"), "--out", p("text.txt") + "/data"],
         "text.txt/data: cannot create the directory (Not a directory)"),
        ("programme: bad type", train("type_prog.yaml"), "phases[0]: steps (line 4) must be an integer, got '[1]'"),
        ("programme: a key that is not a name", train("key_prog.yaml"), "a key must be a plain name"),
        ("config.json: bad type", [a.hmla, "layer", "--config", p("mlp_types.json")] + layer[4:],
         "mlp_layer_types must be a list"),
    ]
    check = Checker()
    output_path_cases(a.hmla, a.workdir, layer, check)
    for name, cmd, needle in cases:
        before = tree_digest(a.workdir)
        r = subprocess.run(cmd, capture_output=True, text=True)
        err = r.stderr.strip()
        good = (r.returncode != 0 and needle in err and err.startswith("hmla: error:") and "\n" not in err
                and "internal error" not in err)
        check(name, good and tree_digest(a.workdir) == before, f"exit {r.returncode}: {err[:300]}")
    env = dict(os.environ, HMLA_MEMORY_BUDGET="lots")
    r = subprocess.run(fwd("ck", "ids_ok.safetensors"), capture_output=True, text=True, env=env)
    check("HMLA_MEMORY_BUDGET malformed", r.returncode != 0 and "HMLA_MEMORY_BUDGET = 'lots'" in r.stderr,
          r.stderr.strip())
    check("existing --out file untouched by failed runs", open(p("out.safetensors"), "rb").read() == b"previous output")
    check.exit()


if __name__ == "__main__":
    main()
