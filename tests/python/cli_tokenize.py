#!/usr/bin/env python3
"""`hmla tokenize` at the CLI against the tokenizer fixtures (tests/text/fixtures, tokenizers 0.23.3):
each file one text, ids per line equal to tokenizers'; --add-special; --out writes ids and doc_offsets;
--decode round trips; deepseek_v4 (no eos file beside it) needs --eos-token only with --add-special;
bad input is a one-line error that writes nothing."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, check_refused, parse_args  # noqa: E402

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "text", "fixtures")


def main():
    a = parse_args(__doc__)
    check = Checker()
    for case in ("deepseek_v3", "deepseek_v4", "glm"):
        tok = os.path.join(FIX, case)
        with open(os.path.join(tok, "expected.json"), encoding="utf-8") as f:
            texts = json.load(f)["texts"]
        files = []
        for i, t in enumerate(texts):
            p = os.path.join(a.workdir, f"{case}_{i}.txt")
            with open(p, "wb") as f:
                f.write(bytes.fromhex(t["hex"]))
            files.append(p)
        for special, key in ((False, "ids"), (True, "ids_special")):
            eos = ["--eos-token", "<｜end▁of▁sentence｜>"] if special and case == "deepseek_v4" else []
            cmd = [a.hmla, "tokenize", "--tokenizer", tok] + (["--add-special"] if special else []) + eos + files
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = [[int(x) for x in ln.split()] for ln in r.stdout.split("\n")[:-1]]
            check(f"{case} ids ({key})", r.returncode == 0 and got == [t[key] for t in texts], r.stderr.strip())
        out = os.path.join(a.workdir, f"{case}.safetensors")
        r = subprocess.run([a.hmla, "tokenize", "--tokenizer", tok, "--out", out] + files, capture_output=True)
        m = st.load(out) if r.returncode == 0 else {}
        want = [i for t in texts for i in t["ids"]]
        offsets = [0]
        for t in texts:
            offsets.append(offsets[-1] + len(t["ids"]))
        check(f"{case} --out", r.returncode == 0 and list(m["ids"]) == want and list(m["doc_offsets"]) == offsets
              and str(m["ids"].dtype) == "int32" and str(m["doc_offsets"].dtype) == "int64", r.stderr)
        bad = []
        for i, t in enumerate(texts):  # one call per text: decoded texts hold newlines
            r = subprocess.run([a.hmla, "tokenize", "--tokenizer", tok, "--decode"],
                               input=(" ".join(map(str, t["ids"])) + "\n").encode(), capture_output=True)
            if r.returncode != 0 or r.stdout.decode("utf-8") != t["decoded"] + "\n":
                bad.append(i)
        check(f"{case} --decode", not bad, f"texts {bad}")
    glm = os.path.join(FIX, "glm")
    check_refused(check, "no eos for --add-special",
                  [a.hmla, "tokenize", "--tokenizer", os.path.join(FIX, "deepseek_v4"), "--add-special"],
                  "--eos-token", a.workdir)
    check_refused(check, "unknown eos", [a.hmla, "tokenize", "--tokenizer", glm, "--eos-token", "<x>"],
                  "not a token", a.workdir)
    check_refused(check, "missing file", [a.hmla, "tokenize", "--tokenizer", glm, "nope.txt"], "nope.txt", a.workdir)
    check_refused(check, "no tokenizer", [a.hmla, "tokenize", "--tokenizer", a.workdir], "tokenizer.json", a.workdir)
    check_refused(check, "decode takes no files", [a.hmla, "tokenize", "--tokenizer", glm, "--decode", "x"],
                  "--decode", a.workdir)
    r = subprocess.run([a.hmla, "tokenize", "--tokenizer", glm, "--decode"], input=b"1 2 99999\n",
                       capture_output=True, text=False)
    err = r.stderr.decode().strip().splitlines()
    check("decode: an id out of range", r.returncode != 0 and len(err) == 1 and "99999" in err[0], err)
    check.exit()


if __name__ == "__main__":
    main()
