"""Turns a stream of token ids into text deltas, holding back text that may start a stop string.

Deltas are whole characters: a character split over byte tokens (Gemma's and Llama's `<0xF0>`
byte fallback, byte-level BPE) is held until it is complete, so no delta carries half of one
or a stray U+FFFD, and the deltas add up to `tokenizer.decode(ids)` of the ids fed. The text is
the tokenizer's own `decode` over a short window (the last emitted piece's tokens as context,
then the ones since), as vLLM and TGI stream: right for every tokenizer, where mlx-lm's
streaming detokenizers drop a leading space (BPE), count invalid bytes differently (SPM) or
re-decode the whole line per token (the naive one). Knows tokenizers; knows nothing about models.
"""

from __future__ import annotations

import weakref

from ..models.tokenizer_layers import hf_tokenizer, raw_tokenizer

_REPLACEMENT = "\ufffd"
_BYTE_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plain_decode(tokenizer):
    """`tokenizer.decode` for a list of ids, as a function. For a `tokenizers`-backed
    transformers tokenizer that cleans up no spaces (every model forkv ships), that is the
    backend's own `decode`, skipping transformers' per-call conversions (half of the
    streaming detokenizer's cost, which runs twice a generated token); any other tokenizer,
    or one whose class changes decoding, keeps its `decode`."""
    hf = hf_tokenizer(tokenizer)
    raw = raw_tokenizer(hf)
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return tokenizer.decode
    cls = type(hf)
    if (raw is None or getattr(hf, "clean_up_tokenization_spaces", None) is not False
            or cls.decode is not PreTrainedTokenizerBase.decode
            or getattr(cls, "_decode", None) is not TokenizersBackend._decode):
        return tokenizer.decode
    decode = raw.decode
    return lambda ids: decode(ids, skip_special_tokens=False)


def byte_token_ids(tokenizer) -> frozenset[int]:
    """The ids of the byte-fallback tokens `<0x00>` ... `<0xFF>` (empty for byte-level BPE),
    looked up once per tokenizer."""
    try:
        return _BYTE_TOKENS[tokenizer]
    except (KeyError, TypeError):
        pass
    found: frozenset[int] = frozenset()
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is not None:
        names = [f"<0x{b:02X}>" for b in range(256)]
        ids = convert(names)
        back = tokenizer.convert_ids_to_tokens([i for i in ids if i is not None])
        found = frozenset(i for i, name in zip([i for i in ids if i is not None], back)
                          if name in names)
    try:
        _BYTE_TOKENS[tokenizer] = found
    except TypeError:
        pass
    return found


class IncrementalDecoder:
    """`tokenizer.decode` fed one token at a time; `add` returns the new complete text.

    A run of byte-fallback tokens is decoded as a whole (a tokenizer replaces every byte of a
    run that is not valid UTF-8, even the bytes of a valid character in it): text is emitted
    only after a token that is not a byte token, so a window never starts inside a run.
    """

    def __init__(self, tokenizer):
        self._decode = plain_decode(tokenizer)
        self._bytes = byte_token_ids(tokenizer)
        self.ids: list[int] = []
        self._start = 0  # the window: ids[_start:] are decoded on each add
        self._read = 0  # ids[:_read] are emitted
        self._head = ""  # decode(ids[_start:_read]), the window's already emitted text

    def add(self, token: int) -> str:
        self.ids.append(int(token))
        text = self._decode(self.ids[self._start:])
        if (len(text) <= len(self._head) or text.endswith(_REPLACEMENT)
                or self.ids[-1] in self._bytes):
            return ""  # nothing yet, or a character still waiting for its other bytes
        return self._emit(text)

    def finish(self) -> str:
        """The text still held (a character left incomplete decodes as U+FFFD, as `decode`)."""
        if self._read == len(self.ids):
            return ""
        text = self._decode(self.ids[self._start:])
        return self._emit(text) if len(text) > len(self._head) else ""

    def _emit(self, text: str) -> str:
        out = text[len(self._head):]
        self._start, self._read = self._read, len(self.ids)
        self._head = self._decode(self.ids[self._start:self._read])
        return out


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self._detok = IncrementalDecoder(tokenizer)
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._text = ""
        self._emitted = 0
        self.stopped = False

    def add(self, token: int) -> str:
        """Feed one token; return the text that is now safe to emit."""
        self._text += self._detok.add(token)
        return self._flush(final=False)

    def finish(self) -> str:
        self._text += self._detok.finish()
        return self._flush(final=True)

    @property
    def text(self) -> str:
        return self._text[: self._emitted] if self.stopped else self._text

    def _flush(self, final: bool) -> str:
        if self._stop and not self.stopped:
            # Search only where a new match can be: from the oldest unemitted char minus a
            # stop's length.
            start = max(0, self._emitted - self._hold)
            hits = [i for i in (self._text.find(s, start) for s in self._stop) if i >= 0]
            if hits:
                self.stopped = True
                cut = min(hits)
                out = self._text[self._emitted:cut]
                self._emitted = cut
                return out
        if self.stopped:
            return ""
        upto = len(self._text) if final else max(self._emitted, len(self._text) - self._hold)
        out = self._text[self._emitted:upto]
        self._emitted = upto
        return out
