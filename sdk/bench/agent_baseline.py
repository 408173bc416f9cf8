"""The baselines `forkv bench agent` replays: mlx-lm generation with one prompt cache.

`replay` feeds a trace of forkv's steps (each prompt and the tokens forkv generated for it) to
mlx-lm's `generate_step` with one cache (`make_prompt_cache`), reused when the next prompt
extends the cached tokens, trimmed back (`can_trim_prompt_cache`/`trim_prompt_cache`) when the
cache allows it, else recomputed from scratch: what an agent loop on mlx-lm can reuse. It takes
any mlx-lm model: `load_plain_model` gives the one a user gets without forkv (mlx's own ops),
forkv's loaded model gives reuse alone. This module knows nothing of sessions, trees or timing
figures; it times each step and counts what it prefilled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True)
class Step:
    """One step of forkv's trace, as the baselines replay it."""
    prompt: list[int]
    generated: list[int]
    parent: int | None = None  # the step whose generation this prompt continues
    parent_text_tokens: int = 0  # tokens of that generation's text as re-encoded here


def load_plain_model(lm):
    """`lm`'s model folder as `mlx_lm.load` gives it: mlx's own attention, norms, RoPE and
    activations, none of forkv's kernels. Its weights get forkv's treatment with mlx-lm's and
    mlx's own calls only (dequantized where forkv dequantized, cast to forkv's dtype), so both
    sides compute on the same weights. Returns (model, what was done to the weights)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.utils import dequantize_model

    model = load(str(lm.path))[0]
    done = ["mlx_lm.load"]
    if "dequantized" in lm.quantization:
        model = dequantize_model(model)
        done.append("dequantize_model")
    floats = [v.dtype for _, v in tree_flatten(model.parameters())
              if mx.issubdtype(v.dtype, mx.floating)]
    if any(dt != getattr(mx, lm.dtype) for dt in floats):
        model.set_dtype(getattr(mx, lm.dtype))
        done.append(f"set_dtype({lm.dtype})")
    return model, " + ".join(done)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class Replay:
    """mlx-lm generation on `model` with one prompt cache, reused as far as mlx-lm can."""

    def __init__(self, model):
        self.model = model
        self.cache = None
        self.tokens: list[int] = []  # what the cache holds
        self.wall = 0.0
        self.prefill = 0
        self.steps: list[dict] = []

    def run(self, prompt: list[int], generated: list[int]) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

        t0 = time.perf_counter()
        n = _common_prefix(self.tokens, prompt)
        how = "extend"
        if self.cache is None or n < len(self.tokens) or n == len(prompt):
            n = min(n, len(prompt) - 1)  # at least one token to feed
            if self.cache is not None and n > 0 and can_trim_prompt_cache(self.cache):
                trim_prompt_cache(self.cache, len(self.tokens) - n)
                how = "trim"
            else:
                self.cache, n, how = make_prompt_cache(self.model), 0, "recompute"
        forced = iter(generated)

        def sampler(logprobs):
            # Replays forkv's tokens; tied to the logits so each step is really computed.
            token = next(forced, generated[-1] if generated else 0)
            return mx.argmax(logprobs, axis=-1) * 0 + token

        steps = generate_step(mx.array(prompt[n:]), self.model, prompt_cache=self.cache,
                              max_tokens=len(generated), sampler=sampler)
        ttft = None
        for _ in steps:
            ttft = ttft if ttft is not None else time.perf_counter() - t0
        wall = time.perf_counter() - t0
        self.wall += wall
        self.prefill += len(prompt) - n
        self.tokens = prompt + generated  # generate_step feeds every token it yields
        self.steps.append({"prompt": len(prompt), "reused": n, "computed": len(prompt) - n,
                           "generated": len(generated), "cache": how, "wall_s": round(wall, 3),
                           "ttft_s": round(wall if ttft is None else ttft, 4)})


def replay(model, trace: list[Step]) -> Replay:
    """Replay forkv's `trace` on `model`, step by step, with one mlx-lm prompt cache."""
    base = Replay(model)
    for step in trace:
        prompt = step.prompt
        if step.parent is not None:
            # A prompt that continues a generation holds its text re-encoded; give the baseline
            # the generated tokens themselves, so it can extend its cache as with a real model.
            pp, pg = trace[step.parent].prompt, trace[step.parent].generated
            if prompt[: len(pp)] == pp:
                prompt = pp + pg + prompt[len(pp) + step.parent_text_tokens:]
        base.run(prompt, step.generated)
    return base
