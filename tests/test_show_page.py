"""`forkv show` pages (the run viewer, the tree inlined) stay readable: measured in headless
Chromium on a real demo tree with an 8-way fork, long lines and long unbroken words, every node
selected in turn (no sideways scroll, nothing sticks out of the detail pane). Skipped, with
the reason, where Chromium is not installed (.ci/run installs it)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import load_tiny

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(b)), None)
pytestmark = [
    pytest.mark.slow,  # a demo tree and three Chromium runs: ~15 s on 2 cores
    pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                       "(apt-get install -y chromium); the page layout check needs it"),
]

# Selects every node of the viewer in turn, measures the laid-out page and writes the result
# into the DOM for --dump-dom to print.
PROBE = """<script>
const out = {scroll: document.documentElement.scrollWidth, width: innerWidth, bad: [],
             rows: document.querySelectorAll('.trow').length, seen: 0};
const ids = [...document.querySelectorAll('.trow')].map((row) => row.dataset.id);
for (const id of ids) {
  const row = document.querySelector(`.trow[data-id="${id}"]`);
  if (row.getBoundingClientRect().right > innerWidth + 1) out.bad.push(id + ' row leaves');
  row.querySelector('.pick').click();  // (the tree is drawn again: look the row up each time)
  const detail = document.getElementById('detail');
  const box = detail.getBoundingClientRect();
  if (box.right > innerWidth + 1) out.bad.push(id + ' detail leaves the page');
  for (const el of detail.children) {
    if (el.getBoundingClientRect().right > box.right + 1) out.bad.push(id + ' ' + el.className);
  }
  if (detail.querySelector('.node-text').textContent.length) out.seen++;
  out.scroll = Math.max(out.scroll, document.documentElement.scrollWidth);
}
document.body.setAttribute('data-probe', JSON.stringify(out));
</script>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """`forkv show` of a real demo tree: an 8-way fork, long lines, long unbroken words."""
    from forkv.cli import main

    tmp = tmp_path_factory.mktemp("show")
    out = tmp / "tree.html"
    assert main(["show", str(demo_tree(tmp)), "-o", str(out)]) == 0
    return out


def demo_tree(tmp_path):
    import forkv

    word = "supercalifragilistic" * 12  # one 240-character word
    with forkv.Session(load_tiny("qwen3")) as s:
        u = s.system("You review code. " * 6).user("def f(x):  return x - 1  # " + word
                                                     + "\n" * 2 + "line\n" * 40)
        branches = u.fork(8, gen={"max_tokens": 6})
        s.run(branches)
        answer = branches[0].final({"max_tokens": 8})
        s.run(answer)
        follow = s.tree.prune(answer).user("And the test? " + word).final({"max_tokens": 6})
        s.run(follow)
        path = tmp_path / "tree.json"
        s.save(path)
    return path


def chromium(*args, timeout=120):
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.parametrize("width", [1200, 700])
def test_page_has_no_sideways_scroll_and_nothing_sticks_out(page, tmp_path, width):
    html = page.read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    r = chromium(f"--window-size={width},900", "--dump-dom", probe.as_uri())
    assert 'data-probe="' in r.stdout, r.stderr[-2000:]
    raw = r.stdout.split('data-probe="', 1)[1].split('"', 1)[0].replace("&quot;", '"')
    out = json.loads(raw)
    # system, user, 8 branches, answer, its copy, user, final: each row shows its text
    assert out["rows"] == out["seen"] == 14 and out["bad"] == [], out
    assert out["scroll"] <= out["width"], out  # long lines and words wrap instead of scrolling


def test_screenshot(page, tmp_path):
    shot = tmp_path / "tree.png"
    r = chromium("--window-size=1200,1400", f"--screenshot={shot}", page.as_uri())
    assert shot.is_file() and shot.stat().st_size > 10_000, r.stderr[-2000:]
    keep = os.environ.get("FORKV_SHOW_PNG")  # FORKV_SHOW_PNG=docs/show.png refreshes the docs
    if keep:
        shutil.copyfile(shot, Path(keep))
