#!/usr/bin/env python3
"""Convert a Hugging Face `tokenizer.json` (or the tokenizer inside a `.gguf`) to Krafla's `.mlt`.

    python3 tools/convert_tokenizer.py tokenizer.json -o tokenizer.mlt
    python3 tools/convert_tokenizer.py model.gguf -o tokenizer.mlt

The `.mlt` layout is specified in docs/FORMAT.md. Supported tokenizers are BPE models of two kinds:

* byte-level BPE (GPT-2 style) with the GPT-2 ByteLevel regex, or a Split with the Llama-3 /
  Qwen2 regex followed by ByteLevel(use_regex=false);
* SentencePiece-style BPE (U+2581 for spaces, optional byte fallback, optional prefix space).

Anything else (Unigram, WordPiece, unknown regexes, ...) is rejected with a one-line error and
exit status 2. Only the standard library, numpy and (for `.gguf`) the `gguf` package are used.
"""
import argparse
import json
import os
import pathlib
import re
import struct
import sys
import tempfile

import numpy as np

MAGIC = b"KRAFLAMT"
VERSION = 1
KIND_BYTE_BPE, KIND_SPM_BPE = 0, 1
PRE_NONE, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2 = 0, 1, 2, 3
FLAG_BYTE_FALLBACK, FLAG_PREFIX_SPACE, FLAG_ADD_BOS, FLAG_ADD_EOS, FLAG_METASPACE = 1, 2, 4, 8, 16
FLAG_IGNORE_MERGES, FLAG_NFC = 32, 64
T_NORMAL, T_CONTROL, T_USER, T_BYTE, T_UNKNOWN = 0, 1, 2, 3, 4
MAX_VOCAB, MAX_MERGES, MAX_TOKEN_LEN = 4_194_304, 16_777_216, 65536

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_REGEXES = {LLAMA3_REGEX: PRE_LLAMA3, QWEN2_REGEX: PRE_QWEN2, GPT2_REGEX: PRE_GPT2}

# llama.cpp `tokenizer.ggml.pre` names -> pre-tokenizer kind (byte-level BPE only).
GGUF_PRE = {
    "gpt-2": PRE_GPT2, "gpt2": PRE_GPT2, "smollm": PRE_GPT2, "olmo": PRE_GPT2, "mpt": PRE_GPT2,
    "llama3": PRE_LLAMA3, "llama-v3": PRE_LLAMA3, "llama-bpe": PRE_LLAMA3,
    "qwen2": PRE_QWEN2,
}
# GGUF token types (llama.cpp) -> .mlt token types. 5 = unused: HF marks these special.
GGUF_TYPE = {1: T_NORMAL, 2: T_UNKNOWN, 3: T_CONTROL, 4: T_USER, 5: T_CONTROL, 6: T_BYTE}

METASPACE = "\u2581"
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>\Z")


class Unsupported(Exception):
    """The input is valid but uses a tokenizer feature Krafla does not implement."""


def warn(msg):
    print(f"convert_tokenizer: warning: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Chat template kind
# ---------------------------------------------------------------------------------------------

def template_kind(jinja):
    """Name the chat template family from its jinja source ("" if unknown)."""
    if not jinja:
        return ""
    if "<|im_start|>" in jinja:
        return "chatml"
    if "<start_of_turn>" in jinja:
        return "gemma"
    if "<|start_header_id|>" in jinja:
        return "llama3"
    if "[INST]" in jinja:
        return "llama2" if "<<SYS>>" in jinja else "mistral"
    if "<|user|>" in jinja:
        return "zephyr"
    return ""


def kind_from_vocab(token_to_id):
    """Fallback when no template text exists: infer the family from its turn tokens."""
    for kind, needed in (("chatml", ("<|im_start|>", "<|im_end|>")),
                         ("gemma", ("<start_of_turn>", "<end_of_turn>")),
                         ("llama3", ("<|start_header_id|>", "<|eot_id|>"))):
        if all(t in token_to_id for t in needed):
            return kind
    return ""


EOT_TOKEN = {"chatml": "<|im_end|>", "gemma": "<end_of_turn>", "llama3": "<|eot_id|>"}


def jinja_from_config(cfg):
    """The default chat template of a tokenizer_config.json (string or list of named ones)."""
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) else ""


# ---------------------------------------------------------------------------------------------
# tokenizer.json
# ---------------------------------------------------------------------------------------------

