#!/usr/bin/env python3
# Ratchets on the tree's shape, run by ctest: (lines) no C++/CUDA file in src/ or app/ over 500
# lines but the allow-listed ones; (layers) no #include against the layer order; (docs) every
# repository path and code identifier in backticks in README.md and docs/*.md exists. Each
# allow-list or exception below carries its reason and fails once it is no longer needed, so none
# goes stale. Standard library only; `--self-test` plants one violation per check in a scratch tree.
import argparse
import fnmatch
import glob
import os
import re
import sys
import tempfile

# ---- lines ---------------------------------------------------------------------------------------

LINE_LIMIT = 500
LINE_DIRS = ("src", "app")
SOURCE_EXTS = (".cpp", ".h", ".cu", ".cuh")

# path -> (most lines allowed, why this file is one file). An entry whose file is back under
# LINE_LIMIT (or gone) fails: delete the entry.
LINE_ALLOW = {
    "src/text/hf_tokenizer.cpp": (
        1060,
        "one class (HfTokenizer) whose loading, encoding and decoding share its private tables "
        "(added-token trie, pre-tokenizer regex chain, merge ranks, word cache): splitting it "
        "would publish that class in an internal header and scatter one state machine over files"),
}


def check_lines(root, allow=None):
    allow = LINE_ALLOW if allow is None else allow
    errors = []
    seen = set()
    for top in LINE_DIRS:
        for path in walk_files(root, top, SOURCE_EXTS):
            rel = relpath(root, path)
            n = count_lines(path)
            if rel in allow:
                seen.add(rel)
                cap, _ = allow[rel]
                if n <= LINE_LIMIT:
                    errors.append(f"lines: {rel}: {n} lines, no longer over {LINE_LIMIT}: "
                                  f"remove its LINE_ALLOW entry in tests/python/ratchets.py")
                elif n > cap:
                    errors.append(f"lines: {rel}: {n} lines, over its allowance of {cap}: split it")
            elif n > LINE_LIMIT:
                errors.append(f"lines: {rel}: {n} lines, over {LINE_LIMIT}: split it by what it "
                              f"does (or, if it truly is one unit, allow-list it with the reason)")
    for rel in sorted(set(allow) - seen):
        errors.append(f"lines: {rel}: allow-listed but missing: remove its LINE_ALLOW entry")
    return errors


def count_lines(path):
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# ---- layers --------------------------------------------------------------------------------------

# Low to high: a file may include its own layer's headers and those of lower ranks. Layers of one
# rank are siblings that must not include each other (io and dist are separate libraries; so are
# the CPU and CUDA backends). text sits above io because hmla_text links hmla_io (tokenizer.json
# and corpora are read through it). oracles (float64 references) are test support: they may
# include core, and nothing in src/ or app/ may include them. bench/ is checked only as a target:
# the hmla binary links it and app/ includes its headers.
LAYERS = [
    # name, rank, directories (repository-relative)
    ("core", 0, ["include/hmla/core", "src/core"]),
    ("io", 1, ["include/hmla/io", "src/io"]),
    ("dist", 1, ["include/hmla/dist", "src/dist"]),
    ("oracles", 1, ["src/oracles"]),
    ("text", 2, ["include/hmla/text", "src/text"]),
    ("ops", 3, ["include/hmla/ops", "src/ops"]),
    ("cpu", 4, ["src/cpu"]),
    ("cuda", 4, ["src/cuda"]),
    ("data", 5, ["include/hmla/data", "src/data"]),
    ("model", 6, ["include/hmla/model", "src/model"]),
    ("train", 7, ["include/hmla/train", "src/train"]),
    ("cases", 4, ["tests/common"]),  # the op case registry: rows over the ops and backends (`hmla ops` reads it)
    ("bench", 8, ["bench"]),
    ("app", 9, ["app"]),
]
PRIVATE_LAYERS = {"oracles"}
LAYER_CHECKED = ("src", "include", "app")   # tests/ and bench/ are exempt as includers

