#!/usr/bin/env python3
"""Resume and divergence from the CLI (issue 14): --resume refuses changed data, a changed
programme and a state.json that points outside the data, each with a one-line error, a non-zero
exit and every file of the run byte-identical; a diverging run stops naming the phase and step and
saves nothing non-finite; a non-finite init_checkpoint is refused naming the tensor; an absurd
optimizer setting is refused at load; `hmla report` draws a run whose metrics have gaps."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, parse_args, tree_digest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def programme(data, extra="", base_extra="", pre_steps=3, every=2):
    return f"""model: {HERE}/../train/tiny_model.json
data: {data}
seed: 2
{extra}base: {{batch: 4, seq_len: 32, lr: 3.0e-3, log_every: 1, eval_rows: 2, checkpoint_every: {every}{base_extra}}}
phases:
  - {{name: pre, mode: mha, steps: {pre_steps}}}
"""


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()

    def hmla(*args):
        return subprocess.run([a.hmla, *args], capture_output=True, text=True, timeout=120)

    def one_line_error(r, *words):
        lines = r.stderr.strip().splitlines()
        return r.returncode != 0 and len(lines) == 1 and lines[0].startswith("hmla: error:") and all(
            x in lines[0] for x in words)

    with open(f"{w}/text.txt", "w") as f:
        for i in range(40):
            f.write(f"Document {i}: a small fortune about nothing in particular, number {i * 3}.\n%\n")
    check("prepare-data", hmla("prepare-data", f"{w}/text.txt", "--out", f"{w}/data").returncode == 0)
    with open(f"{w}/p.yaml", "w") as f:
        f.write(programme(f"{w}/data"))
    r = hmla("train", f"{w}/p.yaml", "--out", f"{w}/run")
    check("train", r.returncode == 0, r.stderr[-300:])
    # Pretend the run stopped after its step-2 checkpoint.
    with open(f"{w}/run/checkpoints/latest", "w") as f:
        f.write("0-pre-step2\n")
    before = tree_digest(f"{w}/run")

    # Changed programme: listed key, nothing touched.
    with open(f"{w}/p_lr.yaml", "w") as f:
        f.write(programme(f"{w}/data").replace("lr: 3.0e-3", "lr: 1.0e-3"))
    r = hmla("train", f"{w}/p_lr.yaml", "--out", f"{w}/run", "--resume")
    check("--resume with a changed lr is refused", one_line_error(r, "phases[0].lr"), r.stderr.strip())
    check("  ... and the run is untouched", tree_digest(f"{w}/run") == before)
    # steps is a safe change with --allow-safe-changes only.
    with open(f"{w}/p_steps.yaml", "w") as f:
        f.write(programme(f"{w}/data", pre_steps=4))
    r = hmla("train", f"{w}/p_steps.yaml", "--out", f"{w}/run", "--resume")
    check("--resume with changed steps needs --allow-safe-changes", one_line_error(r, "phases[0].steps"),
          r.stderr.strip())
    check("  ... and the run is untouched", tree_digest(f"{w}/run") == before)

    # Changed data: the data directory prepared again from other text.
    shutil.copytree(f"{w}/data", f"{w}/data2")
    with open(f"{w}/text2.txt", "w") as f:
        f.write("One other document.\n%\nAnd another.\n%\n" * 30)
    check("prepare-data again", hmla("prepare-data", f"{w}/text2.txt", "--out", f"{w}/data2").returncode == 0)
    with open(f"{w}/p2.yaml", "w") as f:
        f.write(programme(f"{w}/data2"))
    shutil.copytree(f"{w}/run", f"{w}/run2")
    with open(f"{w}/run2/programme.json") as f:  # the same programme but for its data directory
        pj = json.load(f)
    pj["data"] = f"{w}/data2"
    with open(f"{w}/run2/programme.json", "w") as f:
        json.dump(pj, f, indent=2)
    before2 = tree_digest(f"{w}/run2")
    r = hmla("train", f"{w}/p2.yaml", "--out", f"{w}/run2", "--resume")
    check("--resume against other data is refused", one_line_error(r, "data differs"), r.stderr.strip())
    check("  ... and the run is untouched", tree_digest(f"{w}/run2") == before2)

    # A state.json whose data position lies outside its document (or the data).
    for label, pos in (("past its document's end", [0, 3, 10 ** 6]), ("past the data", [0, 10 ** 9, 0]),
                       ("negative", [-1, 0, 0])):
        shutil.rmtree(f"{w}/run3", ignore_errors=True)
        shutil.copytree(f"{w}/run", f"{w}/run3")
        sp = f"{w}/run3/checkpoints/0-pre-step2/state.json"
        state = json.load(open(sp))
        state["data_pos"] = pos
        json.dump(state, open(sp, "w"))
        before3 = tree_digest(f"{w}/run3")
        r = hmla("train", f"{w}/p.yaml", "--out", f"{w}/run3", "--resume")
        check(f"state.json data position {label} is an error", one_line_error(r, "data"), r.stderr.strip())
        check("  ... and the run is untouched", tree_digest(f"{w}/run3") == before3)

    # metrics.jsonl cut shorter than the checkpoint recorded: refused before anything is written.
    shutil.rmtree(f"{w}/run4", ignore_errors=True)
    shutil.copytree(f"{w}/run", f"{w}/run4")
    with open(f"{w}/run4/metrics.jsonl", "r+") as f:
        f.truncate(10)
    before4 = tree_digest(f"{w}/run4")
    r = hmla("train", f"{w}/p.yaml", "--out", f"{w}/run4", "--resume")
    check("a metrics.jsonl shorter than the checkpoint's is an error", one_line_error(r, "metrics.jsonl", "shorter"),
          r.stderr.strip())
    check("  ... and the run is untouched", tree_digest(f"{w}/run4") == before4)

    # A real resume after all: the metrics equal the uninterrupted run's (timing fields aside).
    full = open(f"{w}/run/metrics.jsonl").read()
    r = hmla("train", f"{w}/p.yaml", "--out", f"{w}/run", "--resume")

    def untimed(text):
        rows = [json.loads(x) for x in text.splitlines()]
        for row in rows:
            row.pop("tokens_per_s", None)
            row.pop("seconds", None)
        return rows
    check("resume equals the uninterrupted run", r.returncode == 0 and
          untimed(open(f"{w}/run/metrics.jsonl").read()) == untimed(full), r.stderr[-300:])

    # Divergence: a finite but absurd learning rate.
    with open(f"{w}/p_div.yaml", "w") as f:
        f.write(programme(f"{w}/data", base_extra=", lr: 1.0e+30", pre_steps=8, every=1)
                .replace("lr: 3.0e-3, ", ""))
    r = hmla("train", f"{w}/p_div.yaml", "--out", f"{w}/div")
    check("a diverging run stops", one_line_error(r, "phase 'pre' step", "non-finite") or
          one_line_error(r, "phase 'pre' step", "nan") or one_line_error(r, "phase 'pre' step", "inf"),
          r.stderr.strip())
    finite = True
    for d in sorted(os.listdir(f"{w}/div/checkpoints")) if os.path.isdir(f"{w}/div/checkpoints") else []:
        if os.path.isdir(f"{w}/div/checkpoints/{d}"):
            finite &= all(np.isfinite(x).all() for x in st.load(f"{w}/div/checkpoints/{d}/model.safetensors").values())
    check("  ... saving no non-finite checkpoint and no final model", finite and
          not os.path.exists(f"{w}/div/model.safetensors"))

    # Optimizer settings out of range, at load.
    for key, val in (("lr", ".inf"), ("beta1", "1.5"), ("eps", "0"), ("min_lr_ratio", "2"), ("weight_decay", "-1")):
        with open(f"{w}/p_bad.yaml", "w") as f:
            f.write(programme(f"{w}/data", base_extra=f", {key}: {val}").replace(
                "lr: 3.0e-3, ", "" if key == "lr" else "lr: 3.0e-3, "))
        r = hmla("train", f"{w}/p_bad.yaml", "--out", f"{w}/bad_{key}")
        check(f"{key}: {val} is refused", one_line_error(r, key) and not os.path.exists(f"{w}/bad_{key}/checkpoints"),
              r.stderr.strip())

    # A NaN in an init_checkpoint names the tensor.
    weights = st.load(f"{w}/run/model.safetensors")
    weights["model.norm.weight"][3] = np.nan
    os.makedirs(f"{w}/nan", exist_ok=True)
    st.save(f"{w}/nan/model.safetensors", weights)
    shutil.copy(f"{w}/run/config.json", f"{w}/nan/config.json")
    with open(f"{w}/p_nan.yaml", "w") as f:
        f.write(programme(f"{w}/data", extra=f"init_checkpoint: {w}/nan/model.safetensors\n"))
    r = hmla("train", f"{w}/p_nan.yaml", "--out", f"{w}/from_nan")
    check("a NaN init_checkpoint is refused", one_line_error(r, "model.norm.weight", "non-finite"), r.stderr.strip())
    st.save(f"{w}/ids.safetensors", {"input_ids": np.array([[5, 6, 7]], dtype=np.int64)})
    r = hmla("forward", "--checkpoint", f"{w}/nan", "--inputs", f"{w}/ids.safetensors", "--out", f"{w}/o.st")
    check("forward on a NaN checkpoint is refused", one_line_error(r, "model.norm.weight"), r.stderr.strip())

    # report: null, missing and malformed metrics are gaps, not errors.
    os.makedirs(f"{w}/gaps", exist_ok=True)
    with open(f"{w}/gaps/metrics.jsonl", "w") as f:
        f.write('{"phase":"a","step":1,"lm_loss":null,"indexer_kl":null}\n{"phase":"a","step":2,"lm_loss":3.0}\n'
                '{"phase":"b","step":3,"lm_loss":2.5,"indexer_kl":"x"}\n{"phase":"b","step":4,"lm_lo\n[1]\n')
    with open(f"{w}/gaps/summary.json", "w") as f:
        f.write('[{"phase":"a","heldout_lm_loss":null,"peak_bytes":null},{"x":1}]')
    with open(f"{w}/gaps/hmla-run.json", "w") as f:  # a run directory: report writes report.html only into one
        f.write("{}\n")
    r = hmla("report", f"{w}/gaps")
    check("report draws a run with gaps", r.returncode == 0 and os.path.exists(f"{w}/gaps/report.html"), r.stderr)
    check.exit()


if __name__ == "__main__":
    main()
