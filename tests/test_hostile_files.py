"""Property: any byte string given as a .mlb, .mlt or GGUF file ends in a loaded model (exit 0) or a
one-line error without control characters (exit 2; after the startup line when the model loads
and its values turn out not finite): never a crash, a hang, or an allocation driven by a count in
the file. Each file is a mutation of a real one (flipped bytes, extreme integers over the header's
fields, truncations, control bytes inserted, random tails), and each run has its address space
capped at what the valid file needs, so a reader that trusted a count and allocated for it would
abort and fail the test."""
import os
import random
import resource
import struct
import subprocess
import unicodedata

import pytest

from conftest import FIXTURES, import_model, ml_bin

CASES_PER_FORMAT = 120
# Address space of a run: the executable and one thread's stacks (about 8 MiB measured), plus room
# proportional to the file: it is mapped, repacked, or (a tokenizer) built into lookup tables,
# which the 1.2 MB SmolLM2 tokenizer needs about 10x its size for. A hostile count asks for
# gigabytes, far beyond this.
BASE_BYTES = 16 << 20
PER_FILE_BYTE = 12


def run_capped(args, file_size):
    cap = BASE_BYTES + PER_FILE_BYTE * file_size

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run([str(ml_bin()), *map(str, args), "-t", "1"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, preexec_fn=limit, timeout=60, errors="replace",
                          env={**os.environ, "MALLOC_ARENA_MAX": "1"})


def mutations(good, seed, count):
    """`count` mutations of `good`, the same for the same seed."""
    rng = random.Random(seed)
    head = min(len(good), 4096)
    extremes = [0, 1, 0x7F, 0xFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 1 << 40, (1 << 63) - 1, (1 << 64) - 1,
                len(good), len(good) + 1]
    for i in range(count):
        data = bytearray(good)
        kind = i % 5
        if kind == 0:  # flipped bytes, mostly in the header
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(head) if rng.random() < 0.8 else rng.randrange(len(data))
                data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # an extreme integer over a field
            at = rng.randrange(0, (128 if rng.random() < 0.5 else head) - 8, 4)  # the fixed header, often
            value = rng.choice(extremes)
            data[at:at + 8] = struct.pack("<Q", value) if rng.random() < 0.5 or value >= 1 << 32 \
                else struct.pack("<I", value) + data[at + 4:at + 8]
        elif kind == 2:  # truncated
            data = data[:rng.randrange(len(data))]
        elif kind == 3:  # control bytes inserted (in a string, they would reach a message)
            at = rng.randrange(8, head)
            data[at:at] = rng.choice([b"\x1b]0;x\x07", b"\n", b"\x00", b"\x1b[2J", b"\r\x08"])
        else:  # random bytes from some point on
            at = rng.randrange(8, head)
            data[at:] = rng.randbytes(rng.randrange(1, 2048))
        yield kind, bytes(data)


def check_every_mutation(good, path, args, seed):
    """Runs `args` (with `path` in them) on every mutation of `good` and checks the property."""
    failures = []
    outcomes = {0: 0, 2: 0}
    for n, (kind, data) in enumerate(mutations(good, seed, CASES_PER_FORMAT)):
        path.write_bytes(data)
        p = run_capped(args, len(good))
        # (a file that loads and then fails, its values not finite, has its startup line first)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("krafla: isa ")]
        ok = p.returncode in outcomes and "panicked" not in p.stderr
        if ok and p.returncode == 2:
            ok = len(lines) == 1 and lines[0].startswith("krafla: ") and \
                not any(unicodedata.category(c) == "Cc" for c in lines[0])
        if ok:
            outcomes[p.returncode] += 1
        else:
            keep = path.with_name(f"failing-{n}{path.suffix}")
            keep.write_bytes(data)
            failures.append(f"case {n} (kind {kind}, kept as {keep}): exit {p.returncode}: {p.stderr[-300:]!r}")
    assert not failures, "\n".join(failures[:10])
    assert outcomes[2] > CASES_PER_FORMAT // 2, outcomes  # the mutations do reach the checks


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory, smol):
    """A tiny .mlb (the llama2 fixture, q8_0), SmolLM2's real tokenizer (.mlt) and a tiny GGUF as
    llama.cpp writes one (the llama3-scaled fixture)."""
    from test_gguf import llama3_gguf_like_llama_cpp

    root = tmp_path_factory.mktemp("hostile")
    mlb = root / "tiny.mlb"
    import_model(FIXTURES / "hf-tiny" / "llama2", mlb, "--type", "q8_0")
    gguf = root / "tiny.gguf"
    llama3_gguf_like_llama_cpp(FIXTURES / "hf-tiny" / "llama3-scaled", gguf)
    return {"mlb": mlb, "mlt": smol("mlt"), "gguf": gguf}