# Quoted includes resolve against the including file's directory, then the extra include paths
# src/CMakeLists.txt and app/CMakeLists.txt give the directory's target, then include/, then the
# fallback directories, which any target may put on its path (hmla_oracles and hmla_bench export
# theirs): a header found only there is still judged by its layer, and one found nowhere fails.
EXTRA_INCLUDE_DIRS = {
    "src/ops": ["src/cpu"],      # hmla_ops compiles src/cpu/backend.cpp with src/cpu on its path
    "app": ["bench", "tests/common"],  # hmla links hmla_bench and hmla_cases, whose include directories are public
}
FALLBACK_INCLUDE_DIRS = ["src/oracles", "src/cpu", "src/cuda", "bench"]

# (including file, included path as written) -> why it may run against the order. An entry that
# matches no include any more fails.
LAYER_EXCEPTIONS = {}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def layer_of(rel):
    """The layer of a repository-relative path: the longest matching directory."""
    best = None
    for name, rank, dirs in LAYERS:
        for d in dirs:
            if rel == d or rel.startswith(d + "/"):
                if best is None or len(d) > best[2]:
                    best = (name, rank, len(d))
    return (best[0], best[1]) if best else None


def resolve_include(root, rel_file, inc, quoted):
    """The repository-relative path an include names, or None (a system or external header)."""
    if inc.startswith("hmla/"):
        return "include/" + inc
    if not quoted:
        return None
    d = os.path.dirname(rel_file)
    for base in [d] + EXTRA_INCLUDE_DIRS.get(d, []) + ["include"] + FALLBACK_INCLUDE_DIRS:
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand.replace(os.sep, "/")
    return None


