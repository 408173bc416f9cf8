"""forkv serve with tools and structured output, through the official openai client against a
real server process (demo:qwen3:tiny, random weights: every call and JSON answer is valid
because the sampler forces it): a chat tool round trip, streamed tool-call deltas, json_schema
and json_object answers, and the Responses API's function_call items."""

from __future__ import annotations

import json

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from server_proc import TINY, shared_server  # noqa: E402

MODEL = "demo:qwen3:tiny"
WEATHER = {"name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"type": "string", "maxLength": 10}}}}
TOOLS = [{"type": "function", "function": WEATHER}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "score"],
          "properties": {"answer": {"type": "string", "maxLength": 12},
                         "score": {"type": "integer", "minimum": 0, "maximum": 10}}}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def client():
    url = shared_server(*TINY)
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_chat_tool_round_trip(client):
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=1.0, seed=3)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["parameters"])
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                            tool_choice="none", max_tokens=4, temperature=0)
    assert second.choices[0].message.tool_calls is None
    # the history re-renders to the tokens the call was made from: its blocks are restored
    assert second.usage.prompt_tokens_details.cached_tokens >= 512


def test_named_tool_choice_streams_one_tool_call_delta(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120, temperature=1.0, seed=4,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas] == ["get_weather"]
    jsonschema.validate(json.loads(deltas[0].function.arguments), WEATHER["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_json_schema_and_json_object_answers(client):
    for seed in range(4):
        out = client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=80, temperature=1.0, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "rating", "schema": SCHEMA, "strict": True}})
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    out = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3,
                                         response_format={"type": "json_object"})
    assert out.choices[0].message.content.startswith("{")


def test_bad_tool_requests_are_400s(client):
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model=MODEL, messages=ASK, tool_choice="required",
                                       max_tokens=4)


def test_responses_function_call_items(client):
    tools = [{"type": "function", "strict": True, **WEATHER}]
    first = client.responses.create(model=MODEL, input=ASK[0]["content"], tools=tools,
                                    tool_choice="required", parallel_tool_calls=False,
                                    max_output_tokens=120, temperature=1.0)
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and first.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    then = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=tools, max_output_tokens=4,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert then.usage.input_tokens_details.cached_tokens >= 512
    # the same history sent whole (stateless) renders to the same prompt
    whole = client.responses.create(
        model=MODEL, tools=tools, max_output_tokens=4, store=False,
        input=[{"role": "user", "content": ASK[0]["content"]},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert whole.usage.input_tokens == then.usage.input_tokens
    with client.responses.stream(model=MODEL, input="Weather?", tools=tools,
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 parallel_tool_calls=False, max_output_tokens=120,
                                 temperature=1.0) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [o.type for o in final.output][-1] == "function_call"
