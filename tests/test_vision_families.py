"""Vision on every demo VLM family (Qwen2-VL, Qwen 3.5, Gemma 3, Gemma 4): logits match mlx-vlm,
restores that contain images are bit-identical to a fresh block-aligned prefill (float32 and
bfloat16), with several images, images in later turns, decode boundaries, the feature cache,
and image and text-only requests batched together. Tiny demos, 32-token blocks, so each image
(35-64 tokens) spans a block boundary."""

import io

import numpy as np
import pytest

pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed (pip install 'forkv[vision]')")

from forkv.engine import Engine, load_model
from forkv.engine.arrays import materialize
from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.request.generate import prefill

B = 32
FAMILIES = ("qwen2_vl", "qwen3_5_vl", "gemma3_vl", "gemma4_vl")  # demo names
_models = {}


def vlm(arch, dtype="float32"):
    if (arch, dtype) not in _models:
        _models[arch, dtype] = load_model(f"demo:{arch}:tiny", dtype=dtype)
    return _models[arch, dtype]


def image(seed, size=(224, 168)):
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def user(*parts):
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p}
                                        for p in parts]}


def img(data=None):
    return {"type": "image"} if data is None else {"type": "image", "image": data}


def engine(lm, **kw):
    kw.setdefault("store", RecordStore(1 << 30, None))
    return Engine(lm, block_size=B, **kw)


def logits_after(eng, prompt, images=None):
    """Last-token logits of `prompt` on `eng`: restored from its checkpoints, rest prefilled
    (on the engine's thread, where its mlx calls belong)."""
    def run():
        import mlx.core as mx

        request = eng.vision.render(prompt, images)
        seq, cache, start, hook = eng.prefix.restore_vision(request)
        logits = prefill(seq, cache, request.tokens, start, B, hook)
        return np.array(logits.astype(mx.float32)), start, request  # bf16 -> f32 is exact

    return eng.run_on_thread(run)


def fresh_logits(lm, prompt, images=None):
    with engine(lm, store=None, checkpoints=False) as eng:
        return logits_after(eng, prompt, images)[0]


def same(a, b) -> bool:
    return np.array_equal(a, b)


@pytest.fixture(params=FAMILIES)
def arch(request):
    return request.param


def test_demo_vlm_loads_with_its_cache_layout(arch):
    lm = vlm(arch)
    assert lm.is_vision and lm.processor is not None
    kinds = {"qwen2_vl": {"global"}, "qwen3_5_vl": {"state", "global"},
             "gemma3_vl": {"window", "global"}, "gemma4_vl": {"window", "global"}}[arch]
    assert set(lm.layout.kinds) == kinds and lm.layout.can_checkpoint
    assert load_model(str(lm.path)).fingerprint == lm.fingerprint
    # one tokenizer for the processor and the engine (a 262K-word one is ~110 MiB a copy),
    # but not where the processor changed its own (mlx-vlm's Gemma 4 one adds a word)
    shared = lm.processor.tokenizer is lm.tokenizer._tokenizer
    assert shared == (arch != "gemma4_vl")


def test_logits_match_mlx_vlm(arch):
    """Our chunked, block-aligned run of two images equals mlx-vlm's own forward pass."""
    import mlx.core as mx

    lm = vlm(arch)
    prompt = [user("Look: ", img(), "and", img(), "?")]
    images = [image(1), image(2, (300, 120))]
    with engine(lm, store=None, checkpoints=False) as eng:
        ours, _, request = logits_after(eng, prompt, images)

        def reference():
            family = eng.vision.family
            pixels = [family.preprocess(_load(i))[0] for i in images]
            ids = mx.array(request.tokens)[None]
            model = lm.model
            if arch.startswith("qwen"):
                grid = mx.array([s.grid for s in request.images])
                out = model(ids, pixel_values=mx.array(np.concatenate(pixels)),
                            image_grid_thw=grid, cache=lm.make_cache())
            elif arch == "gemma3_vl":
                # As mlx-vlm's generation runs it (its Model.__call__ would pass the 4-D mask
                # that get_input_embeddings builds, all ones, to the language model).
                embeds = model.get_input_embeddings(
                    ids, pixel_values=mx.array(np.concatenate(pixels)),
                    mask=mx.ones(ids.shape, mx.int32)).inputs_embeds
                out = model.language_model(ids, inputs_embeds=embeds, cache=lm.make_cache())
            else:
                out = model(ids, pixel_values=[mx.array(p[0]) for p in pixels],
                            cache=lm.make_cache())
            # mlx-vlm keeps position state on the model: evaluate it here, on its thread.
            materialize(model)
            return np.array(out.logits[0, -1])

        ref = eng.run_on_thread(reference)
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def _load(data):
    from forkv.engine.vision.images import ImageInput

    return ImageInput.of(data).load()