def check_layers(root, exceptions=None):
    exceptions = LAYER_EXCEPTIONS if exceptions is None else exceptions
    errors = []
    used = set()
    for top in LAYER_CHECKED:
        for path in walk_files(root, top, SOURCE_EXTS + (".hpp", ".inl")):
            rel = relpath(root, path)
            mine = layer_of(rel)
            if mine is None:
                errors.append(f"layers: {rel}: its directory is in no layer: add it to LAYERS in "
                              f"tests/python/ratchets.py")
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            for no, line in enumerate(lines, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                inc = m.group(2)
                target = resolve_include(root, rel, inc, m.group(1) == '"')
                if target is None:
                    if m.group(1) == '"':
                        errors.append(f"layers: {rel}:{no}: \"{inc}\" is no file of the tree "
                                      f"(looked in its directory, include/ and the script's "
                                      f"include dirs)")
                    continue
                theirs = layer_of(target)
                if theirs is None:
                    errors.append(f"layers: {rel}:{no}: includes {inc} ({target}), which is in no "
                                  f"layer: add its directory to LAYERS")
                    continue
                why = None
                if theirs[0] == mine[0]:
                    continue
                if theirs[0] in PRIVATE_LAYERS:
                    why = f"{theirs[0]} is test support, not to be included by {mine[0]}"
                elif theirs[1] == mine[1]:
                    why = f"{mine[0]} and {theirs[0]} are sibling layers"
                elif theirs[1] > mine[1]:
                    why = f"{mine[0]} is below {theirs[0]}"
                if why is None:
                    continue
                if (rel, inc) in exceptions:
                    used.add((rel, inc))
                    continue
                errors.append(f"layers: {rel}:{no}: includes {inc}: {why} "
                              f"(order: {layer_order()})")
    for rel, inc in sorted(set(exceptions) - used):
        errors.append(f"layers: exception ({rel}, {inc}) matches no violating include: remove it "
                      f"from LAYER_EXCEPTIONS")
    return errors


def layer_order():
    ranks = {}
    for name, rank, _ in LAYERS:
        ranks.setdefault(rank, []).append(name)
    return " < ".join("/".join(ranks[r]) for r in sorted(ranks))


# ---- docs ----------------------------------------------------------------------------------------

DOC_FILES = ["README.md", "docs/*.md"]
# Where a code identifier must occur (as a whole word) to exist.
IDENT_DIRS = ["src", "include", "app", "python", "scripts", "tests", "bench", "configs", "examples",
              ".ci", "CMakeLists.txt", "CMakePresets.json", "Makefile"]
# A path's first component that names the repository (anything else, e.g. megatron/core/... or
# linear_fwd/bwd, is not a path of this tree); hmla/ is an include path, checked under include/.
REPO_TOPS = {"src", "include", "app", "tests", "bench", "configs", "scripts", "python", "examples",
             "docs", "data", "cmake", ".ci", "hmla"}
# ... or a directory of src/ (ops/attention.cpp), resolved under src/ and include/hmla/.
SRC_TOPS = {"core", "io", "dist", "text", "oracles", "ops", "cpu", "cuda", "data", "model", "train"}
# First components of what a run or a build writes, or of placeholders: never checked.
OUTPUT_TOPS = {"runs", "build", "checkpoints", "tmp"}
# File names checked by basename anywhere in the tree when written without a directory; data
# files (config.json, metrics.jsonl, *.safetensors) written bare are run outputs or user inputs.
CODE_EXTS = (".cpp", ".h", ".hpp", ".cu", ".cuh", ".py", ".sh", ".md", ".cmake")
# Outside backticks, only paths under the tree's own top directories are checked.
PROSE_PATH_RE = re.compile(r"(?<![\w/.~$<{-])((?:src|include|app|tests|bench|configs|scripts|python"
                           r"|examples|docs|data|\.ci)/[\w.*<>/+-]*[\w*>/])")

# Identifiers the docs cite from other code bases (the references hmla matches), or that a doc
# defines itself: word -> where it lives. An entry the code now holds, or that no doc cites, fails.
DOC_EXCEPTIONS = {
    "DSAttention": "Megatron-LM's DSA attention module (docs/indexer.md: its indexer loss)",
    "skip_topk": "a field of Megatron-LM's DSAttention (docs/indexer.md)",
    "use_indexer_loss": "a field of Megatron-LM's DSAttention (docs/indexer.md)",
    "computes_topk": "a field of Megatron-LM's DSAttention (docs/indexer.md)",
    "fp32_residual_connection": "Megatron-LM's option for an f32 residual stream (docs/cuda.md)",
    "prev_topk_indices": "transformers' GlmMoeDsa: the selection passed on (docs/indexer.md)",
    "DeepseekV32Experts": "a transformers 5.24 module, the experts hmla matches (docs/moe.md)",
    "DeepseekV32MLP": "a transformers 5.24 module, the shared expert hmla matches (docs/moe.md)",
    "GlmMoeDsaMoE": "transformers 5.24's GLM-5 MoE module (docs/moe.md)",
    "topk_weights": "a variable of transformers' DeepseekV32MoE routing (docs/moe.md)",
    "rope_I": "the indexer's RoPE as docs/indexer.md's formula names it (a math name)",
}

# Files CMake generates into the build tree (cmake/op_families.cmake), as the docs name them.
GENERATED_FILES = {"hmla/ops/op_families.h", "op_families.h", "case_tables.h"}

IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SNAKE_RE = re.compile(r"^_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*$")
CAMEL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[a-z0-9][A-Z]|[A-Z]{2}[a-z])[A-Za-z0-9]*$")
TYPE_RE = re.compile(r"^[A-Z][a-z]+[a-z0-9]*$")                   # Tensor, Mlp, Comm
PLACEHOLDER_RE = re.compile(r"<[^<>/]*>|\{[^{}/]*\}")


