"""`forkv demo`: a streamed generation on a built-in demo model, with timings."""

from __future__ import annotations

import sys


def run_demo(model: str, max_tokens: int) -> int:
    import forkv

    engine = forkv.load(model)
    lm = engine.lm
    print(f"model {model}: {lm.model_type}, {lm.dtype}, caches: {lm.layout.describe()}")
    messages = [
        {"role": "system", "content": "You are a careful code reviewer."},
        {"role": "user", "content": "Review this function:\n\ndef add(a, b):\n    return a - b\n"},
    ]
    print("streaming (random weights, so the text is noise):")
    for event in engine.stream(messages, max_tokens=max_tokens, temperature=0.7, seed=0):
        sys.stdout.write(event.text)
        sys.stdout.flush()
    t = event.timings
    print(f"\nfinish={event.finish_reason} prompt={t.prompt_tokens} tok "
          f"prefill={t.prefill_tps:.0f} tok/s decode={t.decode_tps:.1f} tok/s "
          f"first-token={t.first_token_s * 1000:.0f} ms")
    return 0
