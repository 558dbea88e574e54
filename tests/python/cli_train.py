#!/usr/bin/env python3
"""The training CLI end to end on a tiny model: prepare-data, train, report, forward, generate,
refusing to overwrite a run, a run owning only its directory (no init checkpoint, foreign files or
non-run overwritten, checkpoints/latest resolved inside the run, one run at a time under a lock
that a dead process never holds), and Ctrl-C (SIGINT) leaving the last checkpoint intact."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, check_refused, parse_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def programme(workdir, steps, every):
    return f"""model: {HERE}/../train/tiny_model.json
data: {workdir}/data
seed: 2
base: {{batch: 4, seq_len: 32, lr: 3.0e-3, log_every: 1, eval_rows: 2, checkpoint_every: {every}}}
phases:
  - {{name: pre, mode: mha, steps: {steps}}}
  - {{name: sparse, mode: dsa_sparse, steps: 2}}
"""


def run_directory_cases(hmla, w, check):
    """`hmla train --out DIR` writes only into a new or empty directory or into its own run, and
    `checkpoints/latest` leads only to a checkpoint of the run; every refusal changes nothing."""
    def train(prog, out, *extra):
        return [hmla, "train", f"{w}/{prog}", "--out", f"{w}/{out}", *extra]

    os.makedirs(f"{w}/ckpt")
    for n in ("config.json", "model.safetensors"):
        shutil.copy(f"{w}/run/{n}", f"{w}/ckpt/{n}")
    with open(f"{w}/init.yaml", "w") as f:
        f.write(programme(w, 3, 0) + f"init_checkpoint: {w}/ckpt\n")
    check_refused(check, "train --out the init_checkpoint's directory", train("init.yaml", "ckpt"),
                  "is the directory of init_checkpoint", w)
    os.makedirs(f"{w}/mine")
    with open(f"{w}/mine/notes.txt", "w") as f:
        f.write("the user's notes\n")
    check_refused(check, "train --out a directory holding other files", train("p.yaml", "mine"),
                  "neither empty nor an hmla run", w)
    check_refused(check, "--resume of a missing directory", train("p.yaml", "nothing", "--resume"), "does not exist", w)
    os.makedirs(f"{w}/empty")
    check_refused(check, "--resume of an empty directory", train("p.yaml", "empty", "--resume"), "is empty", w)
    check_refused(check, "--resume of a directory that is no run", train("p.yaml", "mine", "--resume"),
                  "is not an hmla run", w)

    shutil.copytree(f"{w}/run", f"{w}/tampered", symlinks=True)
    os.symlink(f"{w}/ckpt", f"{w}/tampered/checkpoints/linked")
    for bad, needle in (("../../ckpt", "not a plain name"), ("/tmp", "not a plain name"),
                        ("0-gone-end", "not a checkpoint directory"), ("linked", "not a checkpoint directory")):
        with open(f"{w}/tampered/checkpoints/latest", "w") as f:
            f.write(bad + "\n")
        check_refused(check, f"--resume with checkpoints/latest = {bad}", train("p.yaml", "tampered", "--resume"),
                      needle, w)

    # A copy of the run resumed from its first phase's end: the copied lock file names a process
    # that is gone, which never blocks, and the result equals the uninterrupted run's.
    shutil.copytree(f"{w}/run", f"{w}/resumed", symlinks=True)
    with open(f"{w}/resumed/checkpoints/latest", "w") as f:
        f.write("0-pre-end\n")
    r = subprocess.run(train("p.yaml", "resumed", "--resume"), capture_output=True, text=True)
    same = r.returncode == 0 and open(f"{w}/run/model.safetensors", "rb").read() == \
        open(f"{w}/resumed/model.safetensors", "rb").read()
    check("--resume past a dead holder's lock file, bit-exact", same and "resuming 0-pre-end" in r.stdout,
          r.stderr.strip()[-300:])


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    with open(f"{w}/text.txt", "w") as f:
        for i in range(60):
            f.write(f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7}.\n%\n")
    r = subprocess.run([a.hmla, "prepare-data", f"{w}/text.txt", "--out", f"{w}/data", "--heldout-every", "5"],
                       capture_output=True, text=True)
    check("prepare-data", r.returncode == 0 and os.path.exists(f"{w}/data/train.safetensors"), r.stderr)
    with open(f"{w}/p.yaml", "w") as f:
        f.write(programme(w, 3, 0))
    os.makedirs(f"{w}/run")  # an empty directory may become a run
    r = subprocess.run([a.hmla, "train", f"{w}/p.yaml", "--out", f"{w}/run"], capture_output=True, text=True)
    check("train", r.returncode == 0 and "heldout" in r.stdout, r.stderr[-300:])
    r = subprocess.run([a.hmla, "train", f"{w}/p.yaml", "--out", f"{w}/run"], capture_output=True, text=True)
    check("train refuses an existing run", r.returncode != 0 and "--resume" in r.stderr, r.stderr.strip())
    r = subprocess.run([a.hmla, "report", f"{w}/run"], capture_output=True, text=True)
    html = open(f"{w}/run/report.html").read() if os.path.exists(f"{w}/run/report.html") else ""
    check("report", r.returncode == 0 and "<svg" in html and "dsa_sparse" in html)
    ids = np.array([[5, 40, 41, 42, 43, 44, 45, 46]], dtype=np.int64)
    st.save(f"{w}/in.safetensors", {"input_ids": ids})
    r = subprocess.run([a.hmla, "forward", "--checkpoint", f"{w}/run", "--inputs", f"{w}/in.safetensors", "--out",
                        f"{w}/logits.safetensors"], capture_output=True, text=True)
    logits = st.load(f"{w}/logits.safetensors")["logits"] if r.returncode == 0 else np.zeros(0)
    check("forward", logits.shape == (1, 8, 260) and np.isfinite(logits).all(), r.stderr)
    # A plain HF config (no hmla_layer_modes) runs DESIGN.md's default: dsa_sparse everywhere when the
    # index_* fields are set, which is what this run's last phase wrote.
    os.makedirs(f"{w}/plain", exist_ok=True)
    plain = json.load(open(f"{w}/run/config.json"))
    check("the run ends in dsa_sparse", plain.pop("hmla_layer_modes") == ["dsa_sparse", "dsa_sparse"])
    with open(f"{w}/plain/config.json", "w") as f:
        json.dump(plain, f)
    shutil.copy(f"{w}/run/model.safetensors", f"{w}/plain/model.safetensors")
    r = subprocess.run([a.hmla, "forward", "--checkpoint", f"{w}/plain", "--inputs", f"{w}/in.safetensors", "--out",
                        f"{w}/plain.logits.safetensors"], capture_output=True, text=True)
    got = st.load(f"{w}/plain.logits.safetensors")["logits"] if r.returncode == 0 else None
    check("forward without hmla_layer_modes follows the default", got is not None and np.array_equal(got, logits),
          r.stderr.strip())
    check("held-out loss that could not be evaluated is not a number", "no held-out document fits" in
          json.dumps(json.load(open(f"{w}/run/summary.json"))))
    # The same weights as a sharded bf16 checkpoint and as f32 values rounded to bf16: identical logits.
    weights = st.load(f"{w}/run/model.safetensors")
    rounded = {n: (st.to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32) for n, x in weights.items()}
    names = sorted(weights)
    for d in ("bf16", "rounded"):
        os.makedirs(f"{w}/{d}", exist_ok=True)
        shutil.copy(f"{w}/run/config.json", f"{w}/{d}/config.json")
    st.save(f"{w}/bf16/model-00001-of-00002.safetensors", {n: weights[n] for n in names[::2]}, bf16=set(names))
    st.save(f"{w}/bf16/model-00002-of-00002.safetensors", {n: weights[n] for n in names[1::2]}, bf16=set(names))
    with open(f"{w}/bf16/model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}}, f)
    st.save(f"{w}/rounded/model.safetensors", rounded)
    outs = {}
    for d in ("bf16", "rounded"):
        r = subprocess.run([a.hmla, "forward", "--checkpoint", f"{w}/{d}", "--inputs", f"{w}/in.safetensors", "--out",
                            f"{w}/{d}.logits.safetensors"], capture_output=True, text=True)
        outs[d] = st.load(f"{w}/{d}.logits.safetensors")["logits"] if r.returncode == 0 else None
    check("forward reads sharded bf16", outs["bf16"] is not None and outs["rounded"] is not None
          and np.array_equal(outs["bf16"], outs["rounded"]))
    r = subprocess.run([a.hmla, "generate", "--checkpoint", f"{w}/run", "--prompt", "Document", "--tokens", "5"],
                       capture_output=True, text=True)
    check("generate", r.returncode == 0 and r.stdout.startswith("Document"), r.stderr)

    run_directory_cases(a.hmla, w, check)

    # SIGINT after the first checkpoint: exit 130, the checkpoint it names stays complete.
    with open(f"{w}/long.yaml", "w") as f:
        f.write(programme(w, 100000, 2))
    p = subprocess.Popen([a.hmla, "train", f"{w}/long.yaml", "--out", f"{w}/long"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    latest = f"{w}/long/checkpoints/latest"
    t0 = time.time()
    while not os.path.exists(latest) and time.time() - t0 < 60:
        time.sleep(0.05)
    busy = subprocess.run([a.hmla, "train", f"{w}/long.yaml", "--out", f"{w}/long", "--resume"], capture_output=True,
                          text=True, timeout=60)
    check("a second train into a running run is refused at once", busy.returncode != 0
          and f"in use by pid {p.pid} " in busy.stderr, busy.stderr.strip())
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    name = open(latest).read().strip()
    files = sorted(os.listdir(f"{w}/long/checkpoints/{name}"))
    model = st.load(f"{w}/long/checkpoints/{name}/model.safetensors")
    check("SIGINT", p.returncode == 130 and "intact" in err, f"exit {p.returncode}: {err.strip()}")
    check("checkpoint intact", files == ["config.json", "model.safetensors", "optimizer.safetensors", "state.json"]
          and "model.norm.weight" in model, str(files))
    left = [n for n in os.listdir(f"{w}/long/checkpoints") if n.endswith(".tmp")]
    check("no temporary checkpoint left", not left, str(left))
    check.exit()


if __name__ == "__main__":
    main()
