"""Vision: the demo VLM, images in prompts and keys, position state, image-end checkpoints and
the feature cache. Runs on the tiny Qwen2-VL demo with 32-token blocks, so a 48-token image
spans block boundaries."""

import io

import numpy as np
import pytest

pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed (pip install 'forkv[vision]')")

from conftest import load_tiny
from forkv.engine import Engine, GenerationError, load_model
from forkv.engine.features import FeatureCache
from forkv.engine.generate import prefill
from forkv.engine.layout import CacheKind
from forkv.engine.recordstore import RecordStore
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


def logits_after(eng, prompt, images):
    """Last-token logits of `prompt` on `eng`: restored from its checkpoints, rest prefilled."""
    from forkv.engine.events import Timings

    request = eng.vision.render(prompt, images)
    timings = Timings()
    seq, cache, start, hook = eng.vision.prepare(request, timings)
    return prefill(seq, cache, request.tokens, start, B, hook), start, request


def fresh_logits(prompt, images, lm=None):
    return logits_after(engine(lm, checkpoints=False), prompt, images)[0]


def same(a, b) -> bool:
    import mlx.core as mx

    return mx.array_equal(a, b).item()


def test_demo_vlm_loads_offline():
    lm = vlm()
    assert lm.is_vision and lm.processor is not None
    assert lm.image_token_id == lm.config["image_token_id"]
    assert lm.layout.describe() == "2 global" and lm.make_cache()[0].offset == 0
    assert load_model(str(lm.path)).fingerprint == lm.fingerprint
    assert load_model("demo:qwen2_vl:tiny").path == lm.path


def test_missing_mlx_vlm_names_the_extra(monkeypatch):
    import sys

    from forkv.engine import ModelLoadError

    path = str(vlm().path)
    monkeypatch.setitem(sys.modules, "mlx_vlm.utils", None)  # makes the import fail
    with pytest.raises(ModelLoadError, match=r"forkv\[vision\]"):
        load_model(path)


def test_positions_and_logits_match_mlx_vlm():
    import mlx.core as mx
    from forkv.engine.vision import mrope_positions, rewind_positions

    lm = vlm()
    eng = engine(checkpoints=False)
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                           {"type": "image"}, {"type": "text", "text": "?"}]}]
    request = eng.vision.render(prompt, [image(1), image(2, (300, 120))])
    ids, grid = mx.array(request.tokens)[None], mx.array([s.grid for s in request.images])
    ref_pos, ref_delta = lm.model.language_model.get_rope_index(ids, grid)
    n = len(request.tokens)
    pos, after, end = mrope_positions(n, request.images, 0, 0, 2)
    assert np.array_equal(np.array(ref_pos[:, 0]), pos)
    assert end - n == ref_delta.item()
    # From the state after an image (or the end), positions can be worked out backwards too.
    for anchor in [s.end for s in request.images] + [n]:
        for lo in range(0, anchor + 1, 5):
            c, p = rewind_positions(request.images, anchor, int(after[anchor - 1]), lo, 2)
            assert c <= lo and not any(s.start < c < s.end for s in request.images)
            again, _, end_again = mrope_positions(n, request.images, c, p, 2)
            assert np.array_equal(again, pos[:, c:]) and end_again == end
    pixels = np.concatenate([eng.vision._preprocess(s.image)[0] for s in request.images])
    ref = lm.model(ids, pixel_values=mx.array(pixels), image_grid_thw=grid,
                   cache=lm.make_cache()).logits[0, -1]
    ours = fresh_logits(prompt, [image(1), image(2, (300, 120))])
    np.testing.assert_allclose(np.array(ours), np.array(ref), atol=1e-5)