def components(node):
    """Flatten a (possibly Sequence) normalizer / pre-tokenizer / decoder / processor node."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        out = []
        for sub in node.get("normalizers") or node.get("pretokenizers") or \
                node.get("decoders") or node.get("processors") or []:
            out.extend(components(sub))
        return out
    return [node]


def pattern_of(node):
    pat = node.get("pattern") or {}
    return pat.get("Regex", pat.get("String")), "Regex" in pat


def byte_level_pretok(pres):
    """Pre-tokenizer kind and add_prefix_space for a byte-level BPE tokenizer.json."""
    types = [p.get("type") for p in pres]
    if types == ["ByteLevel"]:
        bl = pres[0]
        return (PRE_GPT2 if bl.get("use_regex", True) else PRE_NONE), bool(bl.get("add_prefix_space"))
    if types == ["Split", "ByteLevel"]:
        split, bl = pres
        pat, is_regex = pattern_of(split)
        if bl.get("use_regex", True):
            raise Unsupported("Split followed by ByteLevel(use_regex=true) pre-tokenizer")
        if not is_regex or pat not in SPLIT_REGEXES:
            raise Unsupported(f"pre-tokenizer regex {pat!r} is not gpt2/llama3/qwen2")
        if split.get("behavior") != "Isolated" or split.get("invert"):
            raise Unsupported("Split pre-tokenizer must be behavior=Isolated, invert=false")
        return SPLIT_REGEXES[pat], bool(bl.get("add_prefix_space"))
    raise Unsupported(f"byte-level pre-tokenizer sequence {types}")


def spm_flags(norms, pres):
    """(add_prefix_space, space_to_metaspace) for a SentencePiece-style tokenizer.json."""
    prefix = metaspace = False
    for n in norms:
        t = n.get("type")
        if t == "Replace" and pattern_of(n) == (" ", False) and n.get("content") == "\u2581":
            metaspace = True
        elif t == "Prepend" and n.get("prepend") == "\u2581":
            prefix = True
        elif t == "NFC":
            warn("NFC normalizer is not applied by Krafla (exact only for NFC input)")
        else:
            raise Unsupported(f"normalizer {t}")
    for p in pres:
        t = p.get("type")
        if t == "Metaspace":
            if p.get("split", True):
                raise Unsupported("Metaspace pre-tokenizer with split=true")
            metaspace = True
            scheme = p.get("prepend_scheme", "always" if p.get("add_prefix_space", True) else "never")
            prefix = scheme != "never"
            if scheme == "first":
                warn("Metaspace prepend_scheme=first is stored as add_prefix_space (applied to each "
                     "text segment between added tokens)")
        elif t == "Split" and pattern_of(p) == (" ", False) and metaspace:
            pass  # splits on ' ' after ' ' -> U+2581 normalisation: never matches (Gemma 3)
        else:
            raise Unsupported(f"pre-tokenizer {t} for a SentencePiece-style BPE")
    if not metaspace:
        raise Unsupported("SentencePiece-style BPE without ' ' -> U+2581 normalisation")
    return prefix, metaspace


def is_spm_decoder(decs):
    for d in decs:
        if d.get("type") == "Metaspace":
            return True
        if d.get("type") == "Replace" and pattern_of(d) == ("\u2581", False) and d.get("content") == " ":
            return True
    return False


def template_specials(post, token_to_id):
    """(bos id or None, eos id or None) added by the post-processor's single template."""
    bos = eos = None
    for proc in components(post):
        t = proc.get("type")
        if t == "ByteLevel":
            continue
        if t != "TemplateProcessing":
            raise Unsupported(f"post-processor {t}")
        seen_a = False
        for item in proc.get("single", []):
            if "Sequence" in item:
                seen_a = True
                continue
            tok = item["SpecialToken"]["id"]
            spec = proc.get("special_tokens", {}).get(tok, {})
            ids = spec.get("ids") or [token_to_id.get(tok)]
            if len(ids) != 1 or ids[0] is None:
                raise Unsupported(f"template special token {tok!r} with ids {ids}")
            if seen_a:
                eos = ids[0]
            else:
                bos = ids[0]
    return bos, eos


