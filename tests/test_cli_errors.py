"""Bad input gets a one-line error and exit code 2, never a panic."""
import struct

import pytest

from conftest import FIXTURES, run_ml, run_tool


@pytest.fixture(scope="module")
def tiny_mlb(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny.mlb"
    run_tool("convert.py", FIXTURES / "hf-tiny" / "llama2", "-o", out, "--type", "q8_0")
    return out


def assert_clean_error(p, needle):
    assert p.returncode == 2, f"exit {p.returncode}, stderr: {p.stderr}"
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got: {p.stderr!r}"
    assert needle in lines[0], lines[0]
    assert "panicked" not in p.stderr


def test_truncated_model_files(tiny_mlb, tmp_path):
    data = tiny_mlb.read_bytes()
    for cut in [0, 7, 8, 11, 15, 19, 23, 30, 200, len(data) // 2, len(data) - 1]:
        bad = tmp_path / f"cut{cut}.mlb"
        bad.write_bytes(data[:cut])
        p = run_ml(bad, "--prompt-ids", "1,2", "-n", "1", check=False)
        assert_clean_error(p, str(bad))


def test_hostile_counts_and_missing_file(tiny_mlb, tmp_path):
    data = bytearray(tiny_mlb.read_bytes())
    struct.pack_into("<I", data, 16, 0xFFFFFFFF)  # tensor count
    bad = tmp_path / "count.mlb"
    bad.write_bytes(data)
    assert_clean_error(run_ml(bad, "--prompt-ids", "1", check=False), "tensor count")
    assert_clean_error(run_ml(tmp_path / "nope.mlb", "--prompt-ids", "1", check=False), "cannot open")


def test_bad_requests(tiny_mlb):
    assert_clean_error(run_ml(tiny_mlb, "--prompt-ids", "1,99999", "-n", "1", check=False), "outside the vocabulary")
    assert_clean_error(run_ml(tiny_mlb, "--prompt-ids", "1", "--ctx", "100000000", check=False),
                       "exceeds the model's maximum context")
    assert_clean_error(run_ml(tiny_mlb, "-p", "hi", check=False), "needs a tokenizer")
    assert_clean_error(run_ml(tiny_mlb, "--prompt-ids", "1", "--chat", "nope", "-p", "x", check=False),
                       "invalid value 'nope' for '--chat")
    p = run_ml("--bogus-flag", check=False)
    assert p.returncode == 2
