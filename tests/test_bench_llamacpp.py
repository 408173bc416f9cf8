"""llama-server for `forkv bench serve`: where the binary is found, a build that fails or
succeeds leaves the cache whole, and (slow, where it is built) the real server on the real
GGUF reports the prompt tokens it computed and reused."""

import os
import subprocess
from pathlib import Path

import pytest
from forkv.bench import llamacpp
from forkv.bench.llamacpp import LlamaServerMissing, llama_counts, llama_server_path

from tests.helpers import real_model_path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FORKV_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # no llama-server on PATH
    return tmp_path / "cache"


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_env_variable_wins_and_must_be_executable(cache, tmp_path, monkeypatch):
    binary = _executable(tmp_path / "mine" / "llama-server")
    monkeypatch.setenv("FORKV_LLAMA_SERVER", str(binary))
    assert llama_server_path() == binary
    monkeypatch.setenv("FORKV_LLAMA_SERVER", str(tmp_path / "nope"))
    with pytest.raises(LlamaServerMissing, match="FORKV_LLAMA_SERVER"):
        llama_server_path()


def test_path_then_the_cached_build(cache, tmp_path, monkeypatch):
    with pytest.raises(LlamaServerMissing, match="python -m forkv.bench.llamacpp --build"):
        llama_server_path()
    cached = _executable(cache / "llamacpp" / llamacpp.LLAMA_CPP_PYTHON / "bin" / "llama-server")
    assert llama_server_path() == cached
    on_path = _executable(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert llama_server_path() == on_path


def _steps(monkeypatch, fail_at: str | None):
    """Stand-ins for pip, cmake configure and cmake build: each writes to the log."""
    def run(cmd, log, cwd, deadline):
        step = "pip" if "pip" in cmd else "build" if "--build" in cmd else "configure"
        log.write(f"{step} output\n".encode())
        if step == fail_at:
            raise subprocess.CalledProcessError(2, cmd)
        if step == "pip":  # an sdist with the vendored tree
            import tarfile

            src = cwd / "stage" / "llama_cpp_python-x" / "vendor" / "llama.cpp"
            src.mkdir(parents=True)
            with tarfile.open(cwd / "llama_cpp_python-x.tar.gz", "w:gz") as tar:
                tar.add(cwd / "stage" / "llama_cpp_python-x", "llama_cpp_python-x")
        if step == "build":
            _executable(cwd / "build" / "bin" / "llama-server")

    monkeypatch.setattr(llamacpp, "_run_logged", run)


def test_a_failed_build_names_its_log_and_leaves_nothing(cache, monkeypatch):
    _steps(monkeypatch, fail_at="build")
    with pytest.raises(LlamaServerMissing, match="building llama-server failed") as e:
        llama_server_path(build=True)
    assert "build output" in str(e.value)  # the log's tail
    root = cache / "llamacpp"
    assert [p.name for p in root.iterdir()] == [f"build-{llamacpp.LLAMA_CPP_PYTHON}.log"]


def test_a_build_lands_in_the_cache_in_one_move(cache, monkeypatch):
    _steps(monkeypatch, fail_at=None)
    path = llama_server_path(build=True)
    assert path == cache / "llamacpp" / llamacpp.LLAMA_CPP_PYTHON / "bin" / "llama-server"
    assert os.access(path, os.X_OK)
    assert not [p for p in (cache / "llamacpp").iterdir() if p.name.startswith(".build-")]
    assert llama_server_path() == path  # found without building again


def test_llama_counts_read_the_timings():
    assert llama_counts({"timings": {"prompt_n": 12, "cache_n": 300}}) == (12, 300)
    assert llama_counts({"usage": {}}) == (None, None)


def built_llama_server() -> Path:
    """A built llama-server: FORKV_LLAMA_SERVER, PATH, the test cache's build or the one
    `.ci/run` makes in the user's forkv cache (the tests run with their own cache); skips
    when there is none, never builds."""
    try:
        return llama_server_path()
    except LlamaServerMissing as e:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        user = Path(xdg, "forkv", "llamacpp", llamacpp.LLAMA_CPP_PYTHON, "bin", "llama-server")
        if os.access(user, os.X_OK):
            return user
        pytest.skip(f"llama-server is not built: {e}")


@pytest.mark.slow
def test_llama_server_reports_computed_and_reused_prompt_tokens():
    """The real server on the registry GGUF: non-streaming responses carry a top-level
    `timings`, streamed ones on their last chunk; a repeated prefix shows up in cache_n."""
    gguf = real_model_path()
    binary = built_llama_server()
    import json
    import urllib.request

    import openai
    from forkv.bench.serve_procs import timed_chat
    from forkv.engine.models.named import GEMMA_TURN_TEMPLATE

    server = llamacpp.start_llama_server(binary, gguf, chat_template=GEMMA_TURN_TEMPLATE)
    try:
        server.wait_ready(timeout=300)
        doc = " ".join(f"Fact {i}: box {i} holds {i * 7} stones." for i in range(60))
        body = {"model": "gguf", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": doc + " How many in box 3?"}]}
        req = urllib.request.Request(f"{server.base_url}/chat/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            first = json.loads(r.read())
        computed, reused = llama_counts(first)
        assert computed == first["usage"]["prompt_tokens"] > 500 and reused == 0
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        again = [{"role": "user", "content": doc + " How many in box 9?"}]
        t = timed_chat(client, "gguf", again, 4)
        assert t.cached_tokens > 500 and 0 < t.computed_tokens < 50
        assert t.computed_tokens + t.cached_tokens == t.prompt_tokens
        assert t.server_prompt_tps > 0 and t.completion_tokens >= 1
    finally:
        server.stop()
