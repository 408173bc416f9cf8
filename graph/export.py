"""Seeing a tree: Mermaid text and one self-contained HTML page.

Knows how to lay a tree out as text (chains stay flat, branches indent), show each node's kind,
text, status, reused / computed / generated tokens and block boundaries within its span. Does
not fetch anything: the page has inline CSS and SVG, no scripts, no external assets.
"""

from __future__ import annotations

import html
from pathlib import Path

from .nodes import Node
from .tree import Tree

__all__ = ["to_html", "to_mermaid", "write_html"]

_COLORS = {
    "system": "#e8e8f8",
    "user": "#e3f1ff",
    "reasoning": "#fff4d6",
    "final": "#e2f7e4",
    "tool": "#f3e6f7",
}


def _short(text: str | None, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def to_mermaid(tree: Tree, max_text: int = 40) -> str:
    """A Mermaid flowchart: one box per node, dashed for pending, dotted links for prune copies."""
    names = {n.id: f"N{i}" for i, n in enumerate(tree)}  # node ids may hold '.', ':' or '-'
    lines = ["flowchart TD"]
    for n in tree:
        label = f"{n.kind} {n.id}"
        if n.text:
            label += f": {_short(n.text, max_text)}"
        elif n.is_pending:
            label += f" ({n.status})"
        for a, b in (("&", "#amp;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;")):
            label = label.replace(a, b)
        lines.append(f'  {names[n.id]}["{label}"]:::{n.kind}')
    for n in tree:
        if n.parent_id is not None:
            lines.append(f"  {names[n.parent_id]} --> {names[n.id]}")
        if n.copied_from in names:
            lines.append(f"  {names[n.copied_from]} -.->|copy| {names[n.id]}")
    for kind, color in _COLORS.items():
        lines.append(f"  classDef {kind} fill:{color},stroke:#888")
    pending = [names[n.id] for n in tree if n.is_pending]
    if pending:
        lines.append(f"  style {','.join(pending)} stroke-dasharray: 4 3")
    return "\n".join(lines) + "\n"


# Layout: a chain of cards stays in one column; the branches of a fork sit in a grid that
# wraps onto new rows (never a sideways scroll), each at least 15em wide, so an 8-way fork and
# forks inside forks stay readable. Cards shrink with their column; long words break.
_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:100%}
ul.chain,ul.branches{list-style:none;margin:0;padding:0}
ul.branches{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(15em,100%),1fr));
 gap:.6em 1em;padding-left:.8em;border-left:2px solid #bbb;margin:.3em 0}
