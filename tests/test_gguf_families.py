"""The families Krafla reads from GGUF files (Mixture-of-Experts: Qwen3-MoE, Qwen2-MoE, Mixtral,
Qwen3.5-MoE, gpt-oss; Qwen3.5 as llama.cpp writes it; Phi-3 / Phi-4-mini), against transformers' own logits (float64):
tiny random models built by transformers' classes and converted by llama.cpp's
convert_hf_to_gguf.py (tools/make_gguf_fixtures.py made tests/fixtures/gguf-tiny/). Their
cross-build byte identity is in test_arm.py / test_armv7.py (conftest.families_q8)."""
import base64
import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import GGUF_TINY, run_ml

NAMES = sorted(p.name for p in GGUF_TINY.glob("*") if (p / "reference.json").exists())
MOE = [n for n in NAMES if "num_experts_per_tok" in json.loads((GGUF_TINY / n / "config.json").read_text())]


def reference(name):
    ref = json.loads((GGUF_TINY / name / "reference.json").read_text())
    t, v = ref["logits_shape"]
    logits = np.frombuffer(base64.b64decode(ref["logits_f32_le_base64"]), dtype="<f4").reshape(t, v)
    return ref["input_ids"], logits, ref["greedy_16"]


def run_args(name):
    """The options the reference was made for (LongRoPE: a context of at most the original one)."""
    return json.loads((GGUF_TINY / name / "reference.json").read_text()).get("args", [])


def logits_of(model, ids, tmp_path, *extra):
    out = tmp_path / "logits.f32"
    run_ml(model, "--prompt-ids", ",".join(map(str, ids)), "--logits-out", out, "-n", "0", *extra)
    return np.fromfile(out, dtype="<f4")


