"""The web app in a real browser: headless Chromium (Playwright for Python, driving the system
Chromium) against a real `forkv serve` on the tiny demo model, and (slow) on smollm2-135m.

Chat and stream, stop with Esc, edit and regenerate make siblings (‹ 2/2 ›), branch from any
turn, delete prunes and releases checkpoints, the tree panel's counts equal the API's usage,
hostile message text and hostile model output render inert, keyboard use, a 2,000-turn tree
lays out within a second, and nothing of a conversation is left in browser storage. Skipped,
with the reason, where Chromium or Playwright is missing (.ci/run installs both)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from server_proc import TINY, http, no_eos, running_server

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                "(apt-get install -y chromium); the browser tests need it")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -e '.[test]'); the browser tests need it")

MODEL = "demo:qwen3:tiny"
HOSTILE = ('<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
           '<svg onload="window.pwned = 3"></svg> [click](javascript:window.pwned=4) '
           '[data](data:text/html,<script>window.pwned=5</script>) '
           '<a href="javascript:window.pwned=6">a</a> <iframe src="javascript:1"></iframe>')


@pytest.fixture(scope="module")
def url():
    # a server of its own: the page lists every conversation of its tenant, and the shared
    # server's other tests create and delete responses under it (a listed one then 404s)
    with running_server(*TINY) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def open_page(browser, url, max_tokens=8):
    """A fresh browser context on the app, ready; console errors collect in `page.errors`."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    page = ctx.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.goto(f"{url}/")
    page.wait_for_selector("body[data-ready='1']")
    page.click("#settings summary")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", "0")
    return page


@pytest.fixture
def page(browser, url):
    page = open_page(browser, url)
    yield page
    assert page.errors == []  # a CSP violation or a script error shows here
    page.context.close()


def send(page, text, count=None):
    """Type `text`, press Enter, wait for the reply to finish (`count` replies with stats)."""
    count = count or page.locator(".msg.model .mstats").count() + 1
    page.fill("#input", text)
    page.press("#input", "Enter")
    wait_replies(page, count)


def wait_replies(page, count):
    page.wait_for_function(
        "n => !document.querySelector('.msg.model.streaming') && !document.body.classList"
        ".contains('busy') && document.querySelectorAll('.msg.model .mstats').length === n",
        arg=count, timeout=60_000)


def conversation(url, page):
    """The server's view of the conversation on screen."""
    cid = page.get_attribute("body", "data-conversation")
    status, conv = http("GET", f"{url}/v1/forkv/conversations/{cid}")
    assert status == 200, conv
    return conv


def counts(page, i):
    return [c.text_content() for c in page.locator(f".msg.model >> nth={i}")
            .locator(".count").all()]


