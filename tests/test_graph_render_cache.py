"""Incremental rendering: a render that extends a cached one equals a render from scratch, on
random trees under random edits, and costs a bounded number of template calls at any depth."""

import random

import pytest
from forkv.graph import ReasoningFormat, Tree, render
from forkv.graph.render_cache import (
    MAX_STATES,
    NodeEnd,
    PathState,
    common_prefix,
    render_cache,
    reusable_ends,
)
from forkv.graph.testing import ToyTokenizer

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00"
       b"\x00\x00\x00IEND\xaeB`\x82")
FORMATS = [ReasoningFormat(), ReasoningFormat(open="<think>", close="</think>\n", empty="<e>")]


class MergingTokenizer(ToyTokenizer):
    """Merges each pair of equal adjacent bytes into one token, so token ends move across
    the text boundaries between turns (as BPE merges do)."""

    def encode(self, text, add_special_tokens=False):
        out = []
        for t in super().encode(text):
            if out and t < 256 and out[-1] == t:
                out[-1] = 600 + t
            else:
                out.append(t)
        return out


class CountingTokenizer(ToyTokenizer):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = 0

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
        self.calls += 1
        return super().apply_chat_template(messages, tokenize, add_generation_prompt, **kw)


def full_render(tree, node, tok, fmt=None):
    """A render that ignores (and keeps) the tree's cache."""
    saved = tree.__dict__.pop("_render_cache", None)
    try:
        return render(tree, node, tok, fmt)
    finally:
        tree.__dict__["_render_cache"] = saved


def same(a, b):
    return (a.prompt_text, a.token_ids, a.spans, a.images, a.messages) == (
        b.prompt_text, b.token_ids, b.spans, b.images, b.messages)


def _grow(tree, rng, nodes, step, repeat=False):
    live = [n for n in nodes if n.id in tree]
    parent = rng.choice(live[-3:]) if rng.random() < 0.8 else rng.choice(live)
    if parent.is_pending:
        return None
    text = rng.choice(["aa", "x", "bb b", "", "ccc"]) + ("" if repeat else f" {step} ") + (
        "dd" * rng.randrange(3))
    if parent.kind == "tool":
        return parent.final(text="after the tool" + text)
    if parent.kind in ("system", "final"):
        return parent.user(text, images=[PNG] if rng.random() < 0.15 else [])
    if parent.kind == "user":
        kind = rng.choice(["reasoning", "final", "final_pending", "tool_call"])
        if kind == "reasoning":
            return parent.reasoning(text=text)
        if kind == "tool_call":
            f = parent.final(text=text, tool_calls=[{"id": f"c{step}", "name": "look",
                                                     "arguments": {"q": step}}])
            return f.tool(f"result {step}", name="look", call=f"c{step}")
        return parent.final() if kind == "final_pending" else parent.final(text=text)
    if parent.kind == "reasoning":
        return parent.final(text="answer" + text)
    return None


def _edit(tree, rng, nodes):
    """Attach a pending node, reset a done generated one, edit a text in place, or remove."""
    live = [n for n in nodes if n.id in tree]
    n = rng.choice(live)
    op = rng.random()
    if n.is_pending:
        tree.attach(n, rng.choice(["ok", "eeee", "yes  no"]))
    elif op < 0.3 and n.gen is not None and not any(
            d.gen is not None and d.status == "done" for d in tree.descendants(n)):
        tree.reset(n)
    elif op < 0.6 and n.kind in ("user", "final", "reasoning"):
        n.text = (n.text or "") + "ff"
    elif op < 0.7 and n.parent_id is not None:
        tree.remove(n)


@pytest.mark.parametrize("tok", [ToyTokenizer(), ToyTokenizer(keep_old_reasoning=True),
                                 MergingTokenizer()],
                         ids=["drops-old-reasoning", "keeps-reasoning", "merging"])
@pytest.mark.parametrize("repeat", [False, True], ids=["", "repeated-texts"])
def test_incremental_equals_full_on_random_trees(tok, repeat):
    rng = random.Random(7 + repeat)
    for trial in range(12):
        tree = Tree()
        nodes = [tree.system(f"sys {trial}", tools=[{"type": "function", "function": {
            "name": "look", "parameters": {"type": "object"}}}] if trial % 3 == 0 else [])]
        for step in range(40):
            if rng.random() < 0.25:
                _edit(tree, rng, nodes)
            else:
                n = _grow(tree, rng, nodes, step, repeat)
                if n is not None:
                    nodes.append(n)
            live = [n for n in nodes if n.id in tree]
            for m in {live[-1].id, rng.choice(live).id}:
                if any(a.is_pending for a in tree.ancestors(m)):
                    continue
                fmt = FORMATS[rng.random() < 0.1]  # another format: a miss, never a reuse
                got = render(tree, m, tok, fmt)
                assert same(got, full_render(tree, m, tok, fmt)), (trial, step, m)