def code_spans(text):
    """(line, content) of every inline code span outside fenced blocks, (line, text) of every
    fenced line (for the source-tree listing) and of every other line (prose)."""
    spans, fenced = [], []
    out_lines = []
    fence = None
    for no, line in enumerate(text.split("\n"), 1):
        s = line.lstrip()
        if fence is None and (s.startswith("```") or s.startswith("~~~")):
            fence = s[:3]
            out_lines.append("")
            continue
        if fence is not None:
            if s.startswith(fence):
                fence = None
            else:
                fenced.append((no, line))
            out_lines.append("")
            continue
        out_lines.append(line)
    prose = [(no, line) for no, line in enumerate(out_lines, 1) if line]
    body = "\n".join(out_lines)
    starts = [0]
    for m in re.finditer("\n", body):
        starts.append(m.end())
    # Backtick runs of equal length delimit a span (CommonMark); a span may wrap a line but not a
    # paragraph.
    for m in re.finditer(r"(`+)(?!`)((?:(?!\n\s*\n).)+?)(?<!`)\1(?!`)", body, re.S):
        content = m.group(2).replace("\n", " ")
        if m.group(1) != "`":
            content = content.strip()
        line = bisect_right(starts, m.start())
        spans.append((line, content))
    return spans, fenced, prose


def bisect_right(a, x):
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


class Tree:
    def __init__(self, root):
        self.root = root
        self._names = None
        self._words = None

    def basenames(self):
        if self._names is None:
            self._names = set()
            for path in walk_files(self.root, ".", None):
                self._names.add(os.path.basename(path))
        return self._names

    def words(self):
        if self._words is None:
            self._words = set()
            for top in IDENT_DIRS:
                p = os.path.join(self.root, top)
                paths = [p] if os.path.isfile(p) else walk_files(self.root, top, None)
                for path in paths:
                    if relpath(self.root, path) == SELF:
                        # This script's tables name what the code lacks: only its own top-level
                        # names (LINE_ALLOW, check_docs) count.
                        with open(path, encoding="utf-8") as f:
                            self._words.update(re.findall(r"^(?:def |class )?([A-Za-z_]\w*)",
                                                          f.read(), re.M))
                        continue
                    try:
                        if os.path.getsize(path) > 8 << 20:
                            continue
                        with open(path, "rb") as f:
                            data = f.read()
                    except OSError:
                        continue
                    if b"\0" in data[:4096]:
                        continue
                    self._words.update(IDENT_RE.findall(data.decode("utf-8", "replace")))
        return self._words

    def path_exists(self, token, doc_dir):
        if token in GENERATED_FILES:
            return True
        pattern = PLACEHOLDER_RE.sub("*", token).rstrip("/")
        bases = [self.root, os.path.join(self.root, doc_dir)]
        first = token.split("/", 1)[0]
        if first == "hmla":
            bases = [os.path.join(self.root, "include")]
        elif first in SRC_TOPS:
            bases += [os.path.join(self.root, "src"), os.path.join(self.root, "include", "hmla")]
        for base in bases:
            full = os.path.join(base, pattern)
            if any(ch in pattern for ch in "*?["):
                if glob.glob(full):
                    return True
            elif os.path.exists(full):
                return True
        return False


def classify_path(token):
    """The part of a code span to check as a repository path, or None when it is no path."""
    t = token
    if " " in t:
        # A command: check its program when that is a path of the tree (scripts/device-check ...).
        t = t.split(" ", 1)[0]
        if "/" not in t:
            return None
    if re.search(r"[()=$~,|;\"'\\]|://|^[-/]|^\.{1,2}(/|$)", t) or "..." in t:
        return None
    if "/" in t:
        first = t.split("/", 1)[0]
        if first in OUTPUT_TOPS or first.startswith("build-"):
            return None
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", first):      # DIR/..., PREFIX/..., CKPT/...
            return None
        return t if first in REPO_TOPS or first in SRC_TOPS else None
    base = PLACEHOLDER_RE.sub("x", t)
    if base.endswith(CODE_EXTS) and re.fullmatch(r"[\w.*-]+", base):
        return t
    return None


def looks_like_code(word):
    return bool(SNAKE_RE.match(word) or CAMEL_RE.match(word) or TYPE_RE.match(word))


