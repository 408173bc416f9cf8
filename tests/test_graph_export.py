"""Mermaid and HTML output sanity."""

import re

from forkv.graph import Tree, render, to_html, to_mermaid, write_html
from forkv.graph.testing import ToyTokenizer


def sample():
    t = Tree(model_id="demo")
    u = t.system('Say "hi" & <b>').user("Q:1", images=[b"\x89PNG\r\n\x1a\n"])
    r = u.reasoning()
    f = r.final()
    t.attach(
        r, "x" * 700, stats={"tokens_reused": 30, "tokens_computed": 10, "tokens_generated": 60}
    )
    t.attach(f, "answer")
    t.record_render(render(t, f, ToyTokenizer()), ["aa" * 16] * 20, block_size=16)
    t.prune(f).user("next").final()
    u.fork(2, kind="final")
    return t


def test_mermaid():
    m = to_mermaid(sample())
    assert m.startswith("flowchart TD\n")
    assert 'N0["system s1: Say #quot;hi#quot; #amp; #lt;b#gt;"]:::system' in m
    assert "N0 --> N1" in m and "-.->|copy|" in m and "stroke-dasharray" in m
    assert "(pending)" in m and '"' not in m.split('"')[1]


def test_html_is_self_contained(tmp_path):
    t = sample()
    page = to_html(t)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"(src|href)=\"(https?:)?//", page) and "<script" not in page
    assert "Say &quot;hi&quot; &amp; &lt;b&gt;" in page
    assert "reused 30 · computed 10 · generated 60" in page
    assert "full text (700 chars)" in page and "<svg" in page and "<line" in page
    assert 'copy of <a href="#node-f4">' in page and "image image/png" in page
    for n in t:
        assert f'id="node-{n.id}"' in page
    p = write_html(t, tmp_path / "tree.html")
    assert p.read_text(encoding="utf-8") == page


def test_html_deep_chain_and_forest():
    t = Tree()
    n = t.user("0")
    for i in range(400):  # long chains do not nest (or recurse) per node
        n = n.final(text=str(i)).user(str(i))
    t.user("second root")
    page = to_html(t)
    assert page.count('<ul class="chain">') == 2
