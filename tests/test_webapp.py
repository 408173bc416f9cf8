"""The web app's server side, without a browser: its files (size, nothing inline, nothing that
could run model text as HTML, no browser storage) and the conversation listing it browses,
against a real `forkv serve` on the tiny demo model. The page itself is tested in Chromium
(test_webapp_browser.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from server_proc import TINY, http, shared_server

MODEL = "demo:qwen3:tiny"
STATIC = Path(__file__).resolve().parents[1] / "sdk" / "server" / "static"


@pytest.fixture(scope="module")
def url():
    return shared_server(*TINY)


def test_the_whole_app_is_small_and_ships_as_package_data():
    files = sorted(p.name for p in STATIC.iterdir())
    assert "index.html" in files and "main.js" in files and "app.css" in files
    assert sum(p.stat().st_size for p in STATIC.iterdir()) <= 150_000
    pyproject = (STATIC.parents[2] / "pyproject.toml").read_text()
    shipped = re.search(r'"forkv.server" = \[(.*)\]', pyproject).group(1)
    for name in files:  # every file matches a package-data pattern, so a wheel has it
        assert any(Path(name).match(pat.strip(' "').removeprefix("static/"))
                   for pat in shipped.split(",")), name


def test_no_inline_script_or_style_and_nothing_fetched_from_elsewhere():
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script type="module" src="/app/main.js">']
    assert "<style" not in html and " style=" not in html and not re.search(r" on\w+=", html)
    for path in STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"\b(src|href)=\"(https?:)?//", text), path.name
        assert "@import" not in text and "url(http" not in text, path.name


def test_scripts_never_parse_html_nor_touch_browser_storage():
    for path in STATIC.glob("*.js"):
        text = re.sub(r"^\s*//.*$", "", path.read_text(), flags=re.MULTILINE)  # code, not comments
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                       "eval(", "new Function", "localStorage", "sessionStorage", "indexedDB",
                       "document.cookie", "DOMParser", "createContextualFragment"):
            assert banned not in text, f"{path.name} uses {banned}"


def test_page_and_assets_are_served_with_their_types(url):
    status, body = http("GET", f"{url}/")
    assert status == 200 and '<script type="module" src="/app/main.js">' in body
    for name, kind in (("main.js", "text/javascript"), ("app.css", "text/css"),
                       ("icon.svg", "image/svg+xml")):
        import urllib.request

        with urllib.request.urlopen(f"{url}/app/{name}") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith(kind)
    for bad in ("nope.js", "..%2Fwebapp.py", "index.html", "Main.js", "app.py"):
        assert http("GET", f"{url}/app/{bad}")[0] == 404, bad


def _respond(url, text, previous=None, conversation=None, instructions=None):
    body = {"model": MODEL, "input": text, "max_output_tokens": 4, "temperature": 0}
    if previous:
        body["previous_response_id"] = previous
    if conversation:
        body["metadata"] = {"conversation": conversation}
    if instructions:
        body["instructions"] = instructions
    status, out = http("POST", f"{url}/v1/responses", body)
    assert status == 200, out
    return out


def test_a_response_chain_is_one_conversation_of_turns_with_engine_stats(url):
    root = _respond(url, "first question", instructions="Be brief.")
    child = _respond(url, "second question", previous=root["id"])
    fork = _respond(url, "another second question", previous=root["id"])
    status, listing = http("GET", f"{url}/v1/forkv/conversations")
    assert status == 200
    mine = [c for c in listing["data"] if c["id"] == root["id"]]
    assert mine and mine[0]["turns"] == 3 and mine[0]["title"] == "first question"
    status, conv = http("GET", f"{url}/v1/forkv/conversations/{root['id']}")
    assert status == 200 and conv["model"] == MODEL
    turns = {t["id"]: t for t in conv["turns"]}
    assert set(turns) == {root["id"], child["id"], fork["id"]}
    assert turns[root["id"]]["instructions"] == "Be brief."
    assert turns[child["id"]]["previous"] == turns[fork["id"]]["previous"] == root["id"]
    assert turns[fork["id"]]["input"] == "another second question"
    for made in (root, child, fork):
        turn = turns[made["id"]]
        assert turn["output"] == made["output"][0]["content"][0]["text"]
        [node] = turn["nodes"]  # the final node (--reasoning off): the engine's own stats
        usage = made["usage"]
        assert node["tokens_restored"] == usage["input_tokens_details"]["cached_tokens"]
        assert node["tokens_restored"] + node["tokens_computed"] == usage["input_tokens"]
        assert node["tokens_generated"] == usage["output_tokens"]
        assert node["ttft_s"] > 0
    assert turns[child["id"]]["nodes"][0]["tokens_restored"] > 0  # the root's path came back


def test_metadata_groups_roots_into_one_conversation_and_delete_prunes(url):
    a = _respond(url, "draft one", conversation="conv_test_group")
    b = _respond(url, "draft two", conversation="conv_test_group")
    c = _respond(url, "reply", previous=b["id"], conversation="conv_test_group")
    status, conv = http("GET", f"{url}/v1/forkv/conversations/conv_test_group")
    assert status == 200 and [t["id"] for t in conv["turns"]] == [a["id"], b["id"], c["id"]]
    assert http("DELETE", f"{url}/v1/responses/{b['id']}")[1]["deleted_responses"] == [
        b["id"], c["id"]]
    status, conv = http("GET", f"{url}/v1/forkv/conversations/conv_test_group")
    assert [t["id"] for t in conv["turns"]] == [a["id"]]
    http("DELETE", f"{url}/v1/responses/{a['id']}")
    status, body = http("GET", f"{url}/v1/forkv/conversations/conv_test_group")
    assert status == 404 and body["error"]["code"] == "conversation_not_found"
