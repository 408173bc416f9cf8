"""`forkv chat`: a server on a free loopback port whose web app URL is printed and opened in
the user's browser (here a fake browser, named by $BROWSER as the webbrowser module reads it,
that writes down the URL it was given)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest

from forkv.chat_cmd import app_url
from server_proc import stop


def test_app_url_is_loopback_for_a_wildcard_bind():
    assert app_url("127.0.0.1", 8123) == "http://127.0.0.1:8123/"
    assert app_url("0.0.0.0", 8123) == "http://127.0.0.1:8123/"
    assert app_url("::1", 8123) == "http://[::1]:8123/"


@pytest.mark.slow  # (3-4 s, a server process: out of the 5-minute fast suite)
def test_chat_serves_the_app_on_a_free_port_and_opens_it(tmp_path):
    opened = tmp_path / "opened"
    fake = tmp_path / "browser.py"
    fake.write_text("import sys, pathlib\npathlib.Path(sys.argv[2]).write_text(sys.argv[1])\n")
    env = {**os.environ, "BROWSER": f"{sys.executable} {fake} %s {opened}"}
    proc = subprocess.Popen([sys.executable, "-m", "forkv.cli", "chat", "--model",
                             "demo:gemma3:tiny"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "forkv chat ended before printing its URL"
            if line.startswith("forkv chat: "):
                url = line.split()[-1]
        assert url and url.startswith("http://127.0.0.1:") and not url.endswith(":8000/")
        with urllib.request.urlopen(url) as r:
            assert r.status == 200 and b'src="/app/main.js"' in r.read()
        while not opened.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert opened.read_text() == url
    finally:
        stop(proc)
