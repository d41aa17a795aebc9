"""Tensor layouts of .mlb files (docs/FORMAT.md, "Tensor layouts").

A file whose Q8_0 / Q4_0 / Q4_K / Q6_K matrices are stored as the eight-row
groups the kernels read (`rows8`, what --save writes) gives the same logits,
byte for byte, as the same model in plain rows (a version 1 file,
`mlb.write_plain_rows`, or the GGUF file itself), on every build:
the host's, the one KRAFLA_BIN names, and the ARM builds under qemu. Builds
with eight-row kernels use the groups in place (no repacked copy), the others
de-interleave them at load; the startup line says which. A bad layout field
or a truncated interleaved tensor is a one-line error.
"""
import re
import shutil
import struct

import numpy as np
import pytest

import mlb
import mlb_layout
from conftest import (
    FIXTURES,
    REPO,
    import_model,
    isas,
    logits_bytes,
    ml_bin,
    oldest_cpu,
    run_ml,
    unavailable,
    variant_table,
)

# Every x86-64 build reads eight-row groups; the K-quant ones need AVX2 (avx2/kquant_rows8.rs).
X86_ROWS8 = rf"isa ({'|'.join(isas('x86_64'))}),"
X86_KQUANT_ROWS8 = rf"isa ({'|'.join(v['name'] for v in variant_table()['x86_64'] if 'avx2' in v['cpu_features'])}),"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(family, type) -> (plain-rows file, rows8 file) of a tiny fixture, converted once."""
    root = tmp_path_factory.mktemp("layout")
    cache = {}

    def get(family, qtype):
        if (family, qtype) not in cache:
            rows, rows8 = root / f"{family}-{qtype}-rows.mlb", root / f"{family}-{qtype}-rows8.mlb"
            import_model(FIXTURES / "hf-tiny" / family, rows8, "--type", qtype)
            mlb.write_plain_rows(rows8, rows)
            cache[(family, qtype)] = (rows, rows8)
        return cache[(family, qtype)]

    return get


def copies(stderr):
    """(repacked MiB, de-interleaved MiB) from the startup line."""
    m = re.search(r"\+ ([0-9.]+) MiB repacked weights \+ ([0-9.]+) MiB de-interleaved weights", stderr)
    assert m, stderr
    return float(m.group(1)), float(m.group(2))


def logits(model, ids, out, *extra):
    run_ml(model, "--prompt-ids", ids, "--logits-out", out, "-n", "0", *extra)
    return out.read_bytes()


def version(path):
    return struct.unpack_from("<I", path.read_bytes(), 8)[0]


CASES = [("smollm2-tied", "q8_0"), ("smollm2-tied", "q4_0"), ("qwen3_5-hybrid", "q4_0"),
         ("gemma3-local-global", "q8_0"), ("llama2", "q4_0")]


@pytest.mark.parametrize("family,qtype", CASES)
def test_stored_groups_give_the_plain_files_logits(family, qtype, pair, tmp_path):
    plain, rows8 = pair(family, qtype)
    assert (version(plain), version(rows8)) == (1, 2)
    ids = "1,2,3,4,5,6,7,8,9,10,11"
    want = logits(plain, ids, tmp_path / "plain.f32")
    for threads, batch in [(1, 512), (2, 5), (3, 1)]:
        got = logits(rows8, ids, tmp_path / "rows8.f32", "-t", threads, "--batch", batch)
        assert got == want, f"{family} {qtype}: rows8 logits differ from plain rows at -t {threads} --batch {batch}"
    assert logits(rows8, ids, tmp_path / "rows8.f32", "--no-repack") == want
    # what loading copied: on x86 the plain file's matrices are repacked, the rows8 file's used in
    # place (Q8_0 re-biased on avx512vnni only); builds without eight-row kernels de-interleave
    p_plain, p_rows8 = run_ml(plain, "--prompt-ids", "1", "-n", "0"), run_ml(rows8, "--prompt-ids", "1", "-n", "0")
    (rep_plain, de_plain), (rep_rows8, de_rows8) = copies(p_plain.stderr), copies(p_rows8.stderr)
    assert de_plain == 0
    if re.search(X86_ROWS8, p_rows8.stderr):
        assert rep_plain > 0 and de_rows8 == 0, p_rows8.stderr
        assert rep_rows8 < rep_plain or (qtype == "q8_0" and "avx512vnni" in p_rows8.stderr), p_rows8.stderr
    else:
        assert rep_plain == rep_rows8 == 0 and de_rows8 > 0, p_rows8.stderr


def test_both_layouts_hold_the_same_tensors(pair):
    """The Python reader takes the groups apart again: every tensor's plain bytes are the plain file's."""
    plain, rows8 = (mlb.MlbReader(p) for p in pair("smollm2-tied", "q4_0"))
    assert plain.tensors.keys() == rows8.tensors.keys()
    stored = [n for n, lay in rows8.layouts.items() if lay == mlb.LAYOUT_ROWS8]
    assert stored and all(rows8.tensors[n][0] in (mlb.Q8_0, mlb.Q4_0) for n in stored)
    assert all(lay == mlb.LAYOUT_ROWS for lay in plain.layouts.values())
    for name in plain.tensors:
        assert np.array_equal(plain.raw(name), rows8.raw(name)), name
    assert any(not np.array_equal(plain.stored(n), rows8.stored(n)) for n in stored)


@pytest.mark.parametrize("ttype", [mlb.Q8_0, mlb.Q4_0, mlb.Q4_K, mlb.Q6_K])
@pytest.mark.parametrize("rows", [8, 19, 40])
def test_interleave_round_trips(ttype, rows):
    """Any bytes (every bit pattern is a block) come back bit for bit; whole groups are moved, a tail of rows % 8
    rows is not."""
    cols = 3 * mlb_layout.BLOCK_WEIGHTS[ttype]
    raw = np.random.default_rng(rows).integers(0, 256, rows * 3 * mlb_layout.ROW_BLOCK[ttype], np.uint8).tobytes()
    stored = mlb_layout.interleave(raw, ttype, rows, cols)
    assert len(stored) == mlb.stored_nbytes(ttype, (rows, cols), mlb.LAYOUT_ROWS8)
    assert mlb_layout.deinterleave(stored, ttype, rows, cols) == raw
    tail = rows % 8 * 3 * mlb_layout.ROW_BLOCK[ttype]
    assert stored[len(stored) - tail:] == raw[len(raw) - tail:] and stored[:64] != raw[:64]


def test_save_interleaves_a_plain_file_as_the_converter_does(pair, tmp_path):
    """`ml_run PLAIN.mlb --save` stores the plain file's matrices in groups: the converter's rows8 file."""
    plain, rows8 = pair("smollm2-tied", "q4_0")
    out = tmp_path / "saved.mlb"
    run_ml(plain, "--save", out, "--prompt-ids", "1", "-n", "0")
    assert out.read_bytes() == rows8.read_bytes()


def test_k_quant_groups_give_the_gguf_files_logits(tmp_path):
    """Gemma 3 270M Q4_K_M: Q4_K and Q6_K matrices (and Q8_0) stored in groups by --save give the
    logits of the GGUF file (plain rows) run as it is."""
    from conftest import models
    gguf = models.gemma3_gguf()
    saved = tmp_path / "gemma3.mlb"
    ids = "2,818,5279,100,200"
    want = logits(gguf, ids, tmp_path / "gguf.f32", "--ctx", "64", "--save", saved)
    r = mlb.MlbReader(saved)
    kinds = {r.tensors[n][0] for n, lay in r.layouts.items() if lay == mlb.LAYOUT_ROWS8}
    assert {mlb.Q4_K, mlb.Q6_K} <= kinds
    for threads, batch in [(2, 512), (1, 2)]:
        got = logits(saved, ids, tmp_path / "mlb.f32", "--ctx", "64", "-t", threads, "--batch", batch)
        assert got == want, f"rows8 K-quant logits differ at -t {threads} --batch {batch}"
    p = run_ml(saved, "--prompt-ids", "1", "-n", "0", "--ctx", "64")
    repacked, deinterleaved = copies(p.stderr)
    if re.search(X86_KQUANT_ROWS8, p.stderr):
        assert deinterleaved == 0, p.stderr
    else:
        assert deinterleaved > 0, p.stderr  # the K-quant matrices, without eight-row K-quant kernels


def entry_field(data, name, after_type):
    """Offset of the u32 `after_type` fields after tensor `name`'s type in a version 2 header."""
    key = struct.pack("<I", len(name)) + name.encode()
    at = data.index(key) + len(key) + 4
    return at + 4 * (after_type - 1)


