"""Response objects of the engine: streamed events, the final result, and timings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Timings:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # restored from checkpoints
    computed_tokens: int = 0  # prompt tokens prefilled
    generated_tokens: int = 0
    restore_s: float = 0.0
    prefill_s: float = 0.0
    first_token_s: float = 0.0  # from the call to the first sampled token
    decode_s: float = 0.0
    drafted_tokens: int = 0  # draft tokens verified (speculative decoding)
    accepted_tokens: int = 0  # of those, the ones the model drew itself

    @property
    def prefill_tps(self) -> float:
        return self.computed_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        n = self.generated_tokens - 1  # the first token comes out of prefill
        return n / self.decode_s if self.decode_s and n > 0 else 0.0

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__}
        d.update(prefill_tps=self.prefill_tps, decode_tps=self.decode_tps)
        return d


@dataclass(slots=True)
class GenerationEvent:
    """One streamed piece: new text and token ids; `finish_reason` set on the last event."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None  # "stop" (EOS or stop string), "length", "cancelled"
    timings: Timings | None = None
    # Per token, the `SamplingParams.top_logprobs` most likely ids and their logprobs.
    top_logprobs: list[dict[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    timings: Timings = field(default_factory=Timings)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # The prompt's block keys in its namespace, as the engine planned them (empty without
    # checkpoints, and from backends that do not say)
    block_keys: list[bytes] = field(default_factory=list)