def greedy_of(model, ids, n, *extra):
    p = run_ml(model, "--prompt-ids", ",".join(map(str, ids)), "-n", n, "--print-ids", "-T", "0", *extra)
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_fixtures_are_there():
    assert {"qwen3moe", "qwen2moe", "mixtral", "qwen35", "qwen35moe", "phi3", "gptoss"} <= set(NAMES)
    assert LONG == ["phi3"]
    assert {"qwen3moe", "qwen2moe", "mixtral", "qwen35moe", "gptoss"} <= set(MOE)
    assert all((GGUF_TINY / n / "model-mxfp4.gguf").exists() for n in MXFP4_NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_f32_logits_and_greedy_match_transformers(name, tmp_path):
    ids, want, greedy = reference(name)
    model = GGUF_TINY / name / "model.gguf"
    got = logits_of(model, ids, tmp_path, *run_args(name)).reshape(want.shape)
    diff = np.abs(got - want).max()
    assert diff <= 1e-4, f"{name}: max |logit difference| {diff:.2e} > 1e-4"
    assert greedy_of(model, ids, 16, *run_args(name)) == greedy


LONG = [n for n in NAMES if "long_input_ids" in json.loads((GGUF_TINY / n / "reference.json").read_text())]


@pytest.mark.parametrize("name", LONG)
def test_long_rope_factors_beyond_the_original_context(name, tmp_path):
    """A context above the original one takes LongRoPE's long factors for every position (as
    llama.cpp; transformers switches once the sequence is that long): a sequence longer than it
    gives transformers' logits at its last 8 positions. Within the original context the short
    factors' logits differ from these (the factors matter)."""
    ref = json.loads((GGUF_TINY / name / "reference.json").read_text())
    ids = ref["long_input_ids"]
    want = np.frombuffer(base64.b64decode(ref["long_logits_f32_le_base64"]), dtype="<f4").reshape(8, -1)
    model = GGUF_TINY / name / "model.gguf"
    got = logits_of(model, ids, tmp_path, "--ctx", 2 * len(ids)).reshape(-1, want.shape[1])[-8:]
    diff = np.abs(got - want).max()
    assert diff <= 1e-4, f"{name}: max |logit difference| {diff:.2e} > 1e-4 with the long factors"
    _, short_want, _ = reference(name)
    short_ids, _, _ = reference(name)
    long_ctx = logits_of(model, short_ids, tmp_path, "--ctx", 2 * len(ids)).reshape(short_want.shape)
    assert np.abs(long_ctx - short_want).max() > 1e-2


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_0"])
def test_logits_identical_across_threads_and_batch_sizes(name, qtype, tmp_path):
    """Each expert's share of a batch is a different number of tokens at each batch size: a
    token's logits must not move with it."""
    ids, _, _ = reference(name)
    model = GGUF_TINY / name / "model.gguf"
    conv = ["--type", qtype, "--requantize", *run_args(name)]
    base = logits_of(model, ids, tmp_path, *conv, "-t", "1", "--batch", "512").tobytes()
    for threads, batch in [(2, 512), (3, 7), (1, 1), (2, 5)]:
        other = logits_of(model, ids, tmp_path, *conv, "-t", threads, "--batch", batch).tobytes()
        assert other == base, f"{name} {qtype}: logits differ at -t {threads} --batch {batch}"


# Measured q8_0 argmax agreement: qwen3moe 100 %, mixtral 96 %, qwen2moe 92 %, gptoss 92 %, qwen35 83 %,
# qwen35moe 67 % (its f16 conversion: 100 %, max |diff| 0.10). The random fixtures' logits are very
# sensitive (test_forward.py says why), the DeltaNet recurrence carries Q8_0's noise along the
# prompt, and a router's choice is discrete: noise that swaps a token's second and third expert
# moves its output by a whole expert's difference.
Q8_MIN_AGREE = {"qwen35moe": 0.6}


@pytest.mark.parametrize("name", NAMES)
def test_q8_0_argmax_agrees(name, tmp_path):
    ids, want, _ = reference(name)
    got = logits_of(GGUF_TINY / name / "model.gguf", ids, tmp_path, "--type", "q8_0", "--requantize",
                    *run_args(name))
    agree = float(np.mean(got.reshape(want.shape).argmax(1) == want.argmax(1)))
    assert agree >= Q8_MIN_AGREE.get(name, 0.7), f"{name} q8_0: argmax agrees at {agree:.0%} of positions"


def edited(name, dst, edit):
    """A copy of the fixture's GGUF with `edit(tensors)` applied in place: tensors maps each name
    to its data as a writable numpy array (rows first: an expert tensor is [experts, rows, cols])."""
    import gguf
    shutil.copy(GGUF_TINY / name / "model.gguf", dst)
    reader = gguf.GGUFReader(str(dst), "r+")
    edit({t.name: t.data for t in reader.tensors})
    reader.data.flush()
    return dst


@pytest.mark.parametrize("name", MOE)
def test_routing_follows_the_router(name, tmp_path):
    """Numbering the experts differently (the router's rows and the experts' matrices permuted
    alike) changes no bit of the logits; permuting the router's rows alone (each token sent to
    other experts) changes them. A router that picked experts by anything but its own scores,
    or an expert read at the wrong rows, fails one or the other."""
    ids, want, _ = reference(name)
    base = logits_of(GGUF_TINY / name / "model.gguf", ids, tmp_path)
    rng = np.random.default_rng(7)

    def permute(also_experts):
        def edit(tensors):
            for tname, data in tensors.items():
                if tname.endswith("ffn_gate_inp.weight"):
                    n = data.shape[0]
                    order = rng.permutation(n)
                    while (order == np.arange(n)).any():  # every expert moves
                        order = rng.permutation(n)
                    layer = tname[: -len("ffn_gate_inp.weight")]
                    data[...] = data[order].copy()
                    # (a router bias, gpt-oss's, is the router's: it moves with its rows)
                    if f"{layer}ffn_gate_inp.bias" in tensors:
                        bias = tensors[f"{layer}ffn_gate_inp.bias"]
                        bias[...] = bias[order].copy()
                    if also_experts:
                        for kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                            for part in (".weight", ".bias"):
                                if f"{layer}{kind}{part}" in tensors:
                                    exps = tensors[f"{layer}{kind}{part}"]
                                    exps[...] = exps[order].copy()
        return edit

    renumbered = edited(name, tmp_path / "renumbered.gguf", permute(True))
    assert logits_of(renumbered, ids, tmp_path).tobytes() == base.tobytes()
    misrouted = edited(name, tmp_path / "misrouted.gguf", permute(False))
    got = logits_of(misrouted, ids, tmp_path).reshape(want.shape)
    assert np.abs(got - want).max() > 1e-2, "the logits did not change when the tokens went to other experts"


MXFP4_NAMES = ["qwen3moe", "gptoss"]


@pytest.mark.parametrize("name", MXFP4_NAMES)
def test_mxfp4_experts_run_in_place_near_their_dequantised_values(name, tmp_path):
    """The Qwen3-MoE and gpt-oss fixtures as llama-quantize's MXFP4_MOE writes them (experts
    MXFP4, the rest Q8_0), run as they are (the MXFP4 and Q8_0 kernels), against the same file
    converted to f32 (Krafla's `dequant_mxfp4`, exact): only the activations' int8 quantisation
    differs. Measured: max |diff| 0.29 and 0.44 (logits up to 8.8 and 8.1), argmax 92 % and
    88 %: on these random fixtures one
    expert swapped by the router's noise moves a token's logits by a whole expert (see the q8_0
    test above). The kernels' exactness is in kernels/tests_mxfp4.rs; the 4-bit experts
    themselves are far from the unquantised model (Qwen3-MoE: argmax 50 % against transformers)."""
    ids, want, _ = reference(name)
    model = GGUF_TINY / name / "model-mxfp4.gguf"
    got = logits_of(model, ids, tmp_path).reshape(want.shape)
    deq = logits_of(model, ids, tmp_path, "--type", "f32", "--requantize").reshape(want.shape)
    diff = np.abs(got - deq).max()
    assert diff <= 0.6, f"MXFP4 in place vs dequantised: max |diff| {diff:.3f}"
    agree = float(np.mean(got.argmax(1) == deq.argmax(1)))
    assert agree >= 0.8, f"MXFP4 in place vs dequantised: argmax agrees at {agree:.0%}"


@pytest.mark.parametrize("name", MXFP4_NAMES)
def test_mxfp4_logits_identical_across_threads_and_batch_sizes(name, tmp_path):
    ids, _, _ = reference(name)
    model = GGUF_TINY / name / "model-mxfp4.gguf"
    base = logits_of(model, ids, tmp_path, "-t", "1", "--batch", "512").tobytes()
    for threads, batch in [(2, 512), (3, 7), (1, 1), (2, 4)]:
        other = logits_of(model, ids, tmp_path, "-t", threads, "--batch", batch).tobytes()
        assert other == base, f"MXFP4: logits differ at -t {threads} --batch {batch}"


@pytest.mark.parametrize("name", MXFP4_NAMES)
def test_mxfp4_experts_repacked_give_the_row_kernels_bits(name, native, tmp_path):
    """The builds with eight-row MXFP4 kernels (avx2, avx512vnni) copy the MXFP4 experts into
    eight-row groups at load and run them through the eight-row kernels and, from 16 tokens, the
    prompt tiles; --no-repack keeps the plain rows and the row kernels, and the native (sse2)
    build has neither. A 40-token prompt gives the native build's logits, byte for byte, at 1 and
    2 threads, in one batch and in batches of 5 (each expert then sees one to a few tokens)."""
    model = GGUF_TINY / name / "model-mxfp4.gguf"
    ids = [3 + (i * 37) % 500 for i in range(40)]
    want = logits_of(model, ids, tmp_path, "-t", "1").tobytes()
    for threads, batch in [("1", "512"), ("2", "512"), ("2", "5")]:
        for extra in [(), ("--no-repack",)]:
            out = tmp_path / "native.f32"
            subprocess.run([str(native), str(model), "--prompt-ids", ",".join(map(str, ids)), "--logits-out", str(out),
                            "-n", "0", "-t", threads, "--batch", batch, *extra], check=True, capture_output=True,
                           timeout=600)
            assert out.read_bytes() == want, f"native -t {threads} --batch {batch} {' '.join(extra)}"
            got = logits_of(model, ids, tmp_path, "-t", threads, "--batch", batch, *extra).tobytes()
            assert got == want, f"-t {threads} --batch {batch} {' '.join(extra)}: not the native build's logits"


@pytest.mark.parametrize("name", MOE)
def test_startup_line_counts_the_experts(name):
    p = run_ml(GGUF_TINY / name / "model.gguf", "--prompt-ids", "1", "-n", "0")
    cfg = json.loads((GGUF_TINY / name / "config.json").read_text())
    n = cfg.get("num_experts") or cfg.get("num_local_experts")
    k = cfg["num_experts_per_tok"]
    assert f"{k} of {n} experts a token" in p.stderr, p.stderr
