"""Constrained decoding: what a row's output must match, and a per-row matcher over its logits.

A `Constraint` says what the generated text must match: a JSON schema, any JSON object, a
regular expression or a Lark grammar (llguidance's dialect, which may embed JSON schemas with
`%json {...}`). It is plain data, so it travels in `SamplingParams` and in saved trees. A
`RowMatcher` is one row's compiled state: `mask(logits, generated)` advances it over the tokens
the row has accepted since the last call and sets every token the grammar forbids to -inf; once
the grammar is complete only end-of-sequence stays allowed. Matching is llguidance's (the
library vLLM, SGLang and llama.cpp use; ~50 us a token on a 126K vocabulary on this CPU, see
`forkv bench constrained`). Knows tokenizers only as a Hugging Face fast tokenizer (or
mlx-lm's wrapper of one); knows nothing about models or batches.
"""

from __future__ import annotations

import copy
import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GenerationError
from ..models.tokenizer_layers import hf_tokenizer

__all__ = ["KINDS", "Constraint", "RowMatcher", "as_constraint", "ll_tokenizer"]

KINDS = ("json_schema", "json_object", "regex", "grammar")

# Compact JSON, as json.dumps and Jinja's tojson write it (", " and ": "), so a constrained
# output re-renders through a chat template to the very tokens that were generated.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True, slots=True)
class Constraint:
    """What a row's output must match: `kind` is one of `KINDS`; `spec` the schema as JSON
    text, the regex, or the Lark grammar (empty for json_object)."""

    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GenerationError(f"constraint kind {self.kind!r} is unknown; use one of "
                                  f"{', '.join(KINDS)}.")
        if self.kind != "json_object" and not self.spec:
            raise GenerationError(f"a {self.kind} constraint needs its {self.kind}; pass it.")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | type) -> Constraint:
        """Output must be JSON valid under `schema` (a dict, JSON text or a pydantic model)."""
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        return cls("json_schema", text)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, lark: str) -> Constraint:
        return cls("grammar", lark)

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object")

    def to_llguidance(self) -> str:
        """The grammar llguidance compiles for this constraint."""
        from llguidance import LLMatcher

        if self.kind == "grammar":
            return LLMatcher.grammar_from_lark(self.spec)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        try:
            schema = json.loads(self.spec) if self.kind == "json_schema" else {"type": "object"}
        except json.JSONDecodeError as e:
            raise GenerationError(f"the json_schema constraint is not valid JSON ({e}); "
                                  "pass a JSON schema object.") from e
        return LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)


def as_constraint(value: Any) -> Constraint | None:
    """A `Constraint` from None, a Constraint, a `(kind, spec)` pair, a one-key mapping
    `{kind: spec}`, or any object with `kind` and `spec` attributes (the graph's)."""
    if value is None or isinstance(value, Constraint):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Constraint(*value)
    if isinstance(value, Mapping) and len(value) == 1:
        kind, spec = next(iter(value.items()))
        if kind == "json_schema":
            return Constraint.json_schema(spec)
        return Constraint(kind, spec or "")
    if hasattr(value, "kind") and hasattr(value, "spec"):
        return Constraint(value.kind, value.spec)
    raise GenerationError(f"constraint {value!r} is not understood; pass a "
                          "forkv.engine.Constraint such as Constraint.json_schema(schema).")


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _backend(tokenizer: Any) -> Any:
    """The Hugging Face fast tokenizer under mlx-lm's wrapper (or the tokenizer itself), or a
    clear error."""
    inner = hf_tokenizer(tokenizer)
    if not hasattr(inner, "backend_tokenizer"):
        raise GenerationError("constrained decoding needs a Hugging Face fast tokenizer; this "
                              f"model's is a {type(inner).__name__}.")
    return inner


def ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of `tokenizer` (built once per tokenizer: ~2 s on a 126K vocab)."""
    from llguidance import LLTokenizer

    inner = _backend(tokenizer)
    with _LOCK:
        found = _TOKENIZERS.get(inner)
        if found is None:
            eos = getattr(tokenizer, "eos_token_ids", None) or inner.eos_token_id
            eos = sorted(eos) if not isinstance(eos, int) else [eos]
            backend = copy.copy(inner.backend_tokenizer)
            backend.no_padding()
            backend.no_truncation()
            found = LLTokenizer(backend.to_str(), eos_token=eos[0] if len(eos) == 1 else eos)
            _TOKENIZERS[inner] = found
    return found


class RowMatcher:
    """One row's constraint state: masks its logits and advances over its accepted tokens."""

    def __init__(self, constraint: Constraint, tokenizer: Any):
        from llguidance import LLMatcher

        self.constraint = constraint
        self._tok = ll_tokenizer(tokenizer)
        self._matcher = LLMatcher(self._tok, constraint.to_llguidance(), log_level=0)
        if self._matcher.is_error():
            raise GenerationError(f"the {constraint.kind} constraint does not compile "
                                  f"({self._matcher.get_error()}); fix it.")
        self.num_consumed = 0
        self._words = (self._tok.vocab_size + 31) // 32

    @property
    def is_accepting(self) -> bool:
        """True when the text so far is a complete match."""
        return self._matcher.is_accepting()

    def advance(self, generated: Sequence[int]) -> None:
        """Feed the tokens of `generated` (the row's output so far) not consumed yet."""
        for token in generated[self.num_consumed:]:
            if self._matcher.is_stopped():  # end of sequence after a complete match
                break
            if not self._matcher.consume_token(int(token)):
                raise GenerationError(f"token {token} breaks the {self.constraint.kind} "
                                      f"constraint ({self._matcher.get_error()}).")
        self.num_consumed = len(generated)

    def allowed(self, generated: Sequence[int] = ()) -> Any:
        """A numpy bool array over the tokenizer's vocabulary: tokens allowed next."""
        import numpy as np

        self.advance(generated)
        words = np.zeros(self._words, dtype=np.int32)
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if self._matcher.is_error():
            raise GenerationError(f"the {self.constraint.kind} constraint failed "
                                  f"({self._matcher.get_error()}).")
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        return bits[: self._tok.vocab_size].astype(bool)

    def mask(self, logits: Any, generated: Sequence[int] = ()) -> Any:
        """`logits` ([vocab], mlx) with every token the constraint forbids next set to -inf."""
        import mlx.core as mx
        import numpy as np

        mx.async_eval(logits)  # the forward pass runs while this thread computes the mask
        allowed = self.allowed(generated)
        size = logits.shape[-1]
        if allowed.shape[0] < size:  # padded model vocabularies: ids past the tokenizer's
            allowed = np.concatenate([allowed, np.zeros(size - allowed.shape[0], bool)])
        return mx.where(mx.array(allowed[:size]), logits, -mx.inf)
