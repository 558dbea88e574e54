#!/usr/bin/env python3
"""The Hugging Face side of `hmla bench tokenizer`: encode_batch MB/s of tokenizers (0.23.3, the venv of
tests/text/make_tokenizer_fixtures.py) on the input's lines, at RAYON_NUM_THREADS threads (and
encode_batch_fast's, which skips offsets), and an FNV-1a
hash of the ids (each line's ids as int32 little-endian, then -1) that hmla checks against its own.
Prints one JSON object."""
import argparse
import json
import struct
import time

from tokenizers import Tokenizer


def fnv1a(ids_per_line):
    h = 1469598103934665603
    for ids in ids_per_line:
        for b in struct.pack(f"<{len(ids) + 1}i", *ids, -1):
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    with open(a.input, "rb") as f:
        raw = f.read()
    lines = raw.decode("utf-8", errors="replace").split("\n")
    tok.encode_batch(lines, add_special_tokens=False)  # warm-up: the word cache, the thread pool
    best = float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        out = tok.encode_batch(lines, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    ids = [e.ids for e in out]
    row = {"mb_s": len(raw) / best / 1e6, "seconds": best, "tokens": sum(map(len, ids)),
           "ids_fnv1a": f"{fnv1a(ids):016x}"}
    if hasattr(tok, "encode_batch_fast"):  # without offsets: tokenizers' fastest batch path
        fast = float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            out = tok.encode_batch_fast(lines, add_special_tokens=False)
            fast = min(fast, time.perf_counter() - t0)
        if [e.ids for e in out] == ids:
            row["fast_mb_s"] = len(raw) / fast / 1e6
    print(json.dumps(row))


if __name__ == "__main__":
    main()
