"""The Responses API runs its nodes through the SDK's node runner, as Session does: a thinking
model's response is a reasoning node and a final node, each with its own stats and sampling
settings; usage adds up from them; the same tree run by a Session on the same engine gives the
same tokens, text and tool calls. A real server on loopback (in this process, so that the
test can read the server's tree) and the official openai client."""

from __future__ import annotations

import http.client as httpclient
import json
import threading
import time

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

import forkv  # noqa: E402
from forkv.engine import load_model  # noqa: E402
from forkv.server.app import ServerConfig, ServerState, make_app  # noqa: E402
from server_proc import free_port  # noqa: E402

MODEL = "demo:qwen3:tiny"
WEATHER = {"name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"type": "string", "maxLength": 10}}}}


@pytest.fixture(scope="module")
def served():
    """(openai client, the served model) of a thinking server with exact reuse (bit-exact
    logits, so that a Session on its engine samples the same tokens)."""
    lm = load_model(MODEL)
    state = ServerState(ServerConfig(model=MODEL, reasoning="on", reuse="exact"), lm)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(state), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0, timeout=120)
    try:
        yield client, state.models.loaded[0]
    finally:
        server.should_exit = True  # its lifespan closes the model's engine
        thread.join(timeout=30)


def _nodes(model, response_id):
    """(reasoning node, final node) of a stored response on the server."""
    stored = model.conversations.get("", response_id)
    tree = model.conversations.tree("")
    reasoning, final = tree.path(stored.last)[-2:]
    return reasoning, final


def test_a_response_is_two_nodes_with_stats_and_their_own_settings(served):
    client, model = served
    close = model.lm.tokenizer.encode("</think>", add_special_tokens=False)
    # the thought closes at its first token, so the answer runs too
    bias = {str(close[0]): 100}
    resp = client.responses.create(model=MODEL, input="Think, then answer.", temperature=0.7,
                                   top_p=0.9, max_output_tokens=6, extra_body={
                                       "seed": 11, "top_k": 5, "stop": ["zz"],
                                       "logit_bias": bias})
    reasoning, final = _nodes(model, resp.id)
    assert (reasoning.kind, final.kind) == ("reasoning", "final")
    for node in (reasoning, final):
        gen = node.gen
        assert (gen.temperature, gen.top_p, gen.top_k, gen.seed) == (0.7, 0.9, 5, 11)
        assert gen.logit_bias == {close[0]: 100.0}
        # the engine's counts, as Session attaches them (not left at zero)
        assert node.result.stats.tokens_generated == len(node.result.token_ids) >= 1
    assert reasoning.gen.stop == ("</think>",) and final.gen.stop == ("zz",)
    thought, answer = reasoning.result.stats, final.result.stats
    assert (thought.tokens_generated, answer.tokens_generated) == (1, 5)
    # the answer's own request restores what the thought's recorded
    assert answer.tokens_reused > thought.tokens_reused
    usage = resp.usage
    assert usage.output_tokens == 6 and usage.output_tokens_details.reasoning_tokens == 1
    assert usage.input_tokens_details.cached_tokens == thought.tokens_reused
    assert usage.input_tokens == thought.tokens_reused + thought.tokens_computed
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output_text == (final.text or "").lstrip("\n")


def test_a_session_on_the_same_engine_gives_the_same_nodes_and_calls(served):
    client, model = served
    close = model.lm.tokenizer.encode("</think>", add_special_tokens=False)
    settings = {"temperature": 1.0, "seed": 5, "logit_bias": {str(close[0]): 100}}
    resp = client.responses.create(
        model=MODEL, input="What is the weather in Oslo?", max_output_tokens=120,
        tools=[{"type": "function", "strict": True, **WEATHER}], tool_choice="required",
        parallel_tool_calls=False, temperature=1.0,
        extra_body={k: v for k, v in settings.items() if k != "temperature"})
    r_server, f_server = _nodes(model, resp.id)
    [call] = [item for item in resp.output if item.type == "function_call"]
    with forkv.Session(model.backend.engine) as session:
        assert session.reasoning == model.format  # one detected format for both
        gen = {**settings, "logit_bias": {close[0]: 100}, "max_tokens": 120}
        user = session.user("What is the weather in Oslo?",
                            tools=[{"type": "function", "strict": True, **WEATHER}])
        reasoning = user.reasoning({**gen, "stop": ["</think>"]})
        final = reasoning.final({**gen, "tool_choice": "required",
                                 "parallel_tool_calls": False,
                                 "max_tokens": 120 - r_server.result.stats.tokens_generated})
        session.run()
    for mine, theirs in ((reasoning, r_server), (final, f_server)):
        assert mine.result.token_ids == theirs.result.token_ids and mine.text == theirs.text
    [made] = final.tool_calls
    assert (made.name, made.arguments) == (call.name, json.loads(call.arguments))
    assert [(c.name, c.arguments) for c in f_server.tool_calls] == [(made.name, made.arguments)]


def test_a_streamed_thinking_response(served):
    client, model = served
    close = model.lm.tokenizer.encode("</think>", add_special_tokens=False)
    events = list(client.responses.create(
        model=MODEL, input="Stream a thought.", max_output_tokens=4, temperature=0,
        stream=True, extra_body={"logit_bias": {str(close[0]): 100}}))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert events[2].item.type == "reasoning"  # opened first, though the thought is empty
    assert kinds[-1] == "response.incomplete"  # the answer ran out of tokens
    done = events[-1].response
    _, final = _nodes(model, done.id)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert done.output_text == text.lstrip("\n") == (final.text or "").lstrip("\n") != ""
    assert [item.type for item in done.output] == ["reasoning", "message"]
    assert done.usage.output_tokens_details.reasoning_tokens == 1
    assert done.usage.output_tokens == 4 == 1 + final.result.stats.tokens_generated


def test_a_client_that_leaves_cancels_and_removes_the_response(served):
    client, model = served
    port = int(str(client.base_url).rsplit(":", 1)[1].split("/")[0])
    tree = model.conversations.tree("")
    before = len(tree)
    no_eos = {str(i): -100 for i in model.lm.eos_token_ids}
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/responses", json.dumps(
        {"model": MODEL, "input": "Go on and on.", "max_output_tokens": 4000,
         "logit_bias": no_eos}), {"Content-Type": "application/json"})
    while len(tree) == before or not model.backend.in_flight:
        time.sleep(0.05)  # its nodes are in the tree and a node is generating
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + 30
    while len(tree) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(tree) == before  # abandoned: its nodes are gone
    assert model.backend.in_flight == 0  # and its request was cancelled