def one_line_error(path, needle):
    p = run_ml(path, "--prompt-ids", "1", "-n", "0", check=False)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and needle in lines[0], p.stderr


def test_a_bad_layout_is_a_one_line_error(pair, tmp_path):
    _, rows8 = pair("smollm2-tied", "q4_0")
    good = rows8.read_bytes()
    r = mlb.MlbReader(rows8)
    matrix = next(n for n, lay in r.layouts.items() if lay == mlb.LAYOUT_ROWS8)
    vector = next(n for n, (t, s, _) in r.tensors.items() if len(s) == 1)
    bad = bytearray(good)
    struct.pack_into("<I", bad, entry_field(good, matrix, 1), 7)
    (tmp_path / "a.mlb").write_bytes(bad)
    one_line_error(tmp_path / "a.mlb", f"tensor '{matrix}' has unknown layout 7")
    bad = bytearray(good)
    struct.pack_into("<I", bad, entry_field(good, vector, 1), 1)
    (tmp_path / "b.mlb").write_bytes(bad)
    one_line_error(tmp_path / "b.mlb", f"tensor '{vector}': layout rows8 needs a 2-D q8_0, q4_0, q4_k or q6_k matrix")
    # the file cut in the middle of the last interleaved matrix's groups
    last = max((n for n, lay in r.layouts.items() if lay == mlb.LAYOUT_ROWS8), key=lambda n: r.tensors[n][2])
    start = r.data_start + r.tensors[last][2]
    (tmp_path / "c.mlb").write_bytes(good[:start + 1000])
    one_line_error(tmp_path / "c.mlb", f"tensor '{last}': data (offset")