# bfloat16 on every family is slow (CI runs it); test_vision.py checks Qwen2-VL's by default.
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_restore_with_images_is_exact(arch, dtype):
    """A second turn with a new image and the first image again: the restored prefix holds
    the first image; logits equal a fresh prefill's bit for bit, and the tower ran once per
    distinct image."""
    lm = vlm(arch, dtype)
    a, b = image(3), image(4, (200, 200))
    first = [user("Here is a photo for you to study. ", img(a), "What is in it?")]
    with engine(lm) as eng:
        out = eng.generate(first, max_tokens=24)
        second = first + [{"role": "assistant", "content": "It shows " + out.text[:8]},
                          user("Now this one: ", img(b), " and the first again: ", img(a),
                               "Which is brighter?")]
        got, start, request = logits_after(eng, second)
        first_image = request.images[0]
        assert start >= first_image.end // B * B > first_image.start
        assert same(got, fresh_logits(lm, second))
        assert eng.vision.features.stats.tower_runs == 2  # a and b, each once
        # Another question in the later turn restores into it, past the new images.
        third = second[:-1] + [user("Now this one: ", img(b), " and the first again: ",
                                    img(a), "Which is larger?")]
        got, start3, request = logits_after(eng, third)
        assert start3 >= request.images[-1].end // B * B > start
        assert same(got, fresh_logits(lm, third))
        assert eng.vision.features.stats.tower_runs == 2


def test_new_question_about_the_same_image_restores_into_it(arch):
    lm = vlm(arch)
    a = image(5)
    with engine(lm) as eng:
        eng.generate([user("Please look. ", img(a), "Describe it.")], max_tokens=1)
        prompt = [user("Please look. ", img(a), "How many shapes?")]
        got, start, request = logits_after(eng, prompt)
        s = request.images[0]
        # Right after the image: its end was checkpointed (every layout).
        assert start == s.end and s.end % B and eng.vision.stats.tail_restores == 1
        assert same(got, fresh_logits(lm, prompt))
        stats = eng.vision.features.stats
        # The image's tail after the restored point takes its features from the cache.
        assert stats.tower_runs == 1 and stats.hits == (1 if start < s.end else 0)


def test_the_same_image_elsewhere_is_another_key(arch):
    lm = vlm(arch)
    a, b = image(6), image(7)  # same size: the same tokens either way round
    with engine(lm) as eng:
        ab = eng.run_on_thread(eng.vision.render, [user("x", img(a), img(b))], None)
        ba = eng.run_on_thread(eng.vision.render, [user("x", img(b), img(a))], None)
        assert ab.tokens == ba.tokens
        keyer = eng.checkpointer.keyer
        ka, kb = keyer.keys(ab.tokens, ab.extras(B)), keyer.keys(ba.tokens, ba.extras(B))
        first = ab.images[0].start // B
        assert ka[:first] == kb[:first]
        assert all(x != y for x, y in zip(ka[first:], kb[first:]))


@pytest.mark.slow
def test_decoded_boundaries_restore_exactly(arch):
    lm = vlm(arch)
    a = image(11)
    with engine(lm) as eng:
        # Pad the prompt (one byte, one token) so decoding reaches a boundary within 4 tokens.
        n = len(eng.run_on_thread(eng.vision.render, [user("Tell me about ", img(a))], None).tokens)
        prompt = [user("Tell me about " + "." * ((B - 4 - n) % B), img(a))]
        out = eng.generate(prompt, max_tokens=12)
        request = eng.run_on_thread(eng.vision.render, prompt, None)
        family = eng.vision.family
        # (Token ids carry images as placeholders: a generated one would be ambiguous.)
        assert family.placeholder_id not in out.token_ids
        history = request.tokens + out.token_ids
        cut = (len(history) - 1) // B * B
        assert cut > len(request.tokens)  # a boundary reached while decoding
        s = request.images[0]
        before, after = (len(w) for w in family.wrap(lm.tokenizer))
        # Continue the decoded history with other tokens, as token ids plus the image.
        ids = (history[:s.start - before] + [family.placeholder_id]
               + history[s.end + after:cut] + [97, 98, 99])
        got, start, _ = logits_after(eng, ids, [a])
        assert start == cut
        assert same(got, fresh_logits(lm, ids, [a]))


def test_image_and_text_requests_share_a_batch(arch):
    lm = vlm(arch)
    prompts = [([user("Short?", img())], [image(13)]),
               ([user("Hi. ", img(), "A much longer question about the picture?")], [image(14)]),
               ("plain text, no image", None)]
    with engine(lm) as eng:
        singles = [eng.generate(p, images=i, max_tokens=12) for p, i in prompts]
    with engine(lm) as eng:
        if not eng.is_batched:
            pytest.skip(f"{arch}'s caches cannot be merged yet (see engine/vision/loader.py)")
        with eng.paused():
            handles = [eng.submit(p, images=i, max_tokens=12) for p, i in prompts]
            widest = 0
            while not all(h.done for h in handles):
                report = eng.step_once()
                widest = max(widest, report.decoded)
        assert widest == 3  # all three rows decoded in one step
        results = [h.result() for h in handles]
    assert [r.token_ids for r in results] == [s.token_ids for s in singles]
    for r, s in zip(results, singles):
        np.testing.assert_allclose(r.logprobs, s.logprobs, atol=1e-4)
