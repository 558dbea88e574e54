#!/usr/bin/env python3
"""Bad input at the CLI: each case must exit non-zero with a one-line `hmla: error:` message
naming the problem, and must leave an existing --out file untouched."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from mla_twin import base_config, make_weights  # noqa: E402


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
        ("attention without inputs", [a.hmla, "attention", "--inputs", p("nope.safetensors"), "--out", p("out.safetensors")], "nope.safetensors"),
        ("bench kv heads", [a.hmla, "bench", "attention", "--heads", "4", "--kv-heads", "3"], "must divide"),
        ("--cp without its ranks", layer + ["--cp", "2"], "--cp 2 needs exactly 2 ranks"),
        ("--cp-split zigzag", layer + ["--cp-split", "zigzag"], "no other split is implemented"),
        ("cp-traffic with --cp not dividing s", [a.hmla, "bench", "cp-traffic", "--config", p("config.json"),
                                                  "--s", "10", "--cp", "3"], "must divide"),
    ]
    ok = True
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
