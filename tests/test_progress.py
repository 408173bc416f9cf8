"""The CLI's prefill progress bar, driven by fake engine callbacks and by a real prefill."""

import io

from conftest import load_tiny
from forkv.progress import PrefillBar


def _drive(bar, total, restored=0, chunk=256):
    """Call `bar` as the engine does: tokens computed so far (restored ones not counted)."""
    done = restored
    while done < total:
        done = min(total, done + chunk)
        bar(done - restored, total, restored)


def test_bar_shows_tokens_computed_of_total_and_restored():
    out = io.StringIO()
    with PrefillBar(force=True, min_tokens=1000, file=out) as bar:
        _drive(bar, 20_000, restored=4096)
    text = out.getvalue()
    assert "prefill" in text and "20.0k" in text and "restored 4,096" in text
    assert "tok" in text


def test_short_prompts_pipes_and_no_progress_stay_quiet():
    out = io.StringIO()
    bar = PrefillBar(force=True, min_tokens=2048, file=out)
    _drive(bar, 3000, restored=2048)  # only 952 tokens left to compute
    assert out.getvalue() == ""
    out = io.StringIO()  # not a terminal and not forced: nothing
    _drive(PrefillBar(file=out, min_tokens=1), 5000)
    assert out.getvalue() == ""
    out = io.StringIO()
    _drive(PrefillBar(force=False, min_tokens=1, file=out), 5000)
    assert out.getvalue() == ""


def test_node_form_labels_one_node_at_a_time():
    out = io.StringIO()
    bar = PrefillBar(force=True, min_tokens=100, file=out)
    bar.node("r.0", 256, 1024, 0)
    bar.node("r.1", 256, 1024, 0)  # a batched sibling: waits for r.0's bar to finish
    assert "prefill r.0" in out.getvalue() and "r.1" not in out.getvalue()
    bar.node("r.0", 768, 1024, 256)  # computed + restored = total: r.0 is done
    bar.node("r.1", 512, 1024, 0)
    assert "prefill r.1" in out.getvalue()
    bar.close()


def test_engine_prefill_drives_the_callback():
    import forkv

    calls = []
    engine = forkv.Engine(load_tiny("qwen3"))
    try:
        prompt = list(range(3, 700))
        engine.generate(prompt, max_tokens=1, progress=lambda *a: calls.append(a))
        engine.generate(prompt, max_tokens=1, progress=lambda *a: calls.append(("again", *a)))
    finally:
        engine.close()
    first = [c for c in calls if c[0] != "again"]
    assert first[-1] == (697, 697, 0) and [c[0] for c in first] == sorted(c[0] for c in first)
    again = [c[1:] for c in calls if c[0] == "again"]
    assert again[-1][1:] == (697, 512)  # the second run restores two blocks


def test_session_run_reports_progress_per_node():
    import forkv

    calls = []
    with forkv.Session(load_tiny("qwen3")) as s:
        u = s.user("word " * 60)
        branches = u.fork(2, gen={"max_tokens": 2})
        s.run(branches, progress=lambda *a: calls.append(a))
    by_node = {}
    for node_id, computed, total, restored in calls:
        by_node.setdefault(node_id, []).append((computed, total, restored))
    assert set(by_node) == {b.id for b in branches}
    first, second = (by_node[b.id] for b in branches)
    assert first[-1][0] == first[-1][1] and first[-1][2] == 0
    computed, total, restored = second[-1]  # the second branch restores the first's blocks
    assert restored >= 256 and computed + restored == total


def test_forkv_run_draws_a_bar_per_node(tmp_path, monkeypatch, capsys):
    import json

    from forkv import progress
    from forkv.cli import main

    real = progress.PrefillBar
    monkeypatch.setattr(progress, "PrefillBar", lambda **kw: real(
        min_tokens=100, force=True, file=__import__("sys").stderr))
    spec = {"model_id": "demo:qwen3", "nodes": [
        {"id": "u", "kind": "user", "text": "word " * 60},
        {"id": "a", "parent": "u", "kind": "final", "gen": {"max_tokens": 2}}]}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "s.json"), "--save", str(tmp_path / "t.json")]) == 0
    assert "prefill a" in capsys.readouterr().err
