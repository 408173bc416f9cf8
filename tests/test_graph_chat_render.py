"""A turn's chat template render costs its new messages (graph/chat_render.py): the rewritten
template renders a window of the chat and the turns between come from the cached render. Every
render equals the plain `apply_chat_template` of the whole chat (and so the same tokens and
spans), on random trees, for the demo models' templates, SmolLM2's, and templates built to
break a careless window (reads that wrap around to the chat's end, `loop.last`, values that
change as the chat grows); templates the syntax check does not accept render whole."""

from __future__ import annotations

import contextlib
import random

import pytest
from conftest import load_tiny
from forkv.engine.demo.tokenizer import chat_template
from forkv.graph import Tree, render
from forkv.graph import chat_render as cr
from forkv.graph.jinja_source import parse, same_tree, to_source
from forkv.graph.template_window import window_template
from forkv.runner import reasoning_format
from test_graph_render_cache import _edit, _grow, same

SMOLLM2 = (  # SmolLM2-135M-Instruct's chat template, as its tokenizer ships it
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
_TAIL = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
TEMPLATES = {
    "qwen3-demo": chat_template("json_tools"),  # drops old reasoning; tool turns read neighbours
    "gemma3-demo": chat_template("function_gemma"),
    "gemma4-demo": chat_template("gemma4"),
    "smollm2": SMOLLM2,
    # turn 0 reads messages[-1] (the chat's end): always rendered again
    "wraps": ("{% for m in messages %}{{ '<|im_start|>' ~ messages[loop.index0 - 1]['role'] ~ "
              "'>' ~ m['role'] ~ '\n' ~ m['content'] ~ '<|im_end|>\n' }}{% endfor %}" + _TAIL),
    "last": ("{% for m in messages %}{{ '<|im_start|>' ~ m['role'] ~ '\n' ~ m['content'] }}"
             "{% if loop.last %}{{ '<|im_end|>\n' }}{% else %}{{ '<|im_end|>\n\n' }}{% endif %}"
             "{% endfor %}" + _TAIL),
    # marks the last three messages: the marks move as the chat grows
    "recent": ("{% set n = messages|length %}{% for m in messages %}{{ '<|im_start|>' ~ "
               "m['role'] ~ '\n' }}{% if loop.index0 + 3 >= n %}{{ '(recent) ' }}{% endif %}"
               "{{ m['content'] ~ '<|im_end|>\n' }}{% endfor %}" + _TAIL),
    # the same, with the value set again after the turns (what the turns saw is compared)
    "recent-reset": ("{% set n = messages|length %}{% for m in messages %}{{ '<|im_start|>' ~ "
                     "m['role'] ~ '\n' }}{% if loop.index0 + 3 >= n %}{{ '(recent) ' }}"
                     "{% endif %}{{ m['content'] ~ '<|im_end|>\n' }}{% endfor %}"
                     "{% set n = 0 %}" + _TAIL),
}
# Not accepted (each turn reads the chat's length; a scan that reads what it set): whole.
REJECTED = {
    "length": ("{% for m in messages %}{{ '<|im_start|>' ~ m['role'] ~ ' ' ~ loop.length ~ "
               "'\n' ~ m['content'] ~ '<|im_end|>\n' }}{% endfor %}" + _TAIL),
    "qwen3-scan": ("{% set ns = namespace(multi=true, last=messages|length - 1) %}"
                   "{% for m in messages[::-1] %}{% if ns.multi and m['role'] == 'user' %}"
                   "{% set ns.multi = false %}{% set ns.last = (messages|length - 1) - "
                   "loop.index0 %}{% endif %}{% endfor %}{% for m in messages %}"
                   "{{ '<|im_start|>' ~ m['role'] ~ '\n' }}{% if loop.index0 > ns.last and "
                   "m.get('reasoning_content') %}{{ '<think>' ~ m['reasoning_content'] ~ "
                   "'</think>' }}{% endif %}{{ m['content'] ~ '<|im_end|>\n' }}{% endfor %}"
                   + _TAIL),
}


class Templated:
    """The demo tokenizer with another chat template."""

    def __init__(self, tok, source: str):
        self.tok, self.chat_template = tok, source
        self.think_start, self.think_end = "<think>", "</think>"

    def apply_chat_template(self, messages, **kw):
        kw.setdefault("chat_template", self.chat_template)
        return self.tok.apply_chat_template(messages, **kw)

    def encode(self, text, add_special_tokens=False):
        return self.tok.encode(text, add_special_tokens=add_special_tokens)


@pytest.fixture(scope="module")
def demo_tok():
    return load_tiny("qwen3").tokenizer


@contextlib.contextmanager
def plain_templates():
    """Renders that call the chat template on the whole chat, as before chat_render.py."""
    saved = cr.window_template
    cr.window_template = lambda source: None
    try:
        yield
    finally:
        cr.window_template = saved


def plain_render(tree, node, tok, fmt):
    saved = tree.__dict__.pop("_render_cache", None)
    try:
        with plain_templates():
            return render(tree, node, tok, fmt)
    finally:
        tree.__dict__["_render_cache"] = saved


def test_the_templates_are_accepted_or_not_as_their_syntax_says():
    for name, source in TEMPLATES.items():
        wt = window_template(source)
        assert wt is not None, name
        again = parse(to_source(parse(source)))  # the source writer keeps every template
        assert again is not None and same_tree(again, parse(source)), name
    assert window_template(TEMPLATES["wraps"]).behind == 1
    assert window_template(TEMPLATES["last"]).uses_last
    assert window_template(TEMPLATES["recent"]).atoms == ((0, 3),)
    qwen = window_template(TEMPLATES["qwen3-demo"])
    assert (qwen.behind, qwen.ahead, qwen.num_scanned, qwen.atoms) == (1, 1, 1, ((0, 0),))
    for name, source in REJECTED.items():
        assert window_template(source) is None, name
    assert window_template("{% generation %}x{% endgeneration %}") is None  # unknown tag


@pytest.mark.parametrize("name", [*TEMPLATES, *REJECTED])
def test_renders_equal_the_plain_template_on_random_trees(name, demo_tok):
    tok = Templated(demo_tok, {**TEMPLATES, **REJECTED}[name])
    fmt = reasoning_format(tok)
    rng = random.Random(sum(map(ord, name)))
    for trial in range(3):
        tree = Tree()
        nodes = [tree.system(f"sys {trial}", tools=[{"type": "function", "function": {
            "name": "look", "parameters": {"type": "object"}}}] if trial == 1 else [])]
        for step in range(36):
            if rng.random() < 0.2:
                _edit(tree, rng, nodes)
            else:
                n = _grow(tree, rng, nodes, step)
                if n is not None:
                    nodes.append(n)
            live = [n for n in nodes if n.id in tree]
            for m in {live[-1].id, rng.choice(live).id}:
                if any(a.is_pending for a in tree.ancestors(m)):
                    continue
                got = render(tree, m, tok, fmt)
                assert same(got, plain_render(tree, m, tok, fmt)), (trial, step, m)


def _turns(tok, fmt, turns: int, thinks: bool, monkeypatch) -> list[list[int]]:
    """A linear conversation (the depth benchmark's shape, or user/reasoning/final turns),
    each node rendered as its prompt and as the whole path once attached (every fourth turn's
    checked against a plain render); the sizes of the chats the template was called on, per
    turn."""
    monkeypatch.setattr(cr, "_trust_of", lambda tok: cr._Trust(0, 0))  # count renders only
    sizes: list[int] = []
    real = tok.apply_chat_template

    def counting(messages, **kw):
        sizes.append(len(messages))
        return real(messages, **kw)

    per_turn = []
    tree = Tree()
    node = tree.system("You are a terse assistant.")
    for turn in range(turns):
        user = node.user(f"Turn {turn}: check the next log line " + "item " * 12)
        steps = ([(user.reasoning(), f"thinking {turn}")] if thinks else [])
        sizes.clear()
        for n, text in steps + [(None, f"ok {turn}")]:
            if n is None:
                n = (steps[0][0] if thinks else user).final()
            for _ in range(2):
                tok.apply_chat_template = counting
                try:
                    got = render(tree, n, tok, fmt)
                finally:
                    del tok.apply_chat_template
                if turn % 4 == 3:
                    assert same(got, plain_render(tree, n, tok, fmt)), (turn, n.kind)
                if n.is_pending:
                    tree.attach(n, text)
        per_turn.append(list(sizes))
        node = n
    return per_turn


# ("wraps" changes its first turn every turn: not prefix-stable, so each node's span is
# worked out again, a call per node - exact, at render.py's fallback cost)
@pytest.mark.parametrize("name", ["qwen3-demo", "smollm2", "last", "recent"])
@pytest.mark.parametrize("thinks", [False, True], ids=["plain", "thinking"])
def test_a_turn_renders_a_window_of_its_chat_at_any_depth(name, thinks, demo_tok, monkeypatch):
    tok = Templated(demo_tok, TEMPLATES[name])
    sizes = _turns(tok, reasoning_format(tok), 32, thinks, monkeypatch)
    # the chat has 65 (97 thinking) nodes at the last turn; each call renders a few
    # messages, and a turn makes as many calls at turn 32 as at turn 5
    assert max(max(s) for s in sizes[5:]) <= 8, sizes[-1]
    assert len(sizes[-1]) == len(sizes[5]) and sum(sizes[-1]) == sum(sizes[5]), sizes


def test_a_window_falls_back_where_the_tokenizer_ignores_the_rewritten_template(demo_tok):
    # A tokenizer that renders its own template whatever it is given: nothing splits at the
    # markers, so each chat renders whole, the same as ever.
    class Stubborn(Templated):
        def apply_chat_template(self, messages, **kw):
            kw["chat_template"] = self.chat_template
            return self.tok.apply_chat_template(messages, **kw)

    tok = Stubborn(demo_tok, SMOLLM2)
    fmt = reasoning_format(tok)
    tree = Tree()
    node = tree.system("S")
    for turn in range(4):
        node = node.user(f"q{turn}").final(text=f"a{turn}")
        assert same(render(tree, node, tok, fmt), plain_render(tree, node, tok, fmt))
    assert len(render_states(tree)) == 0


def test_a_wrong_window_is_caught_by_the_first_checks(demo_tok, monkeypatch):
    # Were a rewritten template wrong for some tokenizer, the first renders compared with a
    # plain one catch it and stop the rewriting for that tokenizer.
    tok = Templated(demo_tok, SMOLLM2)
    real = cr._extend

    def off_by_one(*a, **kw):
        done = real(*a, **kw)
        return None if done is None else (done[0] + " ", done[1])

    monkeypatch.setattr(cr, "_extend", off_by_one)
    tree = Tree()
    node = tree.system("S")
    fmt = reasoning_format(tok)
    for turn in range(5):
        node = node.user(f"q{turn}").final(text=f"a{turn}")
        assert same(render(tree, node, tok, fmt), plain_render(tree, node, tok, fmt))
    assert not cr._trust_of(tok).ok


def test_tree_paths_are_fresh_lists_and_follow_removals():
    tree = Tree()
    a = tree.system("S").user("q").final(text="a")
    b = a.user("q2").final(text="b")
    path = tree.path(b)
    path.append("junk")  # a caller's list: the next path is not changed
    assert [n.id for n in tree.path(b)] == [n.id for n in path[:-1]]
    c = a.user("other").final(text="c")
    assert [n.id for n in tree.path(c)][:3] == [n.id for n in tree.path(a)]
    tree.remove(b.parent_id)
    with pytest.raises(Exception, match="removed"):
        tree.path(b)
    assert tree.path(c)[-1] is c


def render_states(tree):
    from forkv.graph.render_cache import render_cache

    return render_cache(tree).chats