def test_a_turn_costs_the_same_template_calls_at_any_depth():
    tok = CountingTokenizer()
    tree = Tree()
    node = tree.system("S")
    calls = []
    for turn in range(40):
        answer = node.user(f"question {turn}").final()
        tok.calls = 0
        render(tree, answer, tok)  # the prompt
        tree.attach(answer, f"answer {turn}")
        render(tree, answer, tok)  # the whole path, after the answer
        calls.append(tok.calls)
        node = answer
    # One call for the whole text and one per node the cached render did not cover; a render
    # from scratch makes one per node on the path (81 at the last turn).
    assert max(calls[1:]) <= 3 and calls[-1] == calls[5]
    assert same(render(tree, node, tok), full_render(tree, node, tok))


@pytest.mark.parametrize("keep", [False, True], ids=["drops-old-reasoning", "keeps-reasoning"])
def test_a_thinking_turn_costs_the_same_template_calls_at_any_depth(keep):
    # The Responses API's turns: user, reasoning, final, each rendered as its prompt and as
    # the whole path once attached. A template that drops old reasoning changes how the last
    # turn renders once a user turn follows: the nodes above it still keep their ends.
    tok = CountingTokenizer(keep_old_reasoning=keep)
    tree = Tree()
    node = tree.system("S")
    calls = []
    for turn in range(30):
        thought = node.user(f"question {turn}").reasoning()
        made = 0
        for pending, text in ((thought, f"thinking {turn}"), (thought.final(), f"A{turn}")):
            for _ in range(2):  # the prompt, then the whole path once attached
                tok.calls = 0
                got = render(tree, pending, tok)
                made += tok.calls
                assert same(got, full_render(tree, pending, tok)), (turn, pending.id)
                if pending.is_pending:
                    tree.attach(pending, text)
        calls.append(made)
        node = tree.children(thought)[0]
    # A render from scratch makes one call per node on the path (91 at the last prompt).
    assert max(calls[1:]) <= 6 and calls[-1] == calls[5], calls


def test_dropped_reasoning_falls_back_and_edits_are_seen():
    tok = ToyTokenizer()
    tree = Tree()
    u = tree.system("S").user("Q")
    r = u.reasoning(text="long thoughts")
    f = r.final(text="A")
    render(tree, f, tok)
    nxt = f.user("next").final()
    # The template drops r's reasoning now that a user turn follows: not an extension.
    got = render(tree, nxt, tok)
    assert "long thoughts" not in got.prompt_text
    assert same(got, full_render(tree, nxt, tok))
    u.text = "Q edited"  # an edit above a cached render is a miss, not a stale span
    got = render(tree, nxt, tok)
    assert "Q edited" in got.prompt_text and same(got, full_render(tree, nxt, tok))


def test_cache_is_bounded_and_forgets_removed_nodes():
    tok = ToyTokenizer()
    tree = Tree()
    node = tree.system("S")
    for turn in range(MAX_STATES):
        node = node.user(f"q{turn}").final(text=f"a{turn}")
        render(tree, node, tok)
    assert len(render_cache(tree)) == MAX_STATES
    branch = node.user("gone").final(text="x")
    render(tree, branch, tok)
    tree.remove(branch.parent)
    assert render_cache(tree).base_for(tok, (), [], branch) is None
    assert len(render_cache(tree)) == MAX_STATES - 1


def test_common_prefix():
    a = list(range(1000))
    assert common_prefix(a, a) == 1000
    assert common_prefix(a, a[:10]) == 10
    for k in (0, 1, 63, 64, 65, 500, 999):
        b = a[:k] + [-1] + a[k + 1:]
        assert common_prefix(a, b) == k


def _state(text, tokens, ends):
    return PathState(None, (), [], text, tokens, ends)


def test_reusable_ends_stop_at_the_first_end_where_the_tokens_part():
    # A node whose own tokens ran to where the base's tokens and the new ones part (a merge
    # across the boundary) may end elsewhere now: it and every node after it are recomputed.
    base = _state("abcd", [1, 2, 3, 4], [NodeEnd(2, "prefix", 2, 2, 2, 2),
                                         NodeEnd(4, "prefix", 4, 4, 4, 4)])
    assert reusable_ends(base, "abcdef", [1, 2, 3, 4, 5]) == base.ends
    assert reusable_ends(base, "abcdef", [1, 2, 3, 9, 5]) == base.ends[:1]  # parts at 3 < 4
    assert reusable_ends(base, "abcdef", [1, 9, 3, 9, 5]) == []
    last = _state("abcd", [1, 2, 3, 4], [NodeEnd(2, "prefix", 2, 2, 2, 2), NodeEnd(4, "last")])
    assert [e.end for e in reusable_ends(last, "abcdef", [1, 2, 3, 7, 5])] == [2, 3]


def test_reusable_ends_keep_the_nodes_inside_the_text_both_renders_share():
    # A later turn changed how the end renders (old reasoning dropped): the nodes whose own
    # text lies inside the shared text keep their ends, the rest are worked out again.
    base = _state("abcd", [1, 2, 3, 4], [NodeEnd(2, "prefix", 2, 2, 2, 2),
                                         NodeEnd(3, "prefix", 3, 3, 3, 3), NodeEnd(4, "last")])
    assert reusable_ends(base, "abXd", [1, 2, 7, 4]) == base.ends[:1]
    assert reusable_ends(base, "abcX", [1, 2, 3, 7]) == base.ends[:2]
    found = _state("abcd", [1, 2, 3, 4], [NodeEnd(2, "found", 2, 2, 2, 3),
                                          NodeEnd(4, "last")])
    assert reusable_ends(found, "abcX", [1, 2, 3, 7]) == found.ends[:1]
    assert reusable_ends(found, "abX", [1, 2, 7]) == []  # its own text may start this one


