#!/usr/bin/env python3
"""What hmla reads, at the CLI (issue 24): every input is a regular file of bounded size and
nesting, read and checked before anything is written or allocated, and every refusal is one
`hmla: error:` line that leaves the work directory as it was. FIFOs, directories and device nodes
as inputs (they blocked forever, read as empty or never ended), JSON and YAML nested 100,000 deep
(the stack overflowed), a layer count that allocated gigabytes before its refusal, values no config
can mean, strings where numbers belong; prepare-data's token files as one pair, its durable
writes, and the temporaries killed runs leave."""
import json
import os
import resource
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checker, parse_args, tree_digest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = json.load(open(os.path.join(HERE, "..", "train", "tiny_model.json")))
DEEP = "[" * 100000 + "]" * 100000


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def write_json(path, obj):
    write(path, json.dumps(obj))


def safetensors_bytes(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def ids_file(path, ids):
    data = struct.pack(f"<{len(ids)}i", *ids)
    with open(path, "wb") as f:
        f.write(safetensors_bytes({"input_ids": {"dtype": "I32", "shape": [1, len(ids)],
                                                 "data_offsets": [0, len(data)]}}, data))


def refused(check, name, cmd, needle, root, timeout=30, env=None, preexec=None, one_line=True):
    """`cmd` fails within `timeout` with one `hmla: error:` line containing `needle` (the last line
    unless one_line), and leaves every file under `root` byte-identical (a hang or a crash fail)."""
    before = tree_digest(root)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=preexec)
    except subprocess.TimeoutExpired:
        check(name, False, f"still running after {timeout} s")
        return
    changed = sorted(k for k in set(before) | set(tree_digest(root)) if before.get(k) != tree_digest(root).get(k))
    lines = r.stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    good = (r.returncode > 0 and (len(lines) == 1 or not one_line) and last.startswith("hmla: error:")
            and needle in last and not changed)
    check(name, good, f"exit {r.returncode}: {last[:240]}" + (f" CHANGED: {changed[:4]}" if changed else ""))


def refused_bounded(check, name, cmd, needle, root):
    """refused() within 10 s and 2 GiB of address space (reading /dev/zero grew without end)."""
    refused(check, name, cmd, needle, root, timeout=10, preexec=limit_memory(2))


def limit_memory(gib):
    """A preexec_fn capping the address space: a late refusal shows as "out of memory" or a crash."""
    def f():
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    return f


