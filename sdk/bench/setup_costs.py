"""Fixed per-request costs that grow with the vocabulary (262K tokens on Gemma 3), measured.

Each case times one thing a request (or a new engine, e.g. a server tenant's) pays before or
beside its model work: the vocabulary size, the text streamer, a sequence's sampler, a sampling
step per filter, top logprobs, a constrained row's compile and first mask, block keys, prompt
encoding. Reports the median and the first call in ms, so caches built on first use show up
(llguidance's tokenizer view is built once per tokenizer and reported apart). Not wired into
`forkv bench` yet: `python -m forkv.bench.setup_costs MODEL` prints the table.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

__all__ = ["measure_setup_costs"]


def _time(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times[0]


def measure_setup_costs(model: str, reps: int = 7) -> dict[str, tuple[float, float]]:
    """{case: (median ms, first-call ms)} on `model` (a model name)."""
    from forkv.engine import SamplingParams, load_model
    from forkv.engine.models import blas

    blas.activate()  # before mlx is imported
    import mlx.core as mx
    from forkv.engine.cache.blocks import BlockKeyer
    from forkv.engine.models.special_tokens import encode_text
    from forkv.engine.request.constrain import Constraint, RowMatcher, ll_tokenizer
    from forkv.engine.request.sampling import Sampler, top_logprobs, vocab_limit
    from forkv.engine.request.sequence import make_sequence
    from forkv.engine.request.textstream import TextStream

    lm = load_model(model)
    tok = lm.tokenizer
    rows: dict[str, tuple[float, float]] = {}
    rows["vocab_limit (once per tokenizer)"] = _time(lambda: vocab_limit(lm), reps)
    rows["TextStream()"] = _time(lambda: TextStream(tok), reps)
    limit = vocab_limit(lm)
    rows["make_sequence"] = _time(
        lambda: make_sequence(0, [1, 2], SamplingParams(), lm, limit), reps)
    logits = mx.random.normal((_vocab_rows(lm),))
    mx.eval(logits)
    bias = {i: -5.0 for i in range(100)}
    for name, params in (("greedy", {}), ("temperature 1", {"temperature": 1.0}),
                         ("top_p 0.9", {"temperature": 1.0, "top_p": 0.9}),
                         ("top_p 0.8 (a new value)", {"temperature": 1.0, "top_p": 0.8}),
                         ("min_p 0.05", {"temperature": 1.0, "min_p": 0.05}),
                         ("top_k 50", {"temperature": 1.0, "top_k": 50}),
                         ("logit_bias x100", {"logit_bias": bias}),
                         ("repetition_penalty", {"repetition_penalty": 1.1})):
        sampler = Sampler(SamplingParams(seed=0, **params), limit, 2, tok)
        rows[f"sampling step: {name}"] = _time(lambda s=sampler: mx.eval(*s(logits, [1, 2])),
                                               reps)
    logprobs = logits - mx.logsumexp(logits)
    mx.eval(logprobs)
    rows["top_logprobs 5"] = _time(lambda: top_logprobs(logprobs, 5), reps)
    rows["ll_tokenizer (once per tokenizer)"] = _time(lambda: ll_tokenizer(tok), 1)
    schema = Constraint.json_schema({"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer"}, "b": {"type": "string"}}})
    rows["RowMatcher(json_schema)"] = _time(lambda: RowMatcher(schema, tok), reps)
    matcher = RowMatcher(schema, tok)
    rows["constrained mask, first step"] = _time(lambda: mx.eval(matcher.mask(logits, [])), reps)
    keyer = BlockKeyer(lm.fingerprint, 256)
    prompt = list(range(8192))
    rows["block keys, 8192 tokens"] = _time(lambda: keyer.keys(prompt), reps)
    text = "The capital of France is Paris. " * 150
    rows["encode_text, ~1K tokens"] = _time(lambda: encode_text(tok, text), reps)
    ids = encode_text(tok, text)[:256]

    def stream() -> None:
        s = TextStream(tok)
        for t in ids:
            s.add(t)
        s.finish()

    med, first = _time(stream, 3)
    rows["TextStream per token"] = (med / len(ids), first / len(ids))
    return rows


def _vocab_rows(lm) -> int:
    """The logits row length: the model's output vocabulary (padded rows included)."""
    config = lm.config.get("text_config", lm.config)
    return int(config.get("vocab_size") or len(lm.tokenizer))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    model = argv[0] if argv else "demo:gemma3:tiny"
    for name, (med, first) in measure_setup_costs(model).items():
        print(f"{name:<40} {med:10.3f} ms   (first {first:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