def config_token(cfg, key):
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def read_tokenizer_json(path):
    j = json.loads(path.read_text(encoding="utf-8"))
    model = j.get("model") or {}
    if model.get("type", "BPE") != "BPE" or "merges" not in model:
        raise Unsupported(f"model type {model.get('type')} (only BPE)")
    if model.get("dropout"):
        raise Unsupported("BPE dropout")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Unsupported("BPE continuing_subword_prefix / end_of_word_suffix")

    vocab = model["vocab"]
    added = j.get("added_tokens") or []
    n = max([*vocab.values(), *(a["id"] for a in added)], default=-1) + 1
    tokens = [None] * n
    for tok, i in vocab.items():
        tokens[i] = tok
    types = [T_NORMAL] * n
    for a in added:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = T_CONTROL if a.get("special") else T_USER
        if a.get("lstrip") or a.get("rstrip") or a.get("single_word"):
            warn(f"added token {a['content']!r}: lstrip/rstrip/single_word are ignored")
        if a.get("normalized") and not a.get("special") and j.get("normalizer"):
            warn(f"added token {a['content']!r}: normalized=true is matched on the raw text")
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise Unsupported(f"vocabulary has holes (e.g. id {missing[0]})")
    token_to_id = {}
    for i, t in enumerate(tokens):
        token_to_id.setdefault(t, i)

    norms = components(j.get("normalizer"))
    pres = components(j.get("pre_tokenizer"))
    decs = components(j.get("decoder"))
    flags = 0
    if any(d.get("type") == "ByteLevel" for d in decs) or any(p.get("type") == "ByteLevel" for p in pres):
        kind = KIND_BYTE_BPE
        if norms:
            if [n.get("type") for n in norms] == ["NFC"]:
                flags |= FLAG_NFC
            else:
                raise Unsupported(f"normalizer {[n.get('type') for n in norms]} with byte-level BPE")
        pre, prefix = byte_level_pretok(pres)
        if prefix:
            flags |= FLAG_PREFIX_SPACE
    elif is_spm_decoder(decs) or any(p.get("type") == "Metaspace" for p in pres):
        kind, pre = KIND_SPM_BPE, PRE_NONE
        prefix, metaspace = spm_flags(norms, pres)
        flags |= (FLAG_PREFIX_SPACE if prefix else 0) | (FLAG_METASPACE if metaspace else 0)
    else:
        raise Unsupported("neither byte-level nor SentencePiece-style BPE")
    if model.get("byte_fallback"):
        flags |= FLAG_BYTE_FALLBACK
    if model.get("ignore_merges"):
        flags |= FLAG_IGNORE_MERGES

    if kind == KIND_SPM_BPE:
        for i, t in enumerate(tokens):
            if BYTE_TOKEN.match(t) and types[i] == T_NORMAL:
                types[i] = T_BYTE
    unk = token_to_id.get(model.get("unk_token")) if model.get("unk_token") else None
    if unk is not None:
        types[unk] = T_UNKNOWN

    merges = []
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        merges.append((token_to_id[a], token_to_id[b]) if a in token_to_id and b in token_to_id else None)
        if merges[-1] is None:
            raise Unsupported(f"merge {a!r} {b!r} uses a token not in the vocabulary")

    cfg, jinja = sidecar_config(path)
    bos_t, eos_t = template_specials(j.get("post_processor"), token_to_id)
    bos = bos_t if bos_t is not None else token_to_id.get(config_token(cfg, "bos_token"))
    eos = eos_t if eos_t is not None else token_to_id.get(config_token(cfg, "eos_token"))
    if bos_t is not None:
        flags |= FLAG_ADD_BOS
    if eos_t is not None:
        flags |= FLAG_ADD_EOS
    pad = token_to_id.get(config_token(cfg, "pad_token"))
    if unk is None:
        unk = token_to_id.get(config_token(cfg, "unk_token"))
    return dict(kind=kind, pre=pre, flags=flags, bos=bos, eos=eos, eot=None, unk=unk, pad=pad,
                jinja=jinja, tokens=tokens, scores=None, types=types, merges=merges,
                token_to_id=token_to_id)


def sidecar_config(path):
    """(tokenizer_config.json dict, chat template jinja) found next to `path`."""
    cfg = {}
    cfg_path = path.with_name("tokenizer_config.json")
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    jinja = jinja_from_config(cfg)
    jinja_path = path.with_name("chat_template.jinja")
    if not jinja and jinja_path.is_file():
        jinja = jinja_path.read_text(encoding="utf-8")
    return cfg, jinja


# ---------------------------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------------------------

def gguf_value(fields, key, default=None):
    return fields.get(key, default)


def spm_merges_from_scores(tokens, scores, types):
    """SentencePiece BPE as merges: every split of a normal piece into two pieces, best score first.

    This mirrors Hugging Face's SentencePieceExtractor (used to build Llama/Gemma tokenizer.json).
    """
    mergeable = {t: i for i, t in enumerate(tokens) if types[i] in (T_NORMAL, T_USER)}
    found = []
    for t, i in mergeable.items():
        for k in range(1, len(t)):
            a, b = mergeable.get(t[:k]), mergeable.get(t[k:])
            if a is not None and b is not None:
                found.append((-scores[i], i, a, b))
    found.sort()
    return [(a, b) for _, _, a, b in found]


