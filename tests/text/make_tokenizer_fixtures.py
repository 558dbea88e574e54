#!/usr/bin/env python3
"""Writes the tokenizer fixtures of tests/text/test_tokenizer.cpp with Hugging Face `tokenizers`.

Needs tokenizers==0.23.3 (the version the committed fixtures record; another version fails here):
    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3
    /tmp/tokvenv/bin/python tests/text/make_tokenizer_fixtures.py

Trains small byte-level BPE tokenizers on the demo corpus (data/demo/train.safetensors, the fortunes
as byte ids + 3) plus tests/text/fixtures/multilingual.txt, with the layouts DeepSeek-V3/V3.2 and
GLM-4.5/GLM-5 ship (their pre-tokenizer regexes, special tokens and post-processors), a variant that
covers NFKC, ignore_merges, "a b" merges and added-token flags, one with every Split behaviour and a
BPE that is not byte-level (subword prefix and suffix, unk, byte_fallback).
Each case is a directory tests/text/fixtures/<case>/ with tokenizer.json, the eos beside it and
expected.json: for every text (given as hex bytes; invalid UTF-8 is encoded as its
bytes.decode("utf-8", errors="replace")) the ids with and without add_special, the decodes and
whether decode(encode(x)) == x.
"""
import json
import os
import struct
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

PINNED = "0.23.3"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(HERE, "fixtures")

# DeepSeek-V3's tokenizer.json pre_tokenizer (three Isolated Splits, then ByteLevel without its regex).
DS_DIGITS = r"\p{N}{1,3}"
DS_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
DS_MAIN = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
           r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GLM-4.5/GLM-5's (one Isolated Split, then ByteLevel without its regex).
GLM_MAIN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")
# The pre_tokenizer exactly as DeepSeek-V3/V3.2's released tokenizer.json writes it (field order and the
# ByteLevel's trim_offsets included); their normalizer is an empty Sequence, their decoder ByteLevel.
DS_RELEASED_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": DS_DIGITS}, "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex": DS_CJK}, "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex": DS_MAIN}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
DS_BOS, DS_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
GLM_SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
               "<|assistant|>", "<|observation|>", "<think>", "</think>"]


