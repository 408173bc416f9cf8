"""Vision on the tiny Qwen2-VL demo: M-RoPE positions against mlx-vlm, the position state a
restore needs, restores inside and right after images, the disk tier, input errors and the
feature cache. (Every family: test_vision_families.py.) 32-token blocks, so a 48-token image
spans block boundaries."""

import io

import numpy as np
import pytest

pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed (pip install 'forkv[vision]')")

from conftest import load_tiny
from forkv.engine import Engine, GenerationError, load_model
from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.request.generate import prefill
from forkv.engine.vision.features import FeatureCache
from helpers import MemoryDisk

B = 32
_models = {}


def vlm(dtype="float32"):
    if dtype not in _models:
        _models[dtype] = load_model("demo:qwen2_vl", dtype=dtype)
    return _models[dtype]


def image(seed, size=(224, 168)):
    """PNG bytes of a random image; 224x168 gives a 16x12 patch grid, 48 image tokens."""
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def ask(question, before="Look at this picture, please. ", img=None):
    part = {"type": "image"} if img is None else {"type": "image", "image": img}
    return [{"role": "user", "content": [{"type": "text", "text": before}, part,
                                         {"type": "text", "text": question}]}]


def engine(lm=None, **kw):
    kw.setdefault("store", RecordStore(1 << 30, None))
    return Engine(lm or vlm(), block_size=B, **kw)


def logits_after(eng, prompt, images, block_size=B):
    """Last-token logits of `prompt` on `eng` (restored from its checkpoints, the rest
    prefilled, on the engine's thread), the restored position and the request."""
    def run():
        import mlx.core as mx

        request = eng.vision.render(prompt, images)
        seq, cache, start, hook = eng.prefix.restore_vision(request)
        logits = prefill(seq, cache, request.tokens, start, block_size, hook)
        return np.array(logits.astype(mx.float32)), start, request  # bf16 -> f32 is exact

    return eng.run_on_thread(run)


def fresh_logits(prompt, images, lm=None, block_size=B):
    with Engine(lm or vlm(), block_size=block_size, checkpoints=False) as eng:
        return logits_after(eng, prompt, images, block_size)[0]


def render(eng, prompt, images=None):
    return eng.run_on_thread(eng.vision.render, prompt, images)


def same(a, b) -> bool:
    return np.array_equal(a, b)


def test_missing_mlx_vlm_names_the_extra(monkeypatch):
    import sys

    from forkv.engine import ModelLoadError

    path = str(vlm().path)
    monkeypatch.setitem(sys.modules, "mlx_vlm.utils", None)  # makes the import fail
    with pytest.raises(ModelLoadError, match=r"forkv\[vision\]"):
        load_model(path)


def test_mrope_positions_match_mlx_vlm_from_any_boundary():
    import mlx.core as mx
    from forkv.engine.vision.qwen import mrope_positions, rewind_state

    lm = vlm()
    with engine(checkpoints=False, store=None) as eng:
        prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                               {"type": "image"}, {"type": "text", "text": "?"}]}]
        request = render(eng, prompt, [image(1), image(2, (300, 120))])

        def reference():
            ids = mx.array(request.tokens)[None]
            grid = mx.array([s.grid for s in request.images])
            pos, delta = lm.model.language_model.get_rope_index(ids, grid)
            return np.array(pos[:, 0]), delta.item()

        ref_pos, ref_delta = eng.run_on_thread(reference)
    n = len(request.tokens)
    pos, after, end = mrope_positions(n, request.images, 0, 0, 2)
    assert np.array_equal(ref_pos, pos) and end - n == ref_delta
    # From the state at any point (inside images too), positions continue the same way, and
    # the state walks back to any earlier point.
    for anchor in range(1, n + 1, 3):
        state = int(after[anchor - 1])
        again, _, end_again = mrope_positions(n, request.images, anchor, state, 2)
        assert np.array_equal(again, pos[:, anchor:]) and end_again == end
        for lo in range(0, anchor + 1, 7):
            back = rewind_state(request.images, anchor, state, lo, 2)
            assert back == (int(after[lo - 1]) if lo else 0)


def test_generation_with_an_image_is_deterministic():
    with engine(checkpoints=False, store=None) as eng:
        runs = [eng.generate(ask("What is it?"), images=[image(3)], max_tokens=8)
                for _ in range(2)]
        inline = eng.generate(ask("What is it?", img=image(3)), max_tokens=8)
    assert runs[0].token_ids == runs[1].token_ids and runs[0].logprobs == runs[1].logprobs
    assert inline.token_ids == runs[0].token_ids
    assert not same(fresh_logits(ask("What is it?"), [image(4)]),
                    fresh_logits(ask("What is it?"), [image(3)]))


