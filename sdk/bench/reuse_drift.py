"""How far fast reuse's logits are from exact reuse's, on the model itself (no server).

Fast reuse (engine/cache/live.py) continues a finished request's cache cut back to the prefix a new
prompt shares, and prefills the rest in chunks that begin at the cut; exact reuse restores
records at canonical cuts only, so its logits are a fresh run's bit for bit. For each case a
first prompt A is prefilled canonically and answered greedily (the live cache a server would
keep: after the prompt, and after the answer); the second prompt B is then run both ways —
from that live cache with the engine's own cut (`live.cut_limit` / `live.cut`), and fresh with
the canonical chunking — and both are decoded `steps` tokens teacher-forced along the exact
run's greedy tokens. Reported per case and overall: the largest |Δ logit| over every position
compared, and the share of positions whose greedy (argmax) token agrees.
"""

from __future__ import annotations

import random

__all__ = ["measure_drift"]

_WORDS = ("river", "stone", "lamp", "orbit", "cedar", "quartz", "meadow", "signal", "harbor",
          "copper", "violet", "lantern", "summit", "ember", "glacier", "falcon")


def _text(tok, rng: random.Random, n: int) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(n * 2))
    return tok.decode(tok.encode(words, add_special_tokens=False)[:n])


def _greedy(lm, cache: list, first_logits, steps: int) -> tuple[list[int], list]:
    """`steps` greedy tokens from `first_logits` on, and the logits before each."""
    import mlx.core as mx

    logits, out, seen = first_logits, [], []
    for _ in range(steps):
        tok = int(mx.argmax(logits).item())
        out.append(tok)
        seen.append(logits)
        logits = lm.model(mx.array([[tok]]), cache=cache)[0, -1]
        mx.eval(logits, [c.state for c in cache])
    return out, seen


def _forced(lm, cache: list, first_logits, tokens: list[int]) -> list:
    """The logits before each of `tokens`, feeding them in turn (teacher forcing)."""
    import mlx.core as mx

    logits, seen = first_logits, []
    for tok in tokens:
        seen.append(logits)
        logits = lm.model(mx.array([[tok]]), cache=cache)[0, -1]
        mx.eval(logits, [c.state for c in cache])
    return seen


def _cases(engine, tok, rng: random.Random, doc_tokens: int, answer_tokens: int) -> list:
    """(name, messages of A, a function of A's answer -> messages of B, live entry)."""
    system = {"role": "system", "content": _text(tok, rng, 64)}
    doc = _text(tok, rng, doc_tokens)
    q1, q2 = _text(tok, rng, 24), _text(tok, rng, 24)
    a = [system, {"role": "user", "content": f"{doc}\n\nQuestion: {q1}"}]
    return [
        # the next turn of a chat: continues the cache after the answer
        ("extend", a, lambda answer: a + [{"role": "assistant", "content": answer},
                                          {"role": "user", "content": q2}], "answer"),
        # another question on the same document: the cache after A's prompt, cut back
        ("fork", a, lambda answer: [system, {"role": "user",
                                             "content": f"{doc}\n\nQuestion: {q2}"}], "prompt"),
    ]


def measure_drift(model: str = "gemma3-270m", doc_tokens: int = 1500, answer_tokens: int = 24,
                  steps: int = 32, seed: int = 0, lm=None) -> dict:
    """Fast vs exact logits on `model` (a name, or a loaded `lm`): per case and overall."""
    import mlx.core as mx

    from forkv.engine import Engine, load_model
    from forkv.engine.cache.blocks import shared_prefix
    from forkv.engine.cache.live import cut, cut_limit
    from forkv.engine.request.generate import prefill

    lm = lm or load_model(model)
    engine = Engine(lm, checkpoints=True, disk=False)
    try:
        ck, B = engine.checkpointer, engine.block_size
        tok = lm.tokenizer
        rng = random.Random(seed)
        rows = []
        for name, a_msgs, b_of, where in _cases(engine, tok, rng, doc_tokens, answer_tokens):
            a = engine.encode(a_msgs)
            cache = lm.make_cache()
            logits = prefill(ck.model_for(a), cache, a, 0, B)
            if where == "answer":
                answer, _ = _greedy(lm, cache, logits, answer_tokens)
                held = a + answer  # _greedy fed every token it sampled
                b = engine.encode(b_of(tok.decode(answer)))
            else:
                held = a
                b = engine.encode(b_of(""))
            shared = shared_prefix(held, b)
            u = cut_limit(cache, len(held), min(shared, len(b) - 1))
            exact_cache = lm.make_cache()
            exact_first = prefill(ck.model_for(b), exact_cache, b, 0, B)
            exact_tokens, exact_seen = _greedy(lm, exact_cache, exact_first, steps)
            row = {"case": name, "prompt_tokens": len(b), "shared_tokens": shared,
                   "live_tokens": u}
            if u:
                fast_cache = cut(cache, len(held), u, lm.make_cache)
                fast_first = prefill(lm.model, fast_cache, b, u, B)
                fast_seen = _forced(lm, fast_cache, fast_first, exact_tokens)
                diffs = [float(mx.max(mx.abs(e.astype(mx.float32) - f.astype(mx.float32))).item())
                         for e, f in zip(exact_seen, fast_seen)]
                agree = [int(mx.argmax(e).item()) == int(mx.argmax(f).item())
                         for e, f in zip(exact_seen, fast_seen)]
                row.update(max_abs_dlogit=max(diffs), first_abs_dlogit=diffs[0],
                           greedy_agreement=round(sum(agree) / len(agree), 4),
                           positions=len(agree))
            rows.append(row)
        measured = [r for r in rows if "max_abs_dlogit" in r]
        total = sum(r["positions"] for r in measured)
        return {"cases": rows,
                "fast_max_abs_dlogit": max((r["max_abs_dlogit"] for r in measured), default=None),
                "fast_greedy_agreement": round(sum(r["greedy_agreement"] * r["positions"]
                                                   for r in measured) / total, 4)
                if total else None,
                "dtype": str(lm.dtype) if hasattr(lm, "dtype") else None}
    finally:
        engine.close()


if __name__ == "__main__":
    import json
    import sys

    from forkv.engine.models import blas

    blas.activate()
    print(json.dumps(measure_drift(*(sys.argv[1:2] or ["gemma3-270m"])), indent=1))
