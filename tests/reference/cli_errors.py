#!/usr/bin/env python3
"""Bad input at the CLI: each case must exit non-zero with a one-line `hmla: error:` message
naming the problem, and must leave an existing --out file untouched. Output paths: every writer
refuses a FIFO, symlink or directory at its --out, phase names stay one path component, and
prepare-data validates its inputs before it creates anything (each leaves the tree byte-identical)."""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, check_refused  # noqa: E402
from mla_twin import base_config, make_weights  # noqa: E402


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
        "forward": [hmla, "forward", "--checkpoint", q("none"), "--inputs", q("none.safetensors"), "--out"],
        "attention": [hmla, "attention", "--inputs", q("none.safetensors"), "--out"],
    }
    for cmd, argv in writers.items():
        for target, needle in (("fifo", "is a FIFO"), ("link", "symbolic link"), ("dangling", "symbolic link"),
                               ("dir", "is a directory")):
            check_refused(check, f"{cmd} --out {target}", argv + [q(target)], needle, d)
    os.makedirs(q("run"))
    with open(q("run/metrics.jsonl"), "w") as f:
        f.write(json.dumps({"phase": "pre", "step": 1, "lm_loss": 5.0, "indexer_kl": None}) + "\n")
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
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hmla", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    p = lambda n: os.path.join(a.workdir, n)  # noqa: E731
    rng = np.random.default_rng(1)
    cfg = base_config(True, False, False)
    with open(p("config.json"), "w") as f:
        json.dump(cfg, f)
    st.save(p("w.safetensors"), make_weights(cfg, rng))
    x = rng.standard_normal((1, 8, cfg["hidden_size"])).astype(np.float32)
    st.save(p("in.safetensors"), {"hidden_states": x, "grad_output": x})
    st.save(p("noin.safetensors"), {"hidden_states": x})
    with open(p("bad.json"), "w") as f:
        json.dump(dict(cfg, hmla_layer_modes=["dense_mha"]), f)
    with open(p("typo.yaml"), "w") as f:
        f.write("mqa_split_kvb_proj: true\n")
    with open(p("split.yaml"), "w") as f:
        f.write("mqa_split_kv_b_proj: true\n")
    with open(p("trunc.safetensors"), "wb") as f:
        f.write(open(p("w.safetensors"), "rb").read()[:100])
    with open(p("out.safetensors"), "wb") as f:
        f.write(b"previous output")
    layer = [a.hmla, "layer", "--config", p("config.json"), "--weights", p("w.safetensors"),
             "--inputs", p("in.safetensors"), "--out", p("out.safetensors")]
    cases = [
        ("unknown mode in config", [a.hmla, "layer", "--config", p("bad.json")] + layer[4:], "unknown mode 'dense_mha'"),
        ("unknown --mode", layer + ["--mode", "sparse"], "unknown mode 'sparse'"),
        ("dsa mode not built", layer + ["--mode", "dsa_warmup"], "dsa_warmup"),
        ("settings typo", layer + ["--settings", p("typo.yaml")], "unknown key 'mqa_split_kvb_proj'"),
        ("split with mha", layer + ["--mode", "mha", "--settings", p("split.yaml")], "mqa_split_kv_b_proj"),
        ("missing grad_output", layer[:7] + [p("noin.safetensors")] + layer[8:], "grad_output"),
        ("truncated weights", layer[:5] + [p("trunc.safetensors")] + layer[6:], "trunc.safetensors"),
        ("missing config", [a.hmla, "layer", "--config", p("nope.json")] + layer[4:], "nope.json"),
        ("attention without inputs", [a.hmla, "attention", "--inputs", p("nope.safetensors"), "--out", p("out.safetensors")], "cannot open"),
        ("bench kv heads", [a.hmla, "bench", "attention", "--heads", "4", "--kv-heads", "3"], "must divide"),
        ("--cp without its ranks", layer + ["--cp", "2"], "--cp 2 needs exactly 2 ranks"),
        ("--cp-split zigzag", layer + ["--cp-split", "zigzag"], "no other split is implemented"),
        ("cp-traffic with --cp not dividing s", [a.hmla, "bench", "cp-traffic", "--config", p("config.json"),
                                                  "--s", "10", "--cp", "3"], "must divide"),
    ]
    ok = True
    check = Checker()
    output_path_cases(a.hmla, a.workdir, layer, check)
    ok &= check.ok
    for name, cmd, needle in cases:
        r = subprocess.run(cmd, capture_output=True, text=True)
        good = r.returncode != 0 and needle in r.stderr and "hmla: error:" in r.stderr
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {name}: exit {r.returncode}: {r.stderr.strip()[:160]}")
    untouched = open(p("out.safetensors"), "rb").read() == b"previous output"
    print(("ok  " if untouched else "FAIL") + " existing --out file untouched by failed runs")
    ok &= untouched
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
