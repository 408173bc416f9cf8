"""`forkv bench image`: time to first token when the same high-resolution image is asked about
again, on every vision family (one `runs` entry per model; the headline is the worst case).

Each rep uses a fresh image, so the first request is really cold: decode and preprocess the
image, run the vision tower, prefill everything. The second request asks another question about
the same image: forkv restores the checkpoint taken right after the image (its position state,
global K/V and, on sliding-window and gated-delta layouts, those layers' caches) and prefills
only the rest. A third request puts the
same image in another conversation (other text before it): nothing before the image is
reusable, but its features come from the vision-feature cache (`feature_cache_only`).

The multi-turn case is the agent workflow the engine exists for: image + question, a reasoning
turn, the reasoning pruned (the chat template drops it once a new user turn follows), and a new
question about the same image. Its time to first token is compared with plain mlx-vlm on the
same request. Baselines run in the same process, interleaved: mlx-vlm's `stream_generate` on its
own copy of the model (mlx-vlm's caches, no prompt cache), so the tower and the whole prefill
run again. All timings are wall-clock seconds from the call to the first token.
"""

from __future__ import annotations

import io

from .common import result, summary, timed

SYSTEM = "You are a helpful assistant that answers questions about images precisely."
OTHER_SYSTEM = "You are a terse assistant. Answer in one short sentence."
FIRST = "Describe this photo in detail: the objects, their colours and where they are."
SECOND = "How many distinct objects can you see, and which one is the largest?"
FINAL = "The photo shows soft colour fields with fine grain; no distinct objects stand out."
FOLLOW_UP = "Which corner of the photo is the brightest?"


