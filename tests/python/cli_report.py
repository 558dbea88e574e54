#!/usr/bin/env python3
"""`hmla report` as a user meets it: the report of a short real run (every phase kind), of a
hand-made metrics file with what runs leave behind (a cut line, missing and null metrics, a
0-step phase, a resumed run, a phase stopped midway, a single step), of a MoE model's metrics (the
load imbalance chart, one line per MoE layer), of a DeepSeek-V4 stack's run (its attention mass per
layer kind) and of bench JSON lines.
Every SVG must be well-formed XML with axis titles, tick labels, a title, the phase boundaries and
the held-out points; rsvg-convert (Debian's librsvg2-bin), when installed, must rasterise each
one. Values from the whole double range (+-1e308, 1 ulp apart, denormals; a real run whose lr is
constant to 1 ulp) must draw, in bounded time and memory, with every coordinate finite and inside
the chart. Bad invocations and bad bench lines fail with one hmla error line, writing nothing;
the page goes only into a run directory or an explicit --out."""
import json
import math
import os
import re
import resource
import signal
import shutil
import subprocess
import sys
import time
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
    check(f"{name}: readable tick labels",
          all(re.fullmatch(r"-?\d+(\.\d{1,6})?|-?[1-9](\.\d{1,16})?e-?\d{1,3}", t) and len(t) <= 24 for t in ticks), ticks)
    check(f"{name}: every coordinate finite and inside the chart", not outside_viewport(root), outside_viewport(root)[:3])
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


COORDS = {"x": 0, "x1": 0, "x2": 0, "cx": 0, "width": 0, "y": 1, "y1": 1, "y2": 1, "cy": 1, "height": 1}


def outside_viewport(root):
    """The coordinates (attributes, polyline points, translate()) that are not finite numbers
    inside [0, width] x [0, height] of the root <svg>."""
    size = (float(root.get("width")), float(root.get("height")))
    bad = []

    def inside(text, axis):
        try:
            v = float(text)
        except ValueError:
            return False
        return math.isfinite(v) and 0 <= v <= size[axis]

    for e in root.iter():
        for k, v in e.attrib.items():
            if k in COORDS and not inside(v, COORDS[k]):
                bad.append(f"{k}={v}")
        for pair in e.get("points", "").split():
            x, _, y = pair.partition(",")
            if not (inside(x, 0) and inside(y, 1)):
                bad.append(f"points {pair}")
        m = re.search(r"translate\(([^,]*),([^)]*)\)", e.get("transform", ""))
        if m and not (inside(m[1], 0) and inside(m[2], 1)):
            bad.append(f"translate {m[0]}")
    return bad


