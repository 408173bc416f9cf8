"""A model's tokenizer loaded as mlx-lm loads it, without a second whole parse of tokenizer.json.

mlx-lm's `tokenizer_utils.load` reads tokenizer.json with `json.load` only to pick its streaming
detokenizer from the file's "decoder" section, and keeps that dict while transformers parses
the same file again: for Gemma 3's 262K-token vocabulary the two together set the peak of the
whole model load (an RSS high-water of 795 MiB, against 525 once loaded; the dict alone holds
~165 MiB). `load_tokenizer` runs mlx-lm's own loader with its `json.load` of that one file
answered by the file's top-level "decoder" value, read alone (`decoder_section`): the
detokenizer, chat template, tool parser and end-of-sequence ids are still mlx-lm's choices. A
file whose "decoder" comes after its "model" (the writers we know put it before), or that
this reader cannot walk, is parsed whole, as before.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

__all__ = ["decoder_section", "load_tokenizer"]

_SPACE = re.compile(r"\s*")
_LOCK = threading.Lock()  # one patched load at a time


def decoder_section(path: str | Path) -> dict | None:
    """{"decoder": value} of a tokenizer.json (or {} where it has none), its top-level keys
    walked in order and only the values before "decoder" decoded; None where "model" (the
    vocabulary) comes first or the file is not a JSON object."""
    text = Path(path).read_text(encoding="utf-8")
    decode = json.JSONDecoder().raw_decode
    try:
        i = _SPACE.match(text, 0).end()
        if text[i] != "{":
            return None
        i = _SPACE.match(text, i + 1).end()
        while text[i] != "}":
            key, i = decode(text, i)
            i = _SPACE.match(text, i).end()
            if not isinstance(key, str) or text[i] != ":":
                return None
            i = _SPACE.match(text, i + 1).end()
            if key == "decoder":
                return {"decoder": decode(text, i)[0]}
            if key == "model":
                return None
            i = _SPACE.match(text, decode(text, i)[1]).end()
            if text[i] == ",":
                i = _SPACE.match(text, i + 1).end()
        return {}
    except (ValueError, IndexError):
        return None


class _SectionJson:
    """The `json` module for mlx-lm's tokenizer_utils during one load: `load` of `file` gives
    `section`; everything else is json's."""

    def __init__(self, file: Path, section: dict):
        self._file, self._section = file, section

    def load(self, fp, *args, **kwargs):
        if Path(getattr(fp, "name", "")).resolve() == self._file:
            return self._section
        return json.load(fp, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(json, name)


def load_tokenizer(path: str | Path, eos_token_ids=None, *, loader=None):
    """`loader(path, eos_token_ids=...)` (default mlx-lm's `utils.load_tokenizer`) with its
    read of tokenizer.json's decoder section taken from `decoder_section`."""
    from mlx_lm import tokenizer_utils

    if loader is None:
        from mlx_lm.utils import load_tokenizer as loader
    file = (Path(path) / "tokenizer.json").resolve()
    section = decoder_section(file) if file.is_file() else None
    if section is None or getattr(tokenizer_utils, "json", None) is not json:
        return loader(path, eos_token_ids=eos_token_ids)  # (mlx-lm reads it another way)
    with _LOCK:
        tokenizer_utils.json = _SectionJson(file, section)
        try:
            return loader(path, eos_token_ids=eos_token_ids)
        finally:
            tokenizer_utils.json = json
