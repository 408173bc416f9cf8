"""Chat completions' prompts encoded from the namespace's last renders (sdk/server/
chat_encode.py): the engine's own tokens for every request, the new messages' cost only,
never from another namespace's render, bounded."""

from __future__ import annotations

import random

import pytest

from conftest import load_tiny
from forkv.engine import Engine
from forkv.graph import token_extend
from forkv.server.chat_encode import ChatEncodings


class Counting:
    """A tokenizer that counts the characters it is asked to encode."""

    def __init__(self, tok):
        self._tok, self._tokenizer, self.encoded = tok, tok._tokenizer, 0
        self.chat_template = getattr(tok, "chat_template", None)

    def encode(self, text, add_special_tokens=True):
        self.encoded += len(text)
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _chat(rng: random.Random, turns: int) -> list[list[dict]]:
    """The messages of each request of a growing chat."""
    msgs = [{"role": "system", "content": "Be terse."}]
    out = []
    for t in range(turns):
        words = " ".join(rng.choice(["log", "line", "  two", "x\ny", "é", "ok?"])
                         for _ in range(rng.randrange(3, 30)))
        msgs.append({"role": "user", "content": f"turn {t}: {words}"})
        out.append(list(msgs))
        msgs.append({"role": "assistant", "content": rng.choice(["ok", "no", " yes ", "a\n"])})
    return out


def matches_the_engine(lm, turns: int = 12) -> None:
    """Every request of a growing chat of `turns`, then two rewinds, encoded as `lm`'s engine
    encodes it (the real-tokenizer tests call this too)."""
    engine = Engine(lm)
    try:
        enc = ChatEncodings(lm.tokenizer, lm.name)
        for msgs in _chat(random.Random(7), turns):
            assert enc.encode(msgs, "") == engine.encode(msgs)
        for k in (turns - 3, 3):  # rewinds: back to an earlier turn with a new message
            branch = msgs[:1 + 2 * k] + [{"role": "user", "content": f"Back to {k}: why?"}]
            assert enc.encode(branch, "") == engine.encode(branch)
    finally:
        engine.close()


@pytest.fixture(params=["qwen3", "gemma3"])
def counted(request):
    """(a demo model's engine, its tokenizer counting what it encodes, encodings over it)."""
    lm = load_tiny(request.param)
    engine = Engine(lm)
    tok = Counting(lm.tokenizer)
    try:
        yield engine, tok, ChatEncodings(tok, lm.name)
    finally:
        engine.close()


def test_each_request_gets_the_engines_tokens_and_encodes_its_new_part(counted):
    engine, tok, enc = counted
    requests = _chat(random.Random(5), 14)
    late = []
    for i, msgs in enumerate(requests):
        before = tok.encoded
        assert enc.encode(msgs, "a") == engine.encode(msgs), i
        late.append(tok.encoded - before)
    whole = len(tok.apply_chat_template(requests[-1], tokenize=False,
                                        add_generation_prompt=True))
    # past the checked uses a request encodes its tail, not the conversation
    assert max(late[token_extend.CHECKED_USES + 2:]) < whole / 3


def test_a_namespace_never_extends_another_namespaces_render(monkeypatch):
    lm = load_tiny("qwen3")
    enc = ChatEncodings(lm.tokenizer, lm.name)
    seen = []
    real = token_extend.extend_encoding

    def spy(tok, encode, text, old_text, old_tokens):
        seen.append(old_text)
        return real(tok, encode, text, old_text, old_tokens)

    monkeypatch.setattr("forkv.server.chat_encode.extend_encoding", spy)
    first, second = _chat(random.Random(1), 2)
    enc.encode(first, "tenant-a")
    enc.encode(second, "tenant-b")  # starts with tenant-a's render, but is not theirs
    assert seen == []
    enc.encode(first, "tenant-c")
    enc.encode(second, "tenant-c")  # extends its own first render
    assert len(seen) == 1


def test_what_is_kept_is_bounded():
    lm = load_tiny("qwen3")
    enc = ChatEncodings(lm.tokenizer, lm.name, per_namespace=2, max_tokens=400)
    for ns in range(30):
        for msgs in _chat(random.Random(ns), 3):
            enc.encode(msgs, f"ns{ns}")
    assert enc._tokens <= 400
    assert enc._tokens == sum(len(t) for kept in enc._kept.values() for _, t in kept)
    assert all(len(kept) <= 2 for kept in enc._kept.values())
    assert "ns29" in enc._kept  # the most recent stays


def test_rewinds_and_edits_encode_from_what_they_share(counted):
    """A request that goes back to an earlier turn with a new message (a rewind), or edits
    the last one, shares only part of the last render: the engine's tokens, encoded from the
    last special token inside the shared part."""
    engine, tok, enc = counted
    requests = _chat(random.Random(8), 10)
    for msgs in requests[:token_extend.CHECKED_USES + 2]:
        enc.encode(msgs, "a")
    full = requests[-1]
    enc.encode(full, "a")
    whole = len(tok.apply_chat_template(full, tokenize=False, add_generation_prompt=True))
    branches = [full[:1 + 2 * k] + [{"role": "user", "content": f"Back to {k}?"}]
                for k in (7, 3, 8)]
    branches.append(full[:-1] + [{"role": "user", "content": "An edited last ask."}])
    for msgs in branches:
        before = tok.encoded
        assert enc.encode(msgs, "a") == engine.encode(msgs)
        assert tok.encoded - before < whole / 3