def identifiers(token):
    """The identifiers of a code span that must occur in the code (possibly none): snake_case,
    CamelCase or Capitalized words, `A::b` and `f()` (every part), the function of `f(args)` and
    of `x = f(args)`, the name of `class X` / `namespace a::b`, the key of `key: value`, the
    variable of `NAME=value`. Plain lowercase words, flags, formulas and commands are prose."""
    t = token.strip()
    m = re.fullmatch(r"(?:class|struct|enum class|namespace) ([A-Za-z_][\w:]*)", t)
    if m:
        return [p for p in m.group(1).split("::") if p]
    m = re.fullmatch(r"([a-z_][a-z0-9_]*): (\S+)", t)            # a YAML key and its value
    if m:
        return [w for w in m.groups() if SNAKE_RE.match(w)]
    m = re.fullmatch(r"([A-Z][A-Z0-9_]*)=\S*", t)                 # an environment assignment
    if m:
        return [m.group(1)] if "_" in m.group(1) else []
    m = re.fullmatch(r"(?:[\w, ]+ = )?([A-Za-z_][\w:.]*)\((.*)\)", t)
    if m and "(" not in m.group(2):
        name, args = m.groups()
        parts = [p for p in re.split(r"::|\.", name) if p]
        if args == "" or "::" in name:
            return parts                                           # f(), A::f(), A::f(args)
        return [p for p in parts if looks_like_code(p)]
    if " " in t or not t:
        return []
    parts = re.split(r"::|\.", t)
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts if p):
        return []
    parts = [p for p in parts if p]
    if "::" in t:
        return parts
    return [p for p in parts if looks_like_code(p)]


def check_docs(root, exceptions=None):
    exceptions = DOC_EXCEPTIONS if exceptions is None else exceptions
    errors = []
    tree = Tree(root)
    used = set()
    docs = []
    for pat in DOC_FILES:
        docs.extend(sorted(glob.glob(os.path.join(root, pat))))
    for doc in docs:
        rel = relpath(root, doc)
        doc_dir = os.path.dirname(rel)
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        spans, fenced, prose = code_spans(text)
        items = [(no, s, "span") for no, s in spans]
        # A path of the tree in prose (outside backticks): src/..., docs/..., scripts/...
        for no, line in prose:
            for m in PROSE_PATH_RE.finditer(re.sub(r"`[^`]*`", "", line)):
                items.append((no, m.group(1), "prose"))
        # A fenced line that starts with a path: the source-tree listing ("src/ops   the ..."),
        # a command's program (scripts/device-check --rehearse).
        for no, line in fenced:
            m = re.match(r"^(\S+/\S*)(?:\s|$)", line)
            if m:
                items.append((no, m.group(1), "listing"))
        for no, token, kind in items:
            path = classify_path(token)
            if path is not None:
                if "/" in path:
                    ok = tree.path_exists(path, doc_dir)
                else:
                    pat = PLACEHOLDER_RE.sub("*", path)
                    ok = path in GENERATED_FILES or any(fnmatch.fnmatchcase(n, pat) for n in tree.basenames())
                if not ok:
                    shown = token if kind == "prose" else f"`{token}`"
                    errors.append(f"docs: {rel}:{no}: {shown}: no such path in the tree")
                continue
            if kind != "span":
                continue                          # only code spans name identifiers
            missing = []
            for w in identifiers(token):
                if w in exceptions:
                    used.add(w)
                elif w not in tree.words():
                    missing.append(w)
            if missing:
                errors.append(f"docs: {rel}:{no}: `{token}`: {', '.join(missing)} occurs in no "
                              f"file of {' '.join(IDENT_DIRS)}")
    for w in sorted(exceptions):
        if w not in used:
            errors.append(f"docs: DOC_EXCEPTIONS has `{w}`, which no doc cites: remove the entry")
        elif w in tree.words():
            errors.append(f"docs: DOC_EXCEPTIONS has `{w}`, which the code now holds: remove "
                          f"the entry")
    return errors


