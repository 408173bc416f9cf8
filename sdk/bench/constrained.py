"""`forkv bench constrained`: what a JSON-schema-constrained row costs the other rows of its
batch.

Each rep decodes one batch of `batch` rows twice on one `Engine`: once with every row free,
once with `constrained` of them held to a JSON schema (an array of objects with strings,
bounded integers, enums and booleans, long enough never to finish first). Every row samples
at temperature 1 and cannot stop early (end-of-sequence is biased away from free rows; the
schema keeps the constrained ones going), so both runs do the same work but the masks. The
figure is the decode throughput of the rows that stay free in both runs (tokens over each
row's decode time, summed), and the headline the median overhead over reps, in percent. The
masks are computed on the engine thread, so this is also what they cost a whole step.
"""

from __future__ import annotations

import time

from .common import random_tokens, result, summary

SCHEMA = {
    "type": "array", "minItems": 1000,
    "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "n": {"type": "integer", "minimum": 0, "maximum": 9999},
        "kind": {"enum": ["tool", "answer", "plan"]},
        "ok": {"type": "boolean"}},
        "required": ["name", "n", "kind", "ok"], "additionalProperties": False},
}


def _run(engine, prompts, params) -> tuple[float, list]:
    t0 = time.perf_counter()
    handles = [engine.submit(p, sp) for p, sp in zip(prompts, params)]
    results = [h.result() for h in handles]
    return time.perf_counter() - t0, results


def _free_tps(results, rows) -> float:
    return sum(results[i].timings.generated_tokens / results[i].timings.decode_s for i in rows)


def run_constrained_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 3,
                          batch: int = 8, constrained: int = 1,
                          max_tokens: int | None = None) -> dict:
    from forkv.engine import Engine, SamplingParams, load_model
    from forkv.engine.models import blas
    from forkv.engine.request.constrain import Constraint, RowMatcher

    blas.activate()  # before mlx is imported
    import mlx.core as mx

    if quick:
        reps, prompt_len, max_tokens = 1, 32, max_tokens or 24
    else:
        prompt_len, max_tokens = 64, max_tokens or 128
    if not 0 < constrained < batch:
        raise ValueError(f"constrained must be between 1 and batch - 1 ({batch - 1}), got "
                         f"{constrained}; some rows must stay free to measure them.")
    lm = load_model(model)
    engine = Engine(lm, max_seqs=batch, checkpoints=False)
    no_eos = {t: -1e9 for t in lm.eos_token_ids}
    schema = Constraint.json_schema(SCHEMA)

    def params(num_constrained: int, seed: int) -> list:
        return [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed + i,
                               logit_bias={} if i < num_constrained else no_eos,
                               constraint=schema if i < num_constrained else None)
                for i in range(batch)]

    free = range(constrained, batch)  # rows free in both runs
    _run(engine, [random_tokens(prompt_len, seed=999 + i) for i in range(batch)],
         params(constrained, 0))  # warm up kernels and the llguidance tokenizer
    tps = {"free": [], "constrained": []}
    overhead, outputs_ok = [], []
    for r in range(reps):
        prompts = [random_tokens(prompt_len, seed=r * 100 + i) for i in range(batch)]
        runs = {}
        for case in (("free", "constrained") if r % 2 == 0 else ("constrained", "free")):
            runs[case] = _run(engine, prompts, params(constrained if case == "constrained"
                                                      else 0, seed=r * 100))[1]
            mx.clear_cache()
        for case, res in runs.items():
            tps[case].append(_free_tps(res, free))
        overhead.append(100 * (1 - tps["constrained"][-1] / tps["free"][-1]))
        for res in runs["constrained"][:constrained]:  # the schema held on every token
            m = RowMatcher(schema, lm.tokenizer)
            try:
                m.advance(res.token_ids)
                outputs_ok.append(True)
            except Exception:  # noqa: BLE001 - counted as a broken output
                outputs_ok.append(False)
    # what one mask costs by itself, for the notes
    m = RowMatcher(schema, lm.tokenizer)
    t0 = time.perf_counter()
    out = runs["constrained"][0].token_ids
    for i in range(len(out)):
        m.allowed(out[:i])
    mask_us = 1e6 * (time.perf_counter() - t0) / max(len(out), 1)
    engine.close()
    cases = [{"case": "free_rows_decode_tps", "batch": batch, "constrained_rows": constrained,
              "all_free": summary(tps["free"]), "with_constrained": summary(tps["constrained"]),
              "overhead_percent": summary(overhead)},
             {"case": "mask", "us_per_token": round(mask_us, 1),
              "vocab": len(lm.tokenizer.vocab)}]
    headline = {"overhead_percent": round(summary(overhead)["median"], 2),
                "schema_held": all(outputs_ok)}
    return result(
        "constrained", model,
        {"batch": batch, "constrained": constrained, "prompt_tokens": prompt_len,
         "max_tokens": max_tokens, "reps": reps, "library": "llguidance",
         "schema": "array of objects (string maxLength 12, integer 0..9999, enum, boolean)"},
        cases, headline, {"overhead_percent": "<= 5", "schema_held": "== true"},
        notes=[(f"one mask (advance over the last token + compute) takes ~{mask_us:.0f} us on "
                f"this tokenizer's {len(lm.tokenizer.vocab)} tokens; free rows pay it once a "
                "step")],
        dtype=lm.dtype)
