"""Krafla tokenizers vs. Hugging Face `tokenizers` (the oracle) on the real SmolLM2 and Gemma 3
vocabularies, plus converter checks.

The Rust side runs through `shared/examples/tokenize_cases.rs` (one process per case file, cases
as hex lines, results as JSON lines), so the whole module takes a few seconds once built.
"""
import json
import random
import sys

import pytest

from conftest import FIXTURES, import_tokenizer, run_ml

tokenizers = pytest.importorskip("tokenizers")

NAMES = ("smollm2", "gemma3")

LONG_PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. " * 20
    + "In 1969, Apollo 11 landed on the Moon; Neil Armstrong's words were heard by ~600,000,000 "
      "people. It's remarkable, isn't it? We'll never forget what they'd done -- they've shown "
      "what humans can do. "
    + "Götterdämmerung, façade, jalapeño, smörgåsbord, crème brûlée, Ærøskøbing. " * 4
    + "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다. " * 3
    + "Emoji time: 😀😃😄😁 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇮🇸 " * 3
    + "\n\n" + "Numbers: " + " ".join(str(i * 7919) for i in range(60)) + ".\n"
)
assert len(LONG_PARAGRAPH) > 2000

CODE = '''\
fn main() {
    let v: Vec<u32> = (0..10).map(|x| x * x).collect();
    println!("{:?}", v); // squares
}

def f(x, *args, **kw):
\tif x >= 0x1F and not kw.get('y'):
\t\treturn [i for i in range(x)]  # comment
    return {"a": 1, 'b': None}
'''

CASES = [
    "", " ", "  ", "a", "Hello world!", "Hello, World! How are you today?",
    "The cat sat on the mat.", "  leading spaces", "trailing spaces   ", "   ",
    "tabs\tin\t\ttext\t", "new\nlines\n", "\n", "\n\n\n", "\n \n  \n", "a\n\n\nb",
    " \t\n\r\n mixed \u00a0 whitespace \u3000 end", "line\r\nwindows\r\n",
    "12345", "3.14159265358979", "1,000,000 and 9876543210123456789", "2024-01-31T12:34:56Z",
    "I'm, you're, he's, we've, they'll, she'd, can't, don't",
    "I'M YOU'RE HE'S WE'VE THEY'LL SHE'D CAN'T", "rock 'n' roll's 'quoted' words''",
    "Punctuation!!! ... ??? ;;; ::: --- ___ ((())) [[]] {{}} <<>> @#$%^&*",
    "naïve café résumé Ångström Ελληνικά Русский текст",
    "日本語のテキスト、中文文本。한국어 텍스트", "ภาษาไทย हिन्दी العربية עברית",
    "😀 emoji 👍🏽 and ZWJ 👨‍👩‍👧‍👦 flags 🇺🇸🇯🇵 🏳️‍🌈",
    "mixed: hello世界мир123abc🙂!",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|>", "<|im_start|><|im_start|>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>inline bos<eos>", "<unk> <pad> <mask>", "<s>html strike</s> <b>bold</b>",
    "almost special <|im_start and <start_of_turn", "<|im_start|>", "<end_of_turn>",
    "\u2581already metaspace\u2581\u2581", "ĠĊ gpt2 chars", "<0x41> literal byte token text",
    "\u200b zero width \ufeff bom \u00ad soft hyphen", "\x00 nul \x07 bell \x1b[0m",
    "ﬁ ligature Ⅻ roman ½ fraction ² superscript",
    "abc1234567def 12 123 1234", "end!!!\n\n  next ...\r\n\r\nx", "HELLO'S it'S 'LL",
    LONG_PARAGRAPH, CODE,
]


def random_texts(hf, n, seed):
    """Fuzz texts: concatenations of decoded random vocabulary entries and punctuation."""
    rng = random.Random(seed)
    size = hf.get_vocab_size()
    texts = []
    for _ in range(n):
        ids = [rng.randrange(size) for _ in range(rng.randrange(1, 40))]
        parts = [hf.decode([i]) for i in ids]
        seps = ["", " ", "\n", "  ", "'s", "1", "."]
        texts.append("".join(p + rng.choice(seps) for p in parts))
    return texts


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

