"""A Responses-shaped conversation (user, reasoning, final per turn; each node rendered as its
prompt and again once attached) renders incrementally to exactly the tokens, text and spans of
a render from scratch, with real Hugging Face tokenizers and chat templates: the demo Qwen3
model's (which drops old reasoning once a user turn follows) and, if fetched, SmolLM2-135M's."""

from __future__ import annotations

import pytest
from forkv.engine.models.named import NAMED_MODELS
from forkv.graph import ReasoningFormat, Tree, render
from forkv.runner import reasoning_format


def full_render(tree, node, tok, fmt):
    saved = tree.__dict__.pop("_render_cache", None)
    try:
        return render(tree, node, tok, fmt)
    finally:
        tree.__dict__["_render_cache"] = saved


def _same(a, b) -> bool:
    return (a.prompt_text, a.token_ids, a.spans) == (b.prompt_text, b.token_ids, b.spans)


def _conversation(tok, fmt: ReasoningFormat, turns: int, thinks: bool) -> int:
    """Run the turns; each render is checked against one from scratch. The template calls
    the incremental renders of the last turn made (a render from scratch makes one a node)."""
    calls = 0
    real = tok.apply_chat_template

    def counting(*a, **kw):
        nonlocal calls
        calls += 1
        return real(*a, **kw)

    tree = Tree()
    node = tree.system("You answer briefly.")
    for turn in range(turns):
        user = node.user(f"Question {turn}: " + "word " * 40)
        # The same thought and answer each turn, as a greedy tiny model gives.
        pending = [(user.reasoning(), "Hmm, words.")] if thinks else []
        calls = 0
        for n, text in pending + [(None, "Words.")]:
            if n is None:
                n = (pending[0][0] if thinks else user).final()
            for _ in range(2):  # its prompt, then the whole path once attached
                tok.apply_chat_template = counting
                try:
                    got = render(tree, n, tok, fmt)
                finally:
                    del tok.apply_chat_template
                assert _same(got, full_render(tree, n, tok, fmt)), (turn, n.kind)
                if n.is_pending:
                    tree.attach(n, text)
        node = n
    return calls


def _tokenizer(name: str):
    from forkv.engine import load_model

    return load_model(name).tokenizer


@pytest.mark.slow  # (4 s: 40 turns rendered fresh at each depth)
def test_demo_qwen3_thinking_turns_render_exactly_at_any_depth():
    tok = _tokenizer("demo:qwen3:tiny")
    fmt = reasoning_format(tok)
    assert _conversation(tok, fmt, 24, thinks=True) <= 3  # not one per node on the path


def test_demo_qwen3_plain_turns_render_exactly():
    tok = _tokenizer("demo:qwen3:tiny")
    assert _conversation(tok, reasoning_format(tok), 12, thinks=False) <= 3


@pytest.mark.slow
@pytest.mark.skipif(not NAMED_MODELS["smollm2-135m"].is_local(),
                    reason="smollm2-135m is not fetched here: run `forkv pull smollm2-135m`")
@pytest.mark.parametrize("thinks", [False, True], ids=["plain", "thinking"])
def test_smollm2_turns_render_exactly(thinks):
    tok = _tokenizer("smollm2-135m")
    assert _conversation(tok, reasoning_format(tok), 20, thinks=thinks) <= 3
