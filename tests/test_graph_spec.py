"""Declarative workflows: validation, build, keep rules, JSON/YAML, tree roundtrip."""

import json

import pytest
from forkv.graph import GenSettings, SpecError, Tree, WorkflowSpec


def tot_spec(**keep):
    return WorkflowSpec.model_validate(
        {
            "model_id": "demo:qwen3:tiny",
            "nodes": [
                {"id": "sys", "kind": "system", "text": "You are careful."},
                {"id": "q", "parent": "sys", "kind": "user", "text": "Solve it."},
                {
                    "id": "think",
                    "parent": "q",
                    "kind": "reasoning",
                    "gen": {"max_tokens": 64, "temperature": 0.8},
                    "fork": {"k": 3, **({"keep": keep} if keep else {})},
                },
                {"id": "ans", "parent": "think", "kind": "final", "gen": {"max_tokens": 16}},
                {"id": "next", "parent": "ans", "kind": "user", "text": "Why?"},
            ],
            "targets": ["ans"],
        }
    )


def test_build_fans_out_without_keep():
    t = tot_spec().build()
    assert t.model_id == "demo:qwen3:tiny"
    assert [n.id for n in t] == [
        "sys",
        "q",
        "think.0",
        "think.1",
        "think.2",
        "ans.0",
        "next.0",
        "ans.1",
        "next.1",
        "ans.2",
        "next.2",
    ]
    assert [t[f"think.{i}"].gen.seed for i in range(3)] == [0, 1, 2]
    assert t["ans.1"].meta == {"spec_id": "ans"} and t["think.2"].meta["branch"] == 2


def test_keep_by_scorer_defers_then_advances():
    spec = tot_spec(scorer="length", top=1)
    t = spec.build()
    assert [n.id for n in t] == ["sys", "q", "think.0", "think.1", "think.2"]
    assert spec.advance(t, {"length": len}) == []  # branches still pending
    for i, text in enumerate(["short", "the longest one", "medium one"]):
        t.attach(f"think.{i}", text)
    saved = Tree.from_json(t.to_json())  # advance works on a reloaded tree
    added = spec.advance(saved, {"length": lambda n: len(n.text)})
    assert [n.id for n in added] == ["ans.1", "next.1"]
    assert [n.id for n in saved] == ["sys", "q", "think.1", "ans.1", "next.1"]
    assert saved["think.1"].meta["kept"] is True
    assert spec.advance(saved, {"length": len}) == []
    with pytest.raises(SpecError, match="fork node 'think' keeps branches by scorer 'length'"):
        spec.advance(t, {})


def test_keep_by_ids_keeps_others_when_asked():
    spec = tot_spec(ids=[0, "think.2"], drop_others=False)
    t = spec.build()
    for i in range(3):
        t.attach(f"think.{i}", "x")
    assert [n.id for n in spec.advance(t)] == ["ans.0", "next.0", "ans.2", "next.2"]
    assert t["think.1"].meta["kept"] is False and "think.1" in t


def test_nested_fork_ids():
    spec = WorkflowSpec(
        nodes=[
            {"id": "q", "kind": "user", "text": "Q"},
            {"id": "r", "parent": "q", "kind": "reasoning", "fork": {"seeds": [5, 9]}},
            {"id": "a", "parent": "r", "kind": "final", "fork": {"k": 2}},
        ]
    )
    t = spec.build()
    assert [n.id for n in t] == ["q", "r.0", "r.1", "a.0.0", "a.0.1", "a.1.0", "a.1.1"]
    assert t["r.1"].gen.seed == 9


@pytest.mark.parametrize(
    "nodes,match",
    [
        (
            [{"id": "a", "kind": "user", "text": "x"}, {"id": "a", "kind": "user", "text": "y"}],
            "'a' is used twice",
        ),
        ([{"id": "u", "parent": "ghost", "kind": "user", "text": "x"}], "names parent 'ghost'"),
        (
            [
                {"id": "u", "parent": "f", "kind": "user", "text": "x"},
                {"id": "f", "parent": "u", "kind": "final", "text": "x"},
            ],
            "is its own ancestor",
        ),
        (
            [
                {"id": "s", "kind": "system", "text": "x"},
                {"id": "r", "parent": "s", "kind": "reasoning"},
            ],
            "'r' sits directly under system",
        ),
        ([{"id": "f", "kind": "final", "text": "x"}], "'f' has no user turn"),
        ([{"id": "u", "kind": "user"}], "user node 'u' needs text"),
        (
            [
                {"id": "u", "kind": "user", "text": "x"},
                {"id": "f", "parent": "u", "kind": "final", "text": "x", "gen": {}},
            ],
            "has text and gen",
        ),
        (
            [
                {"id": "u", "kind": "user", "text": "x"},
                {"id": "f", "parent": "u", "kind": "final", "fork": {}},
            ],
            "'f' needs k, seeds",
        ),
        (
            [
                {"id": "u", "kind": "user", "text": "x"},
                {"id": "f", "parent": "u", "kind": "final", "fork": {"k": 2, "seeds": [1]}},
            ],
            "'f' needs k, seeds",
        ),
        (
            [
                {"id": "u", "kind": "user", "text": "x"},
                {"id": "f", "parent": "u", "kind": "final", "fork": {"k": 2, "keep": {}}},
            ],
            "exactly one of ids or scorer",
        ),
        (
            [
                {"id": "u", "kind": "user", "text": "x"},
                {"id": "f", "parent": "u", "kind": "final", "fork": {"k": 2, "keep": {"ids": [2]}}},
            ],
            "keeps branch 2, which it does not make",
        ),
        (
            [
                {"id": "u", "kind": "user", "text": "x"},
                {
                    "id": "f",
                    "parent": "u",
                    "kind": "final",
                    "fork": {"k": 2, "keep": {"scorer": "s", "top": 3}},
                },
            ],
            "keeps top 3 of 2",
        ),
        (
            [
                {"id": "u", "kind": "user", "text": "x"},
                {"id": "f", "parent": "u", "kind": "final", "fork": {"k": 2}},
                {"id": "f.1", "parent": "u", "kind": "final"},
            ],
            "expands to tree id 'f.1'",
        ),
        ([{"id": "u", "kind": "user", "text": "x", "images": ["/no/such.png"]}], "is not a file"),
        ([{"id": "bad id", "kind": "user", "text": "x"}], "'bad id' is not valid"),
    ],
)
def test_validation_names_the_node(nodes, match):
    spec = WorkflowSpec.model_validate({"nodes": nodes})
    with pytest.raises(SpecError, match=match):
        spec.build()