def tokenizer_json(name):
    return FIXTURES / "tokenizers" / name / "tokenizer.json"


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """name -> .mlt converted from the fixture tokenizer.json."""
    out = {}
    for name in NAMES:
        mlt = tmp_path_factory.mktemp(name) / "tokenizer.mlt"
        import_tokenizer(tokenizer_json(name), mlt)
        out[name] = mlt
    return out


@pytest.fixture(scope="session")
def from_gguf(tmp_path_factory, smollm2_gguf, gemma3_gguf):
    """name -> .mlt the executable made from the model's own GGUF (`--save-tokenizer`)."""
    out = {}
    for name, gguf in (("smollm2", smollm2_gguf), ("gemma3", gemma3_gguf)):
        mlt = tmp_path_factory.mktemp(f"{name}-gguf") / "tokenizer.mlt"
        run_ml(gguf, "--save-tokenizer", mlt, "-p", "x", "--tokenize")
        out[name] = mlt
    return out


@pytest.fixture(scope="session")
def oracle():
    return {name: tokenizers.Tokenizer.from_file(str(tokenizer_json(name))) for name in NAMES}


def encode_lines(texts):
    return [f"E {flag} {t.encode('utf-8').hex()}" for t in texts for flag in (0, 1)]


def text_of(result, key="decoded"):
    return bytes.fromhex(result[key]).decode("utf-8", errors="replace")


def check_against_oracle(hf, texts, results):
    """Compare encode (both add_special settings), decode and streamed decode."""
    failures = []
    it = iter(results)
    for text in texts:
        for add_special in (False, True):
            got = next(it)
            want = hf.encode(text, add_special_tokens=add_special).ids
            if got["ids"] != want:
                failures.append(f"encode({text[:60]!r}, {add_special}): {got['ids'][:30]} != {want[:30]}")
                continue
            want_text = hf.decode(want, skip_special_tokens=False)
            if text_of(got) != want_text:
                failures.append(f"decode({text[:60]!r}): {text_of(got)[:60]!r} != {want_text[:60]!r}")
            if got["streamed"] != got["decoded"]:
                failures.append(f"streamed decode differs for {text[:60]!r}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


# ---------------------------------------------------------------------------------------------
# Tests against the oracle
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_encode_decode_match_oracle(name, converted, oracle, cases_binary, tmp_path):
    texts = CASES + random_texts(oracle[name], 40, seed=len(name))
    results = cases_binary(converted[name], encode_lines(texts), tmp_path)
    check_against_oracle(oracle[name], texts, results)


@pytest.mark.parametrize("name", NAMES)
def test_gguf_tokenizer_matches_oracle(name, from_gguf, oracle, cases_binary, tmp_path):
    """The tokenizer read from the model's GGUF file (no tokenizer.json) encodes and decodes
    like the oracle built from the model's tokenizer.json, except for text that already holds
    U+2581: Gemma 3's GGUF stores its whitespace-run pieces as spaces (user-defined, matched
    verbatim, as llama.cpp does) where tokenizer.json has U+2581 runs reached by merges."""
    texts = [t for t in CASES if "\u2581" not in t] + random_texts(oracle[name], 40, seed=len(name) + 1)
    check_against_oracle(oracle[name], texts, cases_binary(from_gguf[name], encode_lines(texts), tmp_path))


@pytest.mark.parametrize("name", NAMES)
def test_plain_text_encodes_special_tokens_as_text(name, converted, from_gguf, oracle, cases_binary, tmp_path):
    """Text from users (chat messages, raw prompts by default) is encoded with special tokens as
    plain text: the oracle is HF with `encode_special_tokens = True` (added tokens that are not
    special are still matched), from the converted tokenizer and from the model's GGUF."""
    hf = tokenizers.Tokenizer.from_str(oracle[name].to_str())
    hf.encode_special_tokens = True
    texts = CASES + random_texts(oracle[name], 20, seed=len(name) + 7)
    lines = [f"P {flag} {t.encode('utf-8').hex()}" for t in texts for flag in (0, 1)]
    for mlt in (converted[name], from_gguf[name]):
        results = iter(cases_binary(mlt, lines, tmp_path))
        for text in texts:
            for add_special in (False, True):
                if mlt == from_gguf[name] and "\u2581" in text:
                    next(results)
                    continue  # as in test_gguf_tokenizer_matches_oracle
                want = hf.encode(text, add_special_tokens=add_special).ids
                assert next(results)["ids"] == want, (mlt.name, text[:60], add_special)
    # the cases do hold special tokens that the default encode matches
    assert any(len(oracle[name].encode(t).ids) != len(hf.encode(t).ids) for t in CASES)


@pytest.mark.parametrize("name", NAMES)
def test_decode_oracle_ids(name, converted, oracle, cases_binary, tmp_path):
    """Round-trip: Krafla decodes the oracle's ids of every case to the oracle's text."""
    hf = oracle[name]
    id_lists = [hf.encode(t, add_special_tokens=True).ids for t in CASES]
    lines = ["D " + ",".join(map(str, ids)) for ids in id_lists]
    results = cases_binary(converted[name], lines, tmp_path)
    for text, ids, got in zip(CASES, id_lists, results, strict=True):
        assert text_of(got) == hf.decode(ids, skip_special_tokens=False), text[:60]
        assert got["streamed"] == got["decoded"]


@pytest.mark.parametrize("name", NAMES)
def test_decode_every_token(name, converted, oracle, cases_binary, tmp_path):
    """Each vocabulary entry decodes alone like the oracle (byte tokens excepted for
    SentencePiece: Krafla returns the raw byte where HF substitutes U+FFFD)."""
    hf = oracle[name]
    ids = [i for i in range(hf.get_vocab_size())
           if not (name == "gemma3" and (hf.id_to_token(i) or "").startswith("<0x"))]
    step = 1 if len(ids) < 100_000 else 3  # keep Gemma's 262k vocabulary quick
    ids = ids[::step]
    results = cases_binary(converted[name], [f"D {i}" for i in ids], tmp_path)
    want = hf.decode_batch([[i] for i in ids], skip_special_tokens=False)
    bad = [(i, text_of(r), w) for i, r, w in zip(ids, results, want, strict=True) if text_of(r) != w]
    assert not bad, f"{len(bad)} tokens decode differently, e.g. {bad[:5]}"


# ---------------------------------------------------------------------------------------------
# Other pre-tokenizers / normalisers, built from the real vocabularies
# ---------------------------------------------------------------------------------------------

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def variant(tmp_path, name, edit):
    """A copy of a fixture tokenizer.json changed by `edit(dict)`; returns (hf, mlt path)."""
    j = json.loads(tokenizer_json(name).read_text(encoding="utf-8"))
    edit(j)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j), encoding="utf-8")
    mlt = tmp_path / "tokenizer.mlt"
    import_tokenizer(path, mlt)
    return tokenizers.Tokenizer.from_file(str(path)), mlt