def read_gguf(path):
    try:
        import gguf_file  # noqa: PLC0415 - needs the optional `gguf` package, only for .gguf input
    except ImportError as e:
        raise Unsupported(f"reading .gguf needs the `gguf` package ({e})") from None
    r, _ = gguf_file.read(path)  # a bad file: GgufError, a ValueError
    model = gguf_value(r, "tokenizer.ggml.model")
    tokens = gguf_value(r, "tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise Unsupported("no tokenizer.ggml.model / tokenizer.ggml.tokens metadata")
    n = len(tokens)
    gtypes = gguf_value(r, "tokenizer.ggml.token_type") or [1] * n
    types = [GGUF_TYPE.get(int(t), T_NORMAL) for t in gtypes]
    scores = [float(s) for s in (gguf_value(r, "tokenizer.ggml.scores") or [0.0] * n)]
    token_to_id = {}
    for i, t in enumerate(tokens):
        token_to_id.setdefault(t, i)
    flags = 0
    if model == "gpt2":
        kind = KIND_BYTE_BPE
        pre_name = gguf_value(r, "tokenizer.ggml.pre", "gpt-2")
        if pre_name not in GGUF_PRE:
            raise Unsupported(f"tokenizer.ggml.pre {pre_name!r}")
        pre = GGUF_PRE[pre_name]
        # llama.cpp's Llama 3 tokenizer looks whole words up first (HF's ignore_merges);
        # Qwen2's applies NFC.
        if pre == PRE_LLAMA3:
            flags |= FLAG_IGNORE_MERGES
        if pre == PRE_QWEN2:
            flags |= FLAG_NFC
        merges = []
        for m in gguf_value(r, "tokenizer.ggml.merges") or []:
            a, b = m.split(" ", 1)
            if a not in token_to_id or b not in token_to_id:
                raise Unsupported(f"merge {m!r} uses a token not in the vocabulary")
            merges.append((token_to_id[a], token_to_id[b]))
        if gguf_value(r, "tokenizer.ggml.add_space_prefix", False):
            flags |= FLAG_PREFIX_SPACE
    elif model == "llama":
        kind, pre = KIND_SPM_BPE, PRE_NONE
        flags |= FLAG_BYTE_FALLBACK | FLAG_METASPACE
        if gguf_value(r, "tokenizer.ggml.add_space_prefix", True):
            flags |= FLAG_PREFIX_SPACE
        merges = spm_merges_from_scores(tokens, scores, types)
    else:
        raise Unsupported(f"tokenizer.ggml.model {model!r} (only gpt2 and llama)")

    def tid(key):
        v = gguf_value(r, key)
        return int(v) if v is not None and 0 <= int(v) < n else None

    bos, eos = tid("tokenizer.ggml.bos_token_id"), tid("tokenizer.ggml.eos_token_id")
    if gguf_value(r, "tokenizer.ggml.add_bos_token", model == "llama") and bos is not None:
        flags |= FLAG_ADD_BOS
    if gguf_value(r, "tokenizer.ggml.add_eos_token", False) and eos is not None:
        flags |= FLAG_ADD_EOS
    return dict(kind=kind, pre=pre, flags=flags, bos=bos, eos=eos,
                eot=tid("tokenizer.ggml.eot_token_id"), unk=tid("tokenizer.ggml.unknown_token_id"),
                pad=tid("tokenizer.ggml.padding_token_id"),
                jinja=gguf_value(r, "tokenizer.chat_template", "") or "",
                tokens=list(tokens), scores=scores, types=types, merges=merges,
                token_to_id=token_to_id)


# ---------------------------------------------------------------------------------------------
# llama2.c tokenizer.bin
# ---------------------------------------------------------------------------------------------

def read_llama2c(path):
    """llama2.c's tokenizer.bin: i32 max_token_length, then per token f32 score, i32 length,
    bytes. llama2.c's exporter writes SentencePiece pieces with U+2581 replaced by a space and
    BOS/EOS as "\n<s>\n" / "\n</s>\n"; ids 0, 1, 2 are <unk>, <s>, </s> (Llama 2)."""
    data = path.read_bytes()
    if len(data) < 4:
        raise Unsupported("truncated tokenizer.bin header")
    (max_len,) = struct.unpack_from("<i", data, 0)
    if not 0 < max_len <= 65536:
        raise Unsupported(f"tokenizer.bin max_token_length {max_len} is out of range")
    pos, tokens, scores = 4, [], []
    while pos < len(data):
        if pos + 8 > len(data):
            raise Unsupported(f"tokenizer.bin is truncated in token {len(tokens)}")
        score, n = struct.unpack_from("<fi", data, pos)
        pos += 8
        if not 0 <= n <= max_len or pos + n > len(data):
            raise Unsupported(f"tokenizer.bin token {len(tokens)} has a bad length {n}")
        tokens.append(data[pos:pos + n].decode("utf-8"))
        scores.append(score)
        pos += n
    if len(tokens) < 3:
        raise Unsupported("tokenizer.bin has fewer than 3 tokens")
    tokens = [t.replace(" ", METASPACE) for t in tokens]
    tokens[1], tokens[2] = tokens[1].strip("\n"), tokens[2].strip("\n")
    types = [T_NORMAL] * len(tokens)
    types[0], types[1], types[2] = T_UNKNOWN, T_CONTROL, T_CONTROL
    for i, t in enumerate(tokens):
        if BYTE_TOKEN.match(t):
            types[i] = T_BYTE
    token_to_id = {}
    for i, t in enumerate(tokens):
        token_to_id.setdefault(t, i)
    flags = FLAG_BYTE_FALLBACK | FLAG_METASPACE | FLAG_PREFIX_SPACE | FLAG_ADD_BOS
    return dict(kind=KIND_SPM_BPE, pre=PRE_NONE, flags=flags, bos=1, eos=2, eot=None, unk=0, pad=None,
                jinja="", tokens=tokens, scores=scores, types=types,
                merges=spm_merges_from_scores(tokens, scores, types), token_to_id=token_to_id)


# ---------------------------------------------------------------------------------------------
# .mlt writer
# ---------------------------------------------------------------------------------------------

def finish(tok):
    """Fill in the chat template kind and the end-of-turn id."""
    kind = template_kind(tok["jinja"])
    if not kind and not tok["jinja"]:
        kind = kind_from_vocab(tok["token_to_id"])
        if kind:
            warn(f"no chat template found; inferred {kind!r} from the vocabulary")
    tok["chat"] = kind
    if tok["eot"] is None:
        tok["eot"] = tok["token_to_id"].get(EOT_TOKEN.get(kind, ""), tok["eos"])
    if tok["unk"] is not None and tok["types"][tok["unk"]] == T_NORMAL:
        tok["types"][tok["unk"]] = T_UNKNOWN
    return tok


def pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def encode_mlt(tok):
    """The complete .mlt file as bytes."""
    tokens, types = tok["tokens"], tok["types"]
    scores = tok["scores"] or [0.0] * len(tokens)
    if len(tokens) > MAX_VOCAB or len(tok["merges"]) > MAX_MERGES:
        raise Unsupported(f"{len(tokens)} tokens / {len(tok['merges'])} merges exceed format limits")

    def opt(i):
        return -1 if i is None else int(i)

    out = [MAGIC, struct.pack("<IIIIiiiii", VERSION, tok["kind"], tok["pre"], tok["flags"],
                              opt(tok["bos"]), opt(tok["eos"]), opt(tok["eot"]),
                              opt(tok["unk"]), opt(tok["pad"])),
           pack_string(tok["chat"]), struct.pack("<I", len(tokens))]
    entry = struct.Struct("<fB")
    for t, s, ty in zip(tokens, scores, types):
        b = t.encode("utf-8")
        if len(b) > MAX_TOKEN_LEN:
            raise Unsupported(f"token of {len(b)} bytes exceeds the format limit")
        out += (struct.pack("<I", len(b)), b, entry.pack(s, ty))
    merges = np.asarray(tok["merges"], dtype="<u4").reshape(-1, 2)
    out += (struct.pack("<I", len(merges)), merges.tobytes())
    return b"".join(out)


def write_atomic(data, dest):
    """Write to a temp file in the destination directory, then rename over `dest`."""
    dest = pathlib.Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description="Convert tokenizer.json / .gguf to Krafla .mlt")
    ap.add_argument("input", type=pathlib.Path, help="tokenizer.json, a model .gguf, or llama2.c tokenizer.bin")
    ap.add_argument("-o", "--output", type=pathlib.Path, required=True, help="output .mlt")
    args = ap.parse_args(argv)
    try:
        if args.input.suffix == ".gguf":
            tok = read_gguf(args.input)
        elif args.input.suffix == ".bin":
            tok = read_llama2c(args.input)
        else:
            tok = read_tokenizer_json(args.input)
        data = encode_mlt(finish(tok))
    except Unsupported as e:
        print(f"{args.input}: unsupported tokenizer: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{args.input}: cannot read tokenizer: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    write_atomic(data, args.output)
    print(f"wrote {args.output}: {len(tok['tokens'])} tokens, {len(tok['merges'])} merges, "
          f"chat template {tok['chat'] or '(none)'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
