"""Writes the fuzz targets' seed corpora (tests/fuzz/seeds/<target>/): small
real inputs made by the project's own tools, so the fuzzer starts from files
that parse.

  .mlb   the metadata of each tiny Hugging Face fixture (../shared/fixtures/
         hf-tiny/<family>, imported by `ml_run DIR --save`) with two small
         tensors instead of the weights: a model configuration goes through
         every check, and a seed stays below 2 KB; one more (llama2-rows8)
         with an eight-row matrix in the eight-row groups (version 2, a
         layout field in each tensor entry);
  .mlt   the SmolLM2 (byte-level) and Gemma 3 (SentencePiece) tokenizers of
         ../shared/fixtures/tokenizers cut to their first tokens (and the
         merges among them) and imported by `ml_run -z --save-tokenizer`, and
         the tokenizer of the GGUF seed below;
  GGUF   a one-layer Llama, Gemma 2 and Mistral with sliding windows
         (SentencePiece tokenizer, Q8_0/F16/F32 tensors) and a tensorless
         file with a byte-level (gpt2) tokenizer, written with the `gguf`
         package as tests/test_gguf.py does;
  HTTP, JSON   requests as tests/test_server.py sends them (with schemas
         and tools as tests/test_structured.py and test_tools.py do);
  schemas, GBNF   JSON Schemas and grammars as those tests give them;
  imatrix  two small importance matrices as `ml_run --imatrix-out` writes them;
  scaled   short inputs scaled up: nested groups, a long literal (`SCALED`).

Run from anywhere: python3 tests/fuzz/make_seeds.py (needs tests/requirements.txt and the
release build, target/release/ml_variant, or $KRAFLA_BIN).
"""
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures"
SEEDS = ROOT / "tests" / "fuzz" / "seeds"
sys.path.insert(0, str(ROOT / "tools"))

import gguf  # noqa: E402

import mlb  # noqa: E402
from reference_forward import ml_variant  # noqa: E402

MLB_FAMILIES = ["llama2", "gemma2-softcap", "gemma3-local-global", "qwen3_5-hybrid", "mistral-swa",
                "llama3-scaled", "smollm3-nope"]


def put(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def ml(*args):
    subprocess.run([ml_variant(), *map(str, args)], check=True, capture_output=True, stdin=subprocess.DEVNULL)


def mlb_seeds(tmp):
    norm = np.ones(32, dtype="<f4").tobytes()
    for fam in MLB_FAMILIES:
        full = tmp / f"{fam}.mlb"
        ml(FIXTURES / "hf-tiny" / fam, "--type", "q8_0", "--save", full, "--prompt-ids", "1", "-n", "0")
        r = mlb.MlbReader(full)
        q8 = bytes(r.raw("token_embd"))[:2 * 34]  # two Q8_0 blocks: a [2, 32] matrix
        small = tmp / f"{fam}-small.mlb"
        with open(small, "wb") as f:
            mlb.write_mlb(f, r.meta, [("output_norm", mlb.F32, [32], lambda: norm),
                                      ("token_embd", mlb.Q8_0, [2, 32], lambda q8=q8: q8)])
        put("mlb", f"{fam}.mlb", small.read_bytes())
    # version 2: token_embd with eight rows, stored in the eight-row groups (layout rows8)
    q8x8 = bytes(mlb.MlbReader(tmp / "llama2.mlb").raw("token_embd"))[:8 * 34]
    rows8 = tmp / "llama2-rows8.mlb"
    with open(rows8, "wb") as f:
        mlb.write_mlb(f, mlb.MlbReader(tmp / "llama2.mlb").meta, [("output_norm", mlb.F32, [32], lambda: norm),
                                                               ("token_embd", mlb.Q8_0, [8, 32], lambda: q8x8)])
    put("mlb", "llama2-rows8.mlb", rows8.read_bytes())


def cut(path, n, out):
    """The tokenizer.json at `path` restricted to its first `n` tokens and the merges among them,
    written to `out`."""
    j = json.loads(path.read_text(encoding="utf-8"))
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < n}
    j["model"]["vocab"] = vocab

    def pair(m):
        return m.split(" ", 1) if isinstance(m, str) else m

    j["model"]["merges"] = [m for m in j["model"]["merges"]
                            if all(p in vocab for p in pair(m)) and "".join(pair(m)) in vocab]
    j["added_tokens"] = [a for a in j.get("added_tokens") or [] if a["id"] < n]
    out.write_text(json.dumps(j), encoding="utf-8")
    return out


