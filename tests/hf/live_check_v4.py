#!/usr/bin/env python3
"""Labelled live check of DeepSeek-V4 checkpoints (hf_live, not in the default suite; needs torch +
transformers 5.24 in a virtual environment outside the tree), both ways:
1. `hmla init` draws a tiny V4 model (--config, default tests/hf/fixtures/v4/config.json, here with
   num_nextn_predict_layers 1) and writes it with hmla's checkpoint writer; made-up MTP tensors
   (mtp.0.*, as DeepSeek's release names them) are added to its file, and `hmla convert` reads and
   rewrites it (they must come back byte for byte); transformers' DeepseekV4ForCausalLM.from_pretrained
   loads that with no missing, mismatched or unexpected keys but mtp.* (its ignore list), holds
   the same tid2eid, and its logits equal `hmla forward`'s;
2. transformers saves that model (save_pretrained, sharded at --shard-size), `hmla forward` reads
   transformers' directory and gives transformers' logits again.
The f32 rule: max |hmla - transformers| <= rtol * max |logits| (rtol 1e-4, as live_check.py), and
each MoE layer's chosen experts equal as sets (the hash layers' come from tid2eid). The input is
drawn until no learned router decision is within 1e-5 of a tie (hmla and torch break exact ties
differently; index_topk is raised to max_position_embeddings for the same reason: a freshly drawn
indexer's relu scores tie at 0, and test_v4_model.cpp checks the selection on the fixture); the
seed and the gap are printed.

    /tmp/hfvenv/bin/python tests/hf/live_check_v4.py --hmla build/bin/hmla
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from transformers import DeepseekV4ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import safetensors_lite as st  # noqa: E402


def hmla_forward(hmla, ckpt, ids, d):
    st.save(f"{d}/in.safetensors", {"input_ids": ids})
    subprocess.run([hmla, "forward", "--checkpoint", ckpt, "--inputs", f"{d}/in.safetensors", "--out",
                    f"{d}/out.safetensors"], check=True)
    return st.load(f"{d}/out.safetensors")


def transformers_forward(model, ids):
    """Logits, each MoE layer's chosen experts, and the smallest router / indexer gaps."""
    experts, gaps = {}, [np.inf, np.inf]
    hooks = []
    for L, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate

        def f(mod, args, out, L=L):
            idx = out[-1] if isinstance(out, tuple) else out
            experts[L] = idx.reshape(-1, idx.shape[-1]).numpy()
            if hasattr(mod, "e_score_correction_bias"):  # learned routing: the k-th / (k+1)-th gap
                logits = out[0].double() if isinstance(out, tuple) else None
                if logits is not None and logits.shape[-1] == mod.e_score_correction_bias.shape[0]:
                    sc = torch.sqrt(torch.nn.functional.softplus(logits)) + mod.e_score_correction_bias.double()
                    top = torch.sort(sc, -1, descending=True).values
                    k = idx.shape[-1]
                    gaps[0] = min(gaps[0], float((top[..., k - 1] - top[..., k]).min()))
        hooks.append(gate.register_forward_hook(f))
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)).logits.numpy()
    for h in hooks:
        h.remove()
    return logits, experts, gaps[0]


