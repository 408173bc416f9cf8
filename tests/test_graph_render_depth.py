"""A deep conversation's turn extends its parent's render (spans, end records and bounds copied,
signatures kept until a node's fields are assigned) and still equals a render from scratch, bit
for bit: on a 60-turn chain, a branch from its middle, edits of a middle node seen by every
node below it, and chat templates whose whole-chat quirks move as the chat grows. The keys a
Session records on the nodes at depth are those of the whole path rendered from scratch."""

from __future__ import annotations

import importlib

import pytest
from conftest import load_tiny
from forkv.graph import Tree, render
from forkv.graph.nodes import _RENDERED
from forkv.graph.render import _Seen, block_range
from forkv.graph.render_cache import render_cache, reusable_ends, signature
from forkv.graph.testing import ToyTokenizer
from forkv.graph.tools import ToolCall
from forkv.runner import reasoning_format
from test_graph_chat_render import TEMPLATES, Templated, plain_render
from test_graph_render_cache import full_render, same

TURNS = 60
render_mod = importlib.import_module("forkv.graph.render")  # (the module, not the function)


@pytest.fixture(scope="module")
def demo_tok():
    return load_tiny("qwen3").tokenizer


@pytest.fixture
def checked_ends(monkeypatch):
    """Every `reusable_ends` answer with the state's bounds equals the one that walks every
    record; counts how often the bounds let it skip them."""
    taken = []

    def both(base, text, tokens):
        fast = reusable_ends(base, text, tokens)
        saved, base.bounds = base.bounds, None
        try:
            slow = reusable_ends(base, text, tokens)
        finally:
            base.bounds = saved
        assert fast == slow
        taken.append(saved is not None and saved[0] >= 0)
        return fast

    monkeypatch.setattr(render_mod, "reusable_ends", both)
    return taken


def _tokenizers(demo_tok):
    return {"toy": ToyTokenizer(), "demo": demo_tok,
            **{name: Templated(demo_tok, TEMPLATES[name])
               for name in ("qwen3-demo", "last", "recent")}}


def _chain(tree, tok, fmt, turns, check):
    """user/final turns, each rendered as its prompt and as the whole path once attached;
    every `check`-th turn compared with a plain render. The finals, in order."""
    node = tree.system("You are terse.")
    finals = []
    for turn in range(turns):
        answer = node.user(f"Question {turn}: " + "word " * (turn % 7)).final()
        got = render(tree, answer, tok, fmt)
        if turn % check == 0:
            assert same(got, plain_render(tree, answer, tok, fmt)), turn
        tree.attach(answer, f"answer {turn}" + "!" * (turn % 3))
        got = render(tree, answer, tok, fmt)
        if turn % check == 0:
            assert same(got, plain_render(tree, answer, tok, fmt)), turn
        finals.append(answer)
        node = answer
    return finals


# The toy template in the fast suite; the real templates' 60-turn sweeps (~2.5 s each) are slow.
@pytest.mark.parametrize("name", ["toy"] + [pytest.param(n, marks=pytest.mark.slow)
                                            for n in ("demo", "qwen3-demo", "last", "recent")])
