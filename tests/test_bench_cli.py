"""`forkv bench NAME` prints a readable table of its figures; JSON only with --json."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from forkv.bench import cli

RESULT = {"model": "demo:gemma3:tiny",
          "headline": {"speedup_8k": 123.456, "exact": True, "speedup_at_max": None},
          "targets": {"speedup_8k": {"target": ">= 20", "met": True},
                      "exact": {"target": "== true", "met": False}}}


def test_table_lists_each_figure_with_target_and_whether_met():
    lines = cli.format_table("rewind", {**RESULT, "wall_s": 3.2}).splitlines()
    assert lines[0] == "rewind (3.2 s)"
    assert lines[1].split() == ["figure", "model", "value", "target", "met"]
    assert lines[2].split() == ["speedup_8k", "gemma3:tiny", "123", ">=", "20", "yes"]
    assert lines[3].split() == ["exact", "gemma3:tiny", "True", "==", "true", "NO"]
    assert lines[4].split() == ["speedup_at_max", "gemma3:tiny", "-"]  # not measured
    assert not any(line.lstrip().startswith("{") for line in lines)


def _args(**kw):
    return SimpleNamespace(**{"name": "rewind", "model": None, "quick": True, "reps": None,
                              "set": [], "json_path": None, "report": None, "check": False,
                              **kw})


def test_cli_prints_a_table_or_json(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "run_benchmark", lambda *a, **k: json.loads(json.dumps(RESULT)))
    assert cli.run_cli(_args()) == 0
    out = capsys.readouterr().out
    assert out.startswith("rewind (") and "speedup_8k" in out and '{"' not in out
    assert cli.run_cli(_args(json_path="-")) == 0
    assert json.loads(capsys.readouterr().out)["headline"]["exact"] is True
    assert cli.run_cli(_args(json_path=str(tmp_path / "r.json"))) == 0
    assert "speedup_8k" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["model"] == "demo:gemma3:tiny"


def test_check_exits_1_naming_the_missed_targets(monkeypatch, capsys):
    monkeypatch.setattr(cli, "run_benchmark", lambda *a, **k: json.loads(json.dumps(RESULT)))
    assert cli.run_cli(_args()) == 0  # a miss is NO in the table, and exit 0 without --check
    assert capsys.readouterr().err == ""
    assert cli.run_cli(_args(check=True)) == 1
    out = capsys.readouterr()
    assert " NO" in out.out
    assert out.err == "forkv bench: 1 target missed: rewind exact (gemma3:tiny) True, " \
                      "target == true\n"
    met = json.loads(json.dumps(RESULT))
    met["targets"]["exact"]["met"] = True
    monkeypatch.setattr(cli, "run_benchmark", lambda *a, **k: met)
    assert cli.run_cli(_args(check=True, json_path="-")) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["model"] == "demo:gemma3:tiny" and out.err == ""


@pytest.mark.slow  # a real quick benchmark end to end (~10 s on 2 busy cores)
def test_check_on_a_quick_benchmark(tmp_path):
    path = tmp_path / "rewind.json"
    r = subprocess.run([sys.executable, "-m", "forkv.cli", "bench", "rewind", "--quick",
                        "--check", "--json", str(path)], capture_output=True, text=True,
                       timeout=600, check=False)
    data = json.loads(path.read_text())
    missed = [k for k, t in data["targets"].items() if t["met"] is False]
    assert r.returncode == (1 if missed else 0), r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("forkv bench: ")]
    assert len(lines) == (1 if missed else 0), r.stderr[-2000:]
    for key in missed:
        assert f"rewind {key} (" in lines[0]


def test_store_headline_is_the_median_of_fresh_processes(monkeypatch):
    import subprocess

    from forkv.bench import store

    figures = iter([1.21, 1.08, 1.12])
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        v = next(figures)
        res = {"headline": {"encryption_overhead": v}, "settings": {}, "notes": [],
               "targets": {"encryption_overhead": {"target": "<= 1.15", "met": v <= 1.15}}}
        return subprocess.CompletedProcess(cmd, 0, "noise\n" + json.dumps(res) + "\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    r = store.run_store_bench("demo:gemma3:tiny", reps=1, prefix=512)
    assert len(calls) == 3 and all(c[1] == "-c" for c in calls)  # three fresh interpreters
    assert json.loads(calls[0][3]) == {"model": "demo:gemma3:tiny", "reps": 1, "prefix": 512}
    assert r["headline"]["encryption_overhead"] == 1.12
    assert r["headline"]["encryption_overhead_runs"] == [1.08, 1.12, 1.21]
    assert r["targets"]["encryption_overhead"]["met"] is True and r["settings"]["processes"] == 3
