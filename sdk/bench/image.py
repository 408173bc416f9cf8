"""`forkv bench image`: time to first token when the same high-resolution image is asked about
again with a different question.

Each rep uses a fresh image, so the first request is really cold: decode and preprocess the
image, run the vision tower, prefill everything. The second request asks another question about
the same image: forkv restores the checkpoint taken right after the image (with its M-RoPE
position state) and prefills only the question. A third request puts the same image in another
conversation (other text before it): nothing before the image is reusable, but the image's
features come from the vision-feature cache (`feature_cache_only`). The baseline, in the same
run and interleaved, is plain mlx-vlm generation of the second request (its `stream_generate`,
no caches: the tower and the whole prefill again). All timings are wall-clock seconds from the
call to the first token.
"""

from __future__ import annotations

import io

from .common import result, summary, timed

SYSTEM = "You are a helpful assistant that answers questions about images precisely."
OTHER_SYSTEM = "You are a terse assistant. Answer in one short sentence."
FIRST = "Describe this photo in detail: the objects, their colours and where they are."
SECOND = "How many distinct objects can you see, and which one is the largest?"


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


def _mlx_vlm_ttft(lm, processor, messages: list[dict], image: bytes) -> float:
    """Seconds to the first token with plain mlx-vlm generation (same prompt text)."""
    from mlx_vlm import stream_generate
    from PIL import Image

    prompt = lm.tokenizer.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=True)
    # Demo models have more logits than tokenizer entries (forkv's sampler masks the rest).
    known, vocab = len(lm.tokenizer.vocab), lm.config["vocab_size"]
    mask = {i: -1e9 for i in range(known, vocab)}
    # The image is decoded inside the timing, as forkv decodes it inside its own.
    t, _ = timed(lambda: next(iter(stream_generate(
        lm.model, processor, prompt, image=[Image.open(io.BytesIO(image)).convert("RGB")],
        max_tokens=1, logit_bias=mask))))
    return t


def run_image_bench(model: str = "demo:qwen2_vl:small", quick: bool = False,
                    reps: int = 2) -> dict:
    import mlx.core as mx
    from forkv.engine import Engine, load_model
    from mlx_vlm.utils import load_processor

    reps = 1 if quick else reps
    lm = load_model(model)
    engine = Engine(lm)
    # mlx-vlm's generation needs a processor with its streaming detokenizer.
    processor = load_processor(lm.path, True, eos_token_ids=sorted(lm.eos_token_ids))
    ask = lambda q, img, system=SYSTEM: engine.generate(
        chat(q, system), images=[img], max_tokens=1)
    # First calls pay one-off costs (allocation, kernel set-up); a small image covers them.
    warm = make_image(10_000, (448, 336))
    ask(FIRST, warm)
    _mlx_vlm_ttft(lm, processor, chat(FIRST), warm)
    first, second, features_only, baseline, reused, prompt_tokens = [], [], [], [], [], []
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
        baseline.append(_mlx_vlm_ttft(lm, processor, chat(SECOND), image))
        mx.clear_cache()
    exact = _exactness(engine, lm)
    med = lambda xs: summary(xs)["median"]
    request = engine.vision.render(chat(SECOND), [make_image(0)])
    image_tokens = request.images[0].end - request.images[0].start
    cases = [
        {"case": "first (cold: tower + full prefill)", "ttft_s": summary(first)},
        {"case": "second (same image, new question: restore after the image)",
         "ttft_s": summary(second), "reused_tokens": reused, "prompt_tokens": prompt_tokens},
        {"case": "feature_cache_only (same image, other conversation)",
         "ttft_s": summary(features_only)},
        {"case": "baseline: plain mlx-vlm, second request", "ttft_s": summary(baseline)},
    ]
    headline = {
        "repeat_speedup": round(med(first) / med(second), 2),
        "vs_mlx_vlm": round(med(baseline) / med(second), 2),
        "feature_cache_speedup": round(med(first) / med(features_only), 2),
        "exact": exact["exact"],
    }
    stats = {"features": engine.vision.features.stats.as_dict(),
             "vision": engine.vision.stats.as_dict()}
    engine.close()
    return result(
        "image", model,
        {"reps": reps, "image": "1600x1200 JPEG", "image_tokens": image_tokens,
         "block_size": engine.block_size, "layout": lm.layout.describe(),
         "baseline": "mlx-vlm stream_generate, no caches (qwen2_vl has no encode_image, so "
                     "mlx-vlm's VisionFeatureCache does not apply to it)"},
        cases, headline, {"repeat_speedup": ">= 5", "exact": "== true"},
        notes=[f"exactness: {exact}", f"engine stats: {stats}"], dtype=lm.dtype)


def _exactness(engine, lm) -> dict:
    """Greedy tokens of a second question restored after the image vs a fresh forkv run."""
    from forkv.engine import Engine

    image = make_image(20_000)
    engine.generate(chat(FIRST), images=[image], max_tokens=1)
    restored = engine.generate(chat(SECOND), images=[image], max_tokens=8)
    fresh = Engine(lm, checkpoints=False).generate(chat(SECOND), images=[image], max_tokens=8)
    return {"exact": restored.token_ids == fresh.token_ids and
            restored.logprobs == fresh.logprobs,
            "reused_tokens": restored.timings.reused_tokens,
            "restored_tokens": restored.token_ids, "fresh_tokens": fresh.token_ids}