def test_chat_regenerate_edit_branch_delete_and_the_tree_counts_equal_usage(page, url):
    send(page, "Hello **there**, first question")
    user = page.locator(".msg.user .text").first
    assert user.text_content() == "Hello **there**, first question"  # plain, not markdown
    conv = conversation(url, page)
    [turn] = conv["turns"]
    response = http("GET", f"{url}/v1/responses/{turn['id']}")[1]
    usage = response["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    row = page.locator(f".trow[data-id='{turn['id']}'] .stats").text_content()
    assert row.startswith(f"↺{cached} +{usage['input_tokens'] - cached} · "
                          f"→{usage['output_tokens']} · ")
    assert page.locator(".msg.model .mstats").text_content() == row

    page.click(".msg.model .act[title^='regenerate']")
    page.wait_for_function("() => document.querySelector('.msg.model .count')"
                           "?.textContent === '2/2'")
    wait_replies(page, 1)
    page.click(".msg.model .nav[title='previous version']")
    assert page.locator(".msg.model .count").text_content() == "1/2"
    assert page.locator(".msg.user .count").text_content() == "1/2"

    page.click(".msg.user .act[title^='edit']")
    page.fill(".msg.user textarea.edit", "An edited first question")
    page.press(".msg.user textarea.edit", "Enter")
    page.wait_for_function("() => document.querySelector('.msg.user .count')"
                           "?.textContent === '3/3'")
    wait_replies(page, 1)
    assert page.locator(".msg.user .text").first.text_content() == "An edited first question"

    send(page, "A follow-up")
    first_reply = page.locator(".msg.model").first
    first_reply.locator(".act[title^='branch']").click()
    assert page.locator("#branching").is_visible()
    assert page.locator(".msg.model").count() == 1  # the path ends where the branch starts
    send(page, "Another follow-up", count=2)
    page.wait_for_function("() => document.querySelectorAll('.msg.user')[1]"
                           "?.querySelector('.count')?.textContent === '2/2'")
    conv = conversation(url, page)
    assert len(conv["turns"]) == 5
    assert page.locator(".trow").count() == 5 and page.locator(".trow.on").count() == 2

    # Two branches side by side: the tree row's "beside" button on the other follow-up.
    other = next(t for t in conv["turns"] if t["input"] == "A follow-up")
    page.locator(f".trow[data-id='{other['id']}'] .beside").click()
    columns = page.locator("#messages.split > .column")
    assert columns.count() == 2
    assert [c.locator(".msg.user .text").last.text_content() for c in columns.all()] == [
        "Another follow-up", "A follow-up"]
    page.click(".close-beside")
    assert page.locator("#messages .column").count() == 0

    alt = page.locator(".msg.model >> nth=1").get_attribute("data-turn")
    page.locator(".msg.model >> nth=1").locator(".act[title^='delete']").click()
    page.wait_for_function("() => document.querySelector('#notice').textContent"
                           ".startsWith('Deleted 1 turn')")
    assert alt not in {t["id"] for t in conversation(url, page)["turns"]}
    assert page.locator(".msg.user >> nth=1").locator(".text").text_content() == "A follow-up"
    assert page.locator(".msg.user >> nth=1").locator(".count").count() == 0  # no sibling left

    # Nothing of the conversation in the browser: no storage, no cookies, no databases.
    stored = page.evaluate("""async () => ({local: localStorage.length,
        session: sessionStorage.length, cookie: document.cookie,
        dbs: (await indexedDB.databases()).length})""")
    assert stored == {"local": 0, "session": 0, "cookie": "", "dbs": 0}
    state = page.context.storage_state()
    assert state["cookies"] == [] and all(not o.get("localStorage") for o in state["origins"])


def test_delete_prunes_the_subtree_and_releases_its_checkpoints(page, url):
    send(page, "Short start")
    long_text = "Section 2. Foxes are quick and dogs are lazy. " * 30  # > two 256-token blocks
    send(page, long_text)
    page.locator(".msg.model >> nth=1").locator(".act[title^='delete']").click()
    page.wait_for_function("() => /released [1-9]/.test("
                           "document.querySelector('#notice').textContent)")
    assert page.locator(".msg.model").count() == 1
    assert len(conversation(url, page)["turns"]) == 1


def test_esc_stops_a_streaming_reply_and_keyboard_use(page, url):
    ban = no_eos(MODEL)

    def endless(route):  # the page's own request, with the model's end tokens banned
        body = json.loads(route.request.post_data)
        route.continue_(post_data=json.dumps({**body, "logit_bias": ban}))

    page.route("**/v1/responses", endless)
    page.fill("#max-tokens", "20000")
    page.fill("#input", "first line")
    page.press("#input", "Shift+Enter")  # a newline, nothing sent
    page.keyboard.type("second line")
    assert page.input_value("#input") == "first line\nsecond line"
    assert page.locator(".msg.user").count() == 0
    page.press("#input", "Enter")
    page.wait_for_function("() => document.querySelector('.msg.model.streaming .text')"
                           "?.textContent.length > 0")
    assert page.locator("#stop").is_visible() and not page.locator("#send").is_visible()
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.body.classList.contains('busy')", timeout=10_000)
    assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()
    assert page.locator("#notice").text_content().startswith("Stopped")
    assert page.input_value("#input") == "first line\nsecond line"  # back, to send again
    # The server cancelled it: nothing of it is left generating.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listing = http("GET", f"{url}/v1/forkv/conversations")[1]["data"]
        if not any(c["title"] == "first line" for c in listing):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the stopped reply is still on the server")


def test_an_image_for_a_text_only_model_is_refused_and_kept_to_send_again(page, tmp_path):
    from PIL import Image

    picture = tmp_path / "dot.png"
    Image.new("RGB", (8, 8), (0, 0, 0)).save(picture)
    page.set_input_files("#attach", str(picture))
    page.fill("#input", "look")
    page.press("#input", "Enter")
    page.wait_for_function("() => /text-only/.test(document.querySelector('#notice')"
                           ".textContent)")
    assert page.input_value("#input") == "look"
    assert page.locator("#attachments img").count() == 1
    page.click("#attachments button")  # removed again
    assert page.locator("#attachments img").count() == 0
    page.errors.clear()  # (the browser logs the 400 itself)


def test_hostile_message_text_renders_inert(page):
    send(page, HOSTILE + "\n```\n</code></pre><script>window.pwned = 7</script>\n```")
    assert page.locator(".msg.user .text").first.text_content().startswith(HOSTILE)
    inert(page)


def inert(page):
    assert page.evaluate("() => window.pwned") is None
    assert page.locator("#messages :is(script, img, svg, iframe, object, embed, style)"
                        ).count() == 0
    attrs = page.evaluate("""() => [...document.querySelectorAll('#messages *')]
        .flatMap(e => [...e.attributes].map(a => a.name)).filter(n => n.startsWith('on'))""")
    assert attrs == []
    hrefs = page.evaluate("() => [...document.querySelectorAll('#messages a')]"
                          ".map(a => a.getAttribute('href'))")
    assert all(re.match(r"https?://", h) for h in hrefs), hrefs


def test_hostile_model_output_renders_inert(page):
    """The model's text as a stream and as stored (mocked: a random model cannot be steered
    into writing markup, so the server's answers are replaced, as llama.cpp's tests do)."""
    huge = "x = 1  # <b>not bold</b>\n" * 12_000  # a ~290 KB code block
    output = (HOSTILE + "\n\n**bold** [ok](https://example.org/a?b=<c>) "
              "https://example.org/x\n\n```python\n" + huge + "```\n")
    events = [{"type": "response.created", "response": {"id": "resp_hostile"}},
              {"type": "response.output_text.delta", "delta": output},
              {"type": "response.completed", "response": {"id": "resp_hostile"}}]
    sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    turn = {"id": "resp_hostile", "previous": None, "created_at": 1, "model": MODEL,
            "status": "completed", "instructions": HOSTILE, "input": HOSTILE,
            "reasoning": HOSTILE, "output": output, "usage": None,
            "nodes": [{"id": "n1", "kind": "final", "status": "done", "tokens_restored": 0,
                       "tokens_computed": 5, "tokens_generated": 9, "ttft_s": 0.01,
                       "decode_tps": 50.0}]}
    page.route("**/v1/responses", lambda r: r.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=sse))
    page.route("**/v1/forkv/conversations/*", lambda r: r.fulfill(
        status=200, content_type="application/json",
        body=json.dumps({"id": "c", "model": MODEL, "turns": [turn]})))
    send(page, "please misbehave")
    inert(page)
    assert page.locator("#messages strong").first.text_content() == "bold"
    links = page.locator(".msg.model .text a")
    assert links.count() == 2 and links.first.get_attribute("rel") == "noopener noreferrer nofollow"
    [code] = page.locator(".msg.model pre code").all()
    assert code.text_content() == huge.rstrip("\n")
    assert page.locator(".msg.model .code .copy").count() == 1
    page.click(".msg.model .reasoning summary")  # folded until opened
    assert page.locator(".msg.model .reasoning .text").text_content() == HOSTILE
    inert(page)


