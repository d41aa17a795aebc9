"""Shared pytest fixtures for Krafla's end-to-end tests.

Binaries come from `target/release` (built by `cargo xtask test`); set
KRAFLA_BIN to test another `ml_*` executable. The real models are downloaded
by tools/models.py and cached under `.cache/` in the checkout.
"""
import functools
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
# the tests import the tools' modules (convert, mlb, models, reference_forward, ...)
sys.path.insert(0, str(TOOLS))
import models  # noqa: E402  (needs TOOLS on sys.path)

SHARED = pathlib.Path(os.environ.get("KRAFLA_SHARED", REPO.parent / "shared")).resolve()
FIXTURES = SHARED / "fixtures"
# tiny models of the families read from GGUF only, made by tools/make_gguf_fixtures.py (committed)
GGUF_TINY = REPO / "tests" / "fixtures" / "gguf-tiny"


def ml_bin() -> pathlib.Path:
    """The inference executable under test."""
    return pathlib.Path(os.environ.get("KRAFLA_BIN", REPO / "target" / "release" / "ml_variant"))


def run_ml(*args, check=True, timeout=600, **kw):
    """Run the inference executable; returns CompletedProcess (text mode)."""
    cmd = [str(ml_bin()), *map(str, args)]
    kw.setdefault("stdin", subprocess.DEVNULL)  # without a prompt, a piped stdin would be read as one
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstderr:\n{p.stderr}")
    return p


@functools.cache
def runs_here(exe) -> bool:
    """Whether this CPU runs the build `exe` (its CPU guard exits 3 where a feature is missing)."""
    return subprocess.run([str(exe), "--version"], capture_output=True).returncode == 0