ul.branches>li,ul.chain>li{min-width:0}
.fork{font-size:11px;color:#666;margin:.4em 0 0 .2em}
.node{border:1px solid #aaa;border-radius:6px;padding:.4em .6em;margin:.3em 0;max-width:60em;
 min-width:0;box-sizing:border-box;overflow-wrap:anywhere}
.node.pending,.node.failed{border-style:dashed}
.node.failed{border-color:#c33}
.hdr{font-size:12px;color:#555}.kind{font-weight:600;color:#222}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:.3em 0;max-height:24em;overflow-y:auto;
 font:12px/1.35 ui-monospace,monospace}
.bar{display:flex;height:8px;width:100%;max-width:240px;background:#eee;border-radius:3px;
 overflow:hidden}
.blocks{display:block;width:100%;max-width:240px;height:10px}
.reused{background:#3a8f4a}.computed{background:#d9822b}.generated{background:#4a6fd0}
.small{font-size:11px;color:#666}.err{color:#c33}
"""


def _stats(n: Node) -> str:
    if n.result is None:
        return ""
    s = n.result.stats
    total = s.tokens_reused + s.tokens_computed + s.tokens_generated
    if total == 0:
        return ""
    bar = "".join(
        f'<span class="{k}" style="width:{100 * v / total:.1f}%"></span>'
        for k, v in (
            ("reused", s.tokens_reused),
            ("computed", s.tokens_computed),
            ("generated", s.tokens_generated),
        )
    )
    return (
        f'<div class="bar" title="reused / computed / generated">{bar}</div>'
        f'<div class="small">reused {s.tokens_reused} · computed {s.tokens_computed} · '
        f"generated {s.tokens_generated}</div>"
    )


def _blocks(n: Node, block_size: int | None) -> str:
    if n.span is None:
        return ""
    start, end = n.span
    out = f'<div class="small">tokens {start}–{end}'
    if block_size and end > start:
        width, cuts = 240, range((start // block_size + 1) * block_size, end, block_size)
        ticks = "".join(
            f'<line x1="{width * (c - start) / (end - start):.1f}" y1="0" '
            f'x2="{width * (c - start) / (end - start):.1f}" y2="10" stroke="#333"/>'
            for c in cuts
        )
        keys = ", ".join(f"{b.index}:{b.key[:8] if b.key else 'partial'}" for b in n.blocks)
        out += f" · blocks {n.blocks[0].index}–{n.blocks[-1].index}" if n.blocks else ""
        out += (
            f'</div><svg class="blocks" viewBox="0 0 {width} 10" preserveAspectRatio="none" '
            f'role="img"><title>{html.escape(keys)}</title>'
            f'<rect width="{width}" height="10" fill="#cde"/>{ticks}</svg>'
        )
        return out
    return out + "</div>"


def _card(n: Node, block_size: int | None, max_text: int) -> str:
    hdr = [f'<span class="kind">{n.kind}</span> <code>{html.escape(n.id)}</code> · {n.status}']
    if n.copied_from:
        hdr.append(
            f'copy of <a href="#node-{html.escape(n.copied_from)}">{html.escape(n.copied_from)}</a>'
        )
    if n.gen is not None:
        g = n.gen
        hdr.append(
            f"max {g.max_tokens} · T={g.temperature:g}"
            + (f" · seed {g.seed}" if g.seed is not None else "")
        )
    if n.result is not None and n.result.finish_reason:
        hdr.append(f"finish: {html.escape(n.result.finish_reason)}")
    text = n.text or ""
    body = f"<pre>{html.escape(text[:max_text])}</pre>"
    if len(text) > max_text:
        body = (
            f"<pre>{html.escape(text[:max_text])}…</pre><details><summary>full text "
            f"({len(text)} chars)</summary><pre>{html.escape(text)}</pre></details>"
        )
    images = "".join(
        f'<div class="small">image {p.mime} sha256:{p.sha256[:12]}</div>' for p in n.images
    )
    err = f'<div class="err">{html.escape(n.error)}</div>' if n.error else ""
    return (
        f'<div class="node {n.status}" id="node-{html.escape(n.id)}" '
        f'style="background:{_COLORS.get(n.kind, "#fff")}"><div class="hdr">'
        f"{' · '.join(hdr)}</div>{body}{images}{err}{_stats(n)}"
        f"{_blocks(n, block_size)}</div>"
    )


def _chain(tree: Tree, node: Node, out: list[str], max_text: int) -> None:
    """A run of single-child nodes stays at one level; a branch point indents its children."""
    out.append('<ul class="chain">')
    while True:
        out.append(f"<li>{_card(node, tree.block_size, max_text)}</li>")
        kids = tree.children(node)
        if len(kids) != 1:
            break
        node = kids[0]
    if kids:
        out.append(f'<li><div class="fork">{len(kids)} branches</div><ul class="branches">')
        for kid in kids:
            out.append("<li>")
            _chain(tree, kid, out, max_text)
            out.append("</li>")
        out.append("</ul></li>")
    out.append("</ul>")


def to_html(tree: Tree, title: str = "forkv tree", max_text: int = 600) -> str:
    """One self-contained HTML page showing the whole tree."""
    out = [
        (
            '<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>'
            f"{html.escape(title)}</title><style>{_CSS}</style></head><body>"
            f'<h1>{html.escape(title)}</h1><p class="small">model '
            f"{html.escape(tree.model_id or 'unknown')} · {len(tree)} nodes · "
            f"{len(tree.pending())} pending · block size {tree.block_size or 'unknown'} · bar: "
            '<span style="color:#3a8f4a">reused</span> / <span style="color:#d9822b">computed'
            '</span> / <span style="color:#4a6fd0">generated</span> tokens</p>'
        )
    ]
    roots = tree.roots()
    if len(roots) == 1:
        _chain(tree, roots[0], out, max_text)
    elif roots:
        out.append('<ul class="branches">')
        for root in roots:
            out.append("<li>")
            _chain(tree, root, out, max_text)
            out.append("</li>")
        out.append("</ul>")
    out.append("</body></html>\n")
    return "".join(out)


def write_html(tree: Tree, path: str | Path, title: str = "forkv tree") -> Path:
    """Write `to_html(tree)` to `path`, readable by its owner only (0600, as the tree it
    draws), and return the path (what `forkv show` calls)."""
    from forkv.security import write_private_file

    path = Path(path)
    write_private_file(path, to_html(tree, title))
    return path
