"""Tree operations: add, fork, prune, rewind, remove, attach, renders, model checks."""

import pytest
from forkv.graph import (
    DuplicateNode,
    ForeignNode,
    GenSettings,
    GraphError,
    ModelMismatch,
    NodeNotFound,
    NodeRemoved,
    NodeStateError,
    Tree,
    render,
)
from forkv.graph.testing import ToyTokenizer


def seed_tree():
    t = Tree()
    s = t.system("You review code.")
    u = s.user("Review foo().")
    r = u.reasoning({"max_tokens": 64})
    f = r.final({"max_tokens": 32})
    return t, s, u, r, f


def test_ids_are_short_stable_unique():
    t, _s, u, _r, _f = seed_tree()
    assert [n.id for n in t] == ["s1", "u2", "r3", "f4"]
    assert t["u2"] is u and "u2" in t and u in t and len(t) == 4
    x = u.final(id="my-final")
    assert x.id == "my-final"
    with pytest.raises(DuplicateNode, match="'my-final' is already used"):
        u.final(id="my-final")
    with pytest.raises(GraphError, match="'bad id' is not valid"):
        u.final(id="bad id")


def test_unknown_and_foreign_nodes():
    t, _s, u, _r, _f = seed_tree()
    with pytest.raises(NodeNotFound, match="'zz' is not in this tree") as e:
        t["zz"]
    assert isinstance(e.value, KeyError) and e.value.node_id == "zz"
    other = Tree()
    with pytest.raises(ForeignNode, match="'u2' belongs to another tree"):
        other.add(u, "final")


def test_text_and_gen_rules():
    t = Tree()
    u = t.user("hi")
    with pytest.raises(GraphError, match="both text and gen"):
        u.final(GenSettings(), text="x")
    with pytest.raises(GraphError, match="user node 'u3' has gen settings"):
        t.add(None, "user", "x", gen={"max_tokens": 3})
    with pytest.raises(GraphError, match="needs text"):
        t.add(None, "user")
    with pytest.raises(GraphError, match="unknown kind"):
        t.add(u, "assistant", "x")
    with pytest.raises(GraphError, match="only user and tool turns may carry images"):
        t.add(u, "final", "x", images=[b"\x89PNG\r\n\x1a\n"])


def test_navigation():
    t, s, u, r, f = seed_tree()
    f2 = u.final(text="direct")
    assert t.path(f) == [s, u, r, f] and t.ancestors(f) == [s, u, r]
    assert t.children(u) == [r, f2] and t.parent(s) is None and t.roots() == [s]
    assert t.leaves() == [f, f2] and t.paths() == [[s, u, r, f], [s, u, f2]]
    assert t.descendants(u) == [r, f, f2] and t.pending() == [r, f]
    t2 = t.user("second conversation")
    assert t.roots() == [s, t2]


def test_fork_seeds_settings_k():
    t, _s, u, _r, _f = seed_tree()
    a = t.fork(u, seeds=[7, 8], gen={"temperature": 0.8})
    assert [n.gen.seed for n in a] == [7, 8] and all(n.gen.temperature == 0.8 for n in a)
    b = u.fork(3, kind="final", gen=GenSettings(seed=10))
    assert [n.gen.seed for n in b] == [10, 11, 12] and {n.kind for n in b} == {"final"}
    c = t.fork(u, settings=[{"temperature": 0.1}, GenSettings(temperature=0.9)], ids=["x", "y"])
    assert [n.id for n in c] == ["x", "y"] and c[1].gen.temperature == 0.9
    assert t.fork(u, 2)[1].gen.seed == 1
    with pytest.raises(GraphError, match="k=3 but gets 2"):
        t.fork(u, 3, seeds=[1, 2])
    with pytest.raises(GraphError, match="needs k, seeds or settings"):
        t.fork(u)
    with pytest.raises(GraphError, match="cannot fork user children under node 'u2'"):
        t.fork(u, 2, kind="user")


def test_prune_seed_case():
    t, s, u, r, f = seed_tree()
    with pytest.raises(NodeStateError, match="'f4' has no text yet"):
        t.prune(f, drop=[r])
    t.attach(r, "long thoughts")
    t.attach(f, "Looks good.", [1, 2, 3], "stop", stats={"tokens_generated": 3})
    f2 = t.prune(f, drop=[r])
    assert f2.id != f.id and f2.parent is u and f2.copied_from == f.id
    assert f2.text == "Looks good." and f2.status == "done" and f2.gen is None
    assert f2.result is None  # the original keeps its tokens and stats
    assert [n.id for n in f2.path()] == ["s1", "u2", f2.id]
    assert t.path(f) == [s, u, r, f]  # the original branch stays
    assert t.prune(f) is f2  # default drop = reasoning in the turn; copies are reused
    follow = f2.user("And bar()?")
    assert follow.parent is f2


def test_prune_deep_and_errors():
    t, _s, u, r, f = seed_tree()
    t.attach(r, "think 1")
    t.attach(f, "ans 1")
    u2 = f.user("next")
    r2 = u2.reasoning(text="think 2")
    f2 = r2.final(text="ans 2")
    g = t.prune(f2, drop=[r, r2])
    assert [(n.kind, n.text) for n in g.path()] == [
        ("system", "You review code."),
        ("user", "Review foo()."),
        ("final", "ans 1"),
        ("user", "next"),
        ("final", "ans 2"),
    ]
    assert t.prune(f2, drop=[]) is f2
    with pytest.raises(GraphError, match=f"node '{u2.id}' is not above node 'r3'"):
        t.prune(r, drop=[u2])
    with pytest.raises(GraphError, match="no user turn above it"):
        t.prune(f, drop=[u, r])
    n = len(t)
    with pytest.raises(GraphError):
        t.prune(f2, drop=[u2])  # ans 1 then ans 2: final under final
    assert len(t) == n  # nothing half-built


