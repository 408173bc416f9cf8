from conftest import load_tiny
from forkv.engine.request.textstream import TextStream


def _feed(stream, tok, text):
    out = "".join(stream.add(t) for t in tok.encode(text, add_special_tokens=False))
    return out + stream.finish()


def test_plain_text_roundtrips():
    tok = load_tiny("qwen3").tokenizer
    assert _feed(TextStream(tok), tok, "héllo wörld") == "héllo wörld"


def test_stop_string_cuts_and_never_leaks():
    tok = load_tiny("qwen3").tokenizer
    s = TextStream(tok, ("STOP",))
    pieces = [s.add(t) for t in tok.encode("abc STO more STOP tail", add_special_tokens=False)]
    assert "".join(pieces) + s.finish() == "abc STO more "
    assert s.stopped and s.text == "abc STO more "
    assert all("STOP" not in p for p in pieces)


def _same_decoding(tok, rng, vocab):
    from forkv.engine.request.textstream import plain_decode

    decode = plain_decode(tok)
    assert decode is not tok.decode  # the fast path is taken for this tokenizer
    for n in (1, 2, 5, 40):
        for _ in range(30):
            ids = [rng.randrange(vocab) for _ in range(n)]
            assert decode(ids) == tok.decode(ids), ids


def test_plain_decode_is_the_tokenizers_decode():
    # Special tokens, byte pieces and odd neighbours included: any id of the vocabulary.
    import random

    for arch in ("qwen3", "gemma3"):
        tok = load_tiny(arch).tokenizer
        _same_decoding(tok, random.Random(7), len(tok.get_vocab()))


def test_plain_decode_keeps_a_cleaning_tokenizers_own_decode():
    from forkv.engine.request.textstream import plain_decode

    tok = load_tiny("qwen3").tokenizer
    hf = tok._tokenizer
    hf.clean_up_tokenization_spaces = True
    try:
        assert plain_decode(tok) == tok.decode
    finally:
        hf.clean_up_tokenization_spaces = False
