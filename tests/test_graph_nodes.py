"""Node models: settings validation, image hashing, node builders."""

import hashlib

import pytest
from forkv.graph import GenSettings, GraphError, ImagePart, Node, Tree

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def test_gen_settings_defaults_and_bounds():
    g = GenSettings()
    assert (g.max_tokens, g.temperature, g.top_p, g.top_k, g.seed, g.stop) == (
        256,
        0.0,
        1.0,
        0,
        None,
        (),
    )
    for bad in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"nope": 1},
                {"min_p": 2}, {"repetition_penalty": 0}, {"logit_bias": {"x": 1}}):
        with pytest.raises(GraphError, match=f"generation setting '{next(iter(bad))}") as e:
            GenSettings.of(bad)
        assert "\n" not in str(e.value) and "pydantic" not in str(e.value)
    assert hash(GenSettings(stop=["x"])) == hash(GenSettings(stop=("x",)))
    assert hash(GenSettings(logit_bias={1: 2})) == hash(GenSettings(logit_bias={"1": 2.0}))


def test_gen_settings_take_one_stop_string_and_sampling_extras():
    g = GenSettings(stop="abc", min_p=0.1, repetition_penalty=1.2, presence_penalty=0.5,
                    frequency_penalty=0.1, logit_bias={"7": -5})
    assert g.stop == ("abc",) and g.logit_bias == {7: -5.0}


def test_bad_node_settings_name_the_node_and_field():
    from forkv.graph import Tree

    t = Tree()
    u = t.user("hi", id="u")
    with pytest.raises(GraphError) as e:
        u.reasoning({"temperature": "hot"}, id="r")
    msg = str(e.value)
    assert msg.startswith("node 'r': generation setting 'temperature'") and "'hot'" in msg
    assert "errors.pydantic.dev" not in msg and e.value.node_id == "r"
    with pytest.raises(GraphError, match="'tempreature' is not a known field; use one of"):
        u.final({"tempreature": 1})


def test_an_image_path_that_is_not_an_image_is_named(tmp_path):
    from forkv.graph import Tree

    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    with pytest.raises(GraphError, match="notes.png' is not a PNG, JPEG"):
        Tree().user("look", images=[bad])


def test_image_from_path_hashes_and_checks(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(PNG)
    img = ImagePart.from_path(p)
    assert img.sha256 == hashlib.sha256(PNG).hexdigest()
    assert img.mime == "image/png" and img.path == str(p) and img.data is None
    assert img.load_bytes("u1") == PNG
    p.write_bytes(PNG + b"x")
    with pytest.raises(GraphError, match="'u1' changed"):
        img.load_bytes("u1")
    p.unlink()
    with pytest.raises(GraphError, match="cannot be read"):
        img.load_bytes("u1")


def test_image_from_bytes_keeps_bytes():
    img = ImagePart.from_bytes(b"\xff\xd8\xff" + b"1234")
    assert img.mime == "image/jpeg" and img.data.startswith(b"\xff\xd8") and img.path is None
    again = ImagePart.model_validate_json(img.model_dump_json())
    assert again == img


def test_builders_delegate_to_tree():
    t = Tree()
    s = t.system("sys")
    u = s.user("hi")
    r = u.reasoning({"max_tokens": 8})
    f = r.final(text="answer")
    tool = f.tool("42", name="calc")
    f2 = tool.final()
    assert [n.kind for n in f2.path()] == ["system", "user", "reasoning", "final", "tool", "final"]
    assert r.is_pending and r.gen.max_tokens == 8 and not f.is_pending and f.gen is None
    assert f2.gen == GenSettings() and u.parent is s and s.children == [u]
    assert repr(r) == "Node(id='r3', kind='reasoning', status='pending')"


def test_node_without_tree():
    n = Node(id="x", kind="user", text="hi")
    with pytest.raises(GraphError, match="'x' belongs to no tree"):
        n.user("more")