def test_an_answer_never_holds_an_image_placeholder():
    """A vision model never samples its image placeholder: rendered again with the chat, the
    answer's text would be a slot for an image that nobody gave."""
    with engine(checkpoints=False, store=None) as eng:
        family = eng.vision.family
        banned = {family.placeholder_id, family.image_token_id}
        pushed = {t: 100.0 for t in banned}  # the bias alone would make them certain
        out = eng.generate(ask("What is it?"), images=[image(3)], max_tokens=6,
                           temperature=1.0, seed=0, logit_bias=pushed)
    assert out.token_ids and not banned & set(out.token_ids)


def test_different_images_never_share_image_blocks():
    with engine() as eng:
        a = render(eng, ask("Describe it."), [image(5)])
        b = render(eng, ask("Describe it."), [image(6)])
        assert a.tokens == b.tokens  # same size: the tokens cannot tell the images apart
        keyer = eng.checkpointer.keyer
        ka, kb = keyer.keys(a.tokens, a.extras(B)), keyer.keys(b.tokens, b.extras(B))
        first = a.images[0].start // B
        assert ka[:first] == kb[:first] and first > 0
        assert all(x != y for x, y in zip(ka[first:], kb[first:]))
        eng.generate(ask("Describe it."), images=[image(5)], max_tokens=1)
        got, start, _ = logits_after(eng, ask("Describe it."), [image(6)])
    assert start == first * B  # only the text before the image is reused
    assert same(got, fresh_logits(ask("Describe it."), [image(6)]))