def test_targets_and_scorer_names_checked():
    with pytest.raises(SpecError, match="target 'nope'"):
        WorkflowSpec(nodes=[{"id": "u", "kind": "user", "text": "x"}], targets=["nope"]).check()
    with pytest.raises(SpecError, match="scorer 'length', which was not given"):
        tot_spec(scorer="length").check(scorers={})
    tot_spec(scorer="length").check(scorers={"length": len})


def test_json_and_yaml_roundtrip(tmp_path):
    spec = tot_spec(scorer="length", top=2)
    assert WorkflowSpec.from_json(spec.to_json()) == spec
    assert WorkflowSpec.from_yaml(spec.to_yaml()) == spec
    for name in ("w.json", "w.yaml"):
        spec.save(tmp_path / name)
        assert WorkflowSpec.load(tmp_path / name) == spec
    assert "keep" in json.loads(spec.to_json())["nodes"][2]["fork"]
    with pytest.raises(SpecError, match="field 'nodes.0.kind' \\(node 'a'\\): should be 'system'"):
        WorkflowSpec.from_json('{"nodes": [{"id": "a", "kind": "robot"}]}')


@pytest.mark.parametrize("name, text, message", [
    ("w.json", '{"nodes": [{"id": "a", "kind": "user", "text": "x"}', "w.json is not valid JSON "
     "(EOF while parsing a list at line 1 column 51); fix the JSON there."),
    ("w.yaml", "nodes:\n  - id: a\n    kind: [user\n", "w.yaml is not valid YAML at line 4, "
     "column 1"),
    ("w.json", '{"nodes": [{"id": "r", "kind": "reasoning", "gen": {"max_tokens": 0}}]}',
     "w.json: field 'nodes.0.gen.max_tokens' (node 'r'): should be greater than or equal to 1 "
     "(got 0); fix that value."),
    ("w.json", '{"nodes": [{"id": "r", "kind": "final", "gen": {"temprature": 1}}]}',
     "w.json: field 'nodes.0.gen.temprature' (node 'r') is not a known field; use one of "
     "max_tokens, temperature,"),
    ("w.json", '{"nodes": [{"id": "r", "kind": "final", "gen": {"stop": "END"}}]}', None),
])
def test_spec_file_errors_are_one_line_naming_file_node_and_field(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    if message is None:  # a single stop string is fine on nodes, as in SamplingParams
        assert WorkflowSpec.load(path).nodes[0].gen.stop == ("END",)
        return
    with pytest.raises(SpecError) as e:
        WorkflowSpec.load(path)
    msg = str(e.value)
    assert "\n" not in msg and "pydantic" not in msg
    assert message in msg.replace(str(tmp_path) + "/", "")
    with pytest.raises(SpecError, match="cannot read workflow spec .*missing.json"):
        WorkflowSpec.load(tmp_path / "missing.json")


def test_model_id_without_fingerprint_matches_that_model():
    from forkv.graph.spec import matches_model

    assert matches_model("demo:qwen3:tiny", "demo:qwen3:tiny@760903a5a1f5")
    assert matches_model("demo:qwen3", "demo:qwen3:tiny@760903a5a1f5")
    assert matches_model(None, "x@1") and matches_model("moved/folder@abc", "m@abc")
    assert not matches_model("demo:gemma3:tiny", "demo:qwen3:tiny@760903a5a1f5")
    assert not matches_model("demo:qwen3:tiny@111111111111", "demo:qwen3:tiny@760903a5a1f5")
    t = Tree(model_id="demo:qwen3:tiny")
    t.check_model("demo:qwen3:tiny@760903a5a1f5")
    with pytest.raises(Exception, match="rendered for model 'demo:qwen3:tiny'"):
        t.check_model("demo:gemma3:tiny@0123456789ab")


def test_tree_to_spec_roundtrip():
    t = Tree(model_id="m")
    u = t.system("S").user("Q", images=[b"\x89PNG\r\n\x1a\nX"])
    r = u.reasoning(GenSettings(max_tokens=5))
    f = r.final()
    t.attach(r, "thought")
    spec = t.to_spec()
    t2 = WorkflowSpec.from_json(spec.to_json()).build()
    assert [(n.id, n.parent_id, n.kind, n.text, n.status) for n in t2] == [
        (n.id, n.parent_id, n.kind, n.text, n.status) for n in t
    ]
    assert t2["u2"].images == u.images and t2["f4"].gen == f.gen and t2.model_id == "m"
    rerun = t.to_spec(include_results=False).build()
    assert rerun["r3"].is_pending and rerun["r3"].gen.max_tokens == 5
