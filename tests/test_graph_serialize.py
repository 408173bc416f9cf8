"""Saving and loading trees: lossless roundtrip, format checks, validation on load."""

import json

import pytest
from forkv.graph import (
    CycleError,
    InvalidPlacement,
    ModelMismatch,
    NodeNotFound,
    NodeRemoved,
    Tree,
    TreeFormatError,
    render,
)
from forkv.graph.testing import ToyTokenizer


def full_tree(tmp_path):
    img = tmp_path / "cat.png"
    img.write_bytes(b"\x89PNG\r\n\x1a\n0000")
    t = Tree(model_id="demo:qwen3:tiny")
    s = t.system("sys")
    u = s.user("look", images=[img, b"\xff\xd8\xffinline"])
    r = u.reasoning({"max_tokens": 9, "seed": 3, "stop": ["</think>"]})
    f = r.final()
    t.attach(r, "hmm", [1, 2], "stop", {"prefill_s": 0.1}, {"tokens_computed": 7})
    t.record_render(render(t, f, ToyTokenizer()), ["ab" * 16], block_size=8)
    t.fail(f, "boom")
    gone = u.final(text="bye")
    t.remove(gone)
    u.final(text="kept", meta={"score": 0.5})
    return t


def test_roundtrip_is_lossless(tmp_path):
    t = full_tree(tmp_path)
    text = t.to_json()
    t2 = Tree.from_json(text)
    assert t2.to_json() == text
    assert t2.model_id == "demo:qwen3:tiny" and t2.block_size == 8
    u = t2["u2"]
    assert u.images[1].data == b"\xff\xd8\xffinline" and u.images[0].data is None
    assert t2["r3"].result.stats.tokens_computed == 7 and t2["f4"].error == "boom"
    assert t2["s1"].blocks[0].key == "ab" * 16 and t2["u2"].span is not None
    with pytest.raises(NodeRemoved):
        t2["f5"]
    assert t2["u2"].final().id == "f7"  # the id counter survives too
    assert Tree.from_json(json.loads(text)).to_json() == text


def test_save_load_and_model_check(tmp_path):
    t = full_tree(tmp_path)
    p = tmp_path / "tree.json"
    t.save(p)
    assert Tree.load(p, model_id="demo:qwen3:tiny").to_json() == t.to_json()
    with pytest.raises(ModelMismatch, match="'demo:qwen3:tiny', not 'demo:gemma3:tiny'"):
        Tree.load(p, model_id="demo:gemma3:tiny")


def doc(nodes, **kw):
    return json.dumps({"format": "forkv.tree", "version": 1, "nodes": nodes, **kw})


def test_format_errors():
    with pytest.raises(TreeFormatError, match="not JSON"):
        Tree.from_json("{")
    with pytest.raises(TreeFormatError, match="lacks format"):
        Tree.from_json("{}")
    with pytest.raises(TreeFormatError, match="version 99"):
        Tree.from_json(doc([], version=99))
    with pytest.raises(TreeFormatError, match="node 'u1' is malformed at nodes.0.kind"):
        Tree.from_json(doc([{"id": "u1", "kind": "robot", "text": "x"}]))
    with pytest.raises(TreeFormatError, match="'u1' appears twice"):
        Tree.from_json(doc([{"id": "u1", "kind": "user", "text": "x"}] * 2))
    with pytest.raises(TreeFormatError, match="'f1' is pending but has no gen"):
        Tree.from_json(doc([{"id": "f1", "kind": "final", "status": "pending"}]))


def test_structure_errors_on_load():
    with pytest.raises(NodeNotFound, match="'u1' names parent 'nope'"):
        Tree.from_json(doc([{"id": "u1", "parent_id": "nope", "kind": "user", "text": "x"}]))
    cyc = [
        {"id": "f1", "parent_id": "u1", "kind": "final", "text": "x"},
        {"id": "u1", "parent_id": "f1", "kind": "user", "text": "x"},
    ]
    with pytest.raises(CycleError, match="is its own ancestor"):
        Tree.from_json(doc(cyc))
    with pytest.raises(InvalidPlacement, match="'r2' sits directly under system node 's1'"):
        Tree.from_json(
            doc(
                [
                    {"id": "s1", "kind": "system", "text": "x"},
                    {"id": "r2", "parent_id": "s1", "kind": "reasoning", "text": "x"},
                ]
            )
        )


def test_saved_trees_are_private(tmp_path):
    import os
    import stat

    from forkv.graph import Tree

    tree = Tree()
    tree.user("a secret question")
    path = tmp_path / "t.json"
    path.write_text("{}")
    os.chmod(path, 0o644)  # an existing, readable file is made private too
    tree.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Tree.load(path).roots()[0].text == "a secret question"
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(OSError):
        tree.save(link)
    assert not (tmp_path / "elsewhere.json").exists()
