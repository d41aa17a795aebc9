"""Speculative decoding (issue 17): `--lookup N` and `--draft FILE` give greedy output identical to
decoding without them, on every x86-64 build (the ARM builds check the same through
`tiny_logits_match_native`), on SmolLM2 with the committed benchmark prompts, and in `ml_server`
with several sequences sharing a verification pass; what cannot work is refused with one line."""
import json
import shutil
import threading
import time

import pytest

from conftest import (
    FIXTURES,
    REPO,
    SPEC_LINE,
    import_model,
    isas,
    oldest_cpu,
    run_ml,
    runs_here,
    speculative_matches_plain,
)
from test_server import Server
from test_server_batch import metrics

DIST = REPO / "dist" / "linux-x86_64"
QEMU = shutil.which("qemu-x86_64")
# The oldest qemu CPU model each build runs on (None: natively, on this machine's CPU; qemu-user
# emulates no AVX-512).
CPUS = {isa: oldest_cpu("x86_64", isa) for isa in isas("x86_64")}
PROMPTS = sorted((REPO / "tools" / "speculative_prompts").glob("*.txt"))


@pytest.mark.parametrize("isa", list(CPUS))
def test_greedy_output_is_identical_with_and_without_speculation_on_every_x86_build(isa, native, tiny_llama2):
    exe = DIST / f"ml_{isa}"
    if not exe.is_file():
        pytest.skip(f"no {exe}: run `cargo xtask dist linux-x86_64`")
    if CPUS[isa] is None:
        if not runs_here(exe):
            pytest.skip(f"this CPU cannot run ml_{isa}")
        cmd = [exe]
    else:
        if QEMU is None:
            pytest.skip("qemu-x86_64 is not installed (apt-get install qemu-user)")
        cmd = [QEMU, "-cpu", CPUS[isa], exe]
    speculative_matches_plain(native, cmd, isa, tiny_llama2)


def generate(model, prompt, n, *extra):
    """(stdout, (drafted, accepted) or None) of `ml_run MODEL -f PROMPT -n N`, greedy."""
    # the prompts spell out SmolLM2's chat format: its control tokens are read as such
    p = run_ml(model, "-f", prompt, "--parse-special", "-n", n, "-t", 2, *extra)
    m = SPEC_LINE.search(p.stderr)
    return p.stdout, (int(m[1]), int(m[2])) if m else None


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.stem for p in PROMPTS])
def test_smollm2_prompt_lookup_is_identical_and_copies(smollm2_gguf, prompt):
    plain, none = generate(smollm2_gguf, prompt, 128)
    assert none is None and plain.strip()
    text, (drafted, accepted) = generate(smollm2_gguf, prompt, 128, "--lookup", 2)
    assert text == plain and drafted >= accepted
    # every pass drafts when a guess exists (no pacing by measured time): the same guesses every run
    text, (drafted, accepted) = generate(smollm2_gguf, prompt, 128, "--lookup", 2, "--draft-min", 4, "--draft-max", 4)
    assert text == plain
    if prompt.stem == "multi_turn":
        assert accepted > 30, f"{prompt.stem}: copying should be guessed ({drafted} drafted, {accepted} kept)"


def test_smollm2_draft_model_is_identical_and_guesses_well(smollm2_gguf, smol):
    """The GGUF (Q4_1 read as Q4_0) drafts for the same model in Q8_0: a draft model of the same
    family agrees with the target most of the time."""
    prompt = REPO / "tools" / "speculative_prompts" / "multi_turn.txt"
    target = [smol("q8_0"), "-z", smol("mlt")]
    plain, _ = generate(target[0], prompt, 96, *target[1:])
    text, (drafted, accepted) = generate(target[0], prompt, 96, *target[1:], "--draft", smollm2_gguf)
    assert text == plain
    assert accepted > drafted / 2, (drafted, accepted)


def test_a_seed_fixes_the_sampled_output_with_or_without_speculation(smollm2_gguf, smol):
    """Issue 32: with a temperature, `--lookup` gave another text every run, because the number of
    guesses per pass follows measured timings and each guess drew random numbers. The sampler now
    draws the n-th token with the n-th random number of the seed: the same text every run, the
    same as without speculation, with prompt lookup (paced, or four guesses a pass), a draft
    model, one thread or two."""
    prompt = REPO / "tools" / "speculative_prompts" / "multi_turn.txt"

    def sample(*extra, seed=5, threads=2):
        p = run_ml(smol("q8_0"), "-z", smol("mlt"), "-f", prompt, "--parse-special", "-n", 64, "-t", threads,
                   "--temp", 0.8, "--seed", seed, "--print-ids", *extra)
        m = SPEC_LINE.search(p.stderr)
        return p.stdout, (int(m[1]), int(m[2])) if m else None

    plain, _ = sample()
    assert len(json.loads(plain)) > 8
    runs = [("--lookup", 2)] * 3 + [("--lookup", 2, "--draft-min", 4, "--draft-max", 4),
                                     ("--draft", smollm2_gguf, "--draft-max", 3),
                                     ("--draft", smollm2_gguf, "--draft-min", 5, "--draft-max", 5)]
    accepted_by_draft = 0
    for extra in runs:
        text, spec = sample(*extra)
        assert text == plain, extra
        assert spec is not None and spec[0] > 0, extra
        if "--draft" in extra:
            accepted_by_draft += spec[1]
    assert sample("--lookup", 1, threads=1)[0] == plain
    # a draft model guessing with the target's random numbers is often right
    assert accepted_by_draft > 0
    # another seed, another text (the seed does matter)
    assert sample(seed=6)[0] != plain