def bounded(cmd):
    """cmd with 60 s and 4 GiB: the tick loops that never ended grew until out of memory."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -1, "", "timed out after 60 s")


def report(check, hmla, run):
    r = bounded([hmla, "report", run])
    check(f"report {os.path.basename(run)}", r.returncode == 0, r.stderr[-300:])
    if r.returncode != 0:
        return "", r.stderr
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
    for needle in ["parameters", "commit", "threads", "BLAS", "kernels:", "tokens/s", "peak MiB", "EMA",
                   "<th>tokenizer</th><td>bytes+3; pad 0, bos 1, eos 2; vocab_size 259 (bytes)"]:
        check(f"real run: the page shows {needle}", needle in html)


def handmade_run(check, hmla, w):
    run = f"{w}/handmade"
    os.makedirs(run)
    with open(f"{run}/hmla-run.json", "w") as f:  # the run marker (report.html is the run's own file)
        f.write("{}\n")
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


def marked_run(w, name, rows):
    """A run directory (the marker, metrics.jsonl of `rows`: (phase, step, metrics) or a dict)."""
    run = f"{w}/{name}"
    os.makedirs(run)
    with open(f"{run}/hmla-run.json", "w") as f:
        f.write("{}\n")
    with open(f"{run}/metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r if isinstance(r, dict) else {"phase": r[0], "step": r[1], **r[2]}) + "\n")
    return run


def check_page(check, name, html, w, charts_with_data):
    """Every chart (and sparkline) of a page inside its viewport; the named charts drawn fully."""
    charts = svgs_of(html)
    check(f"{name}: four charts", len(charts) == 4, len(charts))
    titles = ["LM loss", "KL", "lr", "grad norms"]
    for i, svg in enumerate(charts):
        root = ET.fromstring(svg)
        if titles[i] in charts_with_data:
            check_chart(check, f"{name} {titles[i]}", svg, w)
        else:
            check(f"{name} {titles[i]}: inside the chart", not outside_viewport(root), outside_viewport(root)[:3])
    for svg in re.findall(r"<svg[^>]*class='sparkline'>.*?</svg>", html, re.S):
        bad = outside_viewport(ET.fromstring(svg))
        check(f"{name}: the tokens/s sparkline inside its box", not bad, bad[:3])


def extreme_ranges(check, hmla, w):
    """Issue 24: +-1e308 segfaulted; values 1 ulp apart never finished (growing until out of
    memory). Every finite range draws."""
    big, ulp5, lr1 = sys.float_info.max, math.nextafter(5.0, 6.0), math.nextafter(1e-3, 1.0)
    assert ulp5 == 5.000000000000001
    cases = {
        "pm1e308": ([{"lm_loss": 1e308, "lr": 1e308}, {"lm_loss": -1e308, "lr": -1e308}], ["LM loss", "lr"]),
        "pmmax": ([{"lm_loss": big, "grad_norm_backbone": big, "tokens_per_s": big},
                   {"lm_loss": -big, "grad_norm_backbone": 5e-324, "tokens_per_s": -big}], ["LM loss", "grad norms"]),
        "ulp": ([{"lm_loss": 5.0, "lr": 1e-3}, {"lm_loss": ulp5, "lr": lr1}], ["LM loss", "lr"]),
        "denormal": ([{"lm_loss": 5e-324, "indexer_kl": 5e-324, "grad_norm_indexer": 1e-310, "tokens_per_s": 5e-324},
                      {"lm_loss": 0.0, "indexer_kl": 1e-310, "grad_norm_indexer": 1e-310, "tokens_per_s": 0}],
                     ["LM loss", "KL", "grad norms"]),
        "equal_huge": ([{"lm_loss": 1e308, "indexer_kl": 1e308}, {"lm_loss": 1e308, "indexer_kl": 1e308}],
                       ["LM loss", "KL"]),
    }
    for name, (steps, full) in cases.items():
        run = marked_run(w, name, [("p", i + 1, m) for i, m in enumerate(steps)])
        html, _ = report(check, hmla, run)
        if html:
            check_page(check, name, html, w, full)


def long_phase_stopped(check, hmla, w):
    """The real run of issue 24: a phase of 10^8 steps without warmup, stopped after step 2, so
    the cosine lr is constant to 1 ulp. (Ctrl-C stops after the current step, which may be a few
    steps on: the first two step lines are the run stopped after step 2.)"""
    with open(f"{w}/long.yaml", "w") as f:
        f.write(f"""model: {HERE}/../train/tiny_model.json
data: {w}/data
seed: 3
base: {{batch: 2, seq_len: 64, lr: 3.0e-3, log_every: 1, eval_rows: 2}}
phases:
  - {{name: long, mode: mha, steps: 100000000, warmup_steps: 0}}