def test_a_2000_turn_tree_lays_out_within_a_second(page):
    rows, ms, folded = page.evaluate("""async () => {
        const {renderTree} = await import('/app/tree.js');
        const items = [];
        for (let i = 0; i < 2000; i++) {  // a long chain with a fork every 7th turn
            const parent = i === 0 ? null : 'n' + (i % 7 === 0 ? Math.floor(i / 2) : i - 1);
            items.push({id: 'n' + i, parent, label: 'turn ' + i + ' ' + 'word '.repeat(9),
                        stats: '↺512 +40 · →32 · 12 ms · 40 tok/s'});
        }
        const box = document.getElementById('tree');
        const t0 = performance.now();
        const rows = renderTree(box, items, {active: new Set(['n0', 'n1']), folded: new Set()});
        box.lastElementChild.getBoundingClientRect();  // force the layout
        const ms = performance.now() - t0;
        const folded = renderTree(box, items, {folded: new Set(['n0'])});
        return [rows, ms, folded];
    }""")
    print(f"2,000-turn tree laid out in {ms:.0f} ms")
    assert rows == 2000 and folded == 1
    assert ms <= 1000
    # The whole app on a 2,000-turn conversation (served mocked: making it would take minutes).
    turns = [{"id": f"r{i}", "previous": None if i == 0 else f"r{i - 1 if i % 7 else i // 2}",
              "created_at": i, "model": MODEL, "status": "completed", "instructions": None,
              "input": f"question {i} " + "word " * 20, "reasoning": None,
              "output": f"answer {i} **bold** `code` " + "text " * 60, "usage": None,
              "nodes": [{"kind": "final", "tokens_restored": 500, "tokens_computed": 30,
                         "tokens_generated": 40, "ttft_s": 0.02, "decode_tps": 40.0}]}
             for i in range(2000)]
    listing = {"data": [{"id": "big", "model": MODEL, "title": "big", "turns": 2000}]}
    page.route("**/v1/forkv/conversations", lambda r: r.fulfill(json=listing))
    page.route("**/v1/forkv/conversations/big", lambda r: r.fulfill(
        json={"id": "big", "model": MODEL, "turns": turns}))
    page.click("#new")  # lists the conversations again
    page.click("#conv-list button:text('big')")
    page.wait_for_function("() => document.querySelectorAll('.trow').length === 2000")
    ms = page.evaluate("""() => {
        const t0 = performance.now();
        document.querySelector('.trow:last-child .pick').click();  // a whole render
        document.body.getBoundingClientRect();
        return performance.now() - t0;
    }""")
    print(f"the app on a 2,000-turn conversation: {ms:.0f} ms a render")
    assert ms <= 1000 and page.locator(".trow.on").count() > 1


