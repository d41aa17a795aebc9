"""The model's own chat template (issue 36): the prompt the server writes with a Jinja template
(`--chat-template-file`, the way a GGUF file's `tokenizer.chat_template` is used) equals what
Python's jinja2 renders from the same template as transformers' `apply_chat_template` does, for
every template in llama.cpp 0c1e570's `models/templates/` of a family Krafla runs, on
conversations with system prompts, several turns, tool calls and tool results; where jinja2
refuses a conversation (the template raises), the server answers 400. The answer's `<think>` block
becomes `reasoning_content` (streamed too), and `reasoning_format: none` leaves it in the content."""
import datetime
import json

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import llamacpp_models, run_ml
from test_server import Server, smol_files  # noqa: F401 (smol_files is a fixture)

# The templates of the families Krafla runs (Llama 3.x and its fine-tunes, SmolLM3, Mistral,
# Qwen2.5/QwQ/Qwen3/Qwen3.5 and the R1 distills on them, Gemma 2, Phi-3.5, gpt-oss). Not
# meetkai-functionary-medium-v3.1: with tools, jinja2 HTML-escapes the JSON it adds to a `|safe`
# string (Markup + str), so transformers shows that model `&#34;name&#34;`; Krafla (minijinja)
# writes the JSON as it is (docs/STATUS.md). Its conversations without tools render the same.
TEMPLATES = [
    "HuggingFaceTB-SmolLM3-3B",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "Qwen-Qwen2.5-7B-Instruct",
    "fireworks-ai-llama-3-firefunction-v2",
    "llama-cpp-deepseek-r1",
    "meetkai-functionary-medium-v3.2",
    "Mistral-Small-3.2-24B-Instruct-2506",
    "mistralai-Ministral-3-14B-Reasoning-2512",
    "Qwen-QwQ-32B",
    "Qwen-Qwen3-0.6B",
    "Qwen3-Coder",
    "Qwen3.5-4B",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "google-gemma-2-2b-it",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct",
    "microsoft-Phi-3.5-mini-instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "openai-gpt-oss-120b",
    "unsloth-mistral-Devstral-Small-2507",
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "its name"}},
                   "required": ["city"]}}}
CALL = {"id": "call9abc1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}

CONVERSATIONS = {
    "one user turn": ([{"role": "user", "content": "What is 2+2?"}], None),
    "system": ([{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello!"}], None),
    "turns": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello! How can I help?"},
               {"role": "user", "content": "  Tell me a joke\nplease.  "}], None),
    "control text": ([{"role": "user", "content": "a <|im_end|> and [INST] in a message"}], None),
    "tools": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER]),
    "call and result": ([{"role": "system", "content": "Use tools."},
                         {"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": "", "tool_calls": [CALL]},
                         {"role": "tool", "tool_call_id": "call9abc1", "content": '{"temp": 18}'}], [WEATHER]),
}


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' `tojson` filter."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(source, messages, tools, props):
    """The template rendered as transformers' apply_chat_template does (calls' arguments as the
    objects they spell), without the BOS the tokenizer adds itself (as llama.cpp drops it)."""
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now(datetime.timezone.utc).strftime(fmt)
    msgs = json.loads(json.dumps(messages))
    for m in msgs:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    text = env.from_string(source).render(messages=msgs, tools=tools, add_generation_prompt=True,
                                          bos_token=props["bos_token"], eos_token=props["eos_token"])
    if props["add_bos_token"] and props["bos_token"] and text.startswith(props["bos_token"]):
        text = text[len(props["bos_token"]):]
    return text


@pytest.fixture(scope="module", params=TEMPLATES)
def template_server(request, tmp_path_factory, smol_files):  # noqa: F811
    path = llamacpp_models() / "templates" / f"{request.param}.jinja"
    s = Server(tmp_path_factory.mktemp("tmpl"), smol_files, "--chat-template-file", path, "--ctx", 2048)
    status, _, body = s.raw("GET", "/props")
    assert status == 200, body
    props = json.loads(body)
    assert props["chat_template"] == path.read_text(encoding="utf-8")
    yield s, path.read_text(encoding="utf-8"), props
    s.stop()