""")
    run = f"{w}/long"
    p = subprocess.Popen([hmla, "train", f"{w}/long.yaml", "--out", run], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    lines = []
    for _ in range(1200):
        if os.path.exists(f"{run}/metrics.jsonl"):
            with open(f"{run}/metrics.jsonl") as f:
                lines = [ln for ln in f if '"step"' in ln and ln.endswith("\n")]
        if len(lines) >= 2 or p.poll() is not None:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=120)
    check("long phase: two steps logged", len(lines) >= 2, len(lines))
    with open(f"{run}/metrics.jsonl", "w") as f:
        f.writelines(lines[:2])
    lr = [json.loads(ln)["lr"] for ln in lines[:2]]
    check("long phase: the lr is constant to an ulp or two", len(lr) == 2 and abs(lr[0] - lr[1]) <= 2 * (lr[0] - math.nextafter(lr[0], 0)),
          lr)
    html, _ = report(check, hmla, run)
    if html:
        check_page(check, "long phase", html, w, ["LM loss", "lr", "grad norms"])


def bench_extremes(check, hmla, w):
    """report --bench segfaulted on "s": 1e308, "gflops": +-1e308."""
    lines = [{"bench": "attention", "s": 1e308, "gflops": 1e308, "fwdbwd_ms": 1.0, "naive_fwdbwd_ms": 1e-300},
             {"bench": "attention", "s": 1e307, "gflops": -1e308, "sgemm_gflops": 5e-324},
             {"bench": "warmup-memory", "geometry": "huge", "s": 1e308, "mha_peak_bytes": 1e308, "warmup_peak_bytes": 5e-324,
              "legacy_peak_bytes": None},
             {"bench": "warmup-memory", "geometry": "huge", "s": 5e-324, "mha_peak_bytes": 1e308, "warmup_peak_bytes": 1.0},
             {"bench": "sparse", "s": 1.0, "ns_per_pair": 5.0}, {"bench": "sparse", "s": 1.0, "ns_per_pair": 5.000000000000001},
             {"bench": "train", "mode": "mha", "seq_len": 128, "hmla_tokens_per_s": 1e308, "torch_tokens_per_s": None}]
    with open(f"{w}/extreme.jsonl", "w") as f:
        f.write("".join(json.dumps(ln) + "\n" for ln in lines))
    r = bounded([hmla, "report", "--bench", f"{w}/extreme.jsonl", "--out", f"{w}/extreme"])
    check("report --bench of +-1e308, denormals and ulp-close values", r.returncode == 0, r.stderr[-300:])
    for n in ["attention", "warmup_memory_huge", "sparse", "train"]:
        if os.path.exists(f"{w}/extreme/{n}.svg"):
            with open(f"{w}/extreme/{n}.svg") as f:
                svg = f.read()
            check_chart(check, f"extreme bench {n}", svg[svg.index("<svg"):], w)
        else:
            check(f"extreme bench {n}.svg written", False)


def bench_refusals(check, hmla, w):
    """Bench lines that name files or cannot be drawn are refused, naming the line, before
    anything is written: a geometry is one plain name (it was a path: "x/../../escaped" wrote
    escaped.svg outside --out); s <= 0 drew NaN coordinates on the log axis."""
    root = f"{w}/refuse"
    os.makedirs(f"{root}/a/b")
    good = json.dumps({"bench": "sparse", "s": 2048, "ns_per_pair": 3.5})
    cases = [
        ("geometry x/../../escaped", {"bench": "warmup-memory", "geometry": "x/../../escaped", "s": 1024,
                                      "mha_peak_bytes": 1, "warmup_peak_bytes": 1}, ": geometry 'x/../../escaped' is not a plain name"),
        ("geometry ../escaped", {"bench": "warmup-memory", "geometry": "../escaped", "s": 1024}, ": geometry '../escaped' is not a plain name"),
        ("geometry /abs", {"bench": "warmup-memory", "geometry": f"{root}/abs", "s": 1024}, f": geometry '{root}/abs' is not a plain name"),
        ("geometry .hidden", {"bench": "warmup-memory", "geometry": ".hidden", "s": 1024}, ": geometry '.hidden' is not a plain name"),
        ("geometry missing", {"bench": "warmup-memory", "s": 1024}, ": a warmup-memory line needs its geometry as a string"),
        ("s = 0", {"bench": "sparse", "s": 0, "ns_per_pair": 1.0}, " (sparse): 's' is 0; it must be a positive number"),
        ("s < 0", {"bench": "attention", "s": -1024, "gflops": 1.0}, " (attention): 's' is -1024"),
        ("s missing", {"bench": "indexer", "dense_kl_workspace_bytes": 1.0}, " (indexer): 's' is missing"),
        ("s a string", {"bench": "sparse", "s": "2048"}, " (sparse): 's' is \"2048\"; it must be a positive number"),
        ("seq_len < 0", {"bench": "train", "mode": "mha", "seq_len": -5, "hmla_tokens_per_s": 1.0}, " (train): 'seq_len' is -5"),
    ]
    for name, line, needle in cases:
        with open(f"{root}/b.jsonl", "w") as f:
            f.write(good + "\n" + json.dumps(line) + "\n")
        check_refused(check, f"report --bench refuses {name}", [hmla, "report", "--bench", f"{root}/b.jsonl", "--out",
                                                                 f"{root}/a/b/out"], "b.jsonl line 2" + needle, root)
    with open(f"{root}/b.jsonl", "w") as f:
        f.write(good + '\n{"bench": "sparse", "s": 1e999, "ns_per_pair": 1}\n')
    check_refused(check, "report --bench refuses a number beyond the double range",
                  [hmla, "report", "--bench", f"{root}/b.jsonl", "--out", f"{root}/a/b/out"],
                  "b.jsonl line 2: a number beyond the double range", root)
    escaped = [os.path.join(d, n) for d, _, ns in os.walk(w) for n in ns if n.startswith("escaped")]
    check("no escaped.svg anywhere", not escaped, escaped)


def unmarked_directory(check, hmla, w):
    """A directory with a metrics.jsonl but no run marker may hold the user's own report.html:
    report refuses to replace it and writes to an explicit --out instead."""
    d = f"{w}/mine"
    os.makedirs(d)
    with open(f"{d}/metrics.jsonl", "w") as f:
        f.write(json.dumps({"phase": "p", "step": 1, "lm_loss": 3.0}) + "\n")
    with open(f"{d}/report.html", "w") as f:
        f.write("the user's own report\n")
    check_refused(check, "report of an unmarked directory", [hmla, "report", d], "not an hmla run directory", d)
    r = bounded([hmla, "report", d, "--out", f"{w}/mine_report.html"])
    check("report of an unmarked directory --out FILE", r.returncode == 0 and os.path.exists(f"{w}/mine_report.html"),
          r.stderr[-300:])
    with open(f"{d}/report.html") as f:
        check("the user's report.html is untouched", f.read() == "the user's own report\n")
    check_refused(check, "report --out a directory", [hmla, "report", d, "--out", d], "is a directory", w)
    os.makedirs(f"{d}/checkpoints")  # a run from before the marker: checkpoints/latest marks it
    with open(f"{d}/checkpoints/latest", "w") as f:
        f.write("0-p-end\n")
    r = bounded([hmla, "report", d])
    check("report of a run from before the marker (checkpoints/latest)", r.returncode == 0, r.stderr[-300:])


def moe_run(check, hmla, w):
    """A MoE model's steps log each MoE layer's load imbalance (docs/moe.md): a fifth chart, one
    line per MoE layer over the global step, with the phase boundaries; a null value is a gap."""
    rows = []
    for s in range(1, 7):
        rows.append(("pre", s, {"lm_loss": 3.0 - 0.1 * s, "lr": 1e-3, "moe_layers": [1, 2],
                                "moe_imbalance": [4.0 - 0.4 * s, None if s == 3 else 3.0 - 0.2 * s],
                                "moe_aux_loss": [1e-4, 1.1e-4]}))
    for s in range(1, 4):
        rows.append(("warm", s, {"lm_loss": 2.4, "lr": 1e-3, "moe_layers": [1, 2], "moe_imbalance": [1.5, 1.6]}))
    run = marked_run(w, "moe", rows)
    with open(f"{run}/programme.json", "w") as f:
        json.dump({"phases": [{"name": "pre", "mode": "mha"}, {"name": "warm", "mode": "dsa_warmup"}]}, f)
    html, _ = report(check, hmla, run)
    charts = svgs_of(html)
    check("MoE run: five charts, the fifth the load imbalance",
          len(charts) == 5 and "MoE load imbalance" in charts[-1], len(charts))
    if len(charts) == 5:
        root = check_chart(check, "MoE imbalance", charts[4], w, ["pre · mha", "warm · dsa_warmup"])
        if root is not None:
            legend = [g.find(SVG + "text").text for g in groups(root, "legend")]
            check("MoE imbalance: one line per MoE layer", legend == ["layer 1", "layer 2"], legend)
            lines = [g for g in groups(root, "series") if g.find(SVG + "polyline") is not None]
            check("MoE imbalance: both layers drawn", len(lines) >= 2, len(lines))


def v4_run(check, hmla, w):
    """A DeepSeek-V4 stack's run (configs/deepseek_v4_tiny_hybrid.json: HCA, hybrid_mla, CSA,
    hybrid_mla) logs on its logging steps the attention mass of its CSA and HCA kinds (window keys,
    compressed entries, sink; summing to 1; no sliding kind: it has none), and the report draws a
    chart per kind with the three parts and the phase boundaries."""
    with open(f"{w}/v4.yaml", "w") as f:
        f.write(f"""model: {HERE}/../../configs/deepseek_v4_tiny_hybrid.json