def test_first_paint(browser, url):
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(f"{url}/")
    page.wait_for_selector("body[data-ready='1']")
    fcp = page.evaluate("() => performance.getEntriesByName('first-contentful-paint')[0]"
                        ".startTime")
    print(f"first contentful paint {fcp:.0f} ms")
    assert fcp <= 1000  # the target is 300 ms on a quiet machine; this one is shared
    ctx.close()


@pytest.mark.slow  # a second server (a thinking model) and a few turns: ~15 s on 2 cores
def test_reasoning_is_folded_and_streams_on_a_thinking_model(browser):
    with running_server("--model", MODEL) as url:
        page = open_page(browser, url, max_tokens=12)
        send(page, "Think first")
        fold = page.locator(".msg.model details.reasoning")
        assert fold.count() == 1 and fold.get_attribute("open") is None
        conv = conversation(url, page)
        [turn] = conv["turns"]
        assert [n["kind"] for n in turn["nodes"]] == ["reasoning", "final"]
        assert fold.locator(".text").text_content() == turn["reasoning"]
        assert page.errors == []


@pytest.mark.slow  # loads smollm2-135m (installed by `forkv pull smollm2-135m`)
def test_chat_on_smollm2(browser, tmp_path):
    from forkv.engine.models.sources import local_models

    if "smollm2-135m" not in {name for name, _ in local_models()}:
        pytest.skip("smollm2-135m is not installed (forkv pull smollm2-135m)")
    with running_server("--model", "smollm2-135m") as url:
        page = open_page(browser, url, max_tokens=24)
        page.fill("#system", "You are a helpful assistant. Answer in one sentence.")
        send(page, "What is the capital of France?")
        reply = page.locator(".msg.model .text").first.text_content()
        assert reply.strip()
        page.click(".msg.model .act[title^='regenerate']")
        page.wait_for_function("() => document.querySelector('.msg.model .count')"
                               "?.textContent === '2/2'")
        wait_replies(page, 1)
        send(page, "And of Italy?")
        turns = conversation(url, page)["turns"]
        last = turns[-1]
        usage = http("GET", f"{url}/v1/responses/{last['id']}")[1]["usage"]
        cached = usage["input_tokens_details"]["cached_tokens"]
        assert page.locator(f".trow[data-id='{last['id']}'] .stats").text_content().startswith(
            f"↺{cached} +{usage['input_tokens'] - cached} · →{usage['output_tokens']} · ")
        assert cached > 0  # the first turn's prompt came back from the engine's checkpoints
        assert page.locator(".msg.system").text_content().endswith("one sentence.")
        page.locator(".msg.model").first.locator(".act[title^='branch']").click()
        send(page, "Name a famous French painter.", count=2)
        page.set_viewport_size({"width": 1400, "height": 820})
        page.click("#settings summary")  # folded again, for the picture
        shot = tmp_path / "webapp.png"
        page.screenshot(path=shot)
        assert shot.stat().st_size > 20_000
        keep = os.environ.get("FORKV_APP_PNG")  # FORKV_APP_PNG=docs/webapp.png refreshes docs
        if keep:
            shutil.copyfile(shot, Path(keep))
        assert page.errors == []