class ServerProcess:
    """A server on a free loopback port (started with --port 0): `cmd` runs with its output in the
    log `log_path` until the log names its address (host, port); `stop` ends it."""

    def __init__(self, cmd, log_path, start_timeout, stop_timeout, **popen):
        self.log_path = log_path
        self.stop_timeout = stop_timeout
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([str(a) for a in cmd], stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, **popen)
        deadline = time.time() + start_timeout
        while True:
            m = re.search(r"listening on http://([\d.]+):(\d+)/v1", log_path.read_text())
            if m:
                break
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise AssertionError(f"server did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        self.host, self.port = m.group(1), int(m.group(2))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def unavailable(reason):
    """Skips a test whose tool or build is missing; in CI (env CI set) fails instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


class FixtureJson:
    """A JSON file of the shared fixtures, read when a test first looks into it: a checkout without
    ../shared/fixtures still collects, and the tests that need the file skip naming it (fail in CI)."""

    def __init__(self, path):
        self.path = path

    @functools.cached_property
    def data(self):
        if not self.path.is_file():
            unavailable(f"the fixture {self.path} is missing (the shared fixtures: KRAFLA_SHARED)")
        return json.loads(self.path.read_text())

    def __getitem__(self, key):
        return self.data[key]


# ---------------------------------------------------------------- the variant table

@functools.cache
def variant_table():
    """build/src/variants.rs as `cargo xtask variants` prints it: {arch: [{name, rustc_features,
    cpu_features}]},
    fastest first (arch as Rust's std::env::consts::ARCH spells it). `cargo xtask test` writes it to
    target/variants.json; without that file (or when the table is newer) it is asked for."""
    cached = REPO / "target" / "variants.json"
    source = REPO / "build" / "src" / "variants.rs"
    if cached.is_file() and cached.stat().st_mtime >= source.stat().st_mtime:
        return json.loads(cached.read_text())
    p = subprocess.run(["cargo", "xtask", "variants"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def isas(arch):
    """The build names of `arch` (x86_64, aarch64, arm), fastest first."""
    return [v["name"] for v in variant_table()[arch]]


# The CPU features each qemu-user 7.2 CPU model offers, among the ones the variant table checks
# (a fact about qemu, not about Krafla): the guard's expected answers follow from it and the table.
QEMU_CPU_FEATURES = {
    "x86_64": {
        "qemu64": {"sse3"},
        "core2duo": {"sse3", "ssse3"},
        "Nehalem": {"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"},
        "Haswell": {"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2"},
    },
    "aarch64": {
        "cortex-a53": {"neon"},
        "cortex-a72": {"neon"},
        "cortex-a76": {"neon", "dotprod"},
        "neoverse-n1": {"neon", "dotprod"},
        "a64fx": {"neon", "sve"},
        "max": {"neon", "dotprod", "i8mm", "sve"},
    },
    "arm": {"cortex-a7": {"neon", "vfp4"}, "cortex-a15": {"neon", "vfp4"}},
}


def missing_feature(arch, isa, cpu):
    """The feature the start-up guard of build `isa` names on qemu CPU model `cpu` (the first of its
    row the CPU lacks), or None when the build runs there."""
    has = QEMU_CPU_FEATURES[arch][cpu]
    return next((f for f in variant(arch, isa)["cpu_features"] if f not in has), None)


def variant(arch, isa):
    """The table's row of build `isa`."""
    return next(v for v in variant_table()[arch] if v["name"] == isa)


def oldest_cpu(arch, isa):
    """The first qemu CPU model of QEMU_CPU_FEATURES (oldest first) that runs build `isa`, or None
    (qemu-user 7.2 emulates no AVX-512: such a build runs natively or not at all)."""
    return next((cpu for cpu in QEMU_CPU_FEATURES[arch] if missing_feature(arch, isa, cpu) is None), None)


def best_build(arch, cpu):
    """The build the launcher picks on qemu CPU model `cpu`: the fastest that runs there."""
    return next(name for name in isas(arch) if missing_feature(arch, name, cpu) is None)


# ---------------------------------------------------------------- builds under qemu-user


def under_qemu(qemu, cpu, exe, *args, timeout=600):
    return subprocess.run([qemu, "-cpu", cpu, str(exe), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def krafla_lines(stderr):
    """stderr without qemu's own warnings ("qemu-<arch>: ...", e.g. features TCG cannot emulate)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not re.match(r"qemu-[\w-]+:", ln)]


def assert_guard(p, build, missing):
    """`ml_<build> --version` on an emulated CPU: main ran (`missing` None), or
    the start-up guard refused before main with exit 3 and one line naming
    the feature `missing`."""
    if missing is None:
        assert p.returncode == 0, f"ml_{build}: exit {p.returncode}\n{p.stderr}"
        assert "ml_run" in p.stdout  # clap's --version: main was reached
    else:
        want = (f"krafla: this build ({build}) needs the CPU feature '{missing}', which this CPU lacks; "
                f"run ml_run to pick a build that fits")
        assert p.returncode == 3, f"ml_{build}: exit {p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}"
        assert krafla_lines(p.stderr) == [want]
        assert p.stdout == "", "main must not have run"


def cross_toolchain(triple, linker, linker_package, qemu):
    """Skips (fails in CI) unless the Rust target, the cross linker and qemu-user are installed."""
    p = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True)
    missing = []
    if not (p.returncode == 0 and (pathlib.Path(p.stdout.strip()) / "lib" / "rustlib" / triple / "lib").is_dir()):
        missing.append(f"the Rust target (rustup target add {triple})")
    if not shutil.which(linker):
        missing.append(f"{linker} (apt-get install {linker_package})")
    if not shutil.which(qemu):
        missing.append(f"{qemu} (apt-get install qemu-user)")
    if missing:
        unavailable("missing " + ", ".join(missing))


def build_unit_tests(platform, isa):
    """The krafla library's unit-test executable of variant `isa` of `platform` (linux-aarch64,
    linux-armv7hf), compiled by `cargo xtask unit-tests` as `cargo xtask dist` compiles that
    variant (its target features, static C runtime, the shared target dir target/variants, where
    the dependencies are already compiled)."""
    cmd = ["cargo", "xtask", "unit-tests", platform, "--isa", isa]
    env = {k: v for k, v in os.environ.items() if k not in ("RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS")}
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise AssertionError(f"{isa}: {' '.join(cmd)} exited {p.returncode}\n{p.stderr[-4000:]}")
    tests = [m["executable"] for m in map(json.loads, filter(None, p.stdout.splitlines()))
             if m.get("reason") == "compiler-artifact" and m.get("executable")
             and m["target"]["name"] == "krafla" and m["profile"]["test"]]
    assert len(tests) == 1, f"{isa}: unit-test executables {tests}"
    return pathlib.Path(tests[0])


def logits_bytes(cmd, mlb, out, ids, n):
    """(the raw f32 logits `--logits-out` writes, stdout with `--print-ids`) of `cmd MLB`."""
    p = subprocess.run([*map(str, cmd), str(mlb), "--prompt-ids", ids, "--logits-out", str(out), "-n", str(n),
                        "-t", "2", "--print-ids"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stderr}"
    data = out.read_bytes()
    assert len(data) > 0 and len(data) % 4 == 0
    return data, p.stdout


@pytest.fixture(scope="session")
def native():
    """The host build `cargo build --release` makes (x86-64: the sse2 kernels), to compare cross builds against."""
    exe = REPO / "target" / "release" / "ml_variant"
    if not exe.is_file():
        unavailable(f"no native build {exe}: run `cargo build --release`")
    return exe


@pytest.fixture(scope="session")
def tiny_llama2(tmp_path_factory):
    """qtype -> the tiny random llama2 fixture converted to q4_0, q8_0 and f16 (.mlb)."""
    out = tmp_path_factory.mktemp("tiny-llama2")
    models = {}
    for qtype in ["q4_0", "q8_0", "f16"]:
        models[qtype] = out / f"llama2-{qtype}.mlb"
        import_model(FIXTURES / "hf-tiny" / "llama2", models[qtype], "--type", qtype)
    return models


@pytest.fixture
def tiny_logits_match_native(native, tiny_llama2, tmp_path):
    """check(cmd, label): `cmd` (e.g. [qemu, "-cpu", cpu, exe]) writes the native build's exact
    logits bytes and ids for every tiny llama2 quant type; `label` names it in file names and messages."""

    def check(cmd, label):
        for qtype, mlb in tiny_llama2.items():
            want, want_ids = logits_bytes([native], mlb, tmp_path / f"native-{qtype}.f32", "1,2,3", 0)
            got, got_ids = logits_bytes(cmd, mlb, tmp_path / f"{label}-{qtype}.f32", "1,2,3", 0)
            assert got == want, f"{label} {qtype}: logits differ from the native x86-64 build's"
            assert got_ids == want_ids
        speculative_matches_plain(native, cmd, label, tiny_llama2)

    return check


SPEC_LINE = re.compile(r"speculative: drafted (\d+), accepted (\d+)")


def greedy_ids(cmd, mlb, ids, n, *extra):
    """(the greedy ids `cmd MLB` generates as printed by --print-ids, (drafted, accepted) or None)."""
    p = subprocess.run([*map(str, cmd), str(mlb), "--prompt-ids", ids, "-n", str(n), "-t", "2", "--print-ids",
                        *map(str, extra)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stderr}"
    m = SPEC_LINE.search(p.stderr)
    return p.stdout, (int(m[1]), int(m[2])) if m else None


def speculative_matches_plain(native, cmd, label, tiny_llama2):
    """Greedy decoding with prompt lookup and with a draft model (the tiny model in another type) gives
    `cmd` the native build's tokens without speculation, for every tiny llama2 type (and something
    was drafted each time)."""
    for qtype, mlb in tiny_llama2.items():
        plain, _ = greedy_ids([native], mlb, "1,2,3", 40)
        draft = tiny_llama2["q8_0" if qtype == "q4_0" else "q4_0"]
        for extra in [("--lookup", 1), ("--draft", draft, "--draft-max", 4)]:
            got, spec = greedy_ids(cmd, mlb, "1,2,3", 40, *extra)
            assert got == plain, f"{label} {qtype} {extra[0]}: greedy tokens differ from the plain run's"
            assert spec is not None and spec[0] > 0, f"{label} {qtype} {extra[0]}: nothing drafted ({spec})"


@pytest.fixture(scope="session")
def families_q8(tmp_path_factory):
    """family -> (every tiny HF fixture and GGUF fixture converted to q8_0 (.mlb), its reference
    prompt ids as "1,2,...")."""
    out = tmp_path_factory.mktemp("families-q8")
    families = {}
    tiny = [*sorted((FIXTURES / "hf-tiny").glob("*")), *sorted(GGUF_TINY.glob("*"))]
    for src in tiny:
        if (src / "reference.json").exists():
            mlb = out / f"{src.name}-q8_0.mlb"
            gguf = src / "model.gguf"
            import_model(*((gguf, mlb, "--requantize") if gguf.exists() else (src, mlb)), "--type", "q8_0")
            ids = json.loads((src / "reference.json").read_text())["input_ids"]
            families[src.name] = (mlb, ",".join(map(str, ids)))
    # MXFP4 experts kept as they are (the MXFP4 kernels of every build), the rest Q8_0
    for name in ("qwen3moe", "gptoss"):
        mlb = out / f"{name}-mxfp4.mlb"
        import_model(GGUF_TINY / name / "model-mxfp4.gguf", mlb)
        families[f"{name}-mxfp4"] = (mlb, families[name][1])
    return families


@pytest.fixture
def families_match_native(native, families_q8, tmp_path):
    """check(cmd, label): `cmd` gives the native build's exact logits bytes and greedy ids for every
    fixture family (softcaps, sliding windows, Gated DeltaNet...: the forward pass's scalar math too)."""

    def check(cmd, label):
        for family, (mlb, ids) in families_q8.items():
            want, want_ids = logits_bytes([native], mlb, tmp_path / f"native-{family}.f32", ids, 4)
            got, got_ids = logits_bytes(cmd, mlb, tmp_path / f"{label}-{family}.f32", ids, 4)
            assert got == want, f"{label} {family}: logits differ from the native x86-64 build's"
            assert got_ids == want_ids, f"{label} {family}: greedy tokens differ"

    return check


def import_model(src, out, *args):
    """`ml_run SRC ARGS --save OUT`: the executables' importer (a GGUF file, a Hugging Face
    directory or a llama2.c checkpoint) writes the .mlb it runs."""
    run_ml(src, *args, "--save", out, "--prompt-ids", "1", "-n", "0")


def import_tokenizer(src, out):
    """`ml_run -z SRC --save-tokenizer OUT`: a tokenizer.json, GGUF file or llama2.c
    tokenizer.bin as the .mlt the executables read."""
    run_ml("-z", src, "--save-tokenizer", out, "--tokenize", "-p", "x")


IMATRIX_MAGIC = b"KRAFLA-IMATRIX-1\n"


def write_imatrix(path, entries):
    """An importance matrix file as `ml_run --imatrix-out` writes it (shared/src/import/imatrix.rs):
    entries (name, rows, column weights), written in name order as the format asks."""
    out = bytearray(IMATRIX_MAGIC + struct.pack("<I", len(entries)))
    for name, rows, w in sorted(entries, key=lambda e: e[0]):
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<QI", rows, len(w))
        out += np.asarray(w, "<f4").tobytes()
    pathlib.Path(path).write_bytes(bytes(out))


def read_imatrix(path):
    """{name: column weights} of an importance matrix file (the test's reader of the format)."""
    raw = pathlib.Path(path).read_bytes()
    assert raw.startswith(IMATRIX_MAGIC)
    at = len(IMATRIX_MAGIC)
    (n,) = struct.unpack_from("<I", raw, at)
    at += 4
    out = {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", raw, at)
        name = raw[at + 4:at + 4 + ln].decode()
        _rows, cols = struct.unpack_from("<QI", raw, at + 4 + ln)
        at += 4 + ln + 12
        out[name] = np.frombuffer(raw, "<f4", cols, at).astype(np.float32)
        at += 4 * cols
    assert at == len(raw), "trailing bytes"
    return out


LLAMACPP_SDIST = "0.3.36"
LLAMACPP_MODELS = REPO / ".cache" / "llamacpp" / f"llama_cpp_python-{LLAMACPP_SDIST}" / "vendor" / "llama.cpp" \
    / "models"


def llamacpp_models():
    """llama.cpp 0c1e570's models/ folder (the vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist
    on PyPI): its tokenizer suites (`ggml-vocab-*`) and chat templates (`templates/`), extracted
    into .cache/llamacpp from the sdist, downloaded once (74 MB) when they are not there."""
    if not (LLAMACPP_MODELS / "templates").is_dir():
        import tarfile
        cache = REPO / ".cache" / "llamacpp"
        sdist = cache / "dl" / f"llama_cpp_python-{LLAMACPP_SDIST}.tar.gz"
        if not sdist.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                            "llama-cpp-python", f"llama-cpp-python=={LLAMACPP_SDIST}", "-d", str(sdist.parent)],
                           check=True, timeout=1800)
        with tarfile.open(sdist) as tar:
            wanted = ("/vendor/llama.cpp/models/ggml-vocab-", "/vendor/llama.cpp/models/templates/")
            members = [m for m in tar.getmembers() if m.isfile() and any(w in m.name for w in wanted)]
            tar.extractall(cache, members=members, filter="data")
    return LLAMACPP_MODELS


def run_tool(script, *args, check=True, timeout=1800):
    cmd = [sys.executable, str(TOOLS / script), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstderr:\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def gemma3_gguf():
    """Gemma 3 270M Q4_K_M GGUF (tools/models.py, cached under .cache/)."""
    return models.gemma3_gguf()


@pytest.fixture(scope="session")
def smollm2_gguf():
    """SmolLM2-135M-Instruct Q4_1 GGUF (tools/models.py, cached under .cache/)."""
    return models.smollm2_gguf()


def converter(root, name, gguf, tokenizer_source):
    """get(kind) -> the model `gguf` converted into directory `root`: 'f32', 'q8_0', 'q4_0', ...
    (root/<name>-<kind>.mlb, by `ml_run --save`; q4_0 with the importance matrix the executable
    measures on its built-in text; f32 with --requantize: every tensor in f32, the GGUF's own
    quantised ones too, the reference) or 'mlt' (root/<name>.mlt, the tokenizer of
    `tokenizer_source`, by `--save-tokenizer`). Each kind is converted once, on first use."""
    cache = {}

    def get(kind):
        if kind not in cache:
            if kind == "mlt":
                out = root / f"{name}.mlt"
                import_tokenizer(tokenizer_source, out)
            else:
                # (q4_0: weighted by the importance matrix the executable measures on its own text)
                out = root / f"{name}-{kind}.mlb"
                import_model(gguf, out, "--type", kind, *(["--requantize"] if kind == "f32" else []))
            cache[kind] = out
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def gem(tmp_path_factory, gemma3_gguf):
    """kind -> Gemma 3 270M converted from its GGUF by the tools: .mlb of that --type, or 'mlt'
    (the GGUF's tokenizer). Converted once per test session, on first use."""
    return converter(tmp_path_factory.mktemp("gemma3"), "gemma3", gemma3_gguf, gemma3_gguf)


@pytest.fixture(scope="session")
def smol(tmp_path_factory, smollm2_gguf):
    """kind -> SmolLM2 converted from the GGUF: 'f32', 'q8_0', 'q4_0', ... (.mlb) or 'mlt' (tokenizer).

    Converted once per test session, on first use."""
    return converter(tmp_path_factory.mktemp("smollm2"), "smollm2", smollm2_gguf, smollm2_gguf)


@pytest.fixture(scope="session")
def cases_binary():
    """Build the test-support example once (release, like the runtime): run(mlt, lines, tmp_path)
    gives shared/examples/tokenize_cases.rs's JSON result of each case line."""
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "krafla", "--example",
                    "tokenize_cases"], cwd=REPO, check=True, timeout=1800)

    def run(mlt, lines, tmp_path):
        cases = tmp_path / "cases.txt"
        cases.write_text("\n".join(lines) + "\n", encoding="ascii")
        p = subprocess.run(["cargo", "run", "--release", "-q", "-p", "krafla", "--example",
                            "tokenize_cases", "--", str(mlt), str(cases)],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        out = [json.loads(line) for line in p.stdout.splitlines()]
        assert len(out) == len(lines)
        return out
    return run
