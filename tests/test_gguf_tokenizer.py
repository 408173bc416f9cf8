"""GGUF tokenizers: tiny `gpt2` (byte-level BPE) and `llama` (SentencePiece) vocabularies
round-trip through the converted tokenizer files; a hostile chat template stays sandboxed."""

import json

import pytest
from forkv.engine.models.gguf import GGUFError, read_gguf_header
from forkv.engine.models.gguf.tokenizer import save_tokenizer
from gguf_files import bpe_vocab, sentencepiece_vocab, write_gguf

TEXTS = ["hello world", "the  world\n\nhello", "  a b", "caf\u00e9 \U0001f999", "x\ty\r\n"]


def _tokenizer(tmp_path, arch, vocab, template=None):
    from transformers import AutoTokenizer

    def extra(writer):
        if template is not None:
            writer.add_chat_template(template)

    src = tmp_path / "tok.gguf"
    write_gguf(src, arch, {}, vocab=vocab, extra=extra)
    out = tmp_path / "tok"
    out.mkdir()
    save_tokenizer(read_gguf_header(src), out)
    return AutoTokenizer.from_pretrained(str(out)), out


def test_byte_level_bpe_round_trips(tmp_path):
    vocab = bpe_vocab()
    tok, _ = _tokenizer(tmp_path, "qwen2", vocab)
    tokens = vocab["tokenizer.ggml.tokens"]
    ids = tok.encode("hello world", add_special_tokens=True)
    assert [tokens[i] for i in ids] == ["hello", "\u0120world"]  # merges applied, no BOS
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("hi<|im_end|>")
    assert ids[-1] == tokens.index("<|im_end|>")  # a control token stays whole


def test_sentencepiece_adds_bos_and_round_trips(tmp_path):
    vocab = sentencepiece_vocab()
    tok, _ = _tokenizer(tmp_path, "llama", vocab)
    tokens = vocab["tokenizer.ggml.tokens"]
    ids = tok.encode("hello world")
    assert ids[0] == 1  # llama.cpp adds BOS to a llama-type vocabulary by default
    assert [tokens[i] for i in ids[1:]] == ["\u2581hello", "\u2581world"]
    # Not "  a b": transformers' Metaspace prepends no space to text that starts with one, so
    # decoding drops one of them (llama.cpp would encode three); Gemma sets no prefix space.
    for text in TEXTS[:2] + TEXTS[3:]:
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == text
    assert "<0xF0>" in [tokens[i] for i in tok.encode("\U0001f999")]  # byte fallback


def test_chat_template_is_saved(tmp_path):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    tok, out = _tokenizer(tmp_path, "qwen2", bpe_vocab(), template)
    saved = json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    assert saved == template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<user>hi"


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('echo pwned') }}",
])
def test_hostile_chat_template_is_sandboxed(tmp_path, template):
    from jinja2.exceptions import SecurityError

    tok, _ = _tokenizer(tmp_path, "qwen2", bpe_vocab(), template)
    with pytest.raises(SecurityError):
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_unknown_tokenizer_type_is_one_line(tmp_path):
    vocab = dict(bpe_vocab(), **{"tokenizer.ggml.model": "rwkv"})
    with pytest.raises(GGUFError, match="'rwkv'"):
        _tokenizer(tmp_path, "qwen2", vocab)
