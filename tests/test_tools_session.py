"""Tools and structured output through a Session on the tiny demo models: random weights, yet
every constrained output is valid, because the sampler only lets valid tokens through."""

import json
from typing import Annotated

import jsonschema
import pytest
from forkv import Session
from forkv.agent import fork_agents, run_agent
from forkv.graph import Constraint
from forkv.tools import run, run_tools
from pydantic import Field

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 10},
                   "score": {"type": "integer", "minimum": 1, "maximum": 5},
                   "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
    "required": ["title", "score", "tags"], "additionalProperties": False,
}


def get_weather(city: Annotated[str, Field(max_length=10)],
                days: Annotated[int, Field(ge=1, le=7)] = 1) -> str:
    """Weather forecast for a city."""
    return f"sunny in {city} for {days} days"


def add(a: Annotated[int, Field(ge=0, le=99)], b: Annotated[int, Field(ge=0, le=99)]) -> int:
    """Add two small numbers."""
    return a + b


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def session(request):
    with Session(f"demo:{request.param}:tiny") as s:
        yield s


def test_json_schema_holds_in_every_sample_at_temperature_1(session):
    u = session.user("Rate this film as JSON.")
    gen = {"constraint": Constraint.json_schema(SCHEMA), "temperature": 1.0, "max_tokens": 160}
    nodes = u.fork(8, kind="final", gen=gen)
    session.run(nodes)
    for n in nodes:
        assert n.result.finish_reason == "stop", n.text
        jsonschema.validate(json.loads(n.text), SCHEMA)


def test_a_required_call_is_parsed_run_and_continued_with_reuse(session):
    u = session.system("You are helpful.", tools=[get_weather, add]).user("Weather in Oslo?")
    f = u.final({"tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0,
                 "seed": 1, "max_tokens": 160})
    run(session, f)
    assert len(f.tool_calls) == 1 and f.result.finish_reason == "stop", f.text
    call = f.tool_calls[0]
    assert call.name in ("get_weather", "add") and not f.meta.get("tool_call_error")
    [result] = run_tools(f)
    assert result.tool_call_id == call.id and result.name == call.name
    answer = result.final({"tool_choice": "none", "max_tokens": 8})
    session.run(answer)
    # the answer's prompt is the call's prompt + the call + the result: restored, not recomputed
    assert answer.result.stats.tokens_reused >= 256
    named = u.final({"tool_choice": "add", "temperature": 1.0, "seed": 2, "max_tokens": 160,
                     "parallel_tool_calls": False})
    run(session, named)
    assert [c.name for c in named.tool_calls] == ["add"]
    assert sum(named.tool_calls[0].arguments.values()) <= 198


@pytest.mark.slow  # six ~1K-token prompts (the tools block) and five decodes
def test_agent_loop_runs_tools_on_forked_branches_and_reuses_each_step():
    session = Session("demo:qwen3:tiny")
    u = session.system("Act.", tools=[add]).user("Add 2 and 3.")
    branches = fork_agents(session, u, 2, gen={"temperature": 1.0, "seed": 5, "max_tokens": 60,
                                               "parallel_tool_calls": False},
                           tool_choice=["required", "none"], max_steps=2)
    assert branches[0].steps[0].node.text != branches[1].steps[0].node.text  # forks differ
    for b in branches:
        assert [len(s.calls) for s in b.steps] == [1, 0]
        assert b.steps[0].results[0].text == str(sum(b.steps[0].calls[0].arguments.values()))
        assert b.steps[1].tokens_reused >= 256  # step 2 restores step 1's prompt and call
    keep = max(branches, key=lambda b: session.mean_logprob(b.last))
    for b in branches:
        if b is not keep:
            session.remove(b.steps[0].node)
    assert keep.last.id in session.tree
    one = run_agent(session, keep.last.user("Again."), max_steps=1, tool_choice="add",
                    gen={"max_tokens": 60})
    assert len(one.steps) == 1 and one.steps[0].calls[0].name == "add"
    session.close()
