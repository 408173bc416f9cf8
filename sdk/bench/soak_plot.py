"""The soak's curves as one picture: a panel per curve over minutes, the warm-up sample marked
and each judged curve's limit drawn as a dashed line.

`.svg` is written by hand (no dependency, a few KB, the same bytes for the same result); any
other suffix goes through matplotlib (the `bench` extra), and without it an SVG is written
beside the requested path instead. Knows the result's `curves`, not how they were measured.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

__all__ = ["write_plot"]

# curve, title, scale (shown value = raw * scale)
PANELS = (("rss_mib", "server RSS, MiB", 1.0), ("store_bytes", "checkpoint bytes, MiB", 2**-20),
          ("files", "open files (no sockets)", 1.0), ("threads", "threads", 1.0),
          ("sockets", "sockets", 1.0), ("requests", "requests done", 1.0))
_W, _H, _COLS, _PAD = 330, 190, 3, 46  # panel size, columns, inner padding


def _limits(res: dict) -> dict[str, float]:
    judged = next((c for c in res["cases"] if c.get("case") == "judgement"), {})
    return {k: v["limit"] for k, v in judged.items() if isinstance(v, dict) and "limit" in v}


def write_plot(res: dict, path: str | Path) -> Path:
    """Write `res`'s curves to `path`; the path written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() != ".svg":
        try:
            return _matplotlib(res, path)
        except ImportError:
            path = path.with_suffix(".svg")
    path.write_text(_svg(res))
    return path


def _svg(res: dict) -> str:
    curves, limits = res["curves"], _limits(res)
    warm_t = curves["t_s"][res["warm_index"]] / 60
    rows = -(-len(PANELS) // _COLS)
    ok = res["headline"]["soak_ok"]
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W * _COLS}" '
            f'height="{_H * rows + 30}" font-family="sans-serif" font-size="11">'),
           '<rect width="100%" height="100%" fill="white"/>',
           (f'<text x="8" y="18" font-size="13">forkv bench soak: '
            f'{res["settings"]["minutes"]:g} min, {res["headline"]["requests"]} requests, '
            f'{"passed" if ok else "FAILED"}</text>')]
    for i, (name, title, scale) in enumerate(PANELS):
        x0, y0 = (i % _COLS) * _W, 30 + (i // _COLS) * _H
        ts = [t / 60 for t in curves["t_s"]]
        ys = [v * scale for v in curves[name]]
        limit = limits.get(name)
        top = max(ys + ([limit * scale] if limit is not None else [])) or 1.0
        lo, hi = min(0.0, min(ys)), top * 1.05
        span_t = max(ts[-1], 1e-9)

        def px(t, y, x0=x0, y0=y0, lo=lo, hi=hi, span_t=span_t):
            return (x0 + _PAD + t / span_t * (_W - _PAD - 12),
                    y0 + _H - 28 - (y - lo) / (hi - lo) * (_H - 52))

        left, bottom = px(0, lo)
        right, upper = px(span_t, hi)
        out.append(f'<text x="{x0 + _PAD}" y="{y0 + 14}">{escape(title)}</text>')
        out.append(f'<rect x="{left:.1f}" y="{upper:.1f}" width="{right - left:.1f}" '
                   f'height="{bottom - upper:.1f}" fill="none" stroke="#999"/>')
        for y in (lo, hi):
            out.append(f'<text x="{left - 4:.1f}" y="{px(0, y)[1] + 4:.1f}" '
                       f'text-anchor="end">{y:.4g}</text>')
        out.append(f'<text x="{right:.1f}" y="{bottom + 14:.1f}" text-anchor="end">'
                   f'{span_t:.3g} min</text>')
        wx = px(warm_t, lo)[0]
        out.append(f'<line x1="{wx:.1f}" y1="{upper:.1f}" x2="{wx:.1f}" y2="{bottom:.1f}" '
                   'stroke="#888" stroke-dasharray="2,3"/>')
        if limit is not None:
            ly = px(0, limit * scale)[1]
            out.append(f'<line x1="{left:.1f}" y1="{ly:.1f}" x2="{right:.1f}" y2="{ly:.1f}" '
                       'stroke="#c33" stroke-dasharray="5,3"/>')
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in (px(t, y) for t, y in zip(ts, ys)))
        out.append(f'<polyline points="{points}" fill="none" stroke="#1f5fa8" '
                   'stroke-width="1.6"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _matplotlib(res: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, limits = res["curves"], _limits(res)
    ts = [t / 60 for t in curves["t_s"]]
    rows = -(-len(PANELS) // _COLS)
    fig, axes = plt.subplots(rows, _COLS, figsize=(4 * _COLS, 2.6 * rows), squeeze=False)
    for ax, (name, title, scale) in zip(axes.flat, PANELS):
        ax.plot(ts, [v * scale for v in curves[name]], color="#1f5fa8")
        ax.axvline(ts[res["warm_index"]], color="#888", linestyle=":")
        if name in limits:
            ax.axhline(limits[name] * scale, color="#c33", linestyle="--")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("minutes", fontsize=8)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"forkv bench soak ({'passed' if res['headline']['soak_ok'] else 'FAILED'})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
