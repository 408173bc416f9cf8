"""Session: run order and waves, per-node stats, streaming, async, errors that name the node."""

import asyncio

import forkv
import pytest
from conftest import load_tiny, scoped_engine
from forkv.graph import ImageNotSupported, ModelMismatch, NodeFailed, NodeNotFound, NodeRemoved
from forkv.engine import CacheKind
from forkv.graph import ContextOverflow, NodeStateError, WorkflowSpec
from forkv.runner import _clean_text

SYSTEM = "You review code and answer briefly. " * 4
CODE = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(16))


@pytest.fixture
def session():
    with forkv.Session(load_tiny("gemma3")) as s:
        yield s


def small_tree(s):
    """Two conversations; the first forks two reasoning branches, each with a final."""
    u = s.system(SYSTEM).user("Review:\n" + CODE)
    branches = u.fork(2, gen={"temperature": 0.8, "max_tokens": 6})
    finals = [b.final({"max_tokens": 5}) for b in branches]
    other = s.user("A separate question.").final({"max_tokens": 4})
    return u, branches, finals, other


def test_run_computes_in_dependency_order_with_stats(session):
    _u, branches, finals, other = small_tree(session)
    last = [ev.node_id for ev in session.stream() if ev.is_last]
    # wave 0: both branches and the other conversation; wave 1: the finals
    assert last == [branches[0].id, branches[1].id, other.id, finals[0].id, finals[1].id]
    for n in (*branches, *finals, other):
        st, t = n.result.stats, n.result.timings
        assert n.status == "done" and n.text is not None
        assert st.tokens_reused + st.tokens_computed == t["prompt_tokens"]
        assert st.tokens_generated == len(n.result.token_ids) >= 1
        assert n.result.finish_reason in ("stop", "length") and t["wall_s"] > 0
        assert n.span is not None and n.blocks  # spans and block keys recorded
    assert branches[0].result.stats.tokens_reused == 0
    # the second branch shares the first's prompt: restored up to its turn end (past the last
    # full block: the generation prompt's end, where the reasoning opener follows)
    tokens = session.prompt(branches[1]).token_ids
    end = session.engine.checkpointer.turns.ends(tokens[:-1])[-1]
    assert end > (len(tokens) - 1) // 256 * 256 > 0
    assert branches[1].result.stats.tokens_reused == end
    assert session.tree.model_id == session.model_id
    assert session.tree.model_id.startswith("demo:gemma3:tiny@")
    assert session.run() == []  # nothing left


def test_targets_limit_the_work(session):
    _u, branches, finals, other = small_tree(session)
    done = session.run(finals[1].id)
    assert [n.id for n in done] == [branches[1].id, finals[1].id]
    assert branches[0].is_pending and other.is_pending
    assert [n.id for n in session.run([other])] == [other.id]


def test_stream_events_add_up_to_attached_results(session):
    _u, branches, finals, other = small_tree(session)
    events = list(session.stream([finals[0], other]))
    for node in (branches[0], finals[0], other):
        mine = [e for e in events if e.node_id == node.id]
        assert all(not e.is_last and e.stats is None for e in mine[:-1])
        assert mine[-1].is_last and mine[-1].stats == node.result.stats
        assert mine[-1].timings == node.result.timings
        assert [t for e in mine for t in e.token_ids] == node.result.token_ids
        assert "".join(e.text for e in mine).startswith(node.text)
        assert all(e.kind == node.kind for e in mine)
    lps = [lp for e in events if e.node_id == other.id for lp in e.logprobs]
    assert session.mean_logprob(other) == pytest.approx(sum(lps) / len(lps))


def test_async_entry_points_match_sync():
    lm = load_tiny("qwen3")
    with forkv.Session(lm) as a, forkv.Session(lm) as b:
        fa = a.user("Hello there").final({"max_tokens": 6})
        fb = b.user("Hello there").final({"max_tokens": 6})
        a.run()

        async def go():
            events = [ev async for ev in b.astream()]
            assert events[-1].is_last and events[-1].node_id == fb.id
            more = b.tree[fb.id].user("And then?").final({"max_tokens": 3})
            return await b.arun(more)

        done = asyncio.run(go())
        assert fa.result.token_ids == fb.result.token_ids and fa.text == fb.text
        assert len(done) == 1 and done[0].status == "done"


def test_async_stream_stops_when_consumer_leaves():
    with forkv.Session(load_tiny("qwen3")) as s:
        f = s.user("Hello").final({"max_tokens": 40})

        async def first_event():
            async for ev in s.astream():
                return ev

        ev = asyncio.run(first_event())
        assert ev.node_id == f.id and not ev.is_last
        assert f.is_pending and f.status == "pending"  # nothing half-attached
        assert s.run()[0].id == f.id  # and the session is free again