data: {HERE}/../../data/demo
seed: 3
base: {{batch: 2, seq_len: 32, lr: 3.0e-3, indexer_lr: 3.0e-3, log_every: 2, eval_rows: 2, moe_aux_loss_coeff: 0}}
phases:
  - {{name: pre, mode: mha, steps: 3}}
  - {{name: warm, mode: dsa_warmup, steps: 2}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
""")
    r = subprocess.run([hmla, "train", f"{w}/v4.yaml", "--out", f"{w}/v4"], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    check("V4 train", r.returncode == 0, r.stderr[-300:])
    if r.returncode != 0:
        return
    last = {"pre": 3, "warm": 2, "sparse": 2}
    with open(f"{w}/v4/metrics.jsonl") as f:
        steps = [row for row in map(json.loads, f) if "step" in row]
    for row in steps:
        logged = row["step"] % 2 == 0 or row["step"] == last[row["phase"]]
        for kind in ["csa", "hca", "sliding"]:
            keys = [f"attn_mass_{part}_{kind}" for part in ["window", "entries", "sink"]]
            want = logged and kind != "sliding"
            check(f"V4 {row['phase']} step {row['step']}: attn_mass_*_{kind} {'present' if want else 'absent'}",
                  all((k in row) == want for k in keys), sorted(k for k in row if k.startswith("attn_mass")))
            if want and all(k in row for k in keys):
                total = sum(row[k] for k in keys)
                check(f"V4 {row['phase']} step {row['step']}: the {kind} mass sums to 1",
                      abs(total - 1) < 1e-12 and min(row[k] for k in keys) > 0, [row[k] for k in keys])
    html, _ = report(check, hmla, f"{w}/v4")
    charts = {title: svg for svg in svgs_of(html) for title in ["CSA", "HCA", "sliding"]
              if f"Attention mass, {title} layers" in svg}
    check("V4 report: an attention mass chart per kind present", sorted(charts) == ["CSA", "HCA"], sorted(charts))
    for title, svg in charts.items():
        root = check_chart(check, f"V4 attention mass {title}", svg, w,
                           ["pre · mha", "warm · dsa_warmup", "sparse · dsa_sparse"])
        if root is not None:
            legend = [g.find(SVG + "text").text for g in groups(root, "legend")]
            check(f"V4 attention mass {title}: the three parts",
                  legend == ["window keys", "compressed entries", "sink"], legend)


def main():
    a = parse_args(__doc__)
    check = Checker()
    real_run(check, a.hmla, a.workdir)
    handmade_run(check, a.hmla, a.workdir)
    benches(check, a.hmla, a.workdir)
    extreme_ranges(check, a.hmla, a.workdir)
    long_phase_stopped(check, a.hmla, a.workdir)
    bench_extremes(check, a.hmla, a.workdir)
    bench_refusals(check, a.hmla, a.workdir)
    unmarked_directory(check, a.hmla, a.workdir)
    moe_run(check, a.hmla, a.workdir)
    v4_run(check, a.hmla, a.workdir)
    check.exit()


if __name__ == "__main__":
    main()
