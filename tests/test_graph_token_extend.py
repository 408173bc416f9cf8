"""Encoding from a shared prefix (graph/token_extend.py): the same tokens as a whole encode on
Hugging Face tokenizers, by construction and checked; no shortcut where it cannot be shown."""

import random

import pytest

from conftest import load_tiny
from forkv.graph import Tree, render
from forkv.graph import token_extend
from forkv.graph.testing import ToyTokenizer
from forkv.graph.token_extend import extend_encoding


def _encoder(tok):
    return lambda text: list(tok.encode(text, add_special_tokens=False))


def _chat_texts(tok, turns: int, rng: random.Random) -> list[str]:
    """Whole renders of a growing chat (prompt and done path per turn), in order."""
    msgs = [{"role": "system", "content": "Be terse."}]
    out = []
    for t in range(turns):
        words = " ".join(rng.choice(["log", "line", "  two", "x\ny", "é", "ok?", "aa"])
                         for _ in range(rng.randrange(1, 12)))
        msgs.append({"role": "user", "content": f"turn {t}: {words}"})
        out.append(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
        msgs.append({"role": "assistant", "content": rng.choice(["ok", "no", " yes ", "a\n"])})
        out.append(tok.apply_chat_template(msgs, tokenize=False))
    return out


def _check_pairs(tok, texts):
    encode = _encoder(tok)
    used = 0
    for old, new in zip(texts, texts[1:]):
        old_tokens = encode(old)
        for a, b in ((old, new), (new, old[: len(old) * 2 // 3])):  # longer, then a prefix
            base = encode(a) if a is not old else old_tokens
            got = extend_encoding(tok, encode, b, a, base)
            if got is not None:
                used += 1
                assert got == encode(b)
    return used


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_extends_equal_whole_encodes_on_demo_tokenizers(arch):
    tok = load_tiny(arch).tokenizer
    used = _check_pairs(tok, _chat_texts(tok, 12, random.Random(3)))
    assert used > token_extend.CHECKED_USES  # the shortcut ran, past its checked uses


def test_texts_that_part_or_lack_special_tokens_encode_whole():
    tok = load_tiny("qwen3").tokenizer
    encode = _encoder(tok)
    assert extend_encoding(tok, encode, "abc def", "abd", encode("abd")) is None
    assert extend_encoding(tok, encode, "plain text, more", "plain text",
                           encode("plain text")) is None  # no special token to cut at
    toy = ToyTokenizer()  # no `tokenizers` backend: no shortcut
    assert extend_encoding(toy, _encoder(toy), "<|im_start|>a b", "<|im_start|>a",
                           toy.encode("<|im_start|>a")) is None


def test_a_tokenizer_that_does_not_cut_at_special_tokens_loses_the_shortcut():
    tok = load_tiny("qwen3").tokenizer

    class Sticky:  # the same backend table, but an encode that merges across special tokens
        _tokenizer = tok._tokenizer

        def encode(self, text, add_special_tokens=False):
            ids = list(tok.encode(text, add_special_tokens=False))
            return [len(text)] + ids  # depends on the whole text

    sticky = Sticky()
    encode = _encoder(sticky)
    texts = _chat_texts(tok, 3, random.Random(1))
    got = extend_encoding(sticky, encode, texts[2], texts[1], encode(texts[1]))
    # The tail check refuses it (or a whole-encode check would catch it and turn it off).
    assert got is None or got == encode(texts[2])
    table = token_extend._specials(sticky)
    assert table is None or table.checks_left == token_extend.CHECKED_USES


def test_a_mismatch_in_a_checked_use_turns_the_shortcut_off(monkeypatch):
    tok = load_tiny("qwen3").tokenizer
    texts = _chat_texts(tok, 2, random.Random(2))
    calls = []

    class Liar:  # cuts cleanly at the old text's tail, lies only on the whole new text
        _tokenizer = tok._tokenizer

        def encode(self, text, add_special_tokens=False):
            calls.append(text)
            ids = list(tok.encode(text, add_special_tokens=False))
            return ids + [1] if text == texts[2] else ids

    liar = Liar()
    encode = _encoder(liar)
    got = extend_encoding(liar, encode, texts[2], texts[1], encode(texts[1]))
    assert got == encode(texts[2])  # the whole encode's answer, which is the contract
    assert token_extend._specials(liar) is None  # and no more shortcuts for it
    assert extend_encoding(liar, encode, texts[3], texts[2], encode(texts[2])) is None


def test_renders_on_a_demo_tokenizer_equal_renders_from_scratch():
    tok = load_tiny("qwen3").tokenizer
    tree = Tree()
    node = tree.system("You are terse.")
    for turn in range(10):
        answer = node.user(f"question {turn}: " + "why " * turn).final()
        prompt = render(tree, answer, tok)
        tree.attach(answer, f"answer {turn}")
        done = render(tree, answer, tok)
        saved = tree.__dict__.pop("_render_cache")
        try:
            assert render(tree, answer, tok).token_ids == done.token_ids
        finally:
            tree.__dict__["_render_cache"] = saved
        assert done.token_ids[: len(prompt.token_ids)] == prompt.token_ids
        node = answer


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_extends_equal_whole_encodes_on_real_tokenizers(name):
    from forkv.engine import load_model
    from forkv.engine.models.named import NAMED_MODELS

    if not NAMED_MODELS[name].is_local():
        pytest.skip(f"{name} is not fetched here: run `forkv pull {name}`")
    tok = load_model(name).tokenizer
    texts = _chat_texts(tok, 10, random.Random(5))
    assert _check_pairs(tok, texts) > token_extend.CHECKED_USES


# Gemma's 262K-word tokenizer takes ~6 s to load: its case runs with --slow
@pytest.mark.parametrize("name", [pytest.param("gemma3-270m", marks=pytest.mark.slow),
                                  "smollm2-135m"])
def test_mlx_lm_detokenizer_is_built_only_when_asked_for(name):
    # forkv streams with its own text stream; mlx-lm's SPM detokenizer holds every token's
    # bytes (17 MiB for Gemma 3). Asked for, it is the one mlx-lm would have built.
    from forkv.engine import load_model
    from forkv.engine.models.named import NAMED_MODELS

    if not NAMED_MODELS[name].is_local():
        pytest.skip(f"{name} is not fetched here: run `forkv pull {name}`")
    tok = load_model(name).tokenizer
    assert type(tok._detokenizer).__name__ == "_LazyDetokenizer"
    ids = tok.encode("Hello there, a café\n  indented")
    detok = tok.detokenizer
    assert type(tok._detokenizer).__name__.endswith("StreamingDetokenizer")
    for i in ids:
        detok.add_token(i)
    detok.finalize()
    assert detok.text.strip() == tok.decode(ids).strip()


def test_cut_at_special_gives_a_prefix_and_its_tokens():
    from forkv.graph.token_extend import cut_at_special

    tok = load_tiny("qwen3").tokenizer
    encode = _encoder(tok)
    texts = _chat_texts(tok, 6, random.Random(4))
    text = texts[-1]
    tokens = encode(text)
    for limit in (len(text), len(text) // 2, len(text) // 5):
        cut_text, cut_tokens = cut_at_special(tok, text, tokens, limit)
        assert text.startswith(cut_text) and len(cut_text) <= limit
        assert list(cut_tokens) == encode(cut_text)
        assert tok.decode([tokens[len(cut_tokens)]]).startswith("<|")  # a special token next
    assert cut_at_special(tok, text, tokens, 3) is None  # none inside the first 3 characters
    assert cut_at_special(ToyTokenizer(), "<|im_start|>a", [1, 2], 13) is None