def test_a_deep_chain_its_branches_and_middle_edits_equal_renders_from_scratch(
        name, demo_tok, checked_ends):
    tok = _tokenizers(demo_tok)[name]
    fmt = reasoning_format(tok)
    tree = Tree()
    finals = _chain(tree, tok, fmt, TURNS, 20)
    leaf = finals[-1]
    assert same(render(tree, leaf, tok, fmt), plain_render(tree, leaf, tok, fmt))
    assert sum(checked_ends) > TURNS  # the bounds skipped the walk on most turns

    # A branch from the middle extends the middle's render, not the deep one's.
    mid = finals[TURNS // 2]
    branch = mid.user("a side question").final()
    assert same(render(tree, branch, tok, fmt), plain_render(tree, branch, tok, fmt))
    tree.attach(branch, "side answer")
    assert same(render(tree, branch, tok, fmt), plain_render(tree, branch, tok, fmt))

    # An edit of a middle node (an assignment) reaches every render below it.
    user = tree.parent(finals[TURNS // 3])
    user.text = "Question edited in the middle"
    for node in (finals[TURNS // 3], mid, branch, leaf):
        got = render(tree, node, tok, fmt)
        assert "edited in the middle" in got.prompt_text
        assert same(got, plain_render(tree, node, tok, fmt)), node.id
    # ... and so does a generated node's new text, and calls given as a new list.
    finals[TURNS // 4].text = "a new answer"
    finals[TURNS // 5].tool_calls = [ToolCall(id="c1", name="look", arguments={"q": 1})]
    for node in (leaf, branch):
        got = render(tree, node, tok, fmt)
        assert "a new answer" in got.prompt_text
        assert same(got, plain_render(tree, node, tok, fmt)), node.id
    # A list changed in place is seen too (no assignment tells it): appended, then edited.
    finals[TURNS // 6].tool_calls.append(ToolCall(id="c2", name="seek", arguments={"q": 2}))
    assert same(render(tree, leaf, tok, fmt), plain_render(tree, leaf, tok, fmt))
    finals[TURNS // 6].tool_calls[0] = ToolCall(id="c2", name="hunt", arguments={"q": 2})
    assert same(render(tree, leaf, tok, fmt), plain_render(tree, leaf, tok, fmt))

    # A pending node in the middle: the path below it cannot render, and says which node.
    tree.remove(branch.parent)
    deeper = leaf.user("next").final()
    assert same(render(tree, deeper, tok, fmt), full_render(tree, deeper, tok, fmt))


def test_a_node_signature_is_kept_until_a_field_a_render_reads_is_assigned():
    assert _RENDERED == set(_Seen._fields)  # the fields Node.__setattr__ watches
    tree = Tree()
    final = tree.system("S").user("Q").final(text="A")
    cache = render_cache(tree)
    path = tree.path(final)
    first = cache.signatures(path)
    assert first == [signature(n) for n in path]
    assert all(a is b for a, b in zip(first, cache.signatures(path)))  # kept, not rebuilt
    final.span = (0, 3)  # not read by renders: the signature stays
    assert cache.signatures(path)[-1] is first[-1]
    changes = {"text": "B", "name": "n", "tool_call_id": "c", "status": "pending",
               "tool_calls": [ToolCall(id="c1", name="look", arguments={})]}
    for field, value in changes.items():
        setattr(final, field, value)
        assert cache.signatures(path)[-1] == signature(final) != first[-1], field
        first = cache.signatures(path)
    # lists changed in place, which no assignment tells: signed again at every render
    final.tool_calls.append(ToolCall(id="c2", name="seek", arguments={}))
    assert cache.signatures(path)[-1] == signature(final) != first[-1]
    final.tool_calls.clear()
    assert cache.signatures(path)[-1] == signature(final)
    final.tool_calls.append(ToolCall(id="c3", name="hunt", arguments={}))
    assert cache.signatures(path)[-1] == signature(final)
    removed = tree.remove(final)
    assert removed == [final.id] and final.id not in cache._sigs


def test_a_sessions_recorded_keys_at_depth_are_those_of_a_render_from_scratch():
    import forkv

    with forkv.Session(load_tiny("qwen3")) as s:
        node = s.system("You are terse.")
        for turn in range(24):
            node = node.user(f"Question {turn}: " + "word " * 30).final({"max_tokens": 3})
            s.run(node)
        engine, tok = s.engine, s.engine.lm.tokenizer
        fresh = full_render(s.tree, node, tok, s.reasoning)
        assert fresh.num_tokens > 4 * engine.block_size
        keys = [k.hex() for k in engine.block_keys(fresh.token_ids)]
        turn_keys = {k.hex() for k in engine.turn_keys(fresh.token_ids).values()}
        for n in s.tree.path(node):
            assert n.span == fresh.spans[n.id], n.id
            want = [(i, keys[i] if i < len(keys) else None)
                    for i in block_range(fresh.spans[n.id], engine.block_size)]
            assert [(b.index, b.key) for b in n.blocks] == want, n.id
        recorded = {k for n in s.tree.path(node) for k in n.turn_keys}
        assert turn_keys <= recorded  # (earlier prompts' turn ends accumulate too)