# Text that is not in NFC: decomposed accents, Hangul jamo, a compatibility-free mix.
NON_NFC = ["Cafe\u0301 de\u0301ja\u0300 vu", "A\u030angstro\u0308m", "\u1100\u1161\u11a8 \u1112\u1161\u11ab",
           "n\u0303 and o\u0302\u0323"]


# Qwen3.5's: Qwen2's with combining marks in words; o200k's (llama.cpp's `gpt-4o`: Phi-4-mini,
# gpt-oss): words split by case with their contractions, digits in threes.
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
               r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
CASE_TEXTS = ["HELLO'S World'S CamelCaseWord iPhone XMLHttpRequest ÉCOLE école", "1234567 12 123 1234",
              "path/to/file\r\n/usr//bin", "x\u0301y\u0302 Z\u0303"]


@pytest.mark.parametrize("regex,option", [(LLAMA3_REGEX, "ignore_merges"), (QWEN2_REGEX, "nfc"),
                                          (QWEN35_REGEX, "plain"), (GPT4O_REGEX, "ignore_merges")],
                         ids=["llama3", "qwen2", "qwen35", "gpt-4o"])
def test_split_regex_pretokenizers(regex, option, cases_binary, tmp_path):
    """Llama 3 (its regex with ignore_merges), Qwen2 (its regex with the NFC normaliser), Qwen3.5
    and o200k (`gpt-4o`, with ignore_merges) on a real vocabulary, against `tokenizers`."""
    def edit(j):
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}
        if option == "ignore_merges":
            j["model"]["ignore_merges"] = True
            # A whole word in the vocabulary that no merge sequence builds: only
            # ignore_merges produces it as one token.
            j["model"]["vocab"]["\u0120xyzzyq"] = max(j["model"]["vocab"].values()) + 1
        elif option == "nfc":
            j["normalizer"] = {"type": "NFC"}
    hf, mlt = variant(tmp_path, "smollm2", edit)
    texts = CASES + NON_NFC + CASE_TEXTS + ["say xyzzyq twice: xyzzyq xyzzyq"] + random_texts(hf, 20, seed=7)
    check_against_oracle(hf, texts, cases_binary(mlt, encode_lines(texts), tmp_path))