def prepare(hmla, text, out, every=3):
    r = subprocess.run([hmla, "prepare-data", text, "--out", out, "--heldout-every", str(every)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def programme(path, model, data, extra="", phase="{name: pre, mode: mha, steps: 2, checkpoint_every: 1}"):
    write(path, f"model: {model}\ndata: {data}\n{extra}base: {{batch: 2, seq_len: 32, log_every: 1, eval_rows: 1}}\n"
                f"phases:\n  - {phase}\n")


def nesting_cases(hmla, w, check):
    """JSON and YAML nested past the bound: refused as they are parsed, with the depth named."""
    d = f"{w}/nest"
    os.makedirs(f"{d}/ck")
    cfg = json.dumps(TINY)[:-1] + ', "unknown": ' + DEEP + "}"
    write(f"{d}/deep.json", cfg)
    write(f"{d}/ck/config.json", cfg)
    ids_file(f"{d}/ids.safetensors", [5, 6])
    programme(f"{d}/p.yaml", f"{d}/deep.json", f"{w}/data")
    needle = "nests deeper than 64 levels"
    refused(check, "train: config.json nested 100,000 deep", [hmla, "train", f"{d}/p.yaml", "--out", f"{d}/run"],
            "deep.json: " + needle, d)
    refused(check, "forward: config.json nested 100,000 deep",
            [hmla, "forward", "--checkpoint", f"{d}/ck", "--inputs", f"{d}/ids.safetensors", "--out", f"{d}/o.st"],
            "config.json: " + needle, d)
    write(f"{d}/deep.yaml", f"model: {w}/m.json\ndata: {w}/data\nphases:\n  - {{name: a, steps: 1}}\nx: {DEEP}\n")
    refused(check, "train: programme YAML nested 100,000 deep", [hmla, "train", f"{d}/deep.yaml", "--out", f"{d}/run"],
            "deep.yaml: line 5: " + needle, d)
    # A run's programme.json, read on --resume.
    programme(f"{d}/ok.yaml", f"{w}/m.json", f"{w}/data")
    r = subprocess.run([hmla, "train", f"{d}/ok.yaml", "--out", f"{d}/run"], capture_output=True, text=True)
    check("a short run for --resume", r.returncode == 0, r.stderr.strip()[-200:])
    saved = open(f"{d}/run/programme.json").read()
    write(f"{d}/run/programme.json", saved.rstrip()[:-1] + ', "x": ' + DEEP + "}\n")
    refused(check, "train --resume: programme.json nested 100,000 deep",
            [hmla, "train", f"{d}/ok.yaml", "--out", f"{d}/run", "--resume"], "programme.json: " + needle, d)
    # A safetensors header (forward --inputs).
    with open(f"{d}/deep_header.safetensors", "wb") as f:
        f.write(struct.pack("<Q", 12 + len(DEEP)) + b'{"__x__": ' + DEEP.encode() + b"}\n")
    refused(check, "forward: a safetensors header nested 100,000 deep",
            [hmla, "forward", "--checkpoint", f"{w}/ck", "--inputs", f"{d}/deep_header.safetensors", "--out",
             f"{d}/o.st"], "header: " + needle, d)


def non_regular_cases(hmla, w, check):
    """FIFOs (no writer: a read blocks forever), directories and device nodes as inputs."""
    d = f"{w}/fifo"
    os.makedirs(f"{d}/ck")
    os.mkfifo(f"{d}/fifo")
    os.makedirs(f"{d}/adir")
    write_json(f"{d}/ck/config.json", TINY)
    os.mkfifo(f"{d}/ck/model.safetensors")
    ids_file(f"{d}/ids.safetensors", [5, 6])
    for kind, path, needle in (("a FIFO", f"{d}/fifo", "is a FIFO"), ("/dev/zero", "/dev/zero", "is a device node")):
        refused_bounded(check, f"forward --inputs {kind}",
                [hmla, "forward", "--checkpoint", f"{w}/ck", "--inputs", path, "--out", f"{d}/o.st"], needle, d)
        refused_bounded(check, f"report --bench {kind}", [hmla, "report", "--bench", path, "--out", f"{d}/bench"],
                        needle, d)
        programme(f"{d}/model.yaml", path, f"{w}/data")
        refused_bounded(check, f"train: model: {kind}", [hmla, "train", f"{d}/model.yaml", "--out", f"{d}/run"],
                        needle, d)
        programme(f"{d}/init.yaml", f"{w}/m.json", f"{w}/data", f"init_checkpoint: {path}\n")
        refused_bounded(check, f"train: init_checkpoint: {kind}",
                        [hmla, "train", f"{d}/init.yaml", "--out", f"{d}/run"], needle, d)
        refused_bounded(check, f"train: the programme is {kind}", [hmla, "train", path, "--out", f"{d}/run"], needle, d)
    refused_bounded(check, "forward: the checkpoint's model.safetensors is a FIFO",
            [hmla, "forward", "--checkpoint", f"{d}/ck", "--inputs", f"{d}/ids.safetensors", "--out", f"{d}/o.st"],
            "is a FIFO", d)
    for name in ("train.safetensors", "heldout.safetensors"):
        data = f"{d}/data_{name.split('.')[0]}"
        shutil.copytree(f"{w}/data", data)
        os.remove(f"{data}/{name}")
        os.mkfifo(f"{data}/{name}")
        programme(f"{d}/data.yaml", f"{w}/m.json", data)
        refused_bounded(check, f"train: data {name} is a FIFO", [hmla, "train", f"{d}/data.yaml", "--out", f"{d}/run"],
                "is a FIFO", d)
    refused_bounded(check, "prepare-data: a text file that is a FIFO",
            [hmla, "prepare-data", f"{w}/text.txt", f"{d}/fifo", "--out", f"{d}/newdata"], "is a FIFO", d)
    # report on a run whose metrics.jsonl is a FIFO, a directory or /dev/zero: an error, not an empty report.
    for kind, make, needle in (("a FIFO", os.mkfifo, "is a FIFO"), ("a directory", os.makedirs, "is a directory"),
                               ("/dev/zero", lambda p: os.symlink("/dev/zero", p), "is a device node")):
        run = f"{d}/run_{needle.split()[-1]}"
        shutil.copytree(f"{w}/run", run)
        os.remove(f"{run}/metrics.jsonl")
        if os.path.exists(f"{run}/report.html"):
            os.remove(f"{run}/report.html")
        make(f"{run}/metrics.jsonl")
        refused_bounded(check, f"report: metrics.jsonl is {kind}", [hmla, "report", run], f"metrics.jsonl: {needle}", d)


def config_cases(hmla, w, check):
    """Values no config can mean, refused when the config loads (before any allocation)."""
    d = f"{w}/cfg"
    os.makedirs(d)
    ids_file(f"{d}/ids.safetensors", [5, 6])
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    cases = [
        ("YaRN original_max_position_embeddings 0", {"rope_scaling": dict(yarn, original_max_position_embeddings=0)},
         "original_max_position_embeddings = 0: it must be >= 1"),
        ("YaRN beta_fast < beta_slow", {"rope_scaling": dict(yarn, beta_fast=1, beta_slow=32)},
         "beta_fast = 1 is smaller than beta_slow = 32"),
        ("YaRN mscale -50", {"rope_scaling": dict(yarn, mscale=-50)}, "mscale = -50: it must be finite and >= 0"),
        ("YaRN factor 1e308", {"rope_scaling": dict(yarn, factor=1e308)}, "factor = 1e+308: it must be in [1, 65536]"),
        ("initializer_range < 0", {"initializer_range": -0.5}, "initializer_range = -0.5: it must be finite and >= 0"),
        ("pad_token_id >= vocab_size", {"pad_token_id": 260}, "pad_token_id = 260 is not a token of the vocabulary"),
        ("num_hidden_layers 10^6", {"num_hidden_layers": 10**6}, "num_hidden_layers = 1000000: hmla builds at most"),
        ("num_hidden_layers 2^31", {"num_hidden_layers": 2**31}, "num_hidden_layers = 2147483648: hmla builds at most"),
    ]
    for i, (name, over, needle) in enumerate(cases):
        cfg = dict(TINY, **over)
        if "num_hidden_layers" in over:
            cfg.pop("hmla_layer_modes")
        ck = f"{d}/ck_{i}"
        os.makedirs(ck)
        write_json(f"{ck}/config.json", cfg)
        # 2 GiB of address space: a refusal after gigabytes of per-layer tables fails here.
        refused(check, f"forward: {name}",
                [hmla, "forward", "--checkpoint", ck, "--inputs", f"{d}/ids.safetensors", "--out", f"{d}/o.st"],
                needle, d, preexec=limit_memory(2))
        write_json(f"{d}/model.json", cfg)
        programme(f"{d}/p.yaml", f"{d}/model.json", f"{w}/data")
        refused(check, f"train: {name}", [hmla, "train", f"{d}/p.yaml", "--out", f"{d}/run_{i}"], needle, d,
                preexec=limit_memory(2))
    # A safetensors __metadata__ maps strings to strings.
    data = struct.pack("<2i", 5, 6)
    with open(f"{d}/nested_meta.safetensors", "wb") as f:
        f.write(safetensors_bytes({"__metadata__": {"a": {"b": "c"}},
                                   "input_ids": {"dtype": "I32", "shape": [1, 2], "data_offsets": [0, 8]}}, data))
    refused(check, "forward: a nested safetensors __metadata__",
            [hmla, "forward", "--checkpoint", f"{w}/ck", "--inputs", f"{d}/nested_meta.safetensors", "--out",
             f"{d}/o.st"], "__metadata__ 'a' must be a string", d)


def programme_cases(hmla, w, check):
    """Programme values: strings where numbers belong, one document, hybrid layers named once."""
    d = f"{w}/prog"
    os.makedirs(d)
    head = f"model: {w}/m.json\ndata: {w}/data\n"
    cases = [
        ('steps: "2"', head + 'phases:\n  - {name: a, steps: "2"}\n',
         "steps (line 4) must be an integer, got '\"2\"' (a string: write it without quotes or a tag)"),
        ("steps: !!str 2", head + "phases:\n  - {name: a, steps: !!str 2}\n",
         "steps (line 4) must be an integer, got '!!str 2'"),
        ("lr: '0.1'", head + "phases:\n  - {name: a, lr: '0.1'}\n", "lr (line 4) must be a number"),
        ("a second YAML document", head + "phases:\n  - {name: a, steps: 1}\n---\nphases: []\n",
         "line 5: a second YAML document"),
        ("hybrid_layers []", head + "hybrid_layers: []\nphases:\n  - {name: a, steps: 1}\n",
         "hybrid_layers (line 3) is an empty list"),
        ("hybrid_layers [0, 0]", head + "hybrid_layers: [0, 0]\nphases:\n  - {name: a, steps: 1}\n",
         "layer 0 is listed twice"),
        ("a value spanning lines", head + "phases:\n  - name: a\n    steps:\n      a: 1\n      b: 2\n",
         "steps (line 6) must be an integer, got '{a: 1, b: 2}'"),
        ("a block scalar", head + "phases:\n  - name: a\n    steps: |\n      1\n      2\n",
         "got '\"1\\n2\\n\"'"),
    ]
    for i, (name, text, needle) in enumerate(cases):
        write(f"{d}/p{i}.yaml", text)
        refused(check, f"programme: {name}", [hmla, "train", f"{d}/p{i}.yaml", "--out", f"{d}/run_{i}"], needle, d)


def option_cases(hmla, w, check):
    """Options and the environment: the option, the allowed range and the value, on one line."""
    d = f"{w}/opts"
    os.makedirs(d)
    for opt, val, needle in (("--reps", "0", "--reps: must be an integer in [1, 1048576], got '0'"),
                             ("--batch", "0", "--batch: must be an integer >= 1, got '0'"),
                             ("--seq-len", "4", "--seq-len: must be an integer >= 8, got '4'"),
                             ("--device", "tpu", "--device: unknown device 'tpu'; use one of cpu, cuda")):
        refused(check, f"bench train {opt} {val}", [hmla, "bench", "train", opt, val], needle, d)
    programme(f"{d}/p.yaml", f"{w}/m.json", f"{w}/data")
    # libgomp reads the variable before main: it warns of a malformed value itself (a line of its own
    # before hmla's), and takes a large one, to fail when the first parallel region starts 4096 threads.
    for val, one_line in (("4096", True), ("8,4096", True), ("0", False), ("abc", False)):
        env = dict(os.environ, OMP_NUM_THREADS=val)
        refused(check, f"OMP_NUM_THREADS={val}", [hmla, "train", f"{d}/p.yaml", "--out", f"{d}/run_{val}"],
                f"OMP_NUM_THREADS = '{val}': it must be an integer in [1, 1024]", d, env=env, timeout=120,
                one_line=one_line)
    env = dict(os.environ, OMP_NUM_THREADS="2,1")
    r = subprocess.run([hmla, "train", f"{d}/p.yaml", "--out", f"{d}/run"], capture_output=True, text=True, env=env)
    check("OMP_NUM_THREADS=2,1 trains", r.returncode == 0, r.stderr.strip()[-200:])


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def prepare_data_cases(hmla, w, check):
    """The token files are one pair; the temporaries of killed runs go; every write is durable."""
    d = f"{w}/prep"
    os.makedirs(d)
    write(f"{d}/a.txt", "".join(f"first corpus, document {i}, with a few words\n%\n" for i in range(30)))
    write(f"{d}/b.txt", "".join(f"second corpus, document {i}\n%\n" for i in range(30)))
    prepare(hmla, f"{d}/a.txt", f"{d}/data")
    prepare(hmla, f"{d}/b.txt", f"{d}/other")
    # What a kill between the two renames left: a new train.safetensors beside the old heldout.
    shutil.copy(f"{d}/other/train.safetensors", f"{d}/data/train.safetensors")
    programme(f"{d}/p.yaml", f"{w}/m.json", f"{d}/data")
    refused(check, "train: token files from two prepare-data runs",
            [hmla, "train", f"{d}/p.yaml", "--out", f"{d}/run"],
            "train.safetensors and heldout.safetensors are not one prepare-data output", d)
    # Temporaries a killed prepare-data left: the next run removes those whose process is gone.
    dead, live = str(dead_pid()), str(os.getpid())
    for name in (f".train.safetensors.tmp.{dead}", f".heldout.safetensors.tmp.{dead}",
                 f".train.safetensors.tmp.{live}"):
        write(f"{d}/data/{name}", "a killed run's partial file")
    os.symlink(f"{d}/a.txt", f"{d}/data/.heldout.safetensors.tmp.{dead_pid()}")  # not a file hmla wrote
    prepare(hmla, f"{d}/a.txt", f"{d}/data")
    left = sorted(n for n in os.listdir(f"{d}/data") if ".tmp." in n)
    check("prepare-data removes the temporaries of dead runs only",
          len(left) == 2 and f".train.safetensors.tmp.{live}" in left and
          all(os.path.islink(f"{d}/data/{n}") for n in left if n.startswith(".heldout")), left)
    r = subprocess.run([hmla, "train", f"{d}/p.yaml", "--out", f"{d}/run"], capture_output=True, text=True)
    check("train: a fresh pair trains", r.returncode == 0, r.stderr.strip()[-200:])
    # Durable writes: fsync of the file before its rename, of the directory after.
    strace = shutil.which("strace")
    if not strace:
        print("skip fsync order: strace is not installed")
        return
    log = f"{d}/strace.txt"
    r = subprocess.run([strace, "-f", "-y", "-o", log, "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
                        hmla, "prepare-data", f"{d}/a.txt", "--out", f"{d}/data", "--heldout-every", "3"],
                       capture_output=True, text=True)
    if r.returncode != 0 and "ptrace" in r.stderr:
        print("skip fsync order: ptrace is not permitted here")
        return
    lines = open(log).read().splitlines()
    for name in ("train.safetensors", "heldout.safetensors"):
        tmp = f".{name}.tmp."
        synced = [i for i, ln in enumerate(lines) if "sync(" in ln and tmp in ln]
        renamed = [i for i, ln in enumerate(lines) if "rename" in ln and tmp in ln and f'/{name}"' in ln]
        dirsync = [i for i, ln in enumerate(lines) if "sync(" in ln and ln.split("<", 1)[-1].startswith(f"{d}/data>")]
        good = synced and renamed and synced[0] < renamed[0] and any(i > renamed[0] for i in dirsync)
        check(f"prepare-data: {name} fsynced before its rename, the directory after", good,
              f"(fsync {synced}, rename {renamed}, directory fsync {dirsync})")


def main():
    a = parse_args(__doc__)
    w = a.workdir
    write_json(f"{w}/m.json", TINY)
    write(f"{w}/text.txt", "".join(f"document number {i}, short\n%\n" for i in range(40)))
    prepare(a.hmla, f"{w}/text.txt", f"{w}/data", every=4)
    os.makedirs(f"{w}/ck")
    write_json(f"{w}/ck/config.json", TINY)
    programme(f"{w}/p.yaml", f"{w}/m.json", f"{w}/data")
    r = subprocess.run([a.hmla, "train", f"{w}/p.yaml", "--out", f"{w}/run"], capture_output=True, text=True)
    check = Checker()
    check("a short run to report on", r.returncode == 0, r.stderr.strip()[-200:])
    shutil.copy(f"{w}/run/model.safetensors", f"{w}/ck/model.safetensors")
    nesting_cases(a.hmla, w, check)
    non_regular_cases(a.hmla, w, check)
    config_cases(a.hmla, w, check)
    programme_cases(a.hmla, w, check)
    option_cases(a.hmla, w, check)
    prepare_data_cases(a.hmla, w, check)
    check.exit()


if __name__ == "__main__":
    main()