def make_image(seed: int, size: tuple[int, int] = (1600, 1200)) -> bytes:
    """A photo-like JPEG: smooth colour fields with fine noise, different for every seed."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    coarse = (rng.rand(size[1] // 80, size[0] // 80, 3) * 255).astype("uint8")
    field = np.asarray(Image.fromarray(coarse).resize(size, Image.BICUBIC), dtype=np.float32)
    pixels = np.clip(field + rng.normal(0, 6, field.shape), 0, 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def chat(question: str, system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


def pruned(reasoning: str) -> tuple[list[dict], list[dict]]:
    """The multi-turn case: (the reasoning turn's prompt, the prompt after the prune). The
    second keeps the final answer; the template drops `reasoning_content` of assistant turns
    before the last user turn, so the reasoning is gone from its tokens."""
    turn = chat(FIRST)
    answered = turn + [{"role": "assistant", "content": FINAL, "reasoning_content": reasoning},
                       {"role": "user", "content": FOLLOW_UP}]
    return turn, answered


class _MlxVlm:
    """Plain mlx-vlm on its own copy of the model: time to first token of one request."""

    def __init__(self, lm):
        import mlx.core as mx
        from mlx_vlm.utils import load_model, load_processor

        self.model = load_model(lm.path)
        if lm.dtype != "auto":
            self.model.set_dtype(getattr(mx, lm.dtype))
        # mlx-vlm's generation needs a processor with its streaming detokenizer.
        self.processor = load_processor(lm.path, True, eos_token_ids=sorted(lm.eos_token_ids))
        self.tokenizer = lm.tokenizer
        # Demo models have more logits than tokenizer entries (forkv's sampler masks the rest).
        known, vocab = len(lm.tokenizer.vocab), lm.config.get("text_config", lm.config).get(
            "vocab_size", len(lm.tokenizer.vocab))
        self.mask = {i: -1e9 for i in range(known, vocab)}

    def ttft(self, messages: list[dict], image: bytes) -> float:
        from mlx_vlm import stream_generate
        from PIL import Image

        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=True)
        # The image is decoded inside the timing, as forkv decodes it inside its own.
        t, _ = timed(lambda: next(iter(stream_generate(
            self.model, self.processor, prompt,
            image=[Image.open(io.BytesIO(image)).convert("RGB")], max_tokens=1,
            logit_bias=self.mask))))
        return t


def run_image_bench(model: str = "demo:qwen2_vl:small", quick: bool = False, reps: int = 2,
                    reasoning_tokens: int = 64) -> dict:
    import mlx.core as mx
    from forkv.engine import Engine, load_model

    reps = 1 if quick else reps
    reasoning_tokens = 8 if quick else reasoning_tokens
    lm = load_model(model)
    engine = Engine(lm)
    baseline = _MlxVlm(lm)
    ask = lambda q, img, system=SYSTEM: engine.generate(  # noqa: E731
        chat(q, system), images=[img], max_tokens=1)
    # First calls pay one-off costs (allocation, kernel set-up); a small image covers them.
    warm = make_image(10_000, (448, 336))
    ask(FIRST, warm)
    baseline.ttft(chat(FIRST), warm)
    first, second, features_only, base, reused, prompt_tokens = [], [], [], [], [], []
    prune, prune_base, prune_reused = [], [], []
    for r in range(reps):
        image = make_image(r)
        t, out = timed(lambda image=image: ask(FIRST, image))
        first.append(t)
        t, out = timed(lambda image=image: ask(SECOND, image))
        second.append(t)
        reused.append(out.timings.reused_tokens)
        prompt_tokens.append(out.timings.prompt_tokens)
        t, _ = timed(lambda image=image: ask(SECOND, image, OTHER_SYSTEM))
        features_only.append(t)
        base.append(baseline.ttft(chat(SECOND), image))
        # Multi-turn: reason about a new image, prune the reasoning, ask again.
        image = make_image(1_000 + r)
        turn, _ = pruned("")
        thought = engine.generate(turn, images=[image], max_tokens=reasoning_tokens)
        _, after = pruned(thought.text)
        t, out = timed(lambda image=image, after=after: engine.generate(
            after, images=[image], max_tokens=1))
        prune.append(t)
        prune_reused.append(out.timings.reused_tokens)
        prune_base.append(baseline.ttft(after, image))
        mx.clear_cache()
    exact = _exactness(engine, lm)
    med = lambda xs: summary(xs)["median"]  # noqa: E731
    request = engine.run_on_thread(engine.vision.render, chat(SECOND), [make_image(0)])
    image_tokens = request.images[0].end - request.images[0].start
    cases = [
        {"case": "first (cold: tower + full prefill)", "ttft_s": summary(first)},
        {"case": "second (same image, new question: restore right after the image)",
         "ttft_s": summary(second), "reused_tokens": reused, "prompt_tokens": prompt_tokens},
        {"case": "feature_cache_only (same image, other conversation)",
         "ttft_s": summary(features_only)},
        {"case": "baseline: plain mlx-vlm, second request", "ttft_s": summary(base)},
        {"case": f"multi-turn: image + question, {reasoning_tokens} reasoning tokens, prune, "
                 "new question (forkv)", "ttft_s": summary(prune), "reused_tokens": prune_reused},
        {"case": "multi-turn baseline: plain mlx-vlm on the same request",
         "ttft_s": summary(prune_base)},
    ]
    headline = {
        "repeat_speedup": round(med(first) / med(second), 2),
        "vs_mlx_vlm": round(med(base) / med(second), 2),
        "feature_cache_speedup": round(med(first) / med(features_only), 2),
        "prune_vs_mlx_vlm": round(med(prune_base) / med(prune), 2),
        "exact": exact["exact"],
    }
    stats = {"features": engine.vision.features.stats.as_dict(),
             "vision": engine.vision.stats.as_dict()}
    engine.close()
    return result(
        "image", model,
        {"reps": reps, "image": "1600x1200 JPEG", "image_tokens": image_tokens,
         "block_size": engine.block_size, "layout": lm.layout.describe(),
         "reasoning_tokens": reasoning_tokens,
         "baseline": "mlx-vlm stream_generate on its own copy of the model, no prompt cache"},
        cases, headline, {"repeat_speedup": ">= 5", "exact": "== true"},
        notes=[f"exactness: {exact}", f"engine stats: {stats}"], dtype=lm.dtype)


def _exactness(engine, lm) -> dict:
    """Greedy tokens and logprobs of a second question restored at the image vs a fresh
    engine's (its own store, so its decoded blocks are made canonical the same way)."""
    from forkv.engine import Engine

    image = make_image(20_000)
    engine.generate(chat(FIRST), images=[image], max_tokens=1)
    restored = engine.generate(chat(SECOND), images=[image], max_tokens=8)
    with Engine(lm) as fresh_engine:
        fresh = fresh_engine.generate(chat(SECOND), images=[image], max_tokens=8)
    return {"exact": restored.token_ids == fresh.token_ids and
            restored.logprobs == fresh.logprobs,
            "reused_tokens": restored.timings.reused_tokens,
            "restored_tokens": restored.token_ids, "fresh_tokens": fresh.token_ids}