def demo_texts():
    with open(os.path.join(ROOT, "data", "demo", "train.safetensors"), "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    a, b = head["tokens"]["data_offsets"]
    ids = struct.unpack(f"<{(b - a) // 4}i", blob[8 + n + a:8 + n + b])
    docs, cur = [], bytearray()
    for i in ids:
        if i >= 3:
            cur.append(i - 3)
        elif i == 2 and cur:
            docs.append(cur.decode("utf-8", errors="replace"))
            cur = bytearray()
    return docs


def multilingual():
    with open(os.path.join(FIX, "multilingual.txt"), encoding="utf-8", newline="") as f:
        return f.read()


def train(pre, special, vocab_size, normalizer=None, extra=()):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = demo_texts()[:1500] + [multilingual()] * 20 + list(extra)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


TEXTS = [
    "Hello, world!", " leading space", "trailing space ", "", " ", "\n", "a",
    "It's the cat's toy; they'll say we've I'd YOU'RE don'T it'ſ",
    "中文：今天天气很好，我们去公园散步吧。", "東京はラーメンとひらがな、カタカナ。", "안녕하세요 반갑습니다",
    "مرحبا بالعالم ١٢٣", "שלום עולם", "नमस्ते दुनिया क्षत्रिय कृष्ण",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 ❤️‍🔥", "e\u0301 a\u0300 Å A\u030a ﬁ ２０２４ ① Ⅻ ｶﾀｶﾅ",
    "def f(x):\n    return x**2 + 1\n\n\tif (a && b) { printf(\"%d\\n\", a[i]); }",
    "3.14159265358979 1234567890 12 123 1234 ١٢٣٤ ²³",
    "two  spaces   three    four\t\ttabs \u00a0nbsp\u3000ideo \u0085nel \u2028ls end  ",
    "line one\r\nline two\r\n\r\n\n\nafter", "   \n\n   \t  ",
    "x-y-z a::b::c foo--bar ::lead trail:: 1a2b33c",
    "Q: What? A: Nothing. -- fortune(6)",
]


# Code points Unicode assigned after 14.0 (PCRE2 10.42's version) and by 16.0 (tokenizers'), in the
# classes the Split regexes test: letters (Cyrillic TJE U+1C89, Kawi, Todhri, CJK Ext. H and I, a
# modifier letter), marks (Kannada U+0CF3, Arabic U+0897), digits (Kawi and Garay Nd beside ASCII
# digits, Kaktovik No), punctuation (Kawi, Balinese, Garay hyphen) and symbols (emoji 15/16, an
# ideographic description character, a Garay math sign). src/text/unicode_recent_table.cpp has them all.
POST14 = [
    "a\u1c89b \u1c8a\u1c89x \U00011f04\U00011f05 \U000105c0\U000105c1 \U00031350\U0002ebf0\u4e00 x\U0001e030y",
    "ka\u0cf3 \u0897\u0628 q\u0897 \U00011f04\U00011f3e",
    "12\U00011f51\U00011f523 \U00011f50\U00011f51\U00011f52\U00011f53 7\U00010d40\U00010d41 \U0001d2c0\U0001d2c19",
    "x\U00011f43y \U00011f43\U00011f44 \u1b4e\u1b4f. a\U00010d6eb",
    "\U0001fae8 \U0001fa77\U0001fa77! \U0001fa89 \u2ffc\u2ffd \U00010d8e1 \u31e4 hi\U0001fae8\n",
]


def special_texts(specials):
    s = specials
    return [f"{s[0]}Hello{s[1]}", f"pre {s[0]} mid {s[-1]}post", f"{s[0]}{s[0]}", s[0][:-1],
            f"a{s[0]}b {s[-1]}\n", f"{s[-1]}"]


INVALID = [b"ab\xffcd", b"\xc3\x28 bad", b"\xe2\x82 cut", b"\xf0\x9f\x98", b"\xed\xa0\x80 surrogate",
           b"\xc0\xaf overlong", b"ok \xf4\x90\x80\x80 big", b"\x80\x80\x80", "tail é".encode() + b"\xe9"]


def expected(tok, texts):
    rows = []
    for t in texts:
        raw = t if isinstance(t, bytes) else t.encode("utf-8")
        text = raw.decode("utf-8", errors="replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        dec = tok.decode(ids, skip_special_tokens=False)
        rows.append({"hex": raw.hex(), "ids": ids, "ids_special": ids_special, "decoded": dec,
                     "decoded_skip": tok.decode(ids, skip_special_tokens=True), "roundtrip": dec == text})
    return rows


def write_case(name, tok_json, texts, config=None, tokenizer_config=None, edit=None):
    d = os.path.join(FIX, name)
    os.makedirs(d, exist_ok=True)
    spec = json.loads(tok_json)
    if edit:
        edit(spec)
    path = os.path.join(d, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False, separators=(",", ":"))
    tok = Tokenizer.from_file(path)  # expected ids come from the file as written, edits included
    for fname, obj in (("tokenizer_config.json", tokenizer_config), ("config.json", config)):
        if obj is not None:
            with open(os.path.join(d, fname), "w", encoding="utf-8") as f:
                json.dump(obj, f, ensure_ascii=False)
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": tokenizers.__version__, "case": name, "texts": expected(tok, texts)}, f,
                  ensure_ascii=False, separators=(",", ":"))
    print(name, os.path.getsize(path), "bytes,", tok.get_vocab_size(), "tokens")


def main():
    if tokenizers.__version__ != PINNED:
        sys.exit(f"tokenizers {tokenizers.__version__}: the fixtures are made with {PINNED}")
    ml = multilingual().split("\n")

    # (a) DeepSeek-V3/V3.2.
    ds_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(DS_DIGITS), "isolated", invert=False),
        pre_tokenizers.Split(Regex(DS_CJK), "isolated", invert=False),
        pre_tokenizers.Split(Regex(DS_MAIN), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train(ds_pre, [DS_BOS, DS_EOS], 2000, normalizer=normalizers.Sequence([]))
    tok.post_processor = processors.TemplateProcessing(single=f"{DS_BOS} $A", pair=f"{DS_BOS} $A {DS_BOS} $B",
                                                       special_tokens=[(DS_BOS, tok.token_to_id(DS_BOS))])
    write_case("deepseek_v3", tok.to_str(), TEXTS + ml + special_texts([DS_BOS, DS_EOS]) + INVALID + POST14,
               tokenizer_config={"eos_token": {"content": DS_EOS, "lstrip": False}})

    # (f) DeepSeek-V3.2/V4's layout as released: the pre_tokenizer, normalizer and decoder JSON above,
    # merges as "a b" strings and no ignore_merges (older files), a pad and non-special <think> tokens,
    # a ByteLevel post-processor (no bos), and no tokenizer_config.json or config.json beside it: hmla
    # tokenize needs no eos without --add-special.
    # Its BPE also learns the POST14 texts, so that its merges span their new code points: a split that
    # PCRE2 makes and tokenizers does not (or the reverse) then changes the ids.
    tok = train(ds_pre, [DS_BOS, DS_EOS, "<｜▁pad▁｜>"], 2000, normalizer=normalizers.Sequence([]),
                extra=POST14 * 200)
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])

    def edit_f(spec):
        spec["normalizer"] = {"type": "Sequence", "normalizers": []}
        spec["pre_tokenizer"] = DS_RELEASED_PRE
        spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                                  "use_regex": True}
        spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
        spec["model"].pop("ignore_merges", None)
    write_case("deepseek_v4", tok.to_str(), TEXTS + ml + special_texts([DS_BOS, "<think>", "</think>", DS_EOS])
               + INVALID + POST14, edit=edit_f)

    # (b) GLM-4.5/GLM-5.
    glm_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM_MAIN), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train(glm_pre, GLM_SPECIAL, 2000)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="[gMASK] <sop> $A", pair="[gMASK] <sop> $A $B",
                                      special_tokens=[("[gMASK]", tok.token_to_id("[gMASK]")),
                                                      ("<sop>", tok.token_to_id("<sop>"))])])
    write_case("glm", tok.to_str(), TEXTS + ml + special_texts(["[gMASK]", "<sop>", "<|user|>"]) + INVALID + POST14,
               tokenizer_config={"eos_token": "<|endoftext|>"})

    # (c) NFKC, GPT-2's regex through ByteLevel(use_regex), ignore_merges, "a b" merges, added-token flags;
    # the eos from config.json's eos_token_id.
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), ["<|eos|>"], 1000,
                normalizer=normalizers.NFKC())
    tok.add_tokens([AddedToken("<tool>", single_word=False, lstrip=True, rstrip=True, normalized=False),
                    AddedToken("word", single_word=True, lstrip=False, rstrip=False, normalized=True),
                    AddedToken("ＡＢ", single_word=False, lstrip=False, rstrip=True, normalized=True)])

    def edit_c(spec):
        spec["model"]["ignore_merges"] = True
        spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
    texts_c = TEXTS + ml + ["use <tool>  now", "a  <tool>b", "<tool><tool>", "word words sword a word.",
                            "_word word_ (word)", "ＡＢ  AB  x", "ＡＢC"] + INVALID
    write_case("nfkc_ignore_merges", tok.to_str(), texts_c, config={"eos_token_id": tok.token_to_id("<|eos|>")},
               edit=edit_c)

    # (d) every Split behaviour and invert, on the (c) model; its eos is passed to load_tokenizer.
    def edit_d(spec):
        spec["normalizer"] = {"type": "NFC"}
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "::"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": r"\p{N}"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"Regex": r"\p{L}+"}, "behavior": "Isolated", "invert": True},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}
        spec["model"]["ignore_merges"] = False
        spec["post_processor"] = None
    write_case("split_behaviours", tok.to_str(), TEXTS + ml[:4] + INVALID[:3], edit=edit_d)

    # (e) a BPE that is not byte-level: continuing_subword_prefix, end_of_word_suffix, unk_token with
    # fuse_unk, byte_fallback (byte tokens for 0x00-0xDF only: three- and four-byte characters are unk),
    # no decoder (tokens joined by spaces).
    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>",
                               fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), "removed")
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "</s>"], limit_alphabet=60,
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>", show_progress=False)
    tok.train_from_iterator(demo_texts()[:800] + [multilingual()] * 5, trainer=trainer)

    def edit_e(spec):
        vocab = spec["model"]["vocab"]
        top = max(vocab.values())
        for b in range(0xE0):
            vocab.setdefault(f"<0x{b:02X}>", top + 1 + b)
        spec["decoder"] = None
    write_case("bpe_prefix_fallback", tok.to_str(), TEXTS + ml + INVALID[:3], tokenizer_config={"eos_token": "</s>"},
               edit=edit_e)


if __name__ == "__main__":
    main()