def test_server_sampling_is_reproducible_with_lookup(tmp_path, smol):
    srv = Server(tmp_path, (smol("q4_0"), smol("mlt")), "--parallel", 3, "--lookup", 2, key=None)
    messages = [
        {"role": "user", "content": "List five things to pack for a hike, one per line."},
        {"role": "assistant", "content": "1. Water\n2. Map\n3. Rain jacket\n4. Snacks\n5. First aid kit"},
        {"role": "user", "content": "Write the same list again, but put the map first."},
    ]
    try:
        def ask(out, i, extra):
            r = srv.client().chat.completions.create(model="x", messages=messages, max_tokens=64, temperature=0.9,
                                                     seed=11, extra_body=extra)
            out[i] = r.choices[0].message.content

        # three at once (sharing passes), then one alone without speculation
        out = [None] * 4
        threads = [threading.Thread(target=ask, args=(out, i, {})) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        ask(out, 3, {"speculative.n_max": 0})
        assert out[0] and out.count(out[0]) == 4, out
        assert metrics(srv)["krafla:n_drafted_total"] > 0
    finally:
        srv.stop()


@pytest.mark.parametrize("args, needle", [
    (["--lookup", 17], "--lookup 17 must be from 0 to 16"),
    (["--draft-max", 0, "--lookup", 2], "--draft-max 0 must be from 1 to 32"),
    (["--lookup", 2, "--draft", "x.gguf"], "--lookup and --draft are two ways to draft"),
    (["--lookup", 2, "--draft-min", 9], "--draft-min 9 must be at most --draft-max 8"),
])
def test_bad_speculation_options_are_refused(tiny_llama2, args, needle):
    p = run_ml(tiny_llama2["q8_0"], "--prompt-ids", "1,2", "-n", 4, *args, check=False)
    assert p.returncode != 0 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_draft_model_of_another_vocabulary_is_refused(smollm2_gguf, tiny_llama2):
    p = run_ml(smollm2_gguf, "-p", "Hi", "-n", 4, "--draft", tiny_llama2["q8_0"], check=False)
    assert p.returncode != 0 and "--draft" in p.stderr and "do not belong together" in p.stderr, p.stderr


def test_a_recurrent_model_cannot_speculate(tmp_path):
    mlb = tmp_path / "hybrid.mlb"
    import_model(FIXTURES / "hf-tiny" / "qwen3_5-hybrid", mlb, "--type", "q8_0")
    p = run_ml(mlb, "--prompt-ids", "1,2", "-n", 4, "--lookup", 2, check=False)
    assert p.returncode != 0 and "recurrent (DeltaNet)" in p.stderr, p.stderr


def chat(srv, messages, out, i):
    r = srv.client().chat.completions.create(model="x", messages=messages, max_tokens=96, temperature=0)
    out[i] = r.choices[0].message.content


def log_line(srv, request_id):
    """The access-log line of a request (written just after its answer)."""
    for _ in range(100):
        lines = [line for line in srv.log_text().splitlines() if f"request {request_id}:" in line]
        if lines:
            return lines[0]
        time.sleep(0.05)
    raise AssertionError(f"no log line for {request_id}")


def test_server_lookup_is_identical_with_several_sequences_in_a_pass(tmp_path, smol):
    files = smol("q4_0"), smol("mlt")
    packing = [
        {"role": "user", "content": "List five things to pack for a hike, one per line."},
        {"role": "assistant", "content": "1. Water\n2. Map\n3. Rain jacket\n4. Snacks\n5. First aid kit"},
        {"role": "user", "content": "Write the same list again, but put the map first."},
    ]
    story = [{"role": "user", "content": "Tell me a story about a cat."}]
    conversations = [packing, story, packing]
    answers = {}
    for name, extra in [("plain", ()), ("lookup", ("--lookup", 2))]:
        srv = Server(tmp_path, files, "--parallel", 3, *extra, key=None)
        try:
            out = [None] * len(conversations)
            threads = [threading.Thread(target=chat, args=(srv, m, out, i)) for i, m in enumerate(conversations)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            answers[name] = out
            counters = metrics(srv)
            if name == "lookup":
                assert counters["krafla:n_drafted_total"] > 0
                assert counters["krafla:n_drafted_accepted_total"] > 0
                assert "speculative: drafted" in srv.log_text()
                # a request can turn it off (llama.cpp's field)
                r = srv.client().chat.completions.create(model="x", messages=packing, max_tokens=96, temperature=0,
                                                         extra_body={"speculative.n_max": 0})
                assert r.choices[0].message.content == out[0]
                assert log_line(srv, r.id).endswith("speculative: drafted 0, accepted 0 (0 %)")
        finally:
            srv.stop()
    assert all(answers["plain"]) and answers["lookup"] == answers["plain"]