def test_rewind_and_remove():
    t, _s, u, r, f = seed_tree()
    assert t.rewind(u) is u
    alt = t.rewind(u).final(text="short answer")
    assert t.children(u) == [r, alt]
    removed = t.remove(r)
    assert removed == ["r3", "f4"] and len(t) == 3
    for bad in ("r3", f):
        with pytest.raises(NodeRemoved, match="was removed") as e:
            t.path(bad)
        assert isinstance(e.value, NodeNotFound)
    with pytest.raises(NodeRemoved):
        f.user("more")
    with pytest.raises(NodeRemoved):
        t.attach("f4", "x")
    with pytest.raises(DuplicateNode):
        u.reasoning(id="r3")
    assert u.reasoning().id == "r6"  # auto ids never reuse removed ones


def test_attach_fail_reset():
    t, _s, u, r, f = seed_tree()
    t.attach(
        r,
        "thought",
        [5, 6],
        "stop",
        {"decode_s": 0.5},
        {"tokens_reused": 10, "tokens_computed": 2, "tokens_generated": 2},
    )
    assert r.status == "done" and r.text == "thought" and r.result.token_ids == [5, 6]
    assert r.result.stats.tokens_reused == 10 and r.result.timings == {"decode_s": 0.5}
    with pytest.raises(NodeStateError, match="'r3' is not waiting for a result"):
        t.attach(r, "again")
    with pytest.raises(NodeStateError, match="'u2' is not waiting"):
        t.attach(u, "x")
    t.fail(f, "out of memory")
    assert f.status == "failed" and f.is_pending and f.error == "out of memory"
    with pytest.raises(NodeStateError, match="not generated"):
        t.fail(u, "x")
    t.attach(f, "ok")
    with pytest.raises(NodeStateError, match="done descendant 'f4'"):
        t.reset(r)
    t.reset(f)
    assert f.status == "pending" and f.text is None and f.result is None
    with pytest.raises(NodeStateError, match="given text"):
        t.reset(u)


def _user_with_two_answers():
    t = Tree()
    u = t.user("x" * 40)
    return t, u, u.final(text="a" * 50), u.final(text="b" * 50), ToyTokenizer()


def test_record_render_and_keys_only_in():
    t, u, a, b, tok = _user_with_two_answers()
    for leaf, keys in ((a, ["k0", "k1", "ka"]), (b, ["k0", "k1", "kb"])):
        rp = render(t, leaf, tok)
        t.record_render(rp, keys[: rp.num_tokens // 32], block_size=32)
    assert u.span == (0, 48) and a.span == (48, 111) and [x.index for x in u.blocks] == [0, 1]
    assert [x.key for x in a.blocks] == ["k1", "ka", None]  # last block partial: no key
    assert t.block_size == 32
    assert t.keys_only_in(a) == {"ka"} and t.keys_only_in(u) == {"k0", "k1", "ka", "kb"}


def test_turn_keys_go_to_the_node_before_them_and_are_released_with_it():
    t, u, a, b, tok = _user_with_two_answers()
    # u spans [0, 48): a turn end at 48 follows u's last token; one at 100 is inside a / b.
    t.record_render(render(t, a, tok), ["k0"], 32, {48: "tu", 100: "ta"})
    t.record_render(render(t, b, tok), ["k0"], 32, {48: "tu", 100: "tb"})
    assert u.turn_keys == ["tu"] and a.turn_keys == ["ta"] and b.turn_keys == ["tb"]
    assert t.keys_only_in(a) == {"ta"} and t.keys_only_in(u) == {"k0", "tu", "ta", "tb"}
    t.record_render(render(t, a, tok), ["k0"], 32, {48: "tu", 100: "ta2"})
    assert a.turn_keys == ["ta", "ta2"]  # a render that moved a's tokens: both get released


def test_check_model():
    t = Tree(model_id="tiny-dense")
    t.check_model("tiny-dense")
    t.system("s")
    with pytest.raises(ModelMismatch, match="rendered for model 'tiny-dense', not 'other'"):
        t.check_model("other")
    Tree().check_model("anything")


def test_forks_differ_by_default_and_warn_when_they_cannot():
    import warnings

    from forkv import ForkvWarning
    from forkv.graph.branching import FORK_TEMPERATURE

    t, _s, u, _r, _f = seed_tree()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # differing branches: no warning
        b = u.fork(4, gen={"max_tokens": 8})
        assert {n.gen.temperature for n in b} == {FORK_TEMPERATURE} and FORK_TEMPERATURE > 0
        assert len({n.gen.seed for n in b}) == 4 and b[0].gen.max_tokens == 8
        assert t.fork(u, seeds=[1, 2], gen={"temperature": 0.3})[0].gen.temperature == 0.3
        assert u.fork(1)[0].gen.temperature == 0  # one branch: nothing to differ from
    with pytest.warns(ForkvWarning, match="identical \\(temperature 0\\); set a temperature"):
        u.fork(2, gen={"temperature": 0})
    with pytest.warns(ForkvWarning, match="same seed and settings"):
        t.fork(u, settings=[{"temperature": 0.5, "seed": 1}] * 2)
