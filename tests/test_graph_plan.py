"""Planning: dependency waves, rendered prompts, default stops, failures, context."""

import pytest
from forkv.graph import ContextOverflow, ForeignNode, NodeStateError, Tree, plan
from forkv.graph.testing import ToyTokenizer

TOK = ToyTokenizer()


def tot_tree():
    """Two conversations; the first forks 3 reasoning branches, each with a final."""
    t = Tree()
    u = t.system("S").user("Q")
    branches = u.fork(3, gen={"temperature": 0.7})
    finals = [b.final() for b in branches]
    other = t.user("independent").final()
    return t, u, branches, finals, other


def ids(waves):
    return [[j.node_id for j in w] for w in waves]


def test_waves_group_independent_jobs():
    t, _u, _branches, _finals, _other = tot_tree()
    waves = plan(t, tokenizer=TOK)
    assert ids(waves) == [["r3", "r4", "r5", "f10"], ["f6", "f7", "f8"]]
    w0, w1 = waves
    assert all(j.prompt is not None and j.wave == 0 and j.depends_on == () for j in w0)
    assert all(j.prompt is None and j.wave == 1 for j in w1)
    assert w1[0].depends_on == ("r3",)
    assert w0[0].gen.stop == ("</think>",) and w0[0].gen.temperature == 0.7
    assert w0[3].gen.stop == ()  # finals stop at end of turn (the engine's eos)
    assert w0[0].prompt.prompt_text == w0[1].prompt.prompt_text  # fork shares the prefix


def test_targets_limit_the_work():
    t, u, branches, finals, _other = tot_tree()
    assert ids(plan(t, [finals[1]])) == [["r4"], ["f7"]]
    assert ids(plan(t, ["f10", branches[0]])) == [["r3", "f10"]]
    assert plan(t, [u]) == []
    follow = t.user("x")
    assert plan(t, [follow]) == []


def test_attach_moves_work_forward():
    t, _u, _branches, finals, _other = tot_tree()
    t.attach("r3", "idea")
    waves = plan(t, [finals[0]], TOK)
    assert ids(waves) == [["f6"]]
    assert waves[0][0].prompt.prompt_text.endswith("<think>\nidea\n</think>\n\n")
    t.attach("f6", "done")
    assert plan(t, [finals[0]]) == []
    # a pending node under a later user turn depends on nothing pending above
    nxt = finals[0].user("more").final()
    assert ids(plan(t, [nxt])) == [[nxt.id]]


def test_failed_nodes_block_until_reset():
    t, _u, _branches, _finals, _other = tot_tree()
    t.fail("r3", "oom")
    with pytest.raises(NodeStateError, match="node 'r3' failed \\(oom\\)"):
        plan(t, ["f6"])
    t.reset("r3")
    assert ids(plan(t, ["f6"])) == [["r3"], ["f6"]]


def test_context_length_and_foreign():
    t, _u, _branches, finals, _other = tot_tree()
    with pytest.raises(ContextOverflow, match="node 'r3' needs"):
        plan(t, tokenizer=TOK, context_length=100)
    with pytest.raises(ForeignNode):
        plan(Tree(), [finals[0]])


def test_one_target_plans_from_its_path_not_the_tree(monkeypatch):
    """A deep conversation's next turn is planned from its own path: the whole tree is not
    walked (nor each path again), and the jobs are those of the tree-order walk."""
    t = Tree()
    node = t.system("S")
    for i in range(30):
        node = node.user(f"q{i}").final(text=f"a{i}")
    r = node.user("next").reasoning()
    f = r.final()
    walked = plan(t, [f, f])  # more than one target: the tree-order walk
    monkeypatch.setattr(Tree, "__iter__", lambda self: pytest.fail("the tree was walked"))
    assert plan(t, [f]) == walked and ids(walked) == [[r.id], [f.id]]
    assert walked[1][0].depends_on == (r.id,)
