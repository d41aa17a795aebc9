"""Anthropic's Messages API (`/v1/messages`) and OpenAI's Responses API (`/v1/responses`), driven
by the official `anthropic` and `openai` clients against SmolLM2: each answers what the chat
completions endpoint answers for the same conversation (greedy), whole and streamed, with tool
calls, tool results and reasoning in the API's own shapes; their errors in their own shapes."""
import json

import anthropic
import jsonschema
import pytest

from conftest import llamacpp_models
from test_server import KEY, Server, smol_files  # noqa: F401 (smol_files is a fixture)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
QUESTION = "What is the capital of France?"
SYSTEM = "You are a helpful assistant."
# (this anthropic client has no temperature argument; the API still takes the field)
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, smol_files):  # noqa: F811
    s = Server(tmp_path_factory.mktemp("apis"), smol_files, "--ctx", 1024)
    yield s
    s.stop()


def claude(server):
    return anthropic.Anthropic(base_url=f"http://{server.host}:{server.port}", api_key=KEY, max_retries=0)


def chat_answer(server, messages, **kw):
    r = server.client().chat.completions.create(model="x", messages=messages, temperature=0, **kw)
    return r.choices[0]


def test_messages_answer_as_chat_completions_do(server):
    want = chat_answer(server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
                       max_tokens=24)
    c = claude(server)
    m = c.messages.create(model="smol", max_tokens=24, system=SYSTEM, extra_body=GREEDY,
                          messages=[{"role": "user", "content": QUESTION}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == want.message.content
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[want.finish_reason]
    assert m.usage.output_tokens > 0 and m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 10
    # streamed, through the client's own event accumulation
    with c.messages.stream(model="smol", max_tokens=24, system=SYSTEM, extra_body=GREEDY,
                           messages=[{"role": "user", "content": QUESTION}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert final.content[0].text == want.message.content and final.stop_reason == m.stop_reason
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds


def test_messages_tool_use_and_results(server):
    c = claude(server)
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = c.messages.create(model="smol", max_tokens=100, extra_body=GREEDY, tools=tools,
                          tool_choice={"type": "any"}, messages=ask)
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"]
    assert use and use[0].name == "get_weather" and use[0].id and m.content[0] == use[0]
    jsonschema.validate(use[0].input, WEATHER)
    # the same call, streamed (the client joins the input_json_delta pieces)
    with c.messages.stream(model="smol", max_tokens=100, extra_body=GREEDY, tools=tools,
                           tool_choice={"type": "any"}, messages=ask) as s:
        final = s.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(b.name, b.input) for b in use]
    # the result goes back in a user turn; the answer is text
    follow = ask + [{"role": "assistant", "content": [m.content[0].model_dump()]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                                  "content": "18 degrees, clear sky"}]}]
    m2 = c.messages.create(model="smol", max_tokens=30, extra_body=GREEDY, tools=tools, messages=follow)
    assert m2.content and m2.content[0].type == "text" and m2.content[0].text
    # the same conversation through chat completions gives the same text
    args = json.dumps(use[0].input)
    chat = chat_answer(server, [ask[0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": use[0].id, "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": use[0].id, "content": "18 degrees, clear sky"}], max_tokens=30,
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": WEATHER}}])
    assert m2.content[0].text == chat.message.content


def test_messages_errors_are_anthropic_shaped(server):
    c = claude(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="smol", max_tokens=10, messages=[{"role": "tool", "content": "x"}])
    assert e.value.body["type"] == "error" and "role" in e.value.body["error"]["message"]
    status, _, body = server.raw("POST", "/v1/messages", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 400 and json.loads(body)["error"]["message"] == "'max_tokens' is required"
    bad = anthropic.Anthropic(base_url=f"http://{server.host}:{server.port}", api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="smol", max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_responses_answer_as_chat_completions_do(server):
    want = chat_answer(server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
                       max_tokens=24)
    client = server.client()
    r = client.responses.create(model="smol", instructions=SYSTEM, input=QUESTION, temperature=0,
                                max_output_tokens=24)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.output_text == want.message.content
    assert r.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert r.usage.output_tokens > 0
    events = list(client.responses.create(model="smol", instructions=SYSTEM, input=QUESTION, temperature=0,
                                          max_output_tokens=24, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == want.message.content
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.output_text == want.message.content
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_function_calls_and_outputs(server):
    client = server.client()
    tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
              "parameters": WEATHER}]
    r = client.responses.create(model="smol", input="What is the weather in Paris?", tools=tools,
                                tool_choice="required", temperature=0, max_output_tokens=100)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    events = list(client.responses.create(model="smol", input="What is the weather in Paris?", tools=tools,
                                          tool_choice="required", temperature=0, max_output_tokens=100,
                                          stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [(c.name, c.arguments) for c in calls]
    # (the first call's result only: a call without its result is refused)
    follow = [{"role": "user", "content": "What is the weather in Paris?"},
              {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
               "arguments": calls[0].arguments},
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees, clear sky"}]
    r2 = client.responses.create(model="smol", input=follow, tools=tools, temperature=0, max_output_tokens=30)
    assert r2.output_text


@pytest.mark.parametrize("body, words", [
    ({"input": "x", "previous_response_id": "resp_1"}, b"keeps no responses"),
    ({}, b"'input' is required"),
    ({"input": [{"type": "web_search_call"}]}, b"not supported"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, b"only function tools"),
    ({"input": "x", "bogus": 1}, b"'bogus'"),
])
def test_responses_refusals(server, body, words):
    status, _, got = server.raw("POST", "/v1/responses", body)
    assert status == 400 and words in got, got


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory, smol_files):  # noqa: F811
    """QwQ's template (llama.cpp's copy) opens a <think> block in the prompt when thinking is on:
    SmolLM2's answer is then reasoning."""
    path = llamacpp_models() / "templates" / "Qwen-QwQ-32B.jinja"
    s = Server(tmp_path_factory.mktemp("think"), smol_files, "--chat-template-file", path, "--ctx", 1024)
    yield s
    s.stop()


def test_reasoning_in_every_api(thinking_server):
    s = thinking_server
    want = chat_answer(s, [{"role": "user", "content": QUESTION}], max_tokens=16,
                       extra_body={"chat_template_kwargs": {"enable_thinking": True}}).message
    reasoning = want.model_extra["reasoning_content"]
    assert reasoning and not want.content
    think = {"type": "enabled", "budget_tokens": 1024}
    m = claude(s).messages.create(model="smol", max_tokens=16, extra_body=GREEDY, thinking=think,
                                  messages=[{"role": "user", "content": QUESTION}])
    assert m.content[0].type == "thinking" and m.content[0].thinking == reasoning
    with claude(s).messages.stream(model="smol", max_tokens=16, extra_body=GREEDY, thinking=think,
                                   messages=[{"role": "user", "content": QUESTION}]) as st:
        final = st.get_final_message()
    assert final.content[0].thinking == reasoning
    r = s.client().responses.create(model="smol", input=QUESTION, temperature=0, max_output_tokens=16,
                                    reasoning={"effort": "medium"})
    assert r.output[0].type == "reasoning" and r.output[0].content[0].text == reasoning
