"""Placement rules, cycles and context checks; every error names the node."""

import pytest
from forkv.graph import ContextOverflow, CycleError, InvalidPlacement, NodeNotFound, Tree
from forkv.graph.rules import check_parents, check_placement


@pytest.mark.parametrize(
    "kind,parent,match",
    [
        ("final", None, "final node 'x' has no user turn above it"),
        ("final", "system", "final node 'x' has no user turn above it"),
        ("reasoning", "system", "reasoning node 'x' sits directly under system node 'p'"),
        ("reasoning", None, "reasoning node 'x' sits directly under nothing"),
        ("system", "user", "system node 'x' sits under user node 'p'"),
        ("user", "reasoning", "user node 'x' follows reasoning node 'p' without a final"),
        ("user", "user", "user node 'x' sits directly under user node 'p'"),
        ("final", "final", "final node 'x' sits directly under final node 'p'"),
        ("reasoning", "reasoning", "reasoning node 'x' sits directly under reasoning node 'p'"),
        ("reasoning", "final", "reasoning node 'x' sits directly under final node 'p'"),
        ("tool", "user", "tool node 'x' sits under user node 'p'"),
        ("tool", None, "tool node 'x' sits under nothing"),
    ],
)
def test_bad_placements(kind, parent, match):
    with pytest.raises(InvalidPlacement, match=match) as e:
        check_placement(kind, "x", parent, "p" if parent else None, True)
    assert e.value.node_id == "x" and str(e.value).endswith(".")


@pytest.mark.parametrize(
    "kind,parent",
    [
        ("system", None),
        ("user", None),
        ("user", "system"),
        ("reasoning", "user"),
        ("final", "user"),
        ("final", "reasoning"),
        ("user", "final"),
        ("tool", "final"),
        ("final", "tool"),
        ("reasoning", "tool"),
        ("tool", "tool"),
    ],
)
def test_good_placements(kind, parent):
    check_placement(kind, "x", parent, "p" if parent else None, True)


def test_tree_add_validates_before_insert():
    t = Tree()
    s = t.system("sys")
    with pytest.raises(InvalidPlacement, match="'r2'"):
        t.add(s, "reasoning")
    with pytest.raises(InvalidPlacement, match="final node 'f3' has no user turn"):
        s.final()
    assert len(t) == 1


def test_check_parents_order_missing_and_cycle():
    assert check_parents({"b": "a", "a": None, "c": "b"}) == ["a", "b", "c"]
    with pytest.raises(NodeNotFound, match="node 'b' names parent 'zz'"):
        check_parents({"a": None, "b": "zz"})
    with pytest.raises(CycleError, match="is its own ancestor") as e:
        check_parents({"a": "c", "b": "a", "c": "b"})
    assert e.value.node_id in {"a", "b", "c"}


def test_context_overflow_counts_pending_chain():
    t = Tree()
    u = t.user("hi")
    r = u.reasoning({"max_tokens": 100})
    f = r.final({"max_tokens": 50})
    t.validate(context_length=170, count_tokens=lambda node_id: 20)
    with pytest.raises(ContextOverflow, match=f"node '{f.id}' may need 170 tokens") as e:
        t.validate(context_length=169, count_tokens=lambda node_id: 20)
    assert e.value.node_id == f.id
    with pytest.raises(ContextOverflow, match=f"node '{r.id}'"):
        t.validate(context_length=99)  # max_tokens alone, no counter


def test_validate_with_tokenizer():
    from forkv.graph.testing import ToyTokenizer

    t = Tree()
    t.user("hello").final({"max_tokens": 10})
    n = len(ToyTokenizer().encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"))
    t.validate(context_length=n + 10, tokenizer=ToyTokenizer())
    with pytest.raises(ContextOverflow):
        t.validate(context_length=n + 9, tokenizer=ToyTokenizer())
