"""Tool calls through the real `openai` client against SmolLM2-135M-Instruct
(ChatML: Qwen2.5's `<tool_call>` format): `tool_choice` required and a
named function give calls whose arguments validate against the tool's
schema with `jsonschema`; the `tool` result goes back and the final answer
arrives; streamed `delta.tool_calls` reassemble to the same calls; bad tool
requests get a 400 naming the problem."""
import json

import jsonschema
import openai
import pytest

from test_server import Server, error_of

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Adds two integers", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
QUESTION = [{"role": "user", "content": "What is the weather in Paris today?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smol):
    s = Server(tmp_path_factory.mktemp("tools"), (smol("q4_0"), smol("mlt")), "--ctx", 2048)
    yield s
    s.stop()


def valid_calls(message):
    assert message.tool_calls, message
    for c in message.tool_calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return [(c.function.name, c.function.arguments) for c in message.tool_calls]


def streamed_calls(stream):
    """The calls of a stream, reassembled as a client does: the id and name
    come once, the arguments are concatenated per index."""
    calls, finish = {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        for d in ch.delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                assert c["id"] is None
                c["id"] = d.id
            if d.function and d.function.name:
                c["name"] = d.function.name
            if d.function and d.function.arguments:
                c["arguments"] += d.function.arguments
        finish = ch.finish_reason or finish
    assert sorted(calls) == list(range(len(calls))) and finish == "tool_calls"
    return [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]


def test_required_call_round_trip(server):
    client = server.client()
    r = client.chat.completions.create(model="x", messages=QUESTION, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_tokens=200)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = valid_calls(r.choices[0].message)
    assert len(calls) == 1
    call = r.choices[0].message.tool_calls[0]
    # the result goes back; the final answer is text
    follow = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    final = client.chat.completions.create(model="x", messages=follow, tools=TOOLS, temperature=0, max_tokens=60)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert isinstance(final.choices[0].message.content, str) and final.choices[0].message.content
    # a streamed call reassembles to the same call
    stream = client.chat.completions.create(model="x", messages=QUESTION, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, temperature=0, max_tokens=200, stream=True)
    assert streamed_calls(stream) == calls


def test_named_function_and_parallel_calls(server):
    client = server.client()
    for seed in range(3):
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Add 12 and 30."}], tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0.8, seed=seed, max_tokens=100)
        calls = valid_calls(r.choices[0].message)
        assert [n for n, _ in calls] == ["add"]
    # required with parallel calls allowed: one or more, every one valid, streamed the same
    kw = dict(model="x", messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=300)
    whole = valid_calls(client.chat.completions.create(**kw).choices[0].message)
    assert 1 <= len(whole) <= 8
    assert streamed_calls(client.chat.completions.create(**kw, stream=True)) == whole


def test_auto_and_none_answer_text_or_valid_calls(server):
    client = server.client()
    for choice in ("auto", "none"):
        r = client.chat.completions.create(model="x", messages=QUESTION, tools=TOOLS, tool_choice=choice,
                                           temperature=0, max_tokens=80)
        m = r.choices[0].message
        if m.tool_calls:
            assert choice == "auto" and r.choices[0].finish_reason == "tool_calls"
            valid_calls(m)
        else:
            assert isinstance(m.content, str) and m.content
        # streamed: the same text (held back until the answer is known not to be a call)
        parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="x", messages=QUESTION, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=80, stream=True)
            if c.choices]
        if not m.tool_calls:
            assert "".join(parts) == m.content


@pytest.mark.parametrize("body, param, words", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "minimum": 1}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters", "'minimum'"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "function"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name", "two tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'sometimes'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "response_format"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "required"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls", "assistant"),
])
def test_bad_tool_requests_get_400(server, body, param, words):
    req = {"model": "x", "messages": QUESTION, "max_tokens": 5, **body}
    err = error_of(server.raw("POST", "/v1/chat/completions", req), 400)
    assert err["param"] == param and words in err["message"], err
    r = server.client().chat.completions.create(model="x", messages=QUESTION, max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(**req)


def test_text_before_a_call_streams_as_it_comes(server):
    """llama.cpp's streaming with tools: the text before a call arrives in pieces as it is
    generated, then the call; the same text and call as the whole answer."""
    text = "Let me check the weather for you."
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    grammar = f'root ::= "{text}\\n<tool_call>\\n" "{call.replace(chr(34), chr(92) + chr(34))}" "\\n</tool_call>"'
    kw = dict(model="x", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=100, extra_body={"grammar": grammar})
    whole = server.client().chat.completions.create(**kw).choices[0].message
    assert whole.content == text
    want = [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert [(n, json.loads(a)) for n, a in valid_calls(whole)] == want
    events = []
    for chunk in server.client().chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            events.append(("text", chunk.choices[0].delta.content))
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            events.append(("call", chunk.choices[0].delta.tool_calls[0].function.name))
    texts = [t for kind, t in events if kind == "text"]
    assert "".join(texts) == text
    assert len(texts) > 3, events  # token by token, not one piece at the end
    assert [kind for kind, _ in events].index("call") == len(texts), events
