#!/usr/bin/env python3
"""`hmla bench v4` on the CPU at small s (docs/bench.md): one JSON line per (kernel, s) with its
fields; the default widths are DeepSeek-V4-Flash's (configs/deepseek_v4_flash.json); the work
counted as the docs say (the attention's pairs recounted here); rows that cannot fit the memory
budget, or lie above --dense-max-s, are lines saying why; bad arguments are one-line errors."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, check_refused, parse_args  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = ["csa_compress_fwd", "csa_compress_bwd", "csa_index_topk", "csa_attn_fwd", "csa_attn_bwd", "csa_kl_sparse",
           "csa_dense_attn_fwd", "csa_dense_attn_bwd", "csa_kl_dense", "hca_compress_fwd", "hca_compress_bwd",
           "hca_attn_fwd", "hca_attn_bwd", "mhc_pre_fwd", "mhc_pre_bwd", "mhc_post_fwd", "mhc_post_bwd",
           "moe_route_fwd", "moe_route_bwd"]
RATE = {"csa_compress_fwd": "gbps", "csa_compress_bwd": "gbps", "hca_compress_fwd": "gbps", "hca_compress_bwd": "gbps",
        "mhc_post_fwd": "gbps", "mhc_post_bwd": "gbps", "moe_route_fwd": "gbps", "moe_route_bwd": "gbps"}


def bench(hmla, args, env=None):
    r = subprocess.run([hmla, "bench", "v4", "--device", "cpu"] + args, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="2", **(env or {})))
    return r, [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]


def pairs(s, window, m, cap):
    """Window keys plus visible entries (at most cap; 0: all) over one causal document of s rows."""
    return sum(min(t + 1, window) + (min((t + 1) // m, cap) if cap else (t + 1) // m) for t in range(s))


def main():
    a = parse_args(__doc__)
    check = Checker()
    flash = json.load(open(os.path.join(ROOT, "configs", "deepseek_v4_flash.json")))

    r, rows = bench(a.hmla, ["--s", "64,128", "--reps", "1"])
    check("runs", r.returncode == 0, r.stderr[-300:])
    got = [(j.get("kernel"), j.get("s")) for j in rows]
    check("a line per (kernel, s), s outer", got == [(k, s) for s in (64, 128) for k in KERNELS], str(got[:4]))
    for j in rows:
        k = j["kernel"]
        ok = (j["bench"] == "v4" and j["b"] == 1 and j["device"].startswith("cpu") and j["impl"] == "cpu"
              and j["dtype"] == "f32" and j["reps"] == 1 and j["threads"] == 2 and j["ms"] > 0 and j["plan_bytes"] > 0
              and "skipped" not in j and "error" not in j)
        rate = RATE.get(k, "tflops")
        ok = ok and j.get(rate, 0) > 0 and (rate != "gbps" or j["bytes"] > 0) and (rate != "tflops" or j["flops"] > 0)
        check(f"{k} s={j['s']} fields", ok, json.dumps(j)[:300])
    by = {(j["kernel"], j["s"]): j for j in rows}
    # The defaults are V4-Flash's.
    att, kl, mhc, moe = by[("csa_attn_fwd", 128)], by[("csa_kl_dense", 128)], by[("mhc_pre_fwd", 128)], by[("moe_route_fwd", 128)]
    rates = flash["compress_rates"]
    check("defaults: V4-Flash's attention", (att["H"], att["d"], att["K"], att["window"], att["m"]) ==
          (flash["num_attention_heads"], flash["head_dim"], flash["index_topk"], flash["sliding_window"],
           rates["compressed_sparse_attention"]), json.dumps(att))
    check("defaults: V4-Flash's indexer", (kl["HI"], kl["DI"]) == (flash["index_n_heads"], flash["index_head_dim"]))
    check("defaults: HCA's rate", by[("hca_attn_fwd", 128)]["m"] == rates["heavily_compressed_attention"])
    check("defaults: V4-Flash's mHC", (mhc["hc_mult"], mhc["hidden"], mhc["sinkhorn_iters"]) ==
          (flash["hc_mult"], flash["hidden_size"], flash["hc_sinkhorn_iters"]))
    check("defaults: V4-Flash's router", (moe["experts"], moe["experts_per_tok"], moe["scoring_func"]) ==
          (flash["n_routed_experts"], flash["num_experts_per_tok"], flash["scoring_func"]))
    # FLOPs by the FlashAttention convention over the attended pairs: 2 (d + d) per pair and head, 2.5 x backward.
    for k, m, cap in (("csa_attn", 4, 512), ("csa_dense_attn", 4, 0), ("hca_attn", 128, 0)):
        for s in (64, 128):
            f, b = by[(k + "_fwd", s)], by[(k + "_bwd", s)]
            p = pairs(s, 128, m, cap)
            check(f"{k} s={s}: pairs and flops", f["pairs"] == p and f["flops"] == 4 * 512 * 64 * p
                  and b["flops"] == 2.5 * f["flops"] and f["n_e"] == s // m, f"{f['pairs']} vs {p}")
    kd, ks = by[("csa_kl_dense", 128)], by[("csa_kl_sparse", 128)]
    e = sum((t + 1) // 4 for t in range(128))
    check("csa KL flops: (6 HI DI + 2 H d) per candidate", kd["pairs"] == e and kd["flops"] == (6 * 64 * 128 + 2 * 64 * 512) * e
          and ks["flops"] == kd["flops"], json.dumps(kd)[:200])
    check("topk flops: 2 HI DI per visible entry", by[("csa_index_topk", 128)]["flops"] == 2 * 64 * 128 * e)

    # Rows that would not fit the budget, and dense rows above --dense-max-s, are lines saying why.
    r, rows = bench(a.hmla, ["--s", "64", "--reps", "1", "--kernels", "csa_attn_fwd,mhc_pre_fwd"],
                    {"HMLA_MEMORY_BUDGET": "8M"})
    att = rows[0] if rows else {}
    check("budget: a skipped line, not a crash", r.returncode == 0 and len(rows) == 2 and "needs at least" in
          att.get("skipped", "") and "HMLA_MEMORY_BUDGET" in att["skipped"] and "ms" not in att
          and "ms" in rows[1], r.stdout[:400] + r.stderr[-200:])
    r, rows = bench(a.hmla, ["--s", "64,128", "--reps", "1", "--dense-max-s", "64", "--heads", "2",
                             "--kernels", "csa_dense_attn_fwd,csa_kl_dense,csa_attn_fwd"])
    skipped = [(j["kernel"], j["s"]) for j in rows if "skipped" in j]
    check("--dense-max-s: the dense rows above it skipped", r.returncode == 0 and
          skipped == [("csa_dense_attn_fwd", 128), ("csa_kl_dense", 128)] and
          all("--dense-max-s 64" in j["skipped"] for j in rows if "skipped" in j), str(skipped))

    # bench train on a V4 stack (the device check's V4 step, rehearsed on the tiny one): tokens/s and model FLOPs.
    r = subprocess.run([a.hmla, "bench", "train", "--config", os.path.join(ROOT, "configs", "deepseek_v4_tiny.json"),
                        "--seq-len", "64", "--mode", "mha,dsa_sparse", "--batch", "1", "--reps", "1", "--python", ""],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="2"))
    tr = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    check("bench train on a V4 config: tokens/s and model FLOPs per mode", r.returncode == 0 and
          [j["mode"] for j in tr] == ["mha", "dsa_sparse"] and
          all(j["hmla_tokens_per_s"] > 0 and j["model_flops"] > 0 and j["model_tflops"] > 0 for j in tr) and
          tr[0]["model_flops"] != tr[1]["model_flops"], r.stdout[-400:] + r.stderr[-200:])

    v4 = [a.hmla, "bench", "v4", "--device", "cpu"]
    for name, args, needle in (
            ("--s 0", ["--s", "0"], "--s: must be an integer in [1, 16777216], got '0'"),
            ("--device gpu", ["--device", "gpu"], "--device: unknown device 'gpu'"),
            ("--reps -1", ["--reps", "-1"], "--reps: must be an integer in [0, 1000]"),
            ("--hc-mult 9", ["--hc-mult", "9"], "--hc-mult: must be an integer in [1, 8]"),
            ("--heads x", ["--heads", "x"], "--heads: must be an integer"),
            ("--kernels nope", ["--kernels", "csa_attn_fwd,nope"], "--kernels nope: no such kernel; the kernels are"),
            ("k > E", ["--experts", "4", "--experts-per-tok", "5"], "--experts-per-tok 5 must be at most --experts 4"),
    ):
        check_refused(check, f"refused: {name}", v4 + args, needle, a.workdir)
    r = subprocess.run([a.hmla, "bench", "v4", "--s", "64"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    lines = r.stderr.strip().splitlines()
    check("--device cuda (the default) without a GPU: one line", r.returncode != 0 and len(lines) == 1 and
          lines[0].startswith("hmla: error: device cuda:") and not r.stdout, r.stderr[-200:])
    check.exit()


if __name__ == "__main__":
    main()