def test_repeated_image_hits_feature_cache_and_checkpoints():
    shared = "You are a careful assistant who looks at pictures. " * 2  # > 3 blocks
    prompt = ask("Count the dots.", before=shared + "Two: ")
    with engine() as eng:
        first = eng.generate(ask("Count the dots.", before=shared + "One: "),
                             images=[image(7)], max_tokens=6)
        assert eng.vision.features.stats.tower_runs == 1
        # Other text right before the image: its blocks differ, so its features come from the
        # cache, while the shared text before that comes from block checkpoints.
        warm = eng.generate(prompt, images=[image(7)], max_tokens=6)
        stats = eng.vision.features.stats
        assert stats.tower_runs == 1 and stats.hits == 1
        a, b = (render(eng, ask("Count the dots.", before=shared + w), [image(7)]).tokens
                for w in ("One: ", "Two: "))
        got, start, _ = logits_after(eng, prompt, [image(7)])
    # A cold run with its own (empty) store makes its decoded blocks canonical too.
    with engine() as cold_engine:
        cold = cold_engine.generate(prompt, images=[image(7)], max_tokens=6)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert warm.timings.reused_tokens == common // B * B > 0
    assert warm.token_ids == cold.token_ids and warm.logprobs == cold.logprobs
    assert first.timings.reused_tokens == 0
    assert start > warm.timings.reused_tokens  # the whole prompt is checkpointed now
    assert same(got, fresh_logits(prompt, [image(7)]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_restore_after_image_is_exact_and_needs_position_state(dtype, monkeypatch):
    from forkv.engine.vision import ckpt as vision_ckpt

    lm = vlm(dtype)
    after = "Here is a long description of the question. " * 2
    with engine(lm) as eng:
        eng.generate(ask("What colour is it?"), images=[image(8)], max_tokens=1)
        prompt = ask("How many shapes are there, roughly?")
        got, start, request = logits_after(eng, prompt, [image(8)])
        end = request.images[0].end
        assert start == end and end % B and eng.vision.stats.tail_restores == 1
        stats = eng.checkpointer.stats
        assert stats.hits["image_end"] == 1 and stats.image_ends_recorded >= 1
        assert same(got, fresh_logits(prompt, [image(8)], lm))
        # Shared text after the image reaching a block boundary: a block-aligned restore there.
        eng.generate(ask(after + "Which?"), images=[image(8)], max_tokens=1)
        got, start, request = logits_after(eng, ask(after + "What?"), [image(8)])
        assert start % B == 0 and start > request.images[0].end
        assert same(got, fresh_logits(ask(after + "What?"), [image(8)], lm))
        # Restoring the caches without the position state gives other logits.
        monkeypatch.setattr(vision_ckpt, "RESTORE_POSITION_STATE", False)
        for question in ("Is it bright?", after + "Why?"):  # after the image; at a boundary
            bad, start, _ = logits_after(eng, ask(question), [image(8)])
            assert start >= end
            fresh = fresh_logits(ask(question), [image(8)], lm)
            assert np.abs(bad - fresh).max() > 1e-3


def test_restore_inside_an_image_is_exact():
    """Without its image-end record, a new question restores at the last block boundary inside
    the image (with the image's base position as state) and computes the image's rest from
    cached features."""
    from forkv.engine.cache.layout import CacheKind
    from forkv.engine.vision import ckpt as vision_ckpt

    with engine() as eng:
        eng.generate(ask("Anything?"), images=[image(9)], max_tokens=1)
        prompt = ask("Anything else?")
        request = render(eng, prompt, [image(9)])
        (s,) = request.images
        ck = eng.checkpointer
        keys = ck.keyer.keys(request.tokens, request.extras(B))
        ck.store.discard(vision_ckpt.image_end_key(ck.keyer, keys, request, s.end),
                         CacheKind.EXTRA)
        got, start, _ = logits_after(eng, prompt, [image(9)])
        assert s.start < start == s.end // B * B < s.end
        assert ck.stats.misses["image_end"] == 1 and ck.stats.hits["image_end"] == 0
        assert eng.vision.features.stats.tower_runs == 1
        assert eng.vision.features.stats.hits == 1
    assert same(got, fresh_logits(prompt, [image(9)]))


def test_decoding_after_a_restore_right_after_an_image():
    # 64-token blocks: the image ends at 85, the question too ends inside block [64, 128),
    # so the first decode boundary recomputes a block that starts inside the image.
    def run(eng, prompt):
        return eng.generate(prompt, images=[image(12)], max_tokens=50)

    prompt = ask("Go on.")
    with Engine(vlm(), block_size=64, store=RecordStore(1 << 30, None)) as eng:
        eng.generate(ask("Hm?"), images=[image(12)], max_tokens=1)
        out = run(eng, prompt)
        request = render(eng, prompt, [image(12)])
        assert out.timings.reused_tokens == request.images[0].end == 85
        assert len(request.tokens) < 128 < len(request.tokens) + len(out.token_ids)
        # The boundary at 128, reached while decoding, restores exactly.
        history = request.tokens + out.token_ids
        ids = history[:85 - 48 + 1] + history[85:128] + [97, 98]  # one placeholder per image
        restored, at, _ = logits_after(eng, ids, [image(12)], 64)
    # A cold run (that also makes its decoded blocks canonical) gives the same output.
    with Engine(vlm(), block_size=64, store=RecordStore(1 << 30, None)) as cold_engine:
        cold = run(cold_engine, prompt)
    assert out.token_ids == cold.token_ids and out.logprobs == cold.logprobs
    assert at == 128 and same(restored, fresh_logits(ids, [image(12)], block_size=64))


def test_records_survive_the_disk_tier():
    with engine(store=RecordStore(0, MemoryDisk())) as eng:  # every record round-trips the codec
        eng.generate(ask("Is it round?"), images=[image(11)], max_tokens=1)
        got, start, request = logits_after(eng, ask("Is it square?"), [image(11)])
    assert start == request.images[0].end
    assert same(got, fresh_logits(ask("Is it square?"), [image(11)]))


def test_image_sent_to_a_text_model_is_a_clear_error():
    with Engine(load_tiny("qwen3"), checkpoints=False) as eng:
        _text_model_refuses_images(eng)


def _text_model_refuses_images(eng):
    with pytest.raises(GenerationError, match="text-only.*vision model"):
        eng.generate("What is this?", images=[image(1)], max_tokens=1)
    with pytest.raises(GenerationError, match="text-only"):
        eng.generate(ask("What?", img=image(1)), max_tokens=1)
    assert eng.generate("plain text still works", max_tokens=2).token_ids


def test_bad_image_inputs():
    with engine(checkpoints=False, store=None) as eng:
        _bad_inputs_are_refused(eng)


def _bad_inputs_are_refused(eng):
    with pytest.raises(GenerationError, match="no image part to go to"):
        eng.generate(ask("?"), images=[image(1), image(2)], max_tokens=1)
    with pytest.raises(GenerationError, match="has no image"):
        eng.generate(ask("?"), max_tokens=1)
    with pytest.raises(GenerationError, match="does not fetch"):
        eng.generate("?", images=["https://example.com/a.png"], max_tokens=1)
    with pytest.raises(GenerationError, match="Cannot read"):
        eng.generate("?", images=["/nonexistent/a.png"], max_tokens=1)
    with pytest.raises(GenerationError, match="not a readable image"):
        eng.generate("?", images=[b"not an image"], max_tokens=1)


def test_feature_cache_is_lru_under_a_byte_budget():
    import mlx.core as mx

    cache = FeatureCache(budget=3 * 400)
    for i in range(4):
        cache.put(bytes([i]), mx.zeros((100,), mx.float32))  # 400 bytes each
    assert cache.get(b"\x00") is None and cache.stats.evictions == 1
    assert cache.get(b"\x01") is not None
    cache.put(b"\x04", mx.zeros((100,), mx.float32))
    assert cache.get(b"\x02") is None and cache.get(b"\x01") is not None
    assert cache.stats.bytes <= cache.budget




def test_gemma4_with_bidirectional_image_attention_is_refused():
    from types import SimpleNamespace

    from forkv.engine import ModelLoadError
    from forkv.engine.vision.gemma import Gemma4Family

    config = {"model_type": "gemma4", "image_token_id": 9,
              "text_config": {"use_bidirectional_attention": "vision"}}
    lm = SimpleNamespace(name="g4", config=config, image_token_id=9, processor=None,
                         model=SimpleNamespace(language_model=None))
    with pytest.raises(ModelLoadError, match="bidirectional attention inside images"):
        Gemma4Family(lm)
