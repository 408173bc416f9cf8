"""The node runner's pieces without a model: the reasoning format a tokenizer names, a node's
settings taken back from the engine's, and tool calls parsed on attach (one parser, with the
node's `parallel_tool_calls` and a call-id prefix)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from forkv.engine import SamplingParams
from forkv.engine.demo.tokenizer import chat_template
from forkv.graph import ReasoningFormat, Tree
from forkv.runner import gen_settings, reasoning_format, sampling_params
from forkv.tools import attach_tool_calls, call_content

WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}
TWO_CALLS = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
             '\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Rome"}}\n</tool_call>')


def test_the_reasoning_format_is_the_tokenizers_tags_or_think():
    fmt = reasoning_format(SimpleNamespace(think_start="<|channel>thought",
                                           think_end="<channel|>"))
    assert (fmt.open, fmt.close, fmt.close_tag) == ("<|channel>thought\n", "\n<channel|>\n\n",
                                                     "<channel|>")
    assert reasoning_format(SimpleNamespace(think_start=None, think_end=None)) == \
        ReasoningFormat()
    assert reasoning_format(None) == ReasoningFormat()


def test_a_nodes_settings_carry_every_sampling_field_back_and_forth():
    params = SamplingParams(max_tokens=9, temperature=0.5, top_p=0.8, top_k=4, seed=2,
                            stop=("x",), min_p=0.1, repetition_penalty=1.2,
                            presence_penalty=0.3, frequency_penalty=0.4, penalty_context=7,
                            logit_bias={5: -2.0})
    gen = gen_settings(params, tool_choice="none")
    assert gen.tool_choice == "none" and gen.logit_bias == {5: -2.0}
    back = sampling_params(gen)
    for f in dataclasses.fields(SamplingParams):
        if f.name not in ("constraint", "top_logprobs"):  # not a node's: compiled, per request
            assert getattr(back, f.name) == getattr(params, f.name), f.name


def _final(parallel: bool) -> tuple[Tree, object]:
    tree = Tree()
    final = tree.user("Weather in two cities?", tools=[WEATHER]).final(
        {"parallel_tool_calls": parallel})
    tree.attach(final, TWO_CALLS, [1, 2], "stop")
    return tree, final


def test_calls_are_parsed_on_attach_with_the_nodes_own_settings():
    tok = SimpleNamespace(chat_template=chat_template("json_tools"))
    tree, final = _final(parallel=True)
    calls = attach_tool_calls(tok, tree, final)
    assert [(c.id, c.arguments["city"]) for c in calls] == [(f"call_{final.id}_0", "Oslo"),
                                                          (f"call_{final.id}_1", "Rome")]
    assert call_content(tok, final) == "Let me look."
    tree, final = _final(parallel=False)
    [call] = attach_tool_calls(tok, tree, final, "call_abc")
    assert (call.id, call.arguments) == ("call_abc_0", {"city": "Oslo"})
    assert final.tool_calls == [call]


def test_drafts_of_a_single_conversation_walk_nothing(monkeypatch):
    """tree_drafts on a tree that is one path (a Session's chat) returns at once: no walk of
    the tree per request; with another branch its tokens are the draft."""
    from forkv.runner import tree_drafts

    tree = Tree()
    node = tree.system("S")
    for i in range(20):
        node = node.user(f"q{i}").final({"max_tokens": 4})
        tree.attach(node, f"a{i}", [i, i + 1])
    nxt = node.user("next").final({"max_tokens": 4})
    with monkeypatch.context() as m:
        m.setattr(Tree, "__iter__", lambda self: pytest.fail("the tree was walked"))
        assert tree_drafts(tree, nxt.id) == []
    other = node.user("other").final({"max_tokens": 4})
    tree.attach(other, "b", [7, 8])
    assert tree_drafts(tree, nxt.id) == [[7, 8]]


def test_drafts_in_a_tree_of_many_conversations_are_the_newest_off_the_path():
    """A server's tree holds every conversation of a tenant: the drafts are read from the
    newest nodes on, as a walk of the whole tree in reverse would give them."""
    import itertools

    from forkv.runner import tree_drafts

    def walked(tree, node_id, limit=8):  # the whole-tree walk, as it was
        node = tree[node_id]
        path = tree.path(node)
        on_path = {n.id for n in path}
        parent = tree.parent(node)
        siblings = tree.children(parent) if parent is not None else []
        skip = on_path | {n.id for n in siblings}
        others = (n for n in reversed(list(tree)) if n.id not in skip)
        out = []
        for n in itertools.chain(siblings, others):
            if n.id in on_path or n.result is None or not n.result.token_ids:
                continue
            out.append(n.result.token_ids)
            if len(out) == limit:
                break
        return out

    tree = Tree()
    ends = [tree.system(f"S{c}") for c in range(4)]
    for turn in range(12):
        for c in range(4):
            ends[c] = ends[c].user(f"q{turn}").final({"max_tokens": 4})
            tree.attach(ends[c], f"a{turn}", [turn, c])
    assert [n.id for n in tree.newest_first()] == [n.id for n in reversed(list(tree))]
    for node in (ends[0], ends[3], tree.parent(tree.parent(ends[1]))):
        nxt = node.user("next").final({"max_tokens": 4})
        assert tree_drafts(tree, nxt.id) == walked(tree, nxt.id) != []
