"""Tools in the graph: specs from Python, rendering through the demo templates, call grammars
that accept what the templates write, and mlx-lm's parsers reading it back (no model runs)."""

import json
from typing import Annotated

import pytest
from forkv.engine.demo.models import ensure_demo_model
from forkv.engine.demo.tokenizer import chat_template
from forkv.engine.request.constrain import Constraint as EngineConstraint
from forkv.engine.request.constrain import RowMatcher
from forkv.graph import GraphError, InvalidPlacement, Tree, render
from forkv.graph.toolformat import FORMATS, call_grammar, detect_format
from forkv.graph.tools import ToolCall, check_arguments, make_tool, visible_tools
from forkv.tools import parse_tool_calls
from pydantic import BaseModel, Field


def get_weather(city: Annotated[str, Field(max_length=12)],
                days: Annotated[int, Field(ge=1, le=7)] = 1) -> str:
    """Weather forecast for a city.

    Args:
        city: the city's name
        days: how many days ahead
    """
    return f"sunny in {city} for {days} days"


class Note(BaseModel):
    """Save a note."""

    text: str = Field(max_length=20)
    pinned: bool


@pytest.fixture(scope="module", params=sorted(FORMATS))
def tok(request):
    """The demo tokenizer with the chat template of one tool format."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(ensure_demo_model("qwen3", "tiny")))
    tok.chat_template = chat_template(request.param)
    tok.fmt = FORMATS[request.param]
    return tok


def test_make_tool_from_a_function_a_model_and_a_dict():
    spec = make_tool(get_weather)
    assert spec.name == "get_weather" and spec.description == "Weather forecast for a city."
    props = spec.parameters["properties"]
    assert props["city"] == {"type": "string", "maxLength": 12, "description": "the city's name"}
    assert spec.parameters["required"] == ["city"]
    assert spec.parameters["additionalProperties"] is False
    assert spec.invoke({"city": "Rome", "days": 2}) == "sunny in Rome for 2 days"
    note = make_tool(Note)
    assert note.name == "Note" and note.parameters["required"] == ["text", "pinned"]
    d = make_tool(spec.to_openai())
    assert d == spec and d.function is None
    with pytest.raises(GraphError, match="no Python function"):
        d.invoke({"city": "x"})
    with pytest.raises(GraphError, match="not valid"):
        make_tool(lambda x: x)
    with pytest.raises(GraphError, match="not a function tool"):
        make_tool({"type": "retrieval"})
    with pytest.raises(GraphError, match="two tools"):
        Tree().system("s", tools=[get_weather, get_weather])


def test_check_arguments_names_the_problem():
    spec = make_tool(get_weather)
    assert check_arguments(spec, {"city": "Rome", "days": 3}) is None
    assert "days" in check_arguments(spec, {"city": "Rome", "days": 9})
    assert "city" in check_arguments(spec, {"days": 2})
    assert "not a JSON object" in check_arguments(spec, [1])


def test_tools_are_seen_below_their_node_and_survive_prune_and_save():
    t = Tree()
    s = t.system("sys", tools=[get_weather])
    u = s.user("hi", tools=[Note, make_tool(get_weather, description="newer")])
    assert [x.name for x in visible_tools(u.path())] == ["Note", "get_weather"]
    assert visible_tools(u.path())[1].description == "newer"
    r = u.reasoning(text="think")
    call = ToolCall(id="c1", name="get_weather", arguments={"city": "Rome"})
    f = r.final(text="", tool_calls=[call])
    res = f.tool("sunny", call=call)
    assert (res.name, res.tool_call_id) == ("get_weather", "c1")
    pruned = t.prune(f, drop=[r])
    assert pruned.tool_calls == [call] and pruned.id != f.id
    back = Tree.from_json(t.to_json())
    assert back[f.id].tool_calls == [call] and back[res.id].tool_call_id == "c1"
    assert back[u.id].tools == u.tools
    with pytest.raises(GraphError, match="only final"):
        u.user  # noqa: B018 - builders exist; tool calls belong to final nodes only
        t.add(s, "user", "x", tool_calls=[call])
    with pytest.raises(InvalidPlacement):
        u.tool("orphan")


def _path(tok, args):
    t = Tree()
    u = t.system("sys", tools=[get_weather]).user("Weather in Rome?")
    call = ToolCall(id="c0", name="get_weather", arguments=args)
    f = u.final(text="", tool_calls=[call])
    return t, u, f, f.tool("sunny", call=call)


def test_templates_write_tools_and_calls_in_their_family_format(tok):
    t, u, _, res = _path(tok, {"city": "Rome", "days": 2})
    text = render(t, res.final(), tok).prompt_text
    assert detect_format(tok.chat_template) is tok.fmt
    assert "get_weather" in text.split("<|im_start|>user")[0]  # declared in the system turn
    assert tok.fmt.start in text and "sunny" in text
    plain = render(t, u, tok).prompt_text  # no tools on another tree: no tool text at all
    t2 = Tree()
    assert tok.fmt.start not in render(t2, t2.user("Weather in Rome?").final(), tok).prompt_text
    assert plain.count("<|im_start|>") == 2


def test_a_call_the_template_writes_is_accepted_by_the_grammar_and_parsed_back(tok):
    args = {"city": "Rome", "days": 2}
    t, u, f, _ = _path(tok, args)
    prompt = render(t, u.final(), tok).prompt_text
    full = render(t, f, tok).prompt_text
    written = full[len(prompt):full.rindex("<|im_end|>")]  # what the model has to generate
    tools = visible_tools(f.path())
    grammar = call_grammar(tok.fmt, tools, "required", parallel=True)
    m = RowMatcher(EngineConstraint.grammar(grammar), tok)
    m.advance(tok.encode(written, add_special_tokens=False))
    assert m.is_accepting
    content, calls, problems = parse_tool_calls(written, tok.fmt, tools)
    assert (content, problems) == ("", [])
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", args)]
    # the generated node (its raw text, calls parsed) renders back to the very same tokens
    g = u.final(text=written, tool_calls=calls)
    assert render(t, g, tok).token_ids == render(t, f, tok).token_ids


def test_named_choice_and_bad_schemas():
    tools = [make_tool(get_weather), make_tool(Note)]
    g = call_grammar(FORMATS["json_tools"], tools, "Note", parallel=False)
    assert "Note" in g and "get_weather" not in g and g.startswith("start: call\n")
    with pytest.raises(GraphError, match="not a declared tool"):
        call_grammar(FORMATS["json_tools"], tools, "nope")
    with pytest.raises(GraphError, match="at least one"):
        call_grammar(FORMATS["json_tools"], [], "required")
    nested = make_tool({"type": "function", "function": {"name": "n", "parameters": {
        "type": "object", "properties": {"o": {"type": "object", "properties": {}}}}}})
    with pytest.raises(GraphError, match="cannot force"):
        call_grammar(FORMATS["function_gemma"], [nested], "required")


def test_parse_reports_bad_calls():
    fmt = FORMATS["json_tools"]
    tools = [make_tool(get_weather)]
    text = ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>'
            '\n<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
            '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
            '\n<tool_call>\n{"name": "get_wea')
    content, calls, problems = parse_tool_calls(text, fmt, tools, "call_x")
    assert content == "Sure."
    assert [(c.id, c.arguments) for c in calls] == [("call_x_0", {"city": "Oslo"})]
    assert len(problems) == 3 and "'city' is a required property" in problems[0]
    assert "not a declared tool" in problems[1] and "did not parse" in problems[2]
    assert json.loads(calls[0].to_openai()["function"]["arguments"]) == {"city": "Oslo"}


def test_a_gemma_string_argument_may_hold_braces():
    """mlx-lm's function_gemma parser ends the arguments at the first "}", even inside an
    <escape>-quoted string; forkv hides those braces from it (a random demo model wrote one)."""
    fmt = FORMATS["function_gemma"]
    tools = [make_tool(get_weather)]
    text = ("<start_function_call>call:get_weather{city:<escape>O}s{l}o<escape>,days:2}"
            "<end_function_call>")
    _, calls, problems = parse_tool_calls(text, fmt, tools, "c")
    assert problems == [] and [c.arguments for c in calls] == [{"city": "O}s{l}o", "days": 2}]