def qemu_builds():
    """(label, command prefix) of each ARM build of this checkout in dist/ that qemu can run."""
    out = []
    for platform, qemu, arch in [("linux-aarch64", "qemu-aarch64", "aarch64"), ("linux-armv7hf", "qemu-arm", "arm")]:
        baseline = isas(arch)[-1]
        cpu = oldest_cpu(arch, baseline)
        exe = REPO / "dist" / platform / f"ml_{baseline}"
        if exe.is_file() and shutil.which(qemu):
            out.append((platform, [shutil.which(qemu), "-cpu", cpu, exe]))
    return out


def test_arm_builds_de_interleave_to_the_same_logits(pair, tmp_path):
    """ARM builds (no eight-row kernels) read a rows8 file by de-interleaving it: the native build's
    logits of the plain file, byte for byte (`cargo xtask dist linux-aarch64` / `linux-armv7hf` first)."""
    builds = qemu_builds()
    if not builds:
        unavailable("no ARM build in dist/ (cargo xtask dist linux-aarch64 --isa neon) or no qemu-user")
    for family, qtype in [("smollm2-tied", "q4_0"), ("llama2", "q8_0")]:
        plain, rows8 = pair(family, qtype)
        want = logits_bytes([ml_bin()], plain, tmp_path / "native.f32", "1,2,3,4,5", 2)
        for label, cmd in builds:
            got = logits_bytes(cmd, rows8, tmp_path / f"{label}.f32", "1,2,3,4,5", 2)
            assert got == want, f"{label} {family} {qtype}: rows8 logits differ from the native plain file's"
