#!/usr/bin/env python3
"""`hmla report` as a user meets it: the report of a short real run (every phase kind), of a
hand-made metrics file with what runs leave behind (a cut line, missing and null metrics, a
0-step phase, a resumed run, a phase stopped midway, a single step) and of bench JSON lines.
Every SVG must be well-formed XML with axis titles, tick labels, a title, the phase boundaries and
the held-out points; rsvg-convert (Debian's librsvg2-bin), when installed, must rasterise each
one. Bad invocations fail with one hmla error line."""
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, check_refused, parse_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SVG = "{http://www.w3.org/2000/svg}"


def svgs_of(html):
    return re.findall(r"<svg xmlns='http://www.w3.org/2000/svg' width='860'.*?</svg>", html, re.S)


def texts(root, cls):
    return [t.text or "" for t in root.iter(SVG + "text") if t.get("class") == cls]


def groups(root, cls):
    return [g for g in root.iter(SVG + "g") if g.get("class") == cls]


def check_chart(check, name, svg, w, markers=None, heldout=None):
    """Well-formed; a title, both axis titles and tick labels; `markers` dashed boundaries;
    `heldout` held-out points; rasterised when rsvg-convert exists."""
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as e:
        check(f"{name}: well-formed XML", False, str(e))
        return None
    title = texts(root, "chart-title")
    check(f"{name}: title, axis titles, ticks",
          title and texts(root, "x-title")[0] and texts(root, "y-title")[0] and len(texts(root, "tick")) >= 4,
          f"{title} {texts(root, 'x-title')} {texts(root, 'y-title')} {len(texts(root, 'tick'))} ticks")
    ticks = texts(root, "tick")
    check(f"{name}: readable tick labels", all(re.fullmatch(r"-?\d+(\.\d{1,6})?|[1-9]e-?\d+", t) for t in ticks), ticks)
    if markers is not None:
        got = [g.find(SVG + "text").text for g in groups(root, "marker")]
        check(f"{name}: phase boundaries {markers}", got == markers, got)
    if heldout is not None:
        legend = [g.find(SVG + "text").text for g in groups(root, "legend")]
        series = groups(root, "series")
        points = [c for g in series for c in g.iter(SVG + "circle") if g.get("fill") == "#ffd700"]
        check(f"{name}: {heldout} held-out points", len(points) == heldout and ("held-out loss" in legend) == (heldout > 0),
              f"{len(points)} {legend}")
    rsvg = shutil.which("rsvg-convert")
    if rsvg:
        path = f"{w}/{re.sub('[^a-z0-9]+', '_', name.lower())}"
        with open(path + ".svg", "w") as f:
            f.write(svg)
        r = subprocess.run([rsvg, path + ".svg", "-o", path + ".png"], capture_output=True, text=True)
        check(f"{name}: rasterised by rsvg-convert",
              r.returncode == 0 and os.path.getsize(path + ".png") > 1000 and not r.stderr.strip(), r.stderr[-200:])
    return root


def report(check, hmla, run):
    r = subprocess.run([hmla, "report", run], capture_output=True, text=True)
    check(f"report {os.path.basename(run)}", r.returncode == 0, r.stderr[-300:])
    with open(f"{run}/report.html") as f:
        return f.read(), r.stderr