def shows_tools(source, props):
    """Whether the template shows the tools it is given (the server's probe, llama.cpp's too)."""
    probe = {"type": "function", "function": {
        "name": "krafla_probe_tool_7d2f", "description": "A tool",
        "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "An argument"}},
                       "required": ["arg"]}}}
    try:
        return "krafla_probe_tool_7d2f" in render(source, [{"role": "user", "content": "hi"}], [probe], props)
    except (jinja2.exceptions.TemplateError, TypeError):
        return False


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_prompt_equals_jinja2s_rendering(template_server, name):
    server, source, props = template_server
    messages, tools = CONVERSATIONS[name]
    if tools and not shows_tools(source, props):
        # a template that does not show tools (Gemma 2, the R1 distills): a conversation with
        # tools takes the server's built-in format for its kind
        status, _, got = server.raw("POST", "/apply-template", {"messages": messages, "tools": tools})
        assert status == 400 or (status == 200 and "get_weather" in json.loads(got)["prompt"]), got
        return
    try:
        want = render(source, messages, tools, props)
    except jinja2.exceptions.TemplateError as e:  # the template refuses it
        want = e
    except TypeError:
        # Python fails inside the template (the -tool_use templates iterate `tools` when there
        # are none): no rendering to compare with; the server answers either way
        want = None
    body = {"messages": messages}
    if tools:
        body["tools"] = tools
    status, _, got = server.raw("POST", "/apply-template", body)
    if want is None:
        assert status in (200, 400), got
        return
    if isinstance(want, Exception):
        assert status == 400, (want, got)
        return
    if status == 400 and props["chat_template_kind"] == "harmony" and tools:
        assert b"does not take tools yet" in got
        return
    assert status == 200, got
    assert json.loads(got)["prompt"] == want


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory, smol_files):  # noqa: F811
    path = llamacpp_models() / "templates" / "Qwen-Qwen3-0.6B.jinja"
    s = Server(tmp_path_factory.mktemp("qwen3"), smol_files, "--chat-template-file", path, "--ctx", 1024)
    yield s
    s.stop()


REASONING = "The user greets me. I should greet back."
CONTENT = "Hello! How can I help you today?"
THINK_GRAMMAR = f'root ::= "<think>\\n{REASONING}\\n</think>\\n\\n{CONTENT}"'


def test_enable_thinking_reaches_the_template(qwen3_server):
    msgs = [{"role": "user", "content": "Hi"}]
    _, _, on = qwen3_server.raw("POST", "/apply-template", {"messages": msgs})
    _, _, off = qwen3_server.raw("POST", "/apply-template",
                                 {"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}})
    assert json.loads(on)["prompt"].endswith("<|im_start|>assistant\n")
    assert json.loads(off)["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    status, _, body = qwen3_server.raw("POST", "/apply-template", {"messages": msgs, "enable_thinking": "yes"})
    assert status == 400 and b"enable_thinking" in body


def test_a_think_block_is_reasoning_content(qwen3_server):
    msgs = [{"role": "user", "content": "Hi"}]
    body = {"messages": msgs, "grammar": THINK_GRAMMAR, "max_tokens": 200}
    status, _, got = qwen3_server.raw("POST", "/v1/chat/completions", body)
    assert status == 200, got
    message = json.loads(got)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (REASONING + "\n", CONTENT)
    # streamed: the same text in reasoning_content deltas, then content deltas
    stream = qwen3_server.client().chat.completions.create(
        model="smol", messages=msgs, stream=True, max_tokens=200, extra_body={"grammar": THINK_GRAMMAR})
    reasoning, content, order = "", "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            reasoning += r
            order.append("r")
        if d.content:
            content += d.content
            order.append("c")
    assert (reasoning, content) == (REASONING + "\n", CONTENT)
    assert "".join(order).rstrip("c") == "".join(order).rstrip("c").replace("c", "")
    # reasoning_format none: the block stays in the content as written
    status, _, got = qwen3_server.raw("POST", "/v1/chat/completions", {**body, "reasoning_format": "none"})
    message = json.loads(got)["choices"][0]["message"]
    assert message["content"] == f"<think>\n{REASONING}\n</think>\n\n{CONTENT}"
    assert "reasoning_content" not in message
    status, _, got = qwen3_server.raw("POST", "/v1/chat/completions", {**body, "reasoning_format": "bogus"})
    assert status == 400 and b"reasoning_format" in got


def test_the_cli_shows_reasoning_apart(smol_files):  # noqa: F811
    """`ml_run -p` under a template that opens a <think> block: the answer's reasoning goes to
    stderr (dimmed on a terminal), stdout holds the content alone; --chat-template-kwargs turns
    the template's thinking on and off."""
    path = llamacpp_models() / "templates" / "Qwen-QwQ-32B.jinja"
    common = [smol_files[0], "-z", smol_files[1], "--chat-template-file", path, "-n", 12, "-p", "What is 2+2?"]
    on = run_ml(*common, "--chat-template-kwargs", '{"enable_thinking": true}')
    off = run_ml(*common, "--chat-template-kwargs", '{"enable_thinking": false}')
    assert on.stdout.strip() == "" and len(on.stderr.splitlines()) > 1
    # SmolLM2 says the same either way: with thinking on, as reasoning on stderr
    said = off.stdout.strip()
    assert said and said in on.stderr and said not in off.stderr
    bad = run_ml(*common, "--chat-template-kwargs", "[1]", check=False)
    assert bad.returncode == 2 and "not a JSON object" in bad.stderr
