"""The tree viewer of a run: live on loopback for `forkv run SPEC --ui`, inlined for `forkv show`.

One page (`static/run.html`, `run.js` on the app's `tree.js`) draws a tree from `tree_items`:
each node's kind, text, status and the engine's stats (tokens restored / computed / generated,
time to first token, tok/s). Live, `RunViewer` serves it from a small Starlette app on a free
loopback port in a daemon thread: the run loop calls `publish(tree)` from the thread that
changes the tree (so the server never reads a tree being changed), and the page gets each new
snapshot as a server-sent event. The URL carries a random token, so another local user or a
page that finds the port cannot read the run, and a Host that is not a loopback name is
refused (DNS rebinding). `viewer_html(tree)` writes the same page as one file with the tree,
script and style inlined, for `forkv show`. Knows nothing about how a run runs.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import re
import secrets
import socket
import threading
import time
from importlib import resources

__all__ = ["RunViewer", "tree_items", "viewer_html"]

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def tree_items(tree) -> list[dict]:
    """The nodes of `tree` as the viewer draws them, parents first."""
    items = []
    for n in tree:
        item = {"id": n.id, "parent": n.parent_id, "kind": n.kind, "status": n.status,
                "text": n.text or "", "copied_from": n.copied_from, "error": n.error,
                "images": [f"{p.mime} sha256:{p.sha256[:12]}" for p in n.images]}
        if n.span is not None:
            item["span"] = list(n.span)
            item["blocks"] = [f"{b.index}:{b.key[:8] if b.key else 'partial'}"
                              for b in n.blocks]
        if n.gen is not None:
            g = n.gen
            item["gen"] = f"max {g.max_tokens} · T={g.temperature:g}" + (
                f" · seed {g.seed}" if g.seed is not None else "")
        if n.result is not None:
            s, t = n.result.stats, n.result.timings
            item.update(finish=n.result.finish_reason,
                        stats={"restored": s.tokens_reused, "computed": s.tokens_computed,
                               "generated": s.tokens_generated,
                               "ttft_s": t.get("first_token_s"), "tps": t.get("decode_tps")})
        items.append(item)
    return items


def _static(name: str) -> str:
    return resources.files("forkv.server").joinpath("static", name).read_text()


def _script_json(data) -> str:
    """JSON that can sit inside a <script> element: no `</script>` or `<!--` can close it."""
    return json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")


def viewer_html(tree, title: str = "forkv tree") -> str:
    """The viewer page with `tree`, its script and its style inlined: one file, no requests."""
    script = "\n".join(re.sub(r"^export ", "", line)
                       for name in ("tree.js", "run.js") for line in _static(name).splitlines()
                       if not line.startswith("import "))
    data = _script_json({"title": title, "model": tree.model_id, "done": True,
                         "nodes": tree_items(tree)})
    page = _static("run.html").replace(
        '<link rel="icon" href="/app/icon.svg" type="image/svg+xml">\n', "")
    page = page.replace('<link rel="stylesheet" href="/app/app.css">',
                        f"<style>{_static('app.css')}</style>")
    page = page.replace('<script type="module" src="/app/run.js"></script>\n', "")
    return page.replace("</body>", f'<script type="application/json" id="forkv-tree">{data}'
                                   f"</script>\n<script>{script}</script>\n</body>")


class RunViewer:
    """A loopback server of one run's tree (see the module docstring); `url` once started."""

    def __init__(self, title: str, model: str | None = None, host: str = "127.0.0.1"):
        self.title, self.model, self.host = title, model, host
        self.token = secrets.token_urlsafe(18)
        # Recent snapshots, oldest first: a page sees every one after it connected, in order.
        self._history = collections.deque([(0, _script_json(
            {"title": title, "model": model, "done": False, "nodes": []}))], maxlen=256)
        self._done = False
        self._server = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def publish(self, tree, done: bool = False) -> None:
        """Take a snapshot of `tree` for the page (call it from the thread changing it)."""
        body = _script_json({"title": self.title, "model": self.model, "done": done,
                             "nodes": tree_items(tree)})
        self._history.append((self._history[-1][0] + 1, body))  # (deque appends are atomic)
        self._done = done

    def start(self) -> str:
        import uvicorn

        with socket.socket() as s:
            s.bind((self.host, 0))
            port = s.getsockname()[1]
        config = uvicorn.Config(self._app(), host=self.host, port=port, log_level="warning",
                                lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True,
                                        name="forkv-run-viewer")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.02)  # the URL is printed once it answers
        self.url = f"http://{self.host}:{port}/run/{self.token}/"
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=5)

    # -- the app -------------------------------------------------------------------------------
    def _app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        from .errors import APIError
        from .webapp import asset

        async def static(request):
            try:
                return await asset(request)
            except APIError as e:
                return e.response()

        def allowed(request) -> Response | None:
            host = request.headers.get("host", "").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name not in _LOOPBACK:
                return JSONResponse({"error": "This viewer answers loopback names only."}, 403)
            if not hmac.compare_digest(request.path_params.get("token", ""), self.token):
                return JSONResponse({"error": "No run here; open the URL forkv printed."}, 404)
            return None

        headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                   "Referrer-Policy": "no-referrer"}

        async def page(request):
            refused = allowed(request)
            if refused is not None:
                return refused
            return Response(_static("run.html"), media_type="text/html; charset=utf-8",
                            headers={**headers, "Content-Security-Policy": _CSP})

        async def snapshot(request):
            return allowed(request) or Response(self._history[-1][1], headers=headers,
                                                media_type="application/json")

        async def events(request):
            refused = allowed(request)
            if refused is not None:
                return refused

            async def frames():
                seen, body = self._history[-1]  # the latest at once, then each new one
                yield f"event: tree\ndata: {body}\n\n"
                while True:
                    done = self._done
                    for version, body in list(self._history):
                        if version > seen:
                            seen = version
                            yield f"event: tree\ndata: {body}\n\n"
                    if done and seen == self._history[-1][0]:
                        yield "event: done\ndata: {}\n\n"
                        return
                    await asyncio.sleep(0.05)

            return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)

        routes = [Route("/run/{token}/", page), Route("/run/{token}/tree", snapshot),
                  Route("/run/{token}/events", events), Route("/app/{name}", static)]
        return Starlette(routes=routes)
