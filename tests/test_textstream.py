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