def test_a_later_turn_with_the_same_content_is_no_match():
    # Dropped reasoning is lost, even where a later turn's reasoning has the same text: a
    # node's end never depends on text far below it, so each turn keeps the ends above it.
    tok = ToyTokenizer()
    tree = Tree()
    node = tree.system("S")
    for turn in range(6):
        thought = node.user(f"q{turn}").reasoning(text="same thought")
        node = thought.final(text="same answer")
        got = render(tree, thought, tok)
        assert same(got, full_render(tree, thought, tok))
        old = tree.path(thought)[2]  # the first turn's reasoning, dropped once a user follows
        if turn:
            assert got.spans[old.id][1] - got.spans[old.id][0] <= len("assistant\n") + 1
    assert same(render(tree, node, tok), full_render(tree, node, tok))


def test_cache_keeps_its_own_tokens_within_a_token_budget(monkeypatch):
    import forkv.graph.render_cache as rc

    tok = ToyTokenizer()
    tree = Tree()
    node = tree.system("S").user("q").final(text="a")
    rp = render(tree, node, tok)
    rp.token_ids[-1] = 7  # a caller changing its copy does not reach the cache
    child = node.user("next").final()
    assert same(render(tree, child, tok), full_render(tree, child, tok))
    monkeypatch.setattr(rc, "MAX_TOKENS", rp.num_tokens * 2)
    for turn in range(4):
        node = node.user(f"q{turn}").final(text=f"a{turn}")
        render(tree, node, tok)
    assert len(render_cache(tree)) == 1  # each path is longer than half the budget


def test_a_copied_tree_renders_with_a_cache_of_its_own():
    import copy
    import pickle

    tok = ToyTokenizer()
    tree = Tree()
    node = tree.system("S").user("q").final(text="a")
    render(tree, node, tok)
    for other in (copy.deepcopy(tree), pickle.loads(pickle.dumps(tree))):
        assert len(render_cache(other)) == 0
        assert same(render(other, node.id, tok), render(tree, node, tok))


def test_the_prompt_and_the_path_to_it_share_one_template_call_where_the_template_shows_it(
        monkeypatch):
    """A turn renders its chat with the generation prompt and without: where the template's
    last block is `if add_generation_prompt` over constants, the second is the first less
    that text (graph/gen_prompt.py) - one call fewer per turn, the same render."""
    from conftest import load_tiny
    from forkv.graph import chat_render
    from forkv.graph.gen_prompt import _flag_block_is_fixed, generation_suffix

    tok = load_tiny("qwen3").tokenizer
    # calls counted are the renders' own: no comparisons with a plain render (chat_render.py)
    monkeypatch.setattr(chat_render, "_trust_of", lambda tok: chat_render._Trust(0, 0))
    assert generation_suffix(tok, {}) == "<|im_start|>assistant\n"
    calls = []
    real = tok.apply_chat_template

    def counting(*a, **k):
        calls.append(k.get("add_generation_prompt"))
        return real(*a, **k)

    tree = Tree()
    node = tree.system("S")
    tok.apply_chat_template = counting
    try:
        for turn in range(6):
            answer = node.user(f"question {turn}").final()
            calls.clear()
            got = render(tree, answer, tok)
            # the user node's end came from the prompt render (at turn 0 the system's path
            # renders alone too)
            assert calls == ([True] if turn else [True, False])
            tok.apply_chat_template = real
            assert same(got, full_render(tree, answer, tok))
            tok.apply_chat_template = counting
            tree.attach(answer, f"answer {turn}")
            render(tree, answer, tok)  # the whole path, as the runner records it
            node = answer
    finally:
        tok.apply_chat_template = real
    fixed = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
    assert _flag_block_is_fixed(fixed + "{{ 'A:' }}{% endif %}")
    assert _flag_block_is_fixed(fixed + "{{ 'A:' }}{% if think is defined %}x{% endif %}"
                                "{% endif %}")  # an argument of the render: still fixed
    assert not _flag_block_is_fixed(fixed + "{{ messages[0].role }}{% endif %}")
    assert not _flag_block_is_fixed(fixed + "A{% else %}B{% endif %}")
    assert not _flag_block_is_fixed(fixed + "{{ 'A' | upper }}{% endif %}")  # a filter
    assert not _flag_block_is_fixed(fixed + "A{% endif %}tail")  # not the last block
    assert not _flag_block_is_fixed("{% set x = add_generation_prompt %}" + fixed
                                    + "A{% endif %}")  # read elsewhere too
    assert not _flag_block_is_fixed("{% set r = 1 %}" + fixed + "{{ r }}{% endif %}")
    assert not _flag_block_is_fixed("{% generation %}x{% endgeneration %}")  # not parsed
