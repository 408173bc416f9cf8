"""The tutorials and the README's first example, unchanged, on a remote backend: each runs
against `forkv serve` through `forkv.remote` instead of a local engine, and still shows reuse
(from the servers' `cached_tokens`). Slow: one server per demo model (started once, stopped
by the fixture's finalizer)."""

import re
import runpy
from pathlib import Path

import forkv
import pytest
from forkv.bench.cluster import start_replica
from forkv.remote import remote

ROOT = Path(__file__).resolve().parents[1]
README_FIRST = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "sdk.md").read_text(),
                          re.DOTALL)[0]  # the SDK page's first example
pytestmark = pytest.mark.slow


def canonical(model: str) -> str:
    return model if model.count(":") == 2 else model + ":tiny"


@pytest.fixture(scope="module")
def backends():
    """model name -> a remote backend on a `forkv serve` of that model (started on demand)."""
    procs, made = {}, {}

    def get(model: str):
        name = canonical(model)
        if name not in made:
            procs[name] = start_replica(name)
            procs[name].wait_ready()
            made[name] = remote(procs[name].base_url, model=name)
        return made[name]

    try:
        yield get
    finally:
        for backend in made.values():
            backend.close()
        for proc in procs.values():
            proc.stop()


@pytest.mark.parametrize("case", ["01_conversation.py:demo:qwen3:tiny",
                                  "02_branch_and_prune.py:demo:gemma3:tiny",
                                  "03_tree_of_thought.py:demo:qwen3_5:tiny", "README"])
def test_docs_run_unchanged_on_a_remote_backend(case, backends, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    if case == "README":  # the example names its model: give the Session a remote one instead
        local = forkv.Session
        monkeypatch.setattr(forkv, "Session", lambda model, *a, **kw: local(backends(model),
                                                                            *a, **kw))
        exec(compile(README_FIRST, "docs/sdk.md", "exec"), {"__name__": "__readme__"})  # noqa: S102
        out = capsys.readouterr().out
        reused = int(re.search(r"follow-up: tokens_reused=(\d+)", out).group(1))
        assert reused >= 512, out
        branches = re.search(r"branches reused: \[(.*)\] distinct texts: (\d)", out)
        assert all(int(x) >= 512 for x in branches.group(1).split(",")), out
        assert branches.group(2) == "4", out
        return
    script, model = case.split(":", 1)
    runpy.run_path(str(ROOT / "tutorials" / script), run_name="tutorial")["main"](
        backends(model))
    out = capsys.readouterr().out
    if script.startswith("01"):
        assert "turn 1 -> f3: reused 0" in out and "flowchart TD" in out
    elif script.startswith("02"):  # its own asserts check reuse after every prune and rewind
        assert "system:s1 -> user:u2 -> final:f5 -> user:u6 -> final:f7" in out
    else:
        assert "kept r" in out and "removed the other 3" in out
    stats = backends(model).stats()
    assert stats["cached_tokens"] > 0 and stats["failovers"] == 0
