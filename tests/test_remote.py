"""forkv.remote without servers: routing order, the wire format, failure errors.

The servers themselves (three `forkv serve` replicas, `mlx_lm.server`, failover) are in
test_remote_cluster.py; the tutorials on a remote backend in test_remote_docs.py.
"""

import json
import socket

import pytest
from forkv.engine import SamplingParams
from forkv.errors import ForkvError
from forkv.remote import NoReplicaLeft, RemoteBackend, RemoteError, Router, TokenizerNotFound
from forkv.remote.router import health_url
from forkv.remote.wire import chat_body, data_url, parse_line, route_key


class WordTokenizer:
    """Just enough of a tokenizer: one id per character, a plain chat template."""

    chat_template = None
    eos_token_ids = frozenset({0})

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 1000 for c in text]


def dead_urls(n):
    """Loopback URLs nothing listens on."""
    out = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            out.append(f"http://127.0.0.1:{s.getsockname()[1]}/v1")
    return out


URLS = [f"http://10.0.0.{i}:8000/v1" for i in range(1, 6)]


def test_affinity_order_is_stable_and_moves_only_the_lost_replicas_trees():
    router = Router(URLS)
    keys = [route_key([{"role": "user", "content": f"doc {i}"}], "t") for i in range(200)]
    first = {k: router.order(k)[0].url for k in keys}
    assert all(router.order(k)[0].url == first[k] for k in keys)  # same key, same replica
    assert len(set(first.values())) == 5  # and the keys spread over every replica
    smaller = Router(URLS[1:])
    for k in keys:
        if first[k] != URLS[0]:  # trees of the other replicas stay where they were
            assert smaller.order(k)[0].url == first[k]
        else:  # the lost replica's trees go to their second choice
            assert smaller.order(k)[0].url == router.order(k)[1].url


def test_round_robin_rotates_and_down_replicas_go_last():
    router = Router(URLS[:3], routing="round_robin")
    assert [router.order(b"k")[0].url for _ in range(3)] == URLS[:3]
    router.mark_down(router.replicas[0])
    for _ in range(3):
        assert router.order(b"k")[-1].url == URLS[0]
    with pytest.raises(ValueError, match="routing must be one of"):
        Router(URLS, routing="random")


def test_route_key_covers_the_first_turn_only_and_the_salt():
    head = [{"role": "system", "content": "S"}, {"role": "user", "content": "doc"}]
    later = head + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]
    assert route_key(head, "t") == route_key(later, "t")  # forks and later turns: one replica
    assert route_key(head, "t") != route_key(head, "u")
    assert route_key(head, "t") != route_key(head[:1] + [{"role": "user", "content": "x"}], "t")


def test_chat_body_carries_salt_sampling_and_continuation():
    params = SamplingParams(max_tokens=7, temperature=0.5, seed=3, stop=("</think>",))
    body = chat_body("m", [{"role": "user", "content": "hi"}], params, "salt",
                     continue_final=True)
    assert body["cache_salt"] == "salt" and body["max_tokens"] == 7 and body["seed"] == 3
    assert body["stop"] == ["</think>"] and body["stream"] and body["logprobs"]
    assert body["continue_final_message"] and body["add_generation_prompt"] is False
    assert health_url("http://h:1/v1/") == "http://h:1/health"


def test_sse_lines_parse_to_pieces():
    chunk = {"choices": [{"delta": {"reasoning_content": "th", "content": "ok"},
                          "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.0}]},
                          "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}}
    piece = parse_line("data: " + json.dumps(chunk))
    assert piece.text == "thok" and piece.logprobs == [-0.5, -1.0]
    assert piece.finish_reason == "stop" and piece.usage["prompt_tokens"] == 9
    legacy = parse_line('data: {"choices": [{"text": "x", "logprobs": {"token_logprobs": [-2]}}]}')
    assert legacy.text == "x" and legacy.logprobs == [-2.0]
    assert parse_line("data: [DONE]") is None and parse_line(": ping") is None
    assert parse_line('data: {"error": {"message": "boom"}}').error == "boom"


def test_images_become_data_urls_of_their_type():
    assert data_url(b"\xff\xd8\xff\xe0rest").startswith("data:image/jpeg;base64,")
    assert data_url(b"\x89PNG\r\n\x1a\nrest").startswith("data:image/png;base64,")


def test_no_replica_left_is_one_clear_error():
    with RemoteBackend(dead_urls(2), "m", tokenizer=WordTokenizer()) as backend:
        assert not any(r["up"] for r in backend.stats()["replicas"].values())
        handle = backend.submit([{"role": "user", "content": "hi"}], max_tokens=4)
        with pytest.raises(NoReplicaLeft, match="No replica could answer") as e:
            handle.result(timeout=30)
        assert isinstance(e.value, ForkvError) and str(e.value).count("127.0.0.1") == 2
        assert backend.stats()["failovers"] == 2 and backend.stats()["failed"] == 1


def test_block_keys_chain_and_depend_on_the_tenant():
    a = RemoteBackend(dead_urls(1), "m", tokenizer=WordTokenizer(), block_size=4)
    b = RemoteBackend(dead_urls(1), "m", tokenizer=WordTokenizer(), block_size=4,
                      api_key="other")
    try:
        keys = a.block_keys(list(range(10)))
        assert len(keys) == 2 and keys == a.block_keys(list(range(8)))
        assert a.block_keys([9, 1, 2, 3, 4, 5, 6, 7])[1] != keys[1]  # chained
        assert b.block_keys(list(range(8))) != keys and a.cache_salt != b.cache_salt
        assert a.release(keys) == 0  # the servers evict on their own
    finally:
        a.close()
        b.close()


def test_a_remote_model_needs_a_local_tokenizer():
    with pytest.raises(TokenizerNotFound, match="pass tokenizer="):
        RemoteBackend(dead_urls(1), "org/some-model")
    assert issubclass(RemoteError, ForkvError)


def test_image_placeholders_are_filled_in_order():
    from forkv.remote.wire import _with_images

    png, jpg = b"\x89PNG\r\n\x1a\n1", b"\xff\xd8\xff2"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "image", "image": jpg}, {"type": "image"}]}]
    out = _with_images(messages, [png, png])
    urls = [p["image_url"]["url"] for m in out if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]
    assert [u.split(";")[0] for u in urls] == ["data:image/png", "data:image/jpeg",
                                               "data:image/png"]
    assert out[0]["content"][1] == {"type": "text", "text": "a"} and out[1] == messages[1]
