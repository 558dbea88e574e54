#!/usr/bin/env python3
"""Megatron-LM indexed datasets end to end: the byte ids of a text corpus written as int32 and as
uint16 datasets (documents of several sequences), (a) converted by prepare-data and (b) read in
place by the trainer (`data: PREFIX`), train bit for bit as the same text prepared by hmla does;
a bad index is one line naming the file, and ids past the model's vocabulary are refused."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_writer  # noqa: E402
from harness import Checker, check_refused, parse_args  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def programme(path, data, model=f"{HERE}/../train/tiny_model.json"):
    with open(path, "w") as f:
        f.write(f"model: {model}\ndata: {data}\nseed: 3\n"
                "base: {batch: 4, seq_len: 32, lr: 3.0e-3, log_every: 1, eval_rows: 2, checkpoint_every: 0}\n"
                "phases:\n  - {name: pre, mode: mha, steps: 4}\n")


def untimed(path):
    rows = [json.loads(x) for x in open(path).read().splitlines()]
    for row in rows:
        row.pop("tokens_per_s", None)
        row.pop("seconds", None)
    return rows


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    texts = [f"doc {i} " + "ab " * (i % 4) + f"\nline {i}\n" for i in range(60)]
    with open(f"{w}/text.txt", "w") as f:
        f.write("".join(t + "%\n" for t in texts))
    docs = []
    for t in texts:  # one sequence per line, the eos ending the last: document boundaries differ from sequences
        lines = [list(np.frombuffer(ln.encode(), dtype=np.uint8).astype(np.int64) + 3) for ln in t.splitlines(True)]
        lines[-1].append(2)
        docs.append(lines)
    megatron_writer.write(f"{w}/m32", docs, np.int32)
    megatron_writer.write(f"{w}/m16", docs, np.uint16)

    def run(cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        return r.returncode == 0, (r.stderr or r.stdout).strip()[-300:]

    ok, err = run([a.hmla, "prepare-data", f"{w}/text.txt", "--out", f"{w}/data_text"])
    check("prepare-data of the text", ok, err)
    for name in ("m32", "m16"):
        ok, err = run([a.hmla, "prepare-data", f"{w}/{name}.idx", "--out", f"{w}/data_{name}", "--quiet"])
        check(f"prepare-data converts the {name} dataset", ok, err)
    runs = {"text": f"{w}/data_text", "m32 converted": f"{w}/data_m32", "m16 converted": f"{w}/data_m16",
            "m32 in place": f"{w}/m32", "m16 in place": f"{w}/m16.bin"}
    metrics = {}
    for label, data in runs.items():
        tag = label.replace(" ", "_")
        programme(f"{w}/{tag}.yaml", data)
        ok, err = run([a.hmla, "train", f"{w}/{tag}.yaml", "--out", f"{w}/run_{tag}"])
        check(f"train on {label}", ok, err)
        if ok:
            metrics[label] = untimed(f"{w}/run_{tag}/metrics.jsonl")
    ref = metrics.get("text")
    for label, m in metrics.items():
        if label != "text":
            check(f"{label} trains bit for bit as the text", m == ref and len(m) >= 5,
                  "" if m == ref else f"{m[:1]} vs {ref[:1]}")
    # The data fingerprint a checkpoint records (what --resume compares) is the same for all five.
    prints = {label: json.load(open(f"{w}/run_{label.replace(' ', '_')}/checkpoints/0-pre-end/state.json"))
              ["data_fingerprint"] for label in metrics}
    check("every run records the same data fingerprint", len(set(prints.values())) == 1 and len(prints) == 5, prints)
    # hmla-run.json records what made the ids: the byte tokenizer for the text and the converted
    # sets (prepare-data of a Megatron dataset records it as ids as stored), the dataset read in place.
    toks = {label: json.load(open(f"{w}/run_{label.replace(' ', '_')}/hmla-run.json")).get("tokenizer", {})
            for label in metrics}
    check("hmla-run.json: the text's tokenizer is the byte tokenizer",
          toks.get("text", {}).get("fingerprint") == "bytes" and toks["text"].get("vocab_size") == 259, toks)
    check("hmla-run.json: in place, the Megatron dataset",
          toks.get("m16 in place", {}).get("fingerprint") == "megatron" and
          "m16" in toks["m16 in place"].get("describe", ""), toks)
    ok, err = run([a.hmla, "train", f"{w}/m16_in_place.yaml", "--out", f"{w}/run_m16_in_place", "--resume"])
    check("--resume of a run on in-place data accepts its data", ok, err)
    # In place, nothing is written beside the dataset.
    check("in-place training writes nothing beside the dataset",
          sorted(n for n in os.listdir(w) if n.startswith(("m16", "m32")) and "." in n and
                 not n.endswith(".yaml")) == ["m16.bin", "m16.idx", "m32.bin", "m32.idx"],
          sorted(os.listdir(w)))
    # A bad index: one line naming the .idx, nothing written.
    shutil.copy(f"{w}/m32.idx", f"{w}/bad.idx")
    with open(f"{w}/bad.bin", "wb") as f:
        f.write(open(f"{w}/m32.bin", "rb").read()[:-4])
    check_refused(check, "prepare-data: a .bin shorter than its .idx says",
                  [a.hmla, "prepare-data", f"{w}/bad", "--out", f"{w}/data_bad"], "bad.idx: the sequences hold", w)
    programme(f"{w}/bad.yaml", f"{w}/bad")
    check_refused(check, "train: a .bin shorter than its .idx says",
                  [a.hmla, "train", f"{w}/bad.yaml", "--out", f"{w}/run_bad"], "bad.idx: the sequences hold", w)
    # Ids past the model's vocabulary (tiny_model: 260).
    big = [[[5, 6, 300, 2]] for _ in range(40)]
    megatron_writer.write(f"{w}/big", big, np.int32)
    programme(f"{w}/big.yaml", f"{w}/big")
    check_refused(check, "train: ids past the model's vocab_size",
                  [a.hmla, "train", f"{w}/big.yaml", "--out", f"{w}/run_big"], "has vocab_size 301", w)
    check.exit()


if __name__ == "__main__":
    main()
