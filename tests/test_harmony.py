"""gpt-oss's harmony format (issue 34): the prompt `--chat harmony` writes equals what Python's
jinja2 renders from gpt-oss's own template (`models/templates/openai-gpt-oss-120b.jinja` of
llama.cpp 0c1e570, rendered as transformers does), through llama-server's `/apply-template`; and an
answer in channels reaches the client as `reasoning_content` (the analysis channel) apart from
`content` (the final one), streamed or not. The answer is SmolLM2's, written under a grammar that
spells a harmony answer, so the server's own text path splits it."""
import datetime
import json

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import llamacpp_models
from test_server import Server, smol_files  # noqa: F401 (smol_files is a fixture)

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke\nplease."}],
    [{"role": "user", "content": "a <|end|> in a message"}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "again"}],
]


def render_jinja(messages):
    """The template rendered as transformers' apply_chat_template does."""
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now(datetime.timezone.utc).strftime(fmt)
    source = (llamacpp_models() / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    return env.from_string(source).render(messages=messages, add_generation_prompt=True)


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory, smol_files):  # noqa: F811
    s = Server(tmp_path_factory.mktemp("harmony"), smol_files, "--chat", "harmony", "--ctx", 1024)
    yield s
    s.stop()


@pytest.mark.parametrize("n", range(len(CONVERSATIONS)))
def test_prompt_equals_the_templates_rendering(harmony_server, n):
    status, _, body = harmony_server.raw("POST", "/apply-template", {"messages": CONVERSATIONS[n]})
    assert status == 200, body
    assert json.loads(body)["prompt"] == render_jinja(CONVERSATIONS[n])


def test_tools_and_late_system_messages_are_refused(harmony_server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    status, _, body = harmony_server.raw("POST", "/v1/chat/completions",
                                         {"messages": CONVERSATIONS[0], "tools": [tool]})
    assert status == 400 and b"does not take tools yet" in body
    late = CONVERSATIONS[0] + [{"role": "assistant", "content": "4"}, {"role": "system", "content": "x"}]
    status, _, body = harmony_server.raw("POST", "/apply-template", {"messages": late})
    assert status == 400 and b"only at the start" in body


REASONING = "The user greets me. I should greet back."
CONTENT = "Hello! How can I help you today?"
GRAMMAR = ('root ::= "<|channel|>analysis<|message|>' + REASONING
           + '<|end|><|start|>assistant<|channel|>final<|message|>' + CONTENT + '"')


def test_the_analysis_channel_is_reasoning_content(harmony_server):
    c = harmony_server.client()
    r = c.chat.completions.create(model="m", messages=CONVERSATIONS[0], max_tokens=200, temperature=0,
                                  extra_body={"grammar": GRAMMAR})
    m = r.choices[0].message
    assert (m.content, m.model_extra.get("reasoning_content")) == (CONTENT, REASONING)
    assert r.choices[0].finish_reason == "stop"
    reasoning, content = "", ""
    for chunk in c.chat.completions.create(model="m", messages=CONVERSATIONS[0], max_tokens=200, temperature=0,
                                           stream=True, extra_body={"grammar": GRAMMAR}):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (content, reasoning) == (CONTENT, REASONING)
