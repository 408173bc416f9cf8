"""`forkv run SPEC --ui`: the run's tree grows live on a loopback page (server-sent events),
refused to foreign Host names and to URLs without the run's token; and the same viewer as one
file with the tree inlined (`viewer_html`), whose node text stays text. The live test reads
the events itself and then looks at the page in headless Chromium (skipped where missing)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from server_proc import default_sigint

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(b)), None)
HOSTILE = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
SPEC = """\
model_id: demo:qwen3:tiny
nodes:
  - {id: sys, kind: system, text: "You review code."}
  - {id: ask, parent: sys, kind: user, text: "Review: def add(a, b): return a - b"}
  - id: think
    parent: ask
    kind: reasoning
    gen: {max_tokens: 24}
    fork: {k: 3, keep: {scorer: mean_logprob}}
  - {id: answer, parent: think, kind: final, gen: {max_tokens: 12}}
"""


def browser_page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium)")
    return sync_api.sync_playwright()


def events(url: str, timeout: float = 120.0) -> list[dict]:
    """Every snapshot the page's event stream sends, until its `done` event."""
    out, kind = [], None
    with urllib.request.urlopen(url + "events", timeout=timeout) as r:
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
                if kind == "done":
                    return out
            elif line.startswith("data: ") and kind == "tree":
                out.append(json.loads(line[6:]))
    raise AssertionError("the event stream ended without a done event")


@pytest.mark.slow  # a forkv run process and a browser: ~6 s on 2 cores
def test_run_ui_streams_the_growing_tree_and_refuses_strangers(tmp_path):
    (tmp_path / "review.yaml").write_text(SPEC)
    proc = subprocess.Popen([sys.executable, "-m", "forkv.cli", "run", "review.yaml", "--ui",
                             "--no-progress", "--save", "tree.json"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)
    try:
        line = proc.stdout.readline()
        assert line.startswith("viewer: http://127.0.0.1:"), line
        url = line.split()[-1]
        snapshots = events(url)
        done = [sum(n["status"] == "done" for n in s["nodes"]) for s in snapshots]
        assert done[0] < done[-1] and len(set(done)) >= 3, done  # it grew as nodes ran
        final = snapshots[-1]
        assert final["done"] is True and final["title"] == "review.yaml"
        saved = json.loads((tmp_path / "tree.json").read_text())
        assert {n["id"] for n in final["nodes"]} == {n["id"] for n in saved["nodes"]}
        answer = next(n for n in final["nodes"] if n["kind"] == "final")
        assert answer["stats"]["restored"] > 0 and answer["stats"]["generated"] >= 1
        # Strangers: no token, a wrong token, a rebinding page's Host name.
        base = url.split("/run/")[0]
        for bad, host in ((base + "/run/nope/", None), (base + "/", None), (url, "evil.example")):
            req = urllib.request.Request(bad, headers={"Host": host} if host else {})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code in (403, 404)
        if CHROMIUM is not None and _has_playwright():
            with browser_page() as p:
                b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = b.new_page()
                errors = []
                page.on("console", lambda m: m.type == "error" and errors.append(m.text))
                page.goto(url)
                page.wait_for_selector("body[data-done='1']")
                assert page.locator(".trow").count() == len(final["nodes"])
                assert errors == []
                row = page.locator(f".trow[data-id='{answer['id']}'] .stats").text_content()
                assert row.startswith(f"↺{answer['stats']['restored']} +")
                b.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, out
    assert "until Ctrl-C" in out


def _has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_inlined_viewer_keeps_node_text_as_text(tmp_path):
    from forkv.graph import Tree
    from forkv.server.run_viewer import tree_items, viewer_html

    tree = Tree(model_id="demo")
    root = tree.add(None, "system", "Be careful.")
    user = tree.add(root.id, "user", HOSTILE)
    tree.add(user.id, "final", "<b>fine</b> " + HOSTILE)
    items = tree_items(tree)
    assert [i["kind"] for i in items] == ["system", "user", "final"]
    page = viewer_html(tree, title="hostile")
    # One script element of code plus the data island; the text never closes either.
    assert len(re.findall(r"<script\b", page)) == 2 and "window.pwned" in page
    assert page.count("</script>") == 2 and 'src="/app/' not in page
    html = tmp_path / "tree.html"
    html.write_text(page)
    with browser_page() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        view = b.new_page()
        view.goto(html.as_uri())
        view.wait_for_selector(".trow")
        assert view.locator(".trow").count() == 3
        assert view.evaluate("() => window.pwned") is None
        assert view.locator("#detail img, #tree img, #detail b").count() == 0
        view.click(f".trow[data-id='{user.id}'] .pick")
        assert view.locator("#detail .node-text").text_content() == HOSTILE
        b.close()


def test_session_ui_publishes_each_node_as_it_finishes(capsys):
    import forkv
    from conftest import load_tiny

    with forkv.Session(load_tiny("qwen3"), ui=True) as s:
        url = capsys.readouterr().err.split("grows at ")[1].split()[0]
        assert url == s.viewer.url and url.startswith("http://127.0.0.1:")

        def snapshot():
            with urllib.request.urlopen(url + "tree", timeout=10) as r:
                return {n["id"]: n for n in json.loads(r.read())["nodes"]}

        user = s.system("Be brief.").user("Hi")
        first = user.final({"max_tokens": 4})
        s.run(first)
        seen = snapshot()
        assert seen[first.id]["status"] == "done" and seen[first.id]["stats"]["generated"] >= 1
        second = first.user("Again?").final({"max_tokens": 4})
        s.run(second)
        seen = snapshot()
        assert len(seen) == 5 and seen[second.id]["stats"]["restored"] > 0
    with pytest.raises(OSError):  # closed with the session
        urllib.request.urlopen(url + "tree", timeout=5)
