"""`forkv run SPEC`: a workflow file runs from the command line, prints per-node stats and
saves the tree (0600); bad input is one line and exit status 2."""

import json
import re
import stat

import pytest
from forkv.cli import main

SPEC = {
    "model_id": "demo:qwen3:tiny",  # no fingerprint: matches that model
    "nodes": [
        {"id": "s", "kind": "system", "text": "You review code."},
        {"id": "u", "parent": "s", "kind": "user", "text": "def f(x):\n    return x - 1\n" * 40},
        {"id": "r", "parent": "u", "kind": "reasoning",
         "fork": {"k": 2, "keep": {"scorer": "mean_logprob"}}},
        {"id": "a", "parent": "r", "kind": "final", "gen": {"max_tokens": 3, "stop": "END"}},
    ],
}


def _spec(tmp_path, spec=SPEC, name="flow.json"):
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(spec))
    else:
        import yaml

        path.write_text(yaml.safe_dump(spec))
    return path


def test_run_prints_each_node_and_saves_a_private_tree(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = json.loads(json.dumps(SPEC))
    for n in spec["nodes"]:
        if n["id"] == "r":
            n["fork"]["settings"] = [{"max_tokens": 4, "seed": 1, "temperature": 0.7},
                                     {"max_tokens": 4, "seed": 2, "temperature": 0.7}]
            del n["fork"]["k"]
    path = _spec(tmp_path, spec, "flow.yaml")
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "old.json").chmod(0o644)  # an existing file is made private too
    assert main(["run", str(path), "--save", "old.json"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(rows) == {"r.0", "r.1", "a.0"} or set(rows) == {"r.0", "r.1", "a.1"}
    assert "reused     0" in rows["r.0"] and "generated    4" in rows["r.0"]
    # the second branch restores the shared blocks and the turn end after them
    reused, computed = int(rows["r.1"].split()[3]), int(rows["r.1"].split()[5])
    assert reused >= 1024 and computed < 8
    assert all(re.search(r"first token [0-9.]+ s  total [0-9.]+ s  (length|stop)$", r)
               for r in rows.values())
    assert "demo:qwen3:tiny@" in out.splitlines()[0] and "total: reused " in out
    saved = tmp_path / "old.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    tree = json.loads(saved.read_text())
    assert tree["model_id"].startswith("demo:qwen3:tiny@")
    assert main(["show", str(saved)]) == 0  # the saved tree draws


@pytest.mark.parametrize("spec, args, message", [
    ({"nodes": [{"id": "u", "kind": "user", "text": "x"}]}, [], "has no model_id; pass --model"),
    (SPEC, ["--model", "demo:gemma3:tiny"], ("rendered for model 'demo:qwen3:tiny', not "
                                             "'demo:gemma3:tiny@")),
    ({**SPEC, "nodes": [*SPEC["nodes"][:2], {"id": "r", "parent": "u", "kind": "reasoning",
                                             "fork": {"k": 2, "keep": {"scorer": "best"}}}]},
     [], "scorer 'best', which was not given"),
    ({**SPEC, "nodes": [{"id": "s", "kind": "system", "text": "x", "gen": {"max_tokens": 2}}]},
     [], "system node 's' needs text and no gen"),
])
def test_run_reports_bad_input_in_one_line(tmp_path, capsys, spec, args, message):
    assert main(["run", str(_spec(tmp_path, spec)), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("forkv: error: ") and message in err and err.count("\n") == 1


def test_run_names_the_file_of_a_broken_spec(tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text("nodes:\n  - id: [a\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml is not valid YAML at line 3" in err and err.count("\n") == 1
    assert main(["run", str(tmp_path / "nope.json")]) == 2
    assert "cannot read workflow spec" in capsys.readouterr().err