def test_byte_level_prefix_space_and_template(cases_binary, tmp_path):
    def edit(j):
        j["pre_tokenizer"]["add_prefix_space"] = True
        j["post_processor"] = {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}},
                                          {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
                               "pair": [], "special_tokens": {
                                   "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
                                   "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}}}
    hf, mlt = variant(tmp_path, "smollm2", edit)
    check_against_oracle(hf, CASES, cases_binary(mlt, encode_lines(CASES), tmp_path))


def test_llama2_style_prefix_space(cases_binary, tmp_path):
    """SentencePiece with Prepend('▁') and the Strip decoder (Llama 2 style)."""
    def edit(j):
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        j["pre_tokenizer"] = None
        j["decoder"]["decoders"].append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    hf, mlt = variant(tmp_path, "gemma3", edit)
    texts = [t for t in CASES if t != LONG_PARAGRAPH][:40]
    check_against_oracle(hf, texts, cases_binary(mlt, encode_lines(texts), tmp_path))


def test_gguf_sentencepiece_path(cases_binary, tmp_path):
    """A `llama`-model GGUF (scores, no merges) converts to the same tokenizer as its
    tokenizer.json. Built from the first 32768 Gemma 3 tokens (scores = -id, as SentencePiece
    BPE assigns them); characters outside the subset exercise byte fallback."""
    gguf = pytest.importorskip("gguf")
    n = 32768
    j = json.loads(tokenizer_json("gemma3").read_text(encoding="utf-8"))
    tokens = [None] * n
    for tok, i in j["model"]["vocab"].items():
        if i < n:
            tokens[i] = tok
    keep = set(tokens)
    j["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    j["model"]["merges"] = [m for m in j["model"]["merges"]
                            if m[0] in keep and m[1] in keep and m[0] + m[1] in keep]
    j["added_tokens"] = [a for a in j["added_tokens"] if a["id"] < n]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j), encoding="utf-8")
    hf = tokenizers.Tokenizer.from_file(str(path))

    types = [1] * n  # llama.cpp types: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
    for a in j["added_tokens"]:
        types[a["id"]] = 3 if a["special"] else 4
    for i, t in enumerate(tokens):
        if len(t) == 6 and t.startswith("<0x"):
            types[i] = 6
    types[3] = 2
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(n)])
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mlt = tmp_path / "t.mlt"
    import_tokenizer(tmp_path / "t.gguf", mlt)
    texts = CASES + random_texts(tokenizers.Tokenizer.from_file(str(tokenizer_json("gemma3"))), 20, 5)
    check_against_oracle(hf, texts, cases_binary(mlt, encode_lines(texts), tmp_path))


# ---------------------------------------------------------------------------------------------
# Converter
# ---------------------------------------------------------------------------------------------

def header(mlt):
    import struct
    data = mlt.read_bytes()
    magic, version, kind, pre, flags, *ids = struct.unpack_from("<8sIIII5i", data)
    (tlen,) = struct.unpack_from("<I", data, 44)
    return dict(magic=magic, version=version, kind=kind, pre=pre, flags=flags,
                ids=ids, chat=data[48:48 + tlen].decode())


def test_converter_metadata(converted):
    smol, gemma = header(converted["smollm2"]), header(converted["gemma3"])
    assert smol["magic"] == b"KRAFLAMT" and smol["version"] == 1
    assert (smol["kind"], smol["pre"], smol["flags"]) == (0, 1, 0)
    assert smol["chat"] == "chatml"
    assert smol["ids"] == [1, 2, 2, 0, 2]  # bos <|im_start|>, eos/eot <|im_end|>, unk, pad
    assert (gemma["kind"], gemma["pre"]) == (1, 0)
    assert gemma["flags"] == 1 | 4 | 16  # byte_fallback, add_bos, space_to_metaspace
    assert gemma["chat"] == "gemma"
    assert gemma["ids"] == [2, 1, 106, 3, 0]  # <bos> <eos> <end_of_turn> <unk> <pad>


