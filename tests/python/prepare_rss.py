#!/usr/bin/env python3
"""prepare-data streams: its peak resident memory (ru_maxrss of the child) on 10 MB and on 100 MB of
JSON Lines (the demo's fortunes, recovered from data/demo and repeated) differs by at most 1.2x.
Labelled heavy (it writes ~500 MB)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402
from harness import Checker, parse_args  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def fortunes():
    """The demo's documents as text: held-out document n (from 1) is every 20th."""
    sets = {}
    for name in ("train", "heldout"):
        t = st.load(f"{ROOT}/data/demo/{name}.safetensors")
        ids, off = t["tokens"], t["doc_offsets"]
        sets[name] = [bytes((ids[off[i]:off[i + 1] - 1] - 3).astype("uint8").tolist()).decode("utf-8", "replace")
                      for i in range(len(off) - 1)]
    docs, n = [], 0
    while sets["train"] or sets["heldout"]:
        n += 1
        docs.append(sets["heldout" if n % 20 == 0 else "train"].pop(0))
    return docs


def main():
    a = parse_args(__doc__)
    w = a.workdir
    check = Checker()
    lines = "".join(json.dumps({"text": d}) + "\n" for d in fortunes())
    peaks = {}
    for mb in (10, 100):
        path = f"{w}/f{mb}.jsonl"
        with open(path, "w") as f:
            for _ in range(mb * 1000000 // len(lines) + 1):
                f.write(lines)
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.execv(a.hmla, [a.hmla, "prepare-data", path, "--out", f"{w}/out{mb}", "--quiet"])
        _, status, usage = os.wait4(pid, 0)
        check(f"prepare-data of {mb} MB", os.waitstatus_to_exitcode(status) == 0)
        peaks[mb] = usage.ru_maxrss
        print(f"prepare-data {mb} MB of jsonl: peak RSS {usage.ru_maxrss / 1024:.1f} MiB")
        os.remove(path)
    ratio = peaks[100] / peaks[10]
    check("peak RSS at 100 MB is within 1.2x of that at 10 MB", ratio <= 1.2, f"({ratio:.3f}x)")
    check.exit()


if __name__ == "__main__":
    main()