# ---- common --------------------------------------------------------------------------------------

SELF = "tests/python/ratchets.py"
SKIP_DIRS = {".git", "__pycache__", "node_modules", "runs"}


def walk_files(root, top, exts):
    root = os.path.normpath(root)
    base = os.path.normpath(os.path.join(root, top))
    for d, subdirs, files in os.walk(base):
        subdirs[:] = sorted(s for s in subdirs
                            if s not in SKIP_DIRS and not re.fullmatch(r"build(-.*)?", s)
                            and not (d == root and s.startswith(".") and s != ".ci")
                            and not s.endswith(".egg-info"))
        for name in sorted(files):
            if exts is None or name.endswith(exts):
                yield os.path.join(d, name)


def relpath(root, path):
    return os.path.relpath(path, root).replace(os.sep, "/")


CHECKS = {"lines": check_lines, "layers": check_layers, "docs": check_docs}


def run(root, names):
    errors = []
    for name in names:
        errors.extend(CHECKS[name](root))
    return errors


# ---- self-test -----------------------------------------------------------------------------------

def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# The self-test's own tables, so it does not depend on the tree's.
TEST_LINE_ALLOW = {"src/text/one_state_machine.cpp": (700, "planted")}
TEST_DOC_EXCEPTIONS = {"external_name_abc": "planted"}


def clean_tree(root):
    write(root, "include/hmla/core/tensor.h", "// A tensor.\nstruct Tensor { int real_field; };\n")
    write(root, "include/hmla/model/model.h",
          '// A model.\n#include "hmla/core/tensor.h"\nstruct Model {};\n')
    write(root, "include/hmla/ops/nn.h", "// ops\n")
    write(root, "src/core/tensor.cpp", '#include "hmla/core/tensor.h"\n' + "int x;\n" * 499)
    write(root, "src/model/model.cpp",
          '#include "hmla/model/model.h"\n#include "model_internal.h"\n#include <vector>\n')
    write(root, "src/model/model_internal.h", '#include "hmla/core/tensor.h"\n')
    write(root, "src/cpu/backend.cpp", '#include "cpu_kernels.h"\n#include "hmla/ops/nn.h"\n')
    write(root, "src/cpu/cpu_kernels.h", "// kernels\n")
    write(root, "src/text/one_state_machine.cpp", "int y;\n" * 600)
    write(root, "app/main.cpp", '#include "bench_util.h"\n#include "hmla/model/model.h"\n')
    write(root, "bench/bench_util.h", "// bench\n")
    write(root, "scripts/tool", "#!/bin/sh\n")
    write(root, "docs/intro.md",
          "See `src/core/tensor.cpp`, `include/hmla/core/*.h`, `hmla/model/model.h`,\n"
          "`tensor.cpp`, `Tensor::real_field`, `real_field`, `runs/demo/metrics.jsonl`,\n"
          "`--some-flag`, `S = Q K^T`, `megatron/core/x.py`, `external_name_abc`;\n"
          "`scripts/tool --x` runs, `src/cpu/<file>.cpp`, `ops/nn.h`... no: `cpu/backend.cpp`.\n"
          "```\nsrc/core   the core\n```\n")
    write(root, "README.md", "hmla: `docs/intro.md`, `Model`.\n")


def expect(failures, what, errs, *needles):
    for needle in needles:
        if not any(needle in e for e in errs):
            failures.append(f"{what}: expected a line with {needle!r}, got {errs}")