def mlt_seeds(tmp):
    for name in ("smollm2", "gemma3"):
        small = cut(FIXTURES / "tokenizers" / name / "tokenizer.json", 600, tmp / f"{name}-600.json")
        ml("-z", small, "--save-tokenizer", tmp / f"{name}-600.mlt", "--tokenize", "-p", "x")
        put("mlt", f"{name}-600.mlt", (tmp / f"{name}-600.mlt").read_bytes())
    ml("-z", tmp / "llama.gguf", "--save-tokenizer", tmp / "llama-gguf.mlt", "--tokenize", "-p", "x")
    put("mlt", "llama-gguf.mlt", (tmp / "llama-gguf.mlt").read_bytes())


def one_layer_gguf(path, arch, extra_meta=(), extra_norms=(), experts=0):
    """A one-layer model of `arch`: SentencePiece tokens as tests/test_gguf.py writes them; with
    `experts`, a Mixture-of-Experts layer (a router, stacked experts and a gated shared one)."""
    d, ff, vocab = 32, 64, 300
    rng = np.random.default_rng(14)
    gw = gguf.GGUFWriter(str(path), arch)
    gw.add_block_count(1)
    gw.add_context_length(64)
    gw.add_embedding_length(d)
    gw.add_feed_forward_length(ff)
    gw.add_head_count(2)
    gw.add_head_count_kv(1)
    gw.add_rope_freq_base(10000.0)
    gw.add_layer_norm_rms_eps(1e-5)
    gw.add_vocab_size(vocab)
    for key, value in extra_meta:
        gw.add_uint32(f"{arch}.{key}", value) if isinstance(value, int) else gw.add_float32(f"{arch}.{key}", value)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    gw.add_tokenizer_model("llama")
    gw.add_token_list(tokens)
    gw.add_token_scores([-float(i) for i in range(vocab)])
    gw.add_token_types([2, 3, 3, *([6] * 256), *([1] * (vocab - 259))])
    gw.add_bos_token_id(1)
    gw.add_eos_token_id(2)
    gw.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}")

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    q8 = gguf.GGMLQuantizationType.Q8_0
    gw.add_tensor("token_embd.weight", gguf.quants.quantize(w(vocab, d), q8), raw_dtype=q8)
    gw.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    ffn = [("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))]
    if experts:
        gw.add_expert_count(experts)
        gw.add_expert_used_count(2)
        gw.add_expert_feed_forward_length(16)
        gw.add_expert_shared_feed_forward_length(16)
        ffn = [("ffn_gate_exps", (experts, 16, d)), ("ffn_up_exps", (experts, 16, d)),
               ("ffn_down_exps", (experts, d, 16)), ("ffn_gate_shexp", (16, d)), ("ffn_up_shexp", (16, d)),
               ("ffn_down_shexp", (d, 16))]
        gw.add_tensor("blk.0.ffn_gate_inp.weight", w(experts, d))
        gw.add_tensor("blk.0.ffn_gate_inp_shexp.weight", w(1, d))
    for name, shape in [("attn_q", (d, d)), ("attn_k", (16, d)), ("attn_v", (16, d)), ("attn_output", (d, d)), *ffn]:
        gw.add_tensor(f"blk.0.{name}.weight", w(*shape).astype(np.float16))
    for name in ("attn_norm", "ffn_norm", *extra_norms):
        gw.add_tensor(f"blk.0.{name}.weight", np.ones(d, dtype=np.float32))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    return path.read_bytes()


def gguf_seeds(tmp):
    # One-layer models: a Llama, and two families whose layers have kinds (sliding
    # windows) that the import makes per layer (issue 32: a block_count of 2^40 there
    # allocated terabytes before any tensor was checked).
    put("gguf", "llama-1layer.gguf", one_layer_gguf(tmp / "llama.gguf", "llama"))
    put("gguf", "gemma2-1layer.gguf", one_layer_gguf(
        tmp / "gemma2.gguf", "gemma2", [("attention.sliding_window", 16), ("attn_logit_softcapping", 50.0),
                                        ("final_logit_softcapping", 30.0)],
        ["post_attention_norm", "post_ffw_norm"]))
    put("gguf", "mistral-1layer.gguf", one_layer_gguf(tmp / "mistral.gguf", "mistral",
                                                      [("attention.sliding_window", 16)]))
    # Mixture of Experts (issue 34): 4 stacked experts, a router and a gated shared expert
    put("gguf", "qwen2moe-1layer.gguf", one_layer_gguf(tmp / "qwen2moe.gguf", "qwen2moe", experts=4))
    # gpt-oss as llama-quantize writes it: MXFP4 experts with biases, sinks, YaRN, alternating windows
    fixture = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "gguf-tiny" / "gptoss" / "model-mxfp4.gguf"
    put("gguf", "gptoss-mxfp4.gguf", fixture.read_bytes())

    # Metadata only: a byte-level BPE tokenizer (GPT-2's byte alphabet and a few merges).
    alphabet = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
        [chr(c) for c in range(174, 256)]
    alphabet += [chr(256 + i) for i in range(256 - len(alphabet))]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = alphabet + [m.replace(" ", "") for m in merges] + ["<|im_start|>", "<|im_end|>"]
    path = tmp / "gpt2.gguf"
    gw = gguf.GGUFWriter(str(path), "qwen2")
    gw.add_tokenizer_model("gpt2")
    gw.add_tokenizer_pre("qwen2")
    gw.add_token_list(tokens)
    gw.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    gw.add_token_merges(merges)
    gw.add_eos_token_id(len(tokens) - 1)
    gw.add_add_bos_token(False)
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    put("gguf", "gpt2-tokenizer.gguf", path.read_bytes())


HTTP = {
    "get-health": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
    "head-models": b"HEAD /v1/models?x=1 HTTP/1.0\r\nAuthorization: Bearer k\r\n\r\n",
    "post-completions": b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 33\r\n\r\n{\"prompt\": \"Hi\", \"max_tokens\": 4}",
    "post-chat-expect": b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
                        b"Content-Length: 48\r\nContent-Length: 48\r\n\r\n"
                        b"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
    "chunked": b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "options-cors": b"OPTIONS /v1/chat/completions HTTP/1.1\r\nOrigin: http://localhost:3000\r\n"
                    b"Access-Control-Request-Method: POST\r\n\r\n",
}

JSON = {
    "completion": {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "seed": 1, "stop": ["\n"],
                   "logprobs": 2, "echo": False, "stream": True, "stream_options": {"include_usage": True}},
    "completion-ids": {"prompt": [1, 2, 3], "max_tokens": 2, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
                       "repeat_penalty": 1.1, "n": 1, "user": "u"},
    "chat": {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                        {"role": "assistant", "content": "Hello"},
                                        {"role": "user", "content": "😀 中文"}],
             "max_completion_tokens": 16, "temperature": 0.7, "logprobs": True, "top_logprobs": 3,
             "stop": "END", "presence_penalty": 0, "frequency_penalty": 0, "response_format": {"type": "text"}},
    "chat-schema": {"messages": [{"role": "user", "content": "A book?"}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "b", "strict": True, "schema": {
                        "type": "object", "properties": {"t": {"type": "string", "maxLength": 9},
                                                         "g": {"enum": ["a", "b"]}}, "required": ["t"]}}}},
    "chat-tools": {"messages": [{"role": "user", "content": "Weather?"},
                                {"role": "assistant", "content": None, "tool_calls": [
                                    {"id": "call_1", "type": "function",
                                     "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
                   "tools": [{"type": "function", "function": {"name": "w", "parameters": {
                       "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
                   "tool_choice": "required", "parallel_tool_calls": False},
}

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer"}, "rating": {"type": "number"},
        "tags": {"type": "array", "items": {"enum": ["a", "b\"c", 3, None]}, "minItems": 1, "maxItems": 3},
        "ok": {"type": ["boolean", "null"]}, "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
        "required": ["title"], "additionalProperties": False,
        "$defs": {"node": {"type": "object", "properties": {"v": {"const": 1}, "kids": {
            "type": "array", "items": {"$ref": "#/$defs/node"}}}}}},
    "pattern": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(x|yz)?[^\"\\\\]*$"},
    "any": {"type": "object", "additionalProperties": {"type": "array"}},
}

GRAMMARS = {
    "moves": '# moves\nroot ::= move (", " move){0,3} "!"?\nmove ::=\n  [a-h] [1-8] | "O-O" |\n  "\\u00e9" .\n',
    "json": 'root ::= value\nvalue ::= "{" ws (pair ("," ws pair)*)? "}" | "[" ws (value ("," ws value)*)? "]"'
            ' | "\\"" [^"\\\\]* "\\"" | [0-9]+ | "null"\npair ::= "\\"" [a-z]+ "\\"" ":" ws value\n'
            'ws ::= [ \\t\\n]?\n',
    # found by the 30-minute run of 5 December 2026: wildcards in a recursive rule, so ambiguous that
    # a mask over a large vocabulary is cut (tests/test_hardening.py)
    "ambiguous-wildcards": 'root ::= value\nvalue ::= "{"| ' + "." * 63 + '"" | [2-::=9]+ |ws (value ("," ws value)*)? '
                           '"8]" | .......value\nws ::= [ \\t\\n] \n',
}


# `scaled` (shared/src/fuzz_entry.rs): kind, n, and the parts of P A^n M C^n S. The shapes of
# issue 32's findings, at small n: nested groups in a grammar, a pattern, a schema and a request;
# a long literal.
SCALED = {
    "gbnf-groups": (0, 50, "root ::= ", "(", '"a"', ")", "\n"),
    "gbnf-literal": (0, 200, 'root ::= "', "語", "", "", '"\n'),
    "schema-anyof": (1, 20, "", '{"anyOf": [', "{}", "]}", ""),
    "pattern-groups": (2, 50, "^", "(", "a|b", ")", "$"),
    "request-arrays": (3, 30, '{"messages": ', "[", "", "]", "}"),
    # found by the 30-minute run of 5 December 2026 (a pattern literal of 214 KB with control
    # characters; linear, it timed out only on a starved fuzzer)
    "pattern-long-literal": (2, 23808, "", "ro\x01\x00\x00-\x02\x03\x00", "", "", "\x00\x00\x00\x00a\x01\n+"),
    # its rerun's find: a pattern of 196,605 '.' once made a rule per '.' (grammar::tests)
    "pattern-many-dots": (2, 50947, "", "", "", ".....n......", "..."),
}
# Inputs kept as the fuzzer wrote them (not UTF-8): the third rerun's, 5 December 2026, a pattern of
# 6,900 copies of a 38-byte piece that took 0.7 s under the sanitizer (scaled's limit is now 3 s).
SCALED_RAW = {
    "pattern-long-mixed": bytes.fromhex(
        "1201fa00000026ff8000ff00fe04000004000e0000000000007c7c02d2839d83"
        "ffffffff0000ff9e5c7777ffff000000007ce5e5e5e5e5e5e5e562017eff9e5c24"),
}


# chat templates in the shapes model files use (written here, not copied from any model)
CHAT_TEMPLATES = {
    "turns": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "tools": "{{ bos_token }}{% if tools %}{% for t in tools %}{{ t | tojson(indent=2) }}\n{% endfor %}{% endif %}"
             "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}"
             "{{ c.function.arguments | tojson }}{% endfor %}{% elif m.role == 'tool' %}[{{ m.tool_call_id }}]"
             "{{ m.content }}{% else %}{{ m.content.split('<')[-1].strip() }}{% endif %}{{ eos_token }}{% endfor %}",
    "namespace": "{% set ns = namespace(last=-1) %}{% for m in messages[::-1] %}{% if m.role == 'user' and "
                 "ns.last < 0 %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.last }}"
                 "{% macro r(x, d) %}{% if d > 0 %}({{ r(x, d - 1) }}){% else %}{{ x }}{% endif %}{% endmacro %}"
                 "{{ r('a', 20) }}{% if messages[0]['role'] != 'user' %}{{ raise_exception('no') }}{% endif %}",
    "date": "{{ strftime_now('%d %b %Y') }}{{ messages | length }}{% for k, v in messages[0].items() %}{{ k }}"
            "{% endfor %}",
}


def scaled_input(kind, n, p, a, m, c, s):
    out = bytearray([kind]) + struct.pack("<H", n)
    for part in (p, a, m, c):
        b = part.encode()
        out += bytes([len(b)]) + b
    return bytes(out + s.encode())


def imatrix_file(entries):
    """An importance matrix as `ml_run --imatrix-out` writes it (shared/src/import/imatrix.rs)."""
    out = bytearray(b"KRAFLA-IMATRIX-1\n") + struct.pack("<I", len(entries))
    for name, rows, w in entries:
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<QI", rows, len(w))
        out += np.asarray(w, dtype="<f4").tobytes()
    return bytes(out)


def main():
    put("imatrix", "two", imatrix_file([("blk.0.attn_q", 512, [0.5, 1.0, 2.0, 0.0] * 8),
                                         ("blk.0.ffn_down", 512, np.linspace(0, 3, 64))]))
    put("imatrix", "empty", imatrix_file([]))
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        gguf_seeds(tmp)
        mlt_seeds(tmp)
        mlb_seeds(tmp)
    for name, data in HTTP.items():
        put("http_head", name, data)
    for name, shape in SCALED.items():
        put("scaled", name, scaled_input(*shape))
    for name, data in SCALED_RAW.items():
        put("scaled", name, data)
    for name, body in JSON.items():
        put("json_request", name, json.dumps(body, ensure_ascii=False).encode())
    for name, schema in SCHEMAS.items():
        put("json_schema", name, json.dumps(schema, ensure_ascii=False).encode())
    for name, text in GRAMMARS.items():
        put("gbnf", name, text.encode())
    for name, text in CHAT_TEMPLATES.items():
        put("chat_template", name, text.encode())
    total = sum(p.stat().st_size for p in SEEDS.rglob("*") if p.is_file())
    print(f"seeds: {total} bytes in {SEEDS}")


if __name__ == "__main__":
    main()