def test_unknown_removed_and_image_nodes_are_named(session, tmp_path):
    u = session.user("hi")
    f = u.final({"max_tokens": 3})
    with pytest.raises(NodeNotFound, match="'nope'"):
        session.run("nope")
    removed = u.final({"max_tokens": 3})
    session.remove(removed)
    with pytest.raises(NodeRemoved, match=repr(removed.id)):
        session.run(removed)
    img = tmp_path / "x.png"
    img.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))
    pic = session.user("look", images=[img])
    g = pic.final({"max_tokens": 3})
    with pytest.raises(ImageNotSupported, match=f"node {pic.id!r} has an image"):
        session.run()
    assert f.is_pending and g.is_pending  # refused before anything ran
    assert [n.id for n in session.run(f)] == [f.id]


def test_failure_mid_run_names_node_and_keeps_results(session, monkeypatch):
    from forkv.engine import Engine

    _u, branches, finals, _other = small_tree(session)
    real = Engine.submit  # the fork's two branches are submitted together
    calls = []

    def flaky(self, tokens, params=None, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("out of memory")
        return real(self, tokens, params, **kw)

    monkeypatch.setattr(Engine, "submit", flaky)
    with pytest.raises(NodeFailed, match=f"node {branches[1].id!r} failed") as info:
        session.run(finals)
    assert info.value.node_id == branches[1].id
    assert isinstance(info.value.__cause__, MemoryError)
    assert branches[0].status == "done" and branches[0].result is not None
    assert branches[1].status == "failed" and "out of memory" in branches[1].error
    with pytest.raises(NodeStateError, match=repr(branches[1].id)):
        session.run(finals)
    session.tree.reset(branches[1])
    assert [n.id for n in session.run(finals)] == [branches[1].id, finals[0].id, finals[1].id]


def test_context_overflow_in_a_later_wave_names_the_node(session):
    u = session.user("short")
    r = u.reasoning({"max_tokens": 4})
    f = r.final({"max_tokens": session.engine.lm.context_length})
    with pytest.raises(ContextOverflow, match=f"node {f.id!r} needs"):
        session.run()
    assert r.status == "done" and f.is_pending


def test_tree_for_another_model_is_refused(tmp_path):
    with forkv.Session(load_tiny("gemma3")) as g:
        g.user("hi").final({"max_tokens": 2})
        g.run()
        g.save(tmp_path / "t.json")
        tree = forkv.Tree.load(tmp_path / "t.json")
    with forkv.Session(load_tiny("qwen3")) as q:
        before = q.tree
        with pytest.raises(ModelMismatch, match="demo:gemma3:tiny@"):
            q.load(tmp_path / "t.json")
        assert q.tree is before
        q.tree = tree
        with pytest.raises(ModelMismatch, match="start a new tree"):
            q.run()
    with pytest.raises(ModelMismatch):
        forkv.Session(load_tiny("qwen3"), tree=forkv.Tree.load(tmp_path / "t.json"))
    with forkv.Session(load_tiny("gemma3")) as g2:  # same model: resumes
        g2.load(tmp_path / "t.json")
        leaf = g2.tree.leaves()[0]
        g2.run(leaf.user("more").final({"max_tokens": 2}))


def test_remove_releases_blocks_only_that_subtree_used(session):
    u = session.system(SYSTEM).user("Review:\n" + CODE * 2)
    r = u.reasoning(text="Thinking it over. " * 40)  # spans whole blocks of its own
    f = r.final({"max_tokens": 2})
    session.run()
    only = session.tree.keys_only_in(r)
    shared = {b.key for b in u.blocks if b.key}
    store = session.engine.store
    def has(k):
        return any(store.contains(bytes.fromhex(k), kind) for kind in CacheKind)

    assert only and all(has(k) for k in only | shared)
    assert session.remove(r) == [r.id, f.id]
    assert not any(has(k) for k in only) and all(has(k) for k in shared)


def test_turn_ends_are_reused_and_released_with_the_subtree_that_made_them(session):
    u = session.system("Be brief.").user("A short question?")
    a = u.final({"max_tokens": 2})
    session.run()
    q = a.user("And a follow-up?")
    g = q.final({"max_tokens": 2})
    session.run()
    # The follow-up restores the first prompt's end (under one block: no block record).
    first = session.engine.encode([{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "A short question?"}])
    assert len(first) < 256 and g.result.stats.tokens_reused == len(first)
    store = session.engine.store
    def has(k):
        return store.contains(bytes.fromhex(k), CacheKind.EXTRA)

    mine = session.tree.keys_only_in(q)
    assert mine and all(has(k) for k in mine)  # the follow-up prompt's end
    kept = set().union(*(n.turn_keys for n in (u, a)))
    assert kept and all(has(k) for k in kept)
    session.remove(q)
    assert not any(has(k) for k in mine) and all(has(k) for k in kept)


@pytest.mark.parametrize("model", ["demo:gemma3", "demo:qwen3_5"])
def test_forks_of_either_kind_restore_to_the_turn_end(model):
    """After a final answer ran, forks of final answers restore its whole prompt (its turn
    end's record holds the last logits) and reasoning forks the same turn end; each final
    fork samples what the same fork of a fresh session does."""
    code = "".join(f"def scale_{i}(xs, k={i}):\n    return [x * k - {i} for x in xs]\n"
                   for i in range(20))  # ~1,100 tokens: the turn end is mid-block

    def tree(s):
        return s.system("You review code.").user("Review:\n" + code)

    with forkv.Session(model) as s:
        u = tree(s)
        first = u.final({"max_tokens": 4})
        s.run(first)
        end = first.result.stats.tokens_reused + first.result.stats.tokens_computed
        assert end % 256 and first.result.stats.tokens_reused == 0
        finals = u.fork(3, kind="final", gen={"max_tokens": 4})
        s.run(finals)
        assert [b.result.stats.tokens_reused for b in finals] == [end] * 3
        assert [b.result.stats.tokens_computed for b in finals] == [0] * 3
        thoughts = u.fork(3, gen={"max_tokens": 4})
        s.run(thoughts)
        assert [b.result.stats.tokens_reused for b in thoughts] == [end] * 3
        assert all(0 < b.result.stats.tokens_computed < 8 for b in thoughts)  # <think>
    with forkv.Session(model) as fresh:
        again = tree(fresh).fork(3, kind="final", gen={"max_tokens": 4})
        fresh.run(again)
        assert [b.text for b in again] == [b.text for b in finals]


def test_session_over_an_engine_and_settings_rules():
    engine = scoped_engine(load_tiny("qwen3"), checkpoints=False)
    s = forkv.Session(engine)
    s.user("x").final({"max_tokens": 2})
    assert s.run()[0].result.stats.tokens_reused == 0
    s.close()  # the engine is the caller's: still usable
    assert engine.generate("hi", max_tokens=1).token_ids
    with pytest.raises(TypeError, match="Engine"):
        forkv.Session(engine, block_size=32)


def test_reasoning_text_drops_the_close_tag_newline():
    fmt = forkv.graph.ReasoningFormat()
    eos = frozenset({258})
    assert _clean_text("reasoning", "idea\n", "stop", 260, eos, fmt) == "idea"
    assert _clean_text("reasoning", "idea\n", "stop", 258, eos, fmt) == "idea\n"  # EOS
    assert _clean_text("reasoning", "idea\n", "length", 5, eos, fmt) == "idea\n"
    assert _clean_text("final", "idea\n", "stop", 260, eos, fmt) == "idea\n"


def test_workflow_spec_runs_forks_and_keeps_the_best(session):
    spec = WorkflowSpec.model_validate({"nodes": [
        {"id": "u", "kind": "user", "text": "Pick a plan."},
        {"id": "r", "parent": "u", "kind": "reasoning", "gen": {"max_tokens": 4,
                                                                 "temperature": 1.0},
         "fork": {"k": 3, "keep": {"scorer": "logprob"}}},
        {"id": "f", "parent": "r", "kind": "final", "gen": {"max_tokens": 3}},
    ]})
    tree = session.run_workflow(spec, {"logprob": session.mean_logprob})
    kept = [n for n in tree if n.meta.get("kept")]
    assert len(kept) == 1 and not tree.pending()
    assert [c.kind for c in tree.children(kept[0])] == ["final"]
    assert len([n for n in tree if n.kind == "reasoning"]) == 1  # the others were dropped


def test_images_reach_a_vision_model():
    pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed")
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    pixels = (np.random.RandomState(0).rand(168, 224, 3) * 255).astype("uint8")
    Image.fromarray(pixels).save(buf, format="PNG")
    with forkv.Session("demo:qwen2_vl", block_size=32) as s:
        assert s.can_see_images
        pic = s.user("What is in this picture?", images=[buf.getvalue()])
        first, second = pic.final({"max_tokens": 4}), pic.final({"max_tokens": 4})
        s.run()
        assert first.result.token_ids == second.result.token_ids
        assert second.result.stats.tokens_reused >= 32  # the image's blocks came back
        assert first.result.timings["prompt_tokens"] > s.prompt(first).num_tokens  # expanded