def real_run(check, hmla, w):
    with open(f"{w}/text.txt", "w") as f:
        for i in range(60):
            f.write(f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7}.\n%\n")
    r = subprocess.run([hmla, "prepare-data", f"{w}/text.txt", "--out", f"{w}/data", "--heldout-every", "5"],
                       capture_output=True, text=True)
    check("prepare-data", r.returncode == 0, r.stderr)
    with open(f"{w}/p.yaml", "w") as f:
        f.write(f"""model: {HERE}/../train/tiny_model.json
data: {w}/data
seed: 3
base: {{batch: 2, seq_len: 64, lr: 3.0e-3, log_every: 1, eval_rows: 2}}
phases:
  - {{name: pre, mode: mha, steps: 4}}
  - {{name: eq, mode: mqa_full_causal, steps: 0}}
  - {{name: warm, mode: dsa_warmup, steps: 3}}
  - {{name: sparse, mode: dsa_sparse, steps: 3}}
""")
    r = subprocess.run([hmla, "train", f"{w}/p.yaml", "--out", f"{w}/run"], capture_output=True, text=True)
    check("train", r.returncode == 0, r.stderr[-300:])
    html, _ = report(check, hmla, f"{w}/run")
    charts = svgs_of(html)
    check("real run: four charts", len(charts) == 4, len(charts))
    bounds = ["pre · mha", "eq · mqa_full_causal", "warm · dsa_warmup", "sparse · dsa_sparse"]
    if len(charts) == 4:
        check_chart(check, "real run LM loss", charts[0], w, bounds, heldout=4)
        check_chart(check, "real run KL", charts[1], w, bounds)
        check_chart(check, "real run lr", charts[2], w, bounds)
        check_chart(check, "real run grad norms", charts[3], w, bounds)
    check("real run: equivalence numbers", "Equivalence check" in html, "")
    for needle in ["parameters", "commit", "threads", "BLAS", "kernels:", "tokens/s", "peak MiB", "EMA"]:
        check(f"real run: the page shows {needle}", needle in html)


