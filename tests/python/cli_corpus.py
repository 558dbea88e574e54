#!/usr/bin/env python3
"""Real text in, end to end (issue 29): a JSON Lines corpus, zstd-compressed, prepared with a model's
tokenizer.json (the DeepSeek-V3 fixture of tests/text/fixtures, made by tokenizers 0.23.3), trained on
and generated from.

- prepare-data's documents are tokenizers' ids with add_special_tokens (the bos its
  TemplateProcessing adds) followed by the eos tokenizer_config.json names, in file order, every
  N-th held out: the fixture's expected ids, not hmla's own tokenize output.
- the .jsonl.zst and the plain .jsonl give the same files; the token files record the tokenizer.
- training reads them (hmla-run.json records the tokenizer's fingerprint and vocab_size); a model
  whose vocab_size is smaller than the tokenizer's is refused naming the tokenizer, nothing written.
- generate and forward --text with a checkpoint directory holding the tokenizer.json use it (forward's
  input_ids are the tokenizer's ids with its bos, as the training documents begin; generate names
  it on stderr)."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, check_refused, parse_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "..", "text", "fixtures", "deepseek_v3")
EVERY = 5


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return r.returncode == 0, (r.stderr or r.stdout).strip()[-300:], r


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    texts = json.load(open(os.path.join(TOK, "expected.json"), encoding="utf-8"))["texts"]
    vocab = json.load(open(os.path.join(TOK, "tokenizer.json"), encoding="utf-8"))
    eos = next(t["id"] for t in vocab["added_tokens"] if t["content"] == "<｜end▁of▁sentence｜>")
    # The texts a JSON string can hold (valid UTF-8) that are not blank (prepare-data drops those).
    docs = []
    for t in texts:
        try:
            s = bytes.fromhex(t["hex"]).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if s.strip(" \t\r\n"):
            docs.append((s, t["ids_special"] + [eos], t["ids_special"]))
    check("the fixture gives enough documents", len(docs) >= 4 * EVERY, len(docs))
    with open(f"{w}/corpus.jsonl", "w", encoding="utf-8") as f:
        for s, _, _ in docs:
            f.write(json.dumps({"id": len(s), "text": s}, ensure_ascii=False) + "\n")
    subprocess.run(["zstd", "-q", "-f", "-19", f"{w}/corpus.jsonl", "-o", f"{w}/corpus.jsonl.zst"], check=True)

    want = {"train": [], "heldout": []}
    for n, (_, ids, _) in enumerate(docs, start=1):
        want["heldout" if n % EVERY == 0 else "train"].append(ids)
    for src in ("corpus.jsonl.zst", "corpus.jsonl"):
        out = f"{w}/data_{src.replace('.', '_')}"
        ok, err, _ = run([a.hmla, "prepare-data", f"{w}/{src}", "--tokenizer", TOK, "--out", out,
                          "--heldout-every", str(EVERY), "--quiet"])
        check(f"prepare-data {src} --tokenizer", ok, err)
        if not ok:
            continue
        for part in ("train", "heldout"):
            m = st.load(f"{out}/{part}.safetensors")
            toks, offs = [int(x) for x in m["tokens"]], [int(x) for x in m["doc_offsets"]]
            got = [toks[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
            bad = [i for i, (g, e) in enumerate(zip(got, want[part])) if g != e]
            check(f"{src} {part}: tokenizers' ids + eos per document", len(got) == len(want[part]) and not bad,
                  f"{len(got)} vs {len(want[part])} documents; first differing {bad[:3]}")
    same = all(open(f"{w}/data_corpus_jsonl_zst/{p}.safetensors", "rb").read() ==
               open(f"{w}/data_corpus_jsonl/{p}.safetensors", "rb").read() for p in ("train", "heldout"))
    check("the .zst and the plain .jsonl give the same token files", same)

    # A model with the tokenizer's vocabulary trains on it; one with a smaller vocabulary is refused.
    model = json.load(open(os.path.join(HERE, "..", "train", "tiny_model.json")))
    for name, v in (("model_ok", len(vocab["model"]["vocab"])), ("model_small", 260)):
        with open(f"{w}/{name}.json", "w") as f:
            json.dump(dict(model, vocab_size=v), f)
        with open(f"{w}/{name}.yaml", "w") as f:
            f.write(f"model: {w}/{name}.json\ndata: {w}/data_corpus_jsonl_zst\nseed: 3\n"
                    "base: {batch: 2, seq_len: 32, lr: 3.0e-3, log_every: 1, eval_rows: 1, checkpoint_every: 0}\n"
                    "phases:\n  - {name: pre, mode: mha, steps: 2}\n")
    ok, err, _ = run([a.hmla, "train", f"{w}/model_ok.yaml", "--out", f"{w}/run"])
    check("train on the tokenized corpus", ok, err)
    if ok:
        rec = json.load(open(f"{w}/run/hmla-run.json")).get("tokenizer", {})
        check("hmla-run.json records the tokenizer", rec.get("fingerprint", "").startswith("fnv1a:") and
              rec.get("vocab_size") == len(vocab["model"]["vocab"]), rec)
    check_refused(check, "train: a model smaller than the data's tokenizer",
                  [a.hmla, "train", f"{w}/model_small.yaml", "--out", f"{w}/run_small"], "tokenizer.json", w)

    # The trained model with the tokenizer beside it: forward --text and generate read it.
    if ok:
        ck = f"{w}/ck"
        shutil.copytree(f"{w}/run", ck, ignore=shutil.ignore_patterns("checkpoints", "*.lock", "metrics.jsonl"))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TOK, f), ck)
        s, _, ids = docs[0]
        ok2, err, r = run([a.hmla, "forward", "--checkpoint", ck, "--text", s, "--out", f"{w}/fwd.safetensors"])
        got = [int(x) for x in st.load(f"{w}/fwd.safetensors")["input_ids"][0]] if ok2 else []
        check("forward --text reads the checkpoint's tokenizer.json", ok2 and got == ids and
              "tokenizer.json" in r.stderr, err)
        ok2, err, r = run([a.hmla, "generate", "--checkpoint", ck, "--prompt", "Hello", "--tokens", "8"])
        check("generate reads the checkpoint's tokenizer.json", ok2 and r.stdout.startswith("Hello") and
              "tokenizer.json" in r.stderr, err)
    check.exit()


if __name__ == "__main__":
    main()
