"""Bad input gets a one-line error and exit code 2, never a panic."""
import os
import struct
import subprocess
import unicodedata

import pytest

from conftest import FIXTURES, import_model, ml_bin, run_ml


@pytest.fixture(scope="module")
def tiny_mlb(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny.mlb"
    import_model(FIXTURES / "hf-tiny" / "llama2", out, "--type", "q8_0")
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


def launcher():
    """The launcher beside the executable under test (target/release or an unpacked dist)."""
    return ml_bin().parent / "ml_run"


def run_with_closed_stdout(*args):
    """Runs with stdout a pipe whose reader has gone (as `| head` after it read enough)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([str(a) for a in args], stdout=w, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              text=True, timeout=120)
    finally:
        os.close(w)


def test_a_closed_stdout_ends_every_mode_quietly(smollm2_gguf, smol):
    cases = [
        [launcher(), "--list-isas"],
        [launcher(), "--version"],
        [launcher(), "--help"],
        [ml_bin(), "--help"],
        [ml_bin(), "-z", smol("mlt"), "-p", "hello", "--tokenize"],
        [ml_bin(), smollm2_gguf, "--bench", "-pp", "8", "-tg", "2", "-r", "1"],
        [ml_bin(), smollm2_gguf, "-p", "Count from 1 to 100:", "-n", "40"],
        [ml_bin(), smollm2_gguf, "-p", "Count from 1 to 100:", "-n", "8", "--print-ids"],
    ]
    for args in cases:
        p = run_with_closed_stdout(*args)
        assert p.returncode == 0 and "panicked" not in p.stderr, (args, p.returncode, p.stderr)


def no_control_characters(text):
    return not any(unicodedata.category(c) == "Cc" for c in text)


def test_file_content_in_errors_is_escaped_onto_one_line(tiny_mlb, tmp_path):
    data = tiny_mlb.read_bytes()
    evil = b"e\x1b]0;\x07\n"  # 7 bytes: an OSC title sequence, a newline
    # two keys of 7 bytes renamed to the same evil name: a duplicate key
    for key in (b"n_heads", b"ffn_dim"):
        at = data.index(struct.pack("<I", len(key)) + key) + 4
        data = data[:at] + evil + data[at + 7:]
    bad = tmp_path / "dup.mlb"
    bad.write_bytes(data)
    p = run_ml(bad, "--prompt-ids", "1", "-n", "1", check=False)
    assert_clean_error(p, "duplicate metadata key 'e\\u{1b}]0;\\u{7}\\n'")
    assert no_control_characters(p.stderr.rstrip("\n"))
    # an architecture name holding the same bytes
    data = tiny_mlb.read_bytes()
    at = data.index(b"arch\x02\x05\x00\x00\x00llama") + 9
    bad.write_bytes(data[:at] + b"\x1b]\x07\n\x00" + data[at + 5:])
    p = run_ml(bad, "--prompt-ids", "1", "-n", "1", check=False)
    assert_clean_error(p, "unknown architecture '\\u{1b}]\\u{7}\\n\\u{0}'")
    assert no_control_characters(p.stderr.rstrip("\n"))


@pytest.mark.parametrize("option", [
    ["--top-p", "2"], ["--top-p", "NaN"], ["-T", "NaN"], ["-T", "inf"], ["--temp=-1"], ["--top-p=-0.5"],
    ["--min-p", "5"], ["--repeat-penalty", "NaN"], ["--repeat-penalty", "0"],
])
def test_sampling_values_the_server_refuses_are_refused(tiny_mlb, option):
    p = run_ml(tiny_mlb, "--prompt-ids", "1", "-n", "1", *option, check=False)
    assert_clean_error(p, "must be a number")


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 bytes (tokenizer.json's byte-level token text)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in keep]
    return [chr(b) if b in keep else chr(256 + extra.index(b)) for b in range(256)]


def write_small_tokenizer(path, n_vocab):
    """A byte-level BPE .mlt (docs/FORMAT.md) of `n_vocab` tokens: the 256 bytes, then filler tokens."""
    def string(s):
        b = s.encode()
        return struct.pack("<I", len(b)) + b

    out = b"KRAFLAMT" + struct.pack("<IIII", 1, 0, 1, 0) + struct.pack("<5i", -1, -1, -1, -1, -1) + string("")
    tokens = bytes_to_unicode() + [f"<filler{i}>" for i in range(n_vocab - 256)]
    out += struct.pack("<I", n_vocab) + b"".join(string(t) + struct.pack("<fB", 0.0, 0) for t in tokens)
    path.write_bytes(out + struct.pack("<I", 0))


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(smollm2_gguf, tmp_path):
    small = tmp_path / "400.mlt"
    write_small_tokenizer(small, 400)
    p = run_ml(smollm2_gguf, "-z", small, "-p", "hello", "-n", "4", check=False)
    assert_clean_error(p, "the tokenizer has 400 tokens but the model 49152")
    assert run_ml("-z", small, "-p", "hi", "--tokenize").stdout.strip() == "[104,105]"  # the file itself is fine


def test_bench_refuses_lengths_beyond_the_context(smollm2_gguf):
    for args in (["-pp", "100000"], ["-pp", "9000"], ["-pp", "8", "-tg", "8192"]):
        p = run_ml(smollm2_gguf, "--bench", *args, "-r", "1", check=False, timeout=30)
        assert_clean_error(p, "do not fit the model's context of 8192 tokens")


def test_thread_counts_beyond_any_machine_are_refused(tiny_mlb):
    assert_clean_error(run_ml(tiny_mlb, "--prompt-ids", "1", "-n", "1", "-t", "100000", check=False, timeout=30),
                       "at most 1024 threads")


def test_running_out_of_memory_is_the_machines_fault(smollm2_gguf):
    """A KV cache the address space cannot hold: one line naming it and --ctx, exit 71 (the machine's
    fault, not the input's 2). SmolLM2 at --ctx 8192 needs 2 x 180 MiB of f32 cache beside its load
    (~240 MiB as q8_0 without repacked copies, on every build); 420 MiB of address space holds the
    load but not the cache."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (420 << 20, 420 << 20))

    p = subprocess.run([str(ml_bin()), smollm2_gguf, "--type", "q8_0", "--no-repack", "--ctx", "8192",
                        "--prompt-ids", "1,2", "-n", "1", "-t", "1"],
                       capture_output=True, text=True, timeout=300, preexec_fn=limit, stdin=subprocess.DEVNULL)
    assert p.returncode == 71, f"exit {p.returncode}: {p.stderr}"
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--ctx 8192: cannot allocate the" in lines[0] and "cache" in lines[0], p.stderr
