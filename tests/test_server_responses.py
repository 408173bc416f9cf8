"""forkv serve, Responses API, through the official openai client against a real server:
responses as nodes of a server-side conversation tree - continue and fork from one
`previous_response_id` with cached tokens, GET, DELETE of a subtree, `store: false`,
streaming events, and the 404s of ids that are gone."""

from __future__ import annotations

import http.client as httpclient
import json
import time

import pytest

openai = pytest.importorskip("openai")

from server_proc import TINY, http, metric, no_eos, shared_server  # noqa: E402

MODEL = "demo:qwen3:tiny"
DOCUMENT = "Section 1. Foxes are quick and dogs are lazy. " * 12  # ~560 byte tokens


@pytest.fixture(scope="module")
def url():
    return shared_server(*TINY)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_forks_from_one_previous_response_reuse_its_checkpoints(client):
    root = client.responses.create(model=MODEL, instructions="You summarise documents.",
                                   input=DOCUMENT, max_output_tokens=8, temperature=0)
    assert root.status in ("completed", "incomplete") and root.output[0].type == "message"
    assert isinstance(root.output_text, str)
    assert root.usage.input_tokens > 512 and root.usage.output_tokens >= 1
    forks = [client.responses.create(model=MODEL, previous_response_id=root.id,
                                     input=question, max_output_tokens=6, temperature=0)
             for question in ("Who is quick?", "Who is lazy?")]
    for fork in forks:
        assert fork.previous_response_id == root.id
        # The document's blocks come back from the checkpoints the first response made.
        assert fork.usage.input_tokens_details.cached_tokens >= 512
        assert fork.usage.input_tokens > root.usage.input_tokens
    deeper = client.responses.create(model=MODEL, previous_response_id=forks[0].id,
                                     input="And then?", max_output_tokens=4)
    assert deeper.usage.input_tokens_details.cached_tokens >= 512
    got = client.responses.retrieve(forks[1].id)
    assert got.id == forks[1].id and got.output_text == forks[1].output_text


def test_delete_removes_the_subtree(client, url):
    root = client.responses.create(model=MODEL, input=DOCUMENT + "Q1", max_output_tokens=4)
    child = client.responses.create(model=MODEL, previous_response_id=root.id, input="Q2",
                                    max_output_tokens=4)
    other = client.responses.create(model=MODEL, input="unrelated", max_output_tokens=4)
    status, body = http("DELETE", f"{url}/v1/responses/{root.id}")
    assert status == 200 and body["deleted"] is True
    assert set(body["deleted_responses"]) == {root.id, child.id}
    assert body["released_records"] > 0  # the document's blocks were only this subtree's
    for gone in (root.id, child.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, previous_response_id=root.id, input="more")
    assert client.responses.retrieve(other.id).id == other.id


def test_metrics_count_the_responses_kept_and_their_nodes(client, url):
    before = (metric(url, "forkv_responses_stored"), metric(url, "forkv_response_tree_nodes"))
    root = client.responses.create(model=MODEL, input="count me", max_output_tokens=2)
    client.responses.create(model=MODEL, previous_response_id=root.id, input="and me",
                            max_output_tokens=2)
    client.responses.create(model=MODEL, input="not kept", max_output_tokens=2, store=False)
    kept = (metric(url, "forkv_responses_stored"), metric(url, "forkv_response_tree_nodes"))
    assert kept[0] == before[0] + 2 and kept[1] == before[1] + 4  # user + final each
    http("DELETE", f"{url}/v1/responses/{root.id}")
    assert (metric(url, "forkv_responses_stored"),
            metric(url, "forkv_response_tree_nodes")) == before


def test_delete_releases_turn_end_checkpoints(client, url):
    # Under one block: the only checkpoints are at the prompts' ends (after the generation
    # prompt), which the follow-up restores and DELETE releases.
    root = client.responses.create(model=MODEL, input="A short question?", max_output_tokens=2,
                                   temperature=0)
    child = client.responses.create(model=MODEL, previous_response_id=root.id,
                                    input="A follow-up?", max_output_tokens=2, temperature=0)
    assert child.usage.input_tokens < 256
    assert child.usage.input_tokens_details.cached_tokens > root.usage.input_tokens - 4
    status, body = http("DELETE", f"{url}/v1/responses/{root.id}")
    # The prompts' ends: records, and (the server's default fast reuse) the live caches
    # holding them; the child continued the root's live cache, so it recorded nothing.
    assert status == 200 and body["released_records"] >= 2


def test_a_subtree_still_generating_cannot_be_deleted(client, url):
    root = client.responses.create(model=MODEL, input="root", max_output_tokens=2)
    conn = httpclient.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
    conn.request("POST", "/v1/responses", json.dumps(
        {"model": MODEL, "input": "go on", "previous_response_id": root.id,
         "max_output_tokens": 4000, "stream": True, "logit_bias": no_eos(MODEL)}),
        {"Content-Type": "application/json"})
    resp = conn.getresponse()
    try:
        assert resp.status == 200 and resp.read(6) == b"event:"
        status, body = http("DELETE", f"{url}/v1/responses/{root.id}")
        assert status == 400 and body["error"]["code"] == "response_in_progress"
    finally:
        conn.sock.close()
        conn.close()
    # The cancelled child leaves nothing behind; the root can go now.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, body = http("DELETE", f"{url}/v1/responses/{root.id}")
        if status == 200:
            break
        time.sleep(0.2)
    assert status == 200 and body["deleted_responses"] == [root.id]


def test_store_false_keeps_nothing(client):
    resp = client.responses.create(model=MODEL, input="ephemeral", store=False,
                                   max_output_tokens=4)
    assert resp.status in ("completed", "incomplete")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_streamed_response_events(client):
    events = list(client.responses.create(model=MODEL, input="Stream this.",
                                          max_output_tokens=6, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",
                                                           "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text.lstrip("\n")
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_bad_responses_requests(client, url):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, previous_response_id="resp_missing", input="x")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other-model", input="x")
    status, body = http("POST", f"{url}/v1/responses", {"model": MODEL})
    assert status == 400 and body["error"]["code"] == "missing_required_parameter"
    status, body = http("POST", f"{url}/v1/responses",
                        {"model": MODEL, "input": [{"role": "user", "content": [
                            {"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]})
    assert status == 400 and body["error"]["code"] == "image_not_supported"
    status, body = http("DELETE", f"{url}/v1/responses/resp_missing")
    assert status == 404 and body["error"]["code"] == "response_not_found"


def test_a_huge_max_output_tokens_is_blamed_on_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", max_output_tokens=10 ** 9)
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_output_tokens"