@pytest.mark.slow  # a server of its own, with two API keys
def test_with_api_keys_the_page_asks_for_one_and_keeps_it_in_memory(browser):
    with running_server(*TINY, "--api-key", "key-one", "--api-key", "key-two") as url:
        ctx = browser.new_context()
        page = ctx.new_page()
        page.goto(f"{url}/")
        page.wait_for_selector("#key-box:not([hidden])")
        page.fill("#key", "wrong")
        page.press("#key", "Enter")
        page.wait_for_function("() => document.querySelector('#key-error').textContent")
        assert page.locator("#key-box").is_visible()
        page.fill("#key", "key-one")
        page.press("#key", "Enter")
        page.wait_for_selector("body[data-ready='1']")
        page.click("#settings summary")
        page.fill("#max-tokens", "4")
        send(page, "a private question")
        cid = page.get_attribute("body", "data-conversation")
        auth = {"Authorization": "Bearer key-one"}
        assert http("GET", f"{url}/v1/forkv/conversations/{cid}", headers=auth)[0] == 200
        assert http("GET", f"{url}/v1/forkv/conversations/{cid}")[0] == 401
        other = {"Authorization": "Bearer key-two"}  # another tenant sees nothing of it
        assert http("GET", f"{url}/v1/forkv/conversations", headers=other)[1]["data"] == []
        assert http("GET", f"{url}/v1/forkv/conversations/{cid}", headers=other)[0] == 404
        stored = page.evaluate("""async () => localStorage.length + sessionStorage.length
            + document.cookie.length + (await indexedDB.databases()).length""")
        assert stored == 0
        page.reload()  # the key was in the page's memory only: asked again
        page.wait_for_selector("#key-box:not([hidden])")
        ctx.close()


@pytest.mark.slow  # a vision model's server of its own
def test_images_are_sent_shown_and_sent_again_on_regenerate(browser, tmp_path):
    from PIL import Image

    picture = tmp_path / "red.png"
    Image.new("RGB", (32, 24), (200, 30, 30)).save(picture)
    with running_server("--model", "demo:qwen2_vl:tiny") as url:
        page = open_page(browser, url, max_tokens=4)
        page.set_input_files("#attach", str(picture))
        # the page reads the file before it shows it: wait for the picture, do not count at once
        page.wait_for_selector("#attachments img")
        assert page.locator("#attachments img").count() == 1
        send(page, "What colour is this?")
        assert page.locator("#attachments img").count() == 0  # sent with the message
        assert page.locator(".msg.user .images img").count() == 1
        page.click(".msg.model .act[title^='regenerate']")
        page.wait_for_function("() => document.querySelector('.msg.model .count')"
                               "?.textContent === '2/2'")
        wait_replies(page, 1)
        turns = conversation(url, page)["turns"]
        assert [len(t["images"]) for t in turns] == [1, 1]
        assert turns[0]["images"] == turns[1]["images"]
        assert turns[0]["images"][0] == "data:image/png;base64," + base64.b64encode(
            picture.read_bytes()).decode()
        assert page.errors == []