def handmade_run(check, hmla, w):
    run = f"{w}/handmade"
    os.makedirs(run)
    rows = [{"phase": "a", "step": 1, "lm_loss": 3.0, "lr": 1e-3, "grad_norm_backbone": 1.0, "grad_norm_indexer": 0.0,
             "tokens_per_s": 1000, "peak_bytes": 1 << 20}]
    rows.append({"phase": "a", "step": 2, "lm_loss": None, "lr": 1e-3, "tokens_per_s": 900})  # missing metrics
    rows.append({"phase": "a", "step": 3, "lm_loss": 2.5, "lr": 1e-3, "grad_norm_backbone": 0.5, "peak_bytes": 1 << 20})
    rows.append({"phase": "a", "heldout_lm_loss": 2.4, "first20_lm_loss": 2.75, "last20_lm_loss": 2.75, "seconds": 1})
    rows.append({"phase": "zero", "equivalence_max_diff": 1e-5, "equivalence_max_logit": 9.0})
    rows.append({"phase": "zero", "heldout_lm_loss": 2.4, "seconds": 0})  # a phase of 0 steps
    rows.append({"phase": "one", "step": 1, "lm_loss": 2.2, "indexer_kl": 0.5, "lr": 5e-4})  # a single step
    rows.append({"phase": "one", "heldout_lm_loss": None, "seconds": 0.1})  # held-out unavailable
    # A resumed phase (the rows after the resume continue it) that then stops midway.
    for s in range(1, 6):
        rows.append({"phase": "last", "step": s, "lm_loss": 2.0 - 0.1 * s, "indexer_kl": 0.4 / s, "lr": 1e-4,
                     "grad_norm_indexer": 0.01})
    with open(f"{run}/metrics.jsonl", "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps(r) + "\n")
            if i == 9:
                f.write('{"phase": "last", "step": 4, "lm_lo\n')  # a line cut by a crash
    with open(f"{run}/programme.json", "w") as f:
        json.dump({"phases": [{"name": n, "mode": m, "steps": k} for n, m, k in
                              [("a", "mha", 3), ("zero", "mqa_full_causal", 0), ("one", "dsa_warmup", 1),
                               ("last", "dsa_sparse", 9)]]}, f)
    html, err = report(check, hmla, run)
    check("hand-made run: the cut line is reported", "skipped 1 malformed" in err, err)
    charts = svgs_of(html)
    bounds = ["a · mha", "zero · mqa_full_causal", "one · dsa_warmup", "last · dsa_sparse"]
    check("hand-made run: four charts", len(charts) == 4, len(charts))
    if len(charts) == 4:
        check_chart(check, "hand-made LM loss", charts[0], w, bounds, heldout=2)
        check_chart(check, "hand-made KL", charts[1], w, bounds)
        check_chart(check, "hand-made grad norms", charts[3], w, bounds)
    check("hand-made run: the stopped phase says so", "(stopped)" in html)
    check("hand-made run: no config is said, not crashed on", "config.json is missing" in html and
          "not recorded" in html)
    # Nothing at all: an empty metrics file (and damaged side files) still renders, every chart
    # saying "no data".
    os.makedirs(f"{w}/empty")
    open(f"{w}/empty/metrics.jsonl", "w").close()
    with open(f"{w}/empty/programme.json", "w") as f:  # damaged: phases that are not objects
        f.write('{"phases": [1, "x", null], "seed": 1}')
    with open(f"{w}/empty/hmla-run.json", "w") as f:
        f.write('{"environment": [1, 2]}')
    html, _ = report(check, hmla, f"{w}/empty")
    check("empty run: charts say no data", html.count("no data") == 4, html.count("no data"))


def benches(check, hmla, w):
    lines = ["hmla bench: the table form is skipped",
             *[json.dumps({"bench": "warmup-memory", "geometry": "small", "s": s, "mha_peak_bytes": 1e6 * s / 1024,
                           "warmup_peak_bytes": 1.01e6 * s / 1024, "legacy_peak_bytes": 4.0 * s * s})
               for s in (1024, 2048, 4096, 8192)],
             *[json.dumps({"bench": "attention", "s": s, "gflops": 20.0, "fwdbwd_ms": 1.0, "naive_fwdbwd_ms": 3.0,
                           "sgemm_gflops": 60.0, "threads": 2, "blas_core": "Zen"}) for s in (512, 1024)],
             json.dumps({"bench": "indexer", "s": 1024, "dense_kl_workspace_bytes": 1e5,
                         "materialized_kl_workspace_bytes": 8e6}),
             json.dumps({"bench": "sparse", "s": 2048, "ns_per_pair": 3.5}),
             json.dumps({"bench": "train", "mode": "mha", "seq_len": 128, "hmla_tokens_per_s": 1.4e4,
                         "torch_tokens_per_s": 1.1e4}),
             json.dumps({"bench": "cp-traffic", "mode": "mha"})]
    with open(f"{w}/bench.jsonl", "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run([hmla, "report", "--bench", f"{w}/bench.jsonl", "--out", f"{w}/plots"], capture_output=True,
                       text=True)
    check("report --bench", r.returncode == 0, r.stderr[-300:])
    names = ["warmup_memory_small", "attention", "indexer", "sparse", "train"]
    for n in names:
        path = f"{w}/plots/{n}.svg"
        check(f"bench {n}.svg written", os.path.exists(path))
        if not os.path.exists(path):
            continue
        with open(path) as f:
            svg = f.read()
        root = check_chart(check, f"bench {n}", svg[svg.index("<svg"):], w)
        if n == "warmup_memory_small" and root is not None:
            note = texts(root, "note")
            check("warmup-memory: the ratios are annotated", note and "dsa_warmup / mha = 1.010" in note[0], note)
    with open(f"{w}/none.jsonl", "w") as f:
        f.write(json.dumps({"bench": "cp-traffic"}) + "\n")
    check_refused(check, "report --bench without a plottable line", [hmla, "report", "--bench", f"{w}/none.jsonl",
                                                                      "--out", f"{w}/none"], "no bench line", w)
    check_refused(check, "report without a run or --bench", [hmla, "report"], "either RUN_DIR", w)
    check_refused(check, "report --bench without --out", [hmla, "report", "--bench", f"{w}/bench.jsonl"], "--out", w)


def main():
    a = parse_args(__doc__)
    check = Checker()
    real_run(check, a.hmla, a.workdir)
    handmade_run(check, a.hmla, a.workdir)
    benches(check, a.hmla, a.workdir)
    check.exit()


if __name__ == "__main__":
    main()
