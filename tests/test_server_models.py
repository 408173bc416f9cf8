"""forkv serve without --model (issue 26, item 2): any model name on demand, the least recently
used idle one unloaded past --max-models, /v1/models listing loaded and local models, a 404
with the reason for a name that cannot load, and loads that never hold up loaded models."""

from __future__ import annotations

import asyncio
import threading

import openai
import pytest

from conftest import load_tiny
from server_proc import http, running_server

A, B = "demo:qwen3:tiny", "demo:gemma3:tiny"


def _metric(url: str, name: str) -> float:
    _, text = http("GET", f"{url}/metrics")
    return float(next(line.rsplit(" ", 1)[1] for line in text.splitlines()
                      if line.startswith(name + " ")))


@pytest.fixture(scope="module")
def url():
    with running_server("--reasoning", "off", "--max-models", "1") as u:
        yield u


def test_models_load_by_name_and_the_idle_one_unloads(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
    assert http("GET", f"{url}/health")[1]["models"] == []
    ids = {m.id for m in client.models.list().data}
    assert {"demo:qwen3", "demo:gemma3"} <= ids  # demo names are always available here
    messages = [{"role": "user", "content": "hello " * 300}]
    for name in (A, A, B):
        out = client.chat.completions.create(model=name, messages=messages, max_tokens=2)
        assert out.model == name and out.usage.completion_tokens >= 1
    assert http("GET", f"{url}/health")[1]["models"] == [B]  # --max-models 1: A went
    assert _metric(url, "forkv_model_loads_total") == 2
    assert _metric(url, "forkv_model_unloads_total") == 1
    # Back to A: loaded again, its checkpoints went with the unload.
    out = client.chat.completions.create(model=A, messages=messages, max_tokens=2)
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    card = client.models.retrieve(A)
    assert card.id == A and getattr(card, "status", None) == "loaded"
    comp = client.completions.create(model=A, prompt="The capital", max_tokens=2)
    assert comp.choices[0].text is not None


def test_a_name_that_cannot_load_is_a_404_with_the_reason(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="demo:nonesuch", max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}])
    assert "cannot be loaded" in str(e.value) and "Unknown demo model" in str(e.value)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="/nowhere/at/all", max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}])
    assert "No model '/nowhere/at/all'" in str(e.value)
    status, body = http("GET", f"{url}/v1/models/org/not-here")
    assert status == 404 and body["error"]["code"] == "model_not_found"


@pytest.mark.slow  # (3-4 s, a server process: out of the 5-minute fast suite)
def test_a_pinned_server_serves_only_its_model():
    with running_server("--model", A, "--reasoning", "off") as url:
        status, body = http("POST", f"{url}/v1/chat/completions",
                            {"model": B, "messages": [{"role": "user", "content": "x"}]})
        assert status == 404 and A in body["error"]["message"]
        assert [m["id"] for m in http("GET", f"{url}/v1/models")[1]["data"]][0] == A


def test_a_load_never_holds_up_requests_for_loaded_models(monkeypatch):
    """While one name loads (held here on an event), a loaded model answers at once; two
    requests for the loading name share one load."""
    from forkv.server.app import ServerConfig, ServerState
    from forkv.server import models as pool_mod

    state = ServerState(ServerConfig(reasoning="off"))
    state.models.add(A, load_tiny("qwen3"), pinned=False)
    release, calls = threading.Event(), []

    def slow_load(self, name):
        calls.append(name)
        release.wait(30)
        return self.add(name, load_tiny("gemma3"), pinned=False)

    monkeypatch.setattr(pool_mod.ModelPool, "_load", slow_load)

    async def scenario():
        loading = [asyncio.ensure_future(state.model(B)) for _ in range(2)]
        await asyncio.sleep(0.2)
        served = await asyncio.wait_for(state.model(A), 5)  # not behind B's load
        assert served.name == A and not any(t.done() for t in loading)
        release.set()
        got = await asyncio.gather(*loading)
        assert got[0] is got[1] and got[0].name == B and calls == [B]

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        state.models.close()