def test_converter_rejects_unsupported(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}}))
    p = run_ml("-z", path, "--save-tokenizer", tmp_path / "x.mlt", "--tokenize", "-p", "x", check=False)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "unsupported tokenizer" in p.stderr and "WordPiece" in p.stderr
    assert not (tmp_path / "x.mlt").exists()
    assert not list(tmp_path.glob(".x.mlt*")), "temp file left behind"


def test_gguf_tokenizer_matches_json(smollm2_gguf, converted, cases_binary, tmp_path):
    pytest.importorskip("gguf")
    mlt = tmp_path / "gguf.mlt"
    import_tokenizer(smollm2_gguf, mlt)
    assert header(mlt) == header(converted["smollm2"])
    lines = encode_lines(CASES)
    from_gguf = cases_binary(mlt, lines, tmp_path)
    from_json = cases_binary(converted["smollm2"], lines, tmp_path)
    assert from_gguf == from_json


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_llama2c_tokenizer_bin(cases_binary, tmp_path):
    """llama2.c's tokenizer.bin (scores, no merges; spaces for U+2581; Llama 2 ids 0/1/2 =
    <unk>/<s>/</s>) converts to the tokenizer HF builds from the same pieces and scores, with
    Llama 2's prefix space. Pieces: the first 32768 Gemma 3 tokens with ids 0..2 renamed."""
    import struct

    j = json.loads(tokenizer_json("gemma3").read_text(encoding="utf-8"))
    by_id = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    # The first 32768 pieces plus every piece of one or two characters (letters, digits, "▁x"),
    # renumbered in order, so that ordinary words merge instead of falling back to bytes.
    tokens = [t for t, i in by_id if i < 32768 or len(t) <= 2]
    old_id = {t: i for t, i in by_id}
    tokens[0], tokens[1], tokens[2] = "<unk>", "<s>", "</s>"
    keep = set(tokens)
    j["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    j["model"]["unk_token"] = "<unk>"
    j["model"]["merges"] = [m for m in j["model"]["merges"] if m[0] in keep and m[1] in keep and m[0] + m[1] in keep]
    j["added_tokens"] = [dict(a, content=tokens[a["id"]]) for a in j["added_tokens"] if a["id"] <= 2]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    j["pre_tokenizer"] = None
    j["decoder"]["decoders"].append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    j["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j), encoding="utf-8")
    hf = tokenizers.Tokenizer.from_file(str(path))

    pieces = [t.replace("\u2581", " ") for t in tokens]
    pieces[1], pieces[2] = "\n<s>\n", "\n</s>\n"
    raw = [p.encode("utf-8") for p in pieces]
    with open(tmp_path / "tokenizer.bin", "wb") as f:
        f.write(struct.pack("<i", max(map(len, raw))))
        for t, b in zip(tokens, raw, strict=True):  # SentencePiece scores: the original rank
            f.write(struct.pack("<fi", -float(old_id.get(t, 0)), len(b)) + b)
    mlt = tmp_path / "t.mlt"
    import_tokenizer(tmp_path / "tokenizer.bin", mlt)
    texts = [t for t in CASES if t != LONG_PARAGRAPH and "<" not in t][:40]
    assert len(hf.encode("hello world").ids) <= 4  # words merge
    results = iter(cases_binary(mlt, encode_lines(texts), tmp_path))
    for text in texts:
        for add_special in (False, True):
            got = next(results)
            assert got["ids"] == hf.encode(text, add_special_tokens=add_special).ids, (text, add_special)
            if not add_special:
                assert text_of(got) == hf.decode(got["ids"], skip_special_tokens=False), text

    bad = tmp_path / "bad.bin"
    bad.write_bytes((tmp_path / "tokenizer.bin").read_bytes()[:1001])
    p = run_ml("-z", bad, "--save-tokenizer", tmp_path / "bad.mlt", "--tokenize", "-p", "x", check=False)
    assert p.returncode == 2 and ("truncated" in p.stderr or "bad length" in p.stderr), p.stderr
    assert p.stderr.count("\n") == 1 and not (tmp_path / "bad.mlt").exists()
