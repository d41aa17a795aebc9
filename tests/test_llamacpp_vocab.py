"""llama.cpp's own tokenizer suites (issue 34): every `models/ggml-vocab-NAME.gguf` of
llama.cpp 0c1e570 (the vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist on PyPI) that comes
with `.inp` texts and `.out` ids, the vocabulary read from the GGUF as `ml_run` reads a model's,
every text encoded without special tokens (as llama.cpp's test-tokenizer-0 does) and compared id
for id. The sdist is downloaded once into .cache/llamacpp (74 MB) when it is not there."""
import json

import pytest

from conftest import LLAMACPP_MODELS, llamacpp_models, run_ml

MODELS = LLAMACPP_MODELS
SEPARATOR = "\n__ggml_vocab_test__\n"

# Suites of tokenizers Krafla does not run, and why.
NOT_RUN = {
    "bert-bge": "a WordPiece (BERT) vocabulary: an embedding model's, not one of the Models families",
}


NAMES = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in llamacpp_models().glob("ggml-vocab-*.gguf.inp"))


def test_every_suite_of_the_sdist_is_here():
    assert len(NAMES) >= 15, NAMES
    for name in ["gpt-2", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "deepseek-coder",
                 "deepseek-llm", "falcon", "starcoder", "refact", "command-r", "gemma-4"]:
        assert name in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_suite_ids_from_the_gguf(name, cases_binary, tmp_path):
    if name in NOT_RUN:
        pytest.skip(NOT_RUN[name])
    gguf = MODELS / f"ggml-vocab-{name}.gguf"
    texts = (MODELS / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    texts[-1] = texts[-1].removesuffix("\n__ggml_vocab_test__\n").removesuffix("\n__ggml_vocab_test__")
    want = (MODELS / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    if len(texts) > len(want) and texts[-1] == "":
        texts.pop()  # the separator after the last text
    assert len(want) >= len(texts) > 30, (name, len(texts), len(want))
    want = want[:len(texts)]
    mlt = tmp_path / "tokenizer.mlt"
    run_ml("-z", gguf, "--save-tokenizer", mlt, "--tokenize", "-p", "x")
    lines = [f"E 0 {t.encode('utf-8').hex()}" for t in texts]
    results = cases_binary(mlt, lines, tmp_path)
    wrong = [(t[:40], got["ids"][:16], [int(i) for i in w.split()][:16])
             for t, w, got in zip(texts, want, results, strict=True) if got["ids"] != [int(i) for i in w.split()]]
    assert not wrong, f"{name}: {len(wrong)} of {len(texts)} texts differ, e.g. {wrong[:3]}"


def test_gemma4_always_adds_bos(tmp_path):
    # llama.cpp adds BOS for the gemma4 tokenizer even where the file's add_bos_token says no:
    # a copy whose flag (key, u32 type 7 = bool, one byte) is patched to false
    data = bytearray((MODELS / "ggml-vocab-gemma-4.gguf").read_bytes())
    key = b"tokenizer.ggml.add_bos_token"
    at = data.index(key) + len(key)
    assert data[at:at + 5] == b"\x07\x00\x00\x00\x01"
    data[at + 4] = 0
    gguf = tmp_path / "no-bos.gguf"
    gguf.write_bytes(data)
    for file in [MODELS / "ggml-vocab-gemma-4.gguf", gguf]:
        out = run_ml("-z", file, "--tokenize", "-p", "Hello world")
        assert json.loads(out.stdout) == [2, 9259, 1902]