def test_generation_with_an_image_is_deterministic():
    runs = [engine(checkpoints=False).generate(ask("What is it?"), images=[image(3)],
                                               max_tokens=8) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and runs[0].logprobs == runs[1].logprobs
    inline = engine(checkpoints=False).generate(ask("What is it?", img=image(3)), max_tokens=8)
    assert inline.token_ids == runs[0].token_ids
    other = fresh_logits(ask("What is it?"), [image(4)])
    assert not same(other, fresh_logits(ask("What is it?"), [image(3)]))


def test_different_images_never_share_image_blocks():
    eng = engine()
    a = eng.vision.render(ask("Describe it."), [image(5)])
    b = eng.vision.render(ask("Describe it."), [image(6)])
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
    eng = engine()
    first = eng.generate(ask("Count the dots.", before=shared + "One: "), images=[image(7)],
                         max_tokens=6)
    assert eng.vision.features.stats.tower_runs == 1
    # Other text right before the image: its blocks differ, so its features come from the
    # cache, while the shared text before that comes from block checkpoints.
    prompt = ask("Count the dots.", before=shared + "Two: ")
    warm = eng.generate(prompt, images=[image(7)], max_tokens=6)
    cold = engine(checkpoints=False).generate(prompt, images=[image(7)], max_tokens=6)
    stats = eng.vision.features.stats
    assert stats.tower_runs == 1 and stats.hits == 1
    a, b = (eng.vision.render(ask("Count the dots.", before=shared + w), [image(7)]).tokens
            for w in ("One: ", "Two: "))
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert warm.timings.reused_tokens == common // B * B > 0
    assert warm.token_ids == cold.token_ids and warm.logprobs == cold.logprobs
    assert first.timings.reused_tokens == 0
    got, start, _ = logits_after(eng, prompt, [image(7)])
    assert start > warm.timings.reused_tokens  # the whole prompt is checkpointed now
    assert same(got, fresh_logits(prompt, [image(7)]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_restore_after_image_is_exact_and_needs_position_state(dtype, monkeypatch):
    import mlx.core as mx
    from forkv.engine import vision_ckpt

    lm = vlm(dtype)
    eng = engine(lm)
    eng.generate(ask("What colour is it?"), images=[image(8)], max_tokens=1)
    prompt = ask("How many shapes are there, roughly?")
    got, start, request = logits_after(eng, prompt, [image(8)])
    end = request.images[0].end
    assert start == end and end % B and eng.vision.stats.tail_restores == 1
    fresh = fresh_logits(prompt, [image(8)], lm)
    assert same(got, fresh)
    # Shared text after the image reaching a block boundary: a block-aligned restore there.
    after = "Here is a long description of the question. " * 2
    eng.generate(ask(after + "Which?"), images=[image(8)], max_tokens=1)
    got, start, request = logits_after(eng, ask(after + "What?"), [image(8)])
    assert start % B == 0 and start > request.images[0].end
    assert same(got, fresh_logits(ask(after + "What?"), [image(8)], lm))
    # Restoring the caches without the position offset gives other logits.
    monkeypatch.setattr(vision_ckpt, "RESTORE_POSITION_STATE", False)
    for question in ("Is it bright?", after + "Why?"):  # after the image; at a block boundary
        bad, start, _ = logits_after(eng, ask(question), [image(8)])
        assert start >= end
        fresh = fresh_logits(ask(question), [image(8)], lm)
        assert (bad.astype(mx.float32) - fresh.astype(mx.float32)).abs().max().item() > 1e-3


def test_restore_never_ends_inside_an_image_span():
    eng = engine()
    first = eng.generate(ask("Anything?"), images=[image(9)], max_tokens=1)
    assert first.timings.reused_tokens == 0
    request = eng.vision.render(ask("Anything?"), [image(9)])
    (s, e), = request.barriers
    inside = [b for b in range(B, e, B) if b > s]
    assert inside  # block boundaries inside the image do have global records...
    ck = eng.checkpointer
    keys = ck.keyer.keys(request.tokens, request.extras(B))
    assert all(ck.store.contains(keys[b // B - 1], CacheKind.GLOBAL) for b in inside)
    for cut in range(s + 1, e + 1):  # ...but no prefix ending inside it restores there
        r = ck.restore(request.tokens[:cut], request.extras(B), request.barriers)
        assert not s < r.position < e
        r = ck.restore(request.tokens[:cut], request.extras(B))  # nor without barriers
        assert not s < r.position < e


def test_decoded_boundaries_restore_exactly():
    eng = engine()
    prompt = ask("Tell me a story about it.")
    out = eng.generate(prompt, images=[image(10)], max_tokens=40)
    request = eng.vision.render(prompt, [image(10)])
    history = request.tokens + out.token_ids
    cut = (len(history) - 1) // B * B
    assert cut > len(request.tokens)  # a boundary reached while decoding
    # Continue the decoded history with other tokens, as token ids plus the image.
    ids = history[:cut] + [97, 98, 99]
    placeholder = request.images[0]
    ids = ids[:placeholder.start + 1] + ids[placeholder.end:]  # one placeholder per image
    got, start, _ = logits_after(eng, ids, [image(10)])
    assert start == cut
    assert same(got, fresh_logits(ids, [image(10)]))


def test_decoding_after_a_restore_right_after_an_image():
    # 64-token blocks: the image ends at 85, the question too ends inside block [64, 128),
    # so the first decode boundary recomputes a block that starts inside the image.
    eng = Engine(vlm(), block_size=64, store=RecordStore(1 << 30, None))
    eng.generate(ask("Hm?"), images=[image(12)], max_tokens=1)
    prompt = ask("Go on.")
    out = eng.generate(prompt, images=[image(12)], max_tokens=50)
    request = eng.vision.render(prompt, [image(12)])
    assert out.timings.reused_tokens == request.images[0].end == 85
    assert len(request.tokens) < 128 < len(request.tokens) + len(out.token_ids)
    # A cold run (that also makes its decoded blocks canonical) gives the same output.
    cold = Engine(vlm(), block_size=64, store=RecordStore(1 << 30, None)).generate(
        prompt, images=[image(12)], max_tokens=50)
    assert out.token_ids == cold.token_ids and out.logprobs == cold.logprobs
    # The boundary at 128, reached while decoding, restores exactly.
    history = request.tokens + out.token_ids
    ids = history[:85 - 48 + 1] + history[85:128] + [97, 98]  # one placeholder per image
    from forkv.engine.events import Timings

    for e in (eng, Engine(vlm(), block_size=64, checkpoints=False)):
        req = e.vision.render(ids, [image(12)])
        seq, cache, start, hook = e.vision.prepare(req, Timings())
        logits = prefill(seq, cache, req.tokens, start, 64, hook)
        if e is eng:
            restored, at = logits, start
    assert at == 128 and same(restored, logits)


def test_records_survive_the_disk_tier():
    eng = engine(store=RecordStore(0, MemoryDisk()))  # every record round-trips the codec
    eng.generate(ask("Is it round?"), images=[image(11)], max_tokens=1)
    got, start, request = logits_after(eng, ask("Is it square?"), [image(11)])
    assert start == request.images[0].end
    assert same(got, fresh_logits(ask("Is it square?"), [image(11)]))


def test_image_sent_to_a_text_model_is_a_clear_error():
    eng = Engine(load_tiny("qwen3"), checkpoints=False)
    with pytest.raises(GenerationError, match="text-only.*vision model"):
        eng.generate("What is this?", images=[image(1)], max_tokens=1)
    with pytest.raises(GenerationError, match="text-only"):
        eng.generate(ask("What?", img=image(1)), max_tokens=1)
    assert eng.generate("plain text still works", max_tokens=2).token_ids


def test_bad_image_inputs():
    eng = engine(checkpoints=False)
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


def test_rows_of_different_requests_decode_together():
    """What a continuous-batching scheduler does with vision requests: prefill each on its own
    cache, merge the caches (left-padded), decode all rows in one forward, per-row positions."""
    import mlx.core as mx
    from forkv.engine.events import Timings
    from mlx_lm.models.cache import BatchKVCache

    eng = engine(checkpoints=False)
    limit = eng._vocab_limit
    prompts = [(ask("Short?"), image(13)),
               (ask("A much longer question about the picture?", before="Hi. "), image(14))]
    singles = [eng.generate(p, images=[i], max_tokens=6) for p, i in prompts]
    seqs, rows, tokens, logprobs = [], [], [], []

    def pick(logits):
        lp = logits[:limit] - mx.logsumexp(logits[:limit])
        tok = int(mx.argmax(lp).item())
        return tok, lp[tok].item()

    for p, i in prompts:
        request = eng.vision.render(p, [i])
        seq, cache, start, _ = eng.vision.prepare(request, Timings())
        tok, lp = pick(prefill(seq, cache, request.tokens, start, B))
        seqs.append(seq)
        rows.append(cache)
        tokens.append([tok])
        logprobs.append([lp])
    assert seqs[0].num_prompt != seqs[1].num_prompt
    merged = [BatchKVCache.merge([r[layer] for r in rows]) for layer in range(len(rows[0]))]
    for _ in range(5):
        offsets = [s.num_prompt + len(t) - 1 for s, t in zip(seqs, tokens)]
        logits = eng.vision.decode_rows(seqs, offsets, mx.array([[t[-1]] for t in tokens]),
                                        merged)
        for r in range(len(seqs)):
            tok, lp = pick(logits[r, -1])
            tokens[r].append(tok)
            logprobs[r].append(lp)
    assert tokens == [s.token_ids for s in singles]
    np.testing.assert_allclose(logprobs, [s.logprobs for s in singles], atol=1e-4)


def test_vision_and_text_requests_share_the_batch():
    eng = engine(max_seqs=3)
    prompts = [(ask("Short?"), image(15)), (ask("Longer question here?", before="Hi. "),
                                            image(16)), ("plain text, no image", None)]
    singles = [engine().generate(p, images=[i] if i else None, max_tokens=40)
               for p, i in prompts]
    assert eng.is_batched
    handles = [eng.submit(p, images=[i] if i else None, max_tokens=40) for p, i in prompts]
    results = [h.result() for h in handles]
    assert [r.token_ids for r in results] == [s.token_ids for s in singles]
    for r, s in zip(results, singles):
        np.testing.assert_allclose(r.logprobs, s.logprobs, atol=1e-4)
    # The batch's checkpoints restore: the first prompt again reuses past its image.
    again = eng.generate(ask("Short!"), images=[image(15)], max_tokens=1)
    assert again.timings.reused_tokens == eng.vision.render(ask("Short!"),
                                                            [image(15)]).images[0].end
