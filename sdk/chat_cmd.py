"""`forkv chat [--model M]`: `forkv serve` on a free loopback port, its web app opened.

Takes serve's options (one model, several, or none: any model by name, loaded on demand);
picks a free port unless `--port` names one, prints the app's URL once the server answers
`/health`, and opens it with the `webbrowser` module unless `--no-browser`. The chats live in
the server's memory, as they do in `forkv serve`: they end with it. Knows nothing about what
the server or the page does.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.request
import webbrowser

__all__ = ["add_arguments", "app_url", "run_chat"]


def add_arguments(p) -> None:
    from .server.serve import add_arguments as add_serve

    add_serve(p)
    for action in p._actions:  # serve's --port, whose default here is a free port
        if action.dest == "port":
            action.default, action.help = 0, "port to listen on (default: a free one)"
    p.add_argument("--no-browser", action="store_true",
                   help="print the app's URL but do not open a browser")


def app_url(host: str, port: int) -> str:
    """The URL of the web app of a server bound to `host`:`port` (loopback for a wildcard)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _announce(url: str, open_browser: bool, timeout: float = 3600.0) -> None:
    """Wait for the server to answer, then print the URL (and open it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.2)
    else:
        return
    print(f"forkv chat: {url}", file=sys.stderr, flush=True)
    if open_browser:
        webbrowser.open(url)


def run_chat(args) -> int:
    """The `forkv chat` subcommand (arguments from `forkv.cli`)."""
    from .server.serve import run_serve

    if args.port == 0:
        args.port = _free_port(args.host)
    url = app_url(args.host, args.port)
    threading.Thread(target=_announce, args=(url, not args.no_browser), daemon=True,
                     name="forkv-chat-open").start()
    return run_serve(args)
