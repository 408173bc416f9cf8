"""Turns a stream of token ids into text deltas, holding back text that may start a stop string.

Knows the tokenizer's streaming detokenizer and stop strings; knows nothing about models.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self._detok = tokenizer.detokenizer
        self._detok.reset()
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._text = ""
        self._emitted = 0
        self.stopped = False

    def add(self, token: int) -> str:
        """Feed one token; return the text that is now safe to emit."""
        self._detok.add_token(token)
        self._text += self._detok.last_segment
        return self._flush(final=False)

    def finish(self) -> str:
        self._detok.finalize()
        self._text += self._detok.last_segment
        return self._flush(final=True)

    @property
    def text(self) -> str:
        return self._text[: self._emitted] if self.stopped else self._text

    def _flush(self, final: bool) -> str:
        if self._stop and not self.stopped:
            # Search only where a new match can be: from the oldest unemitted char minus a stop's length.
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