def self_test():
    failures = []

    def checks(root):
        return {"lines": check_lines(root, TEST_LINE_ALLOW),
                "layers": check_layers(root, {}),
                "docs": check_docs(root, TEST_DOC_EXCEPTIONS)}

    with tempfile.TemporaryDirectory() as tmp:
        def tree(name, *plants):
            root = os.path.join(tmp, name)
            clean_tree(root)
            for rel, text in plants:
                write(root, rel, text)
            return root

        root = tree("clean")
        errs = sum(checks(root).values(), [])
        if errs:
            failures.append("a clean tree fails:\n  " + "\n  ".join(errs))

        # One planted violation per check, each reported.
        root = tree("lines", ("src/model/big.cpp", "int z;\n" * 501))
        expect(failures, "lines", checks(root)["lines"], "src/model/big.cpp: 501 lines")
        root = tree("layers", ("src/core/bad.cpp", '#include "hmla/model/model.h"\n'))
        expect(failures, "layers", checks(root)["layers"],
               "src/core/bad.cpp:1: includes hmla/model/model.h: core is below model")
        root = tree("docs", ("docs/stale.md", "Lives in `src/no/such_file.cpp`;\ncalls\n"
                                              "`no_such_identifier_xyz` (see tests/gone.py).\n"
                                              "```\nsrc/gone   a listing's line\n```\n"))
        expect(failures, "docs", checks(root)["docs"], "docs/stale.md:1: `src/no/such_file.cpp`",
               "docs/stale.md:3: `no_such_identifier_xyz`", "docs/stale.md:3: tests/gone.py",
               "docs/stale.md:5: `src/gone`")

        # The allow-lists cannot go stale: a shrunk or grown allow-listed file fails, and so do
        # an exception no include or doc needs any more.
        root = tree("allow", ("src/text/one_state_machine.cpp", "int y;\n" * 10))
        expect(failures, "lines (shrunk)", checks(root)["lines"], "remove its LINE_ALLOW entry")
        root = tree("allow_cap", ("src/text/one_state_machine.cpp", "int y;\n" * 701))
        expect(failures, "lines (grown)", checks(root)["lines"], "over its allowance of 700")
        root = tree("stale_exceptions", ("docs/intro.md", "Nothing cited.\n"))
        expect(failures, "layers (stale)", check_layers(root, {("src/core/x.cpp", "y.h"): "why"}),
               "matches no violating include")
        expect(failures, "docs (stale)", checks(root)["docs"], "`external_name_abc`, which no doc")

        # Siblings, private layers, backends' private headers, unknown directories.
        root = tree("siblings", ("src/cuda/k.cu", '#include "../cpu/cpu_kernels.h"\n'),
                    ("src/ops/o.cpp", '#include "attn_dense_ref.h"\n#include "cpu_kernels.h"\n'),
                    ("src/oracles/attn_dense_ref.h", "// ref\n"),
                    ("src/dist/d.cpp", '#include "hmla/io/paths.h"\n'),
                    ("src/newdir/n.cpp", "// unlisted\n"),
                    ("src/train/t.cpp", '#include "missing.h"\n'))
        expect(failures, "layers (siblings)", checks(root)["layers"],
               "src/cuda/k.cu:1: includes ../cpu/cpu_kernels.h: cuda and cpu are sibling",
               "src/ops/o.cpp:1: includes attn_dense_ref.h: oracles is test support",
               "src/ops/o.cpp:2: includes cpu_kernels.h: ops is below cpu",
               "src/dist/d.cpp:1: includes hmla/io/paths.h: dist and io are sibling",
               "src/newdir/n.cpp: its directory is in no layer",
               "src/train/t.cpp:1: \"missing.h\" is no file of the tree")
    for f in failures:
        print("self-test: " + f)
    print("self-test: " + ("FAILED" if failures else "ok"))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description="Ratchets on the tree's shape: lines, layers, docs.")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", ".."))
    ap.add_argument("--check", choices=sorted(CHECKS), action="append",
                    help="run only this check (repeatable); default: all")
    ap.add_argument("--self-test", action="store_true",
                    help="plant one violation per check in a scratch tree and expect each reported")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    names = args.check or list(CHECKS)
    errors = run(root, names)
    for e in errors:
        print(e)
    print(f"ratchets ({', '.join(names)}): "
          + (f"{len(errors)} violation(s)" if errors else "ok"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