def compare(tag, got, ref, experts, rtol):
    ok = True
    names = sorted(int(n.split(".")[1]) for n in got if n.startswith("experts."))
    if names != sorted(experts):
        print(f"{tag}: MoE layers differ: hmla {names}, transformers {sorted(experts)}")
        ok = False
    for L in sorted(experts):
        same = L in names and np.array_equal(np.sort(got[f"experts.{L}"], -1), np.sort(experts[L], -1))
        ok &= bool(same)
        print(f"{tag}: layer {L}: the chosen experts {'equal' if same else 'DIFFER from'} transformers'")
    diff, mag = float(np.abs(got["logits"] - ref).max()), float(np.abs(ref).max())
    print(f"{tag}: max |logits_hmla - logits_transformers| = {diff:.3e}, max |logits| = {mag:.3f}, "
          f"ratio {diff / mag:.2e}")
    return ok and diff <= rtol * mag


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hmla", required=True)
    ap.add_argument("--config", default=os.path.join(HERE, "fixtures", "v4", "config.json"))
    ap.add_argument("--seq-len", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--shard-size", default="20KB")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as d:
        cfg = json.load(open(a.config))
        cfg["num_nextn_predict_layers"] = 1
        # The CSA layers attend every visible entry: a freshly drawn indexer's relu scores tie at 0
        # (as live_check.py notes for V3.2), and torch and hmla break ties differently; the
        # selection itself is checked against transformers by tests/hf/test_v4_model.cpp.
        cfg["index_topk"] = max(cfg["index_topk"], cfg["max_position_embeddings"])
        json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
        ck0, ck = f"{d}/hmla_init", f"{d}/hmla_ckpt"
        subprocess.run([a.hmla, "init", "--config", f"{d}/config.json", "--out", ck0, "--seed", str(a.seed)],
                       check=True)
        with safe_open(f"{ck0}/model.safetensors", "np") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        rng = np.random.default_rng(0)
        mtp = {"mtp.0.enorm.weight": rng.standard_normal(cfg["hidden_size"]).astype(np.float32),
               "mtp.0.eh_proj.weight": rng.standard_normal((cfg["hidden_size"], 2 * cfg["hidden_size"])).astype(np.float32),
               "mtp.0.ffn.gate.tid2eid": np.arange(2 * cfg["vocab_size"], dtype=np.int64).reshape(-1, 2) % 4}
        save_file({**tensors, **mtp}, f"{ck0}/model.safetensors", metadata={"format": "pt"})
        subprocess.run([a.hmla, "convert", "--checkpoint", ck0, "--out", ck], check=True)
        with safe_open(f"{ck}/model.safetensors", "np") as f:
            kept = all(k in f.keys() and f.get_tensor(k).dtype == v.dtype and np.array_equal(f.get_tensor(k), v)
                       for k, v in mtp.items())
            same = all(np.array_equal(f.get_tensor(k), v) for k, v in tensors.items())
        print(f"hmla convert keeps the MTP tensors {'unchanged' if kept else 'CHANGED'} and the rest "
              f"{'unchanged' if same else 'CHANGED'}")
        ok &= kept and same
        model, info = DeepseekV4ForCausalLM.from_pretrained(ck, output_loading_info=True, dtype=torch.float32)
        model.eval()
        problems = {k: v for k, v in info.items() if v and k != "unexpected_keys"}
        unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith("mtp.")]
        print(f"transformers loads hmla's checkpoint: missing {info.get('missing_keys')}, unexpected (besides "
              f"mtp.*) {unexpected}, other problems {problems}")
        ok &= not info.get("missing_keys") and not unexpected and not problems
        with safe_open(f"{ck}/model.safetensors", "np") as f:
            tids = [k for k in f.keys() if k.endswith("tid2eid") and k.startswith("model.layers.")]
            dt = {k: f.get_slice(k).get_dtype() for k in tids}
            same_tid = all(np.array_equal(f.get_tensor(k), getattr(model.model.layers[int(k.split(".")[2])].mlp.gate,
                                                                      "tid2eid").numpy()) for k in tids)
        print(f"tid2eid in hmla's file: {dt}; transformers holds the same tables: {same_tid}")
        ok &= same_tid and all(v == "I64" for v in dt.values()) and len(tids) > 0
        for seed in range(100):
            ids = np.random.default_rng(seed).integers(0, cfg["vocab_size"], (2, a.seq_len)).astype(np.int64)
            ref, experts, rgap = transformers_forward(model, ids)
            if rgap > 1e-5:
                break
        print(f"input seed {seed}: router decision gap {rgap:.2e}")
        got = hmla_forward(a.hmla, ck, ids, d)
        ok &= compare("hmla -> transformers", got, ref, experts, a.rtol)

        hf = f"{d}/hf_ckpt"
        model.save_pretrained(hf, max_shard_size=a.shard_size)
        files = sorted(os.listdir(hf))
        print(f"transformers saved: {files}")
        got = hmla_forward(a.hmla, hf, ids, d)
        ok &= compare("transformers -> hmla", got, ref, experts, a.rtol)
        # and hmla's writer on the model it read from transformers' shards: transformers' own names
        # and dtypes, file for file the same tensors
        with safe_open(f"{ck}/model.safetensors", "np") as f:
            mine = {k for k in f.keys() if not k.startswith("mtp.")}
        idx = json.load(open(f"{hf}/model.safetensors.index.json")) if "model.safetensors.index.json" in files else None
        theirs = set(idx["weight_map"]) if idx else set(safe_open(f"{hf}/model.safetensors", "np").keys())
        print(f"names: hmla's file and transformers' {'equal' if mine == theirs else 'DIFFER'} "
              f"({len(mine)} tensors; only in hmla's: {sorted(mine - theirs)[:3]}, only in transformers': "
              f"{sorted(theirs - mine)[:3]})")
        ok &= mine == theirs
    print("live check v4:", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
