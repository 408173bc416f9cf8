"""The server page's examples (docs/server.md: its ```py and curl blocks) run as written
against a real `forkv serve` on the tiny demo model (model name and port substituted); the
README's own server example runs on the real chat model in tests/test_real_smollm2.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("openai")

from server_proc import TINY, shared_server  # noqa: E402

MODEL = "demo:qwen3:tiny"
README = Path(__file__).resolve().parents[1] / "docs" / "server.md"
SECTION = README.read_text()
PY = re.findall(r"```py\n(.*?)```", SECTION, flags=re.S)
CURL = [b for b in re.findall(r"```bash\n(.*?)```", SECTION, flags=re.S) if "curl" in b]


@pytest.fixture(scope="module")
def url():
    return shared_server(*TINY)


def _local(code: str, url: str) -> str:
    return code.replace("demo:gemma3", MODEL).replace("http://127.0.0.1:8000", url)


def test_readme_has_server_examples():
    assert len(PY) >= 3 and CURL


@pytest.mark.parametrize("code", PY, ids=[f"py{i}" for i in range(len(PY))])
def test_python_example_runs(url, code):
    if "langchain_openai" in code:
        pytest.importorskip("langchain_openai")
    exec(compile(_local(code, url), str(README), "exec"), {"__name__": "__readme__"})


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_example_runs(url):
    out = subprocess.run(["bash", "-c", _local(CURL[0], url)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and '"chat.completion"' in out.stdout, out.stdout + out.stderr