@pytest.mark.parametrize("fmt, seed", [("mlb", 1), ("mlt", 2), ("gguf", 3)])
def test_any_bytes_load_or_fail_on_one_line(valid_files, tmp_path, fmt, seed):
    good = valid_files[fmt].read_bytes()
    path = tmp_path / f"mutated.{fmt}"
    args = ["-z", path, "-p", "hi", "--tokenize"] if fmt == "mlt" else [path, "--prompt-ids", "1,2", "-n", "1",
                                                                        "--ctx", "16"]
    # the valid file itself runs under the same cap
    valid = run_capped([valid_files[fmt] if a == path else a for a in args], len(good))
    assert valid.returncode == 0, valid.stderr
    check_every_mutation(good, path, args, seed)


def few_bytes_gguf(arch, block_count):
    """A GGUF file of a few hundred bytes (issue 32's was 544): `arch`'s hyperparameters claiming
    `block_count` layers and a sliding window (so that the mistral and qwen2 families, like the
    Gemma ones, give every layer a kind), a three-token vocabulary and one token embedding."""
    def string(s):
        return struct.pack("<Q", len(s)) + s.encode()

    u32, u64, text = (lambda v: struct.pack("<II", 4, v)), (lambda v: struct.pack("<IQ", 10, v)), \
        (lambda s: struct.pack("<I", 8) + string(s))
    meta = [("general.architecture", text(arch)), (f"{arch}.block_count", u64(block_count)),
            (f"{arch}.embedding_length", u32(32)), (f"{arch}.attention.head_count", u32(2)),
            (f"{arch}.feed_forward_length", u32(32)), (f"{arch}.attention.sliding_window", u32(4)),
            ("tokenizer.ggml.model", text("gpt2")),
            ("tokenizer.ggml.tokens", struct.pack("<IIQ", 9, 8, 3) + b"".join(map(string, "abc")))]
    out = b"GGUF" + struct.pack("<IQQ", 3, 1, len(meta)) + b"".join(string(k) + v for k, v in meta)
    out += string("token_embd.weight") + struct.pack("<IQQIQ", 2, 32, 3, 0, 0)  # [3][32] f32 at 0
    out += bytes(-len(out) % 32)
    return out + bytes(4 * 32 * 3)


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma2", "gemma3", "llama"])
@pytest.mark.parametrize("block_count", [1 << 26, 1 << 40, 1 << 61])
def test_a_huge_block_count_is_one_line(tmp_path, arch, block_count):
    """A block count far beyond the tensors in the file is refused by name before anything is
    allocated per layer (the families that list a kind per layer asked for 8 bytes a layer: 1 GB
    for 2^26, an abort for 2^40, a capacity-overflow panic for 2^61), under the address-space cap."""
    data = few_bytes_gguf(arch, block_count)
    path = tmp_path / f"{arch}.gguf"
    path.write_bytes(data)
    p = run_capped([path, "--prompt-ids", "1", "-n", "1"], len(data))
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-500:])
    assert lines[0] == f"krafla: {path}: {arch}.block_count = {block_count} is outside 1..=1024"
