"""Fused decoder layers (engine/native/blocks.py) on mlx-lm's batch caches, as the engine merges
rows that decode together (request/batchcache.py): the two kernel calls give the bits of the
same layers run as separate kernel calls (mlx-lm's code), with rows of different lengths (left
padding), a row joining mid-decode and one leaving, sliding windows before and after their
rings wrap; and a row's logits are those it gets decoding alone, whatever rows share its
batch (the kernels' contract)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest


def _rows(lm, lengths, seed=0):
    """Each row's prompt prefilled on its own caches (as the engine does); prompts."""
    rng = np.random.default_rng(seed)
    prompts = [mx.array(rng.integers(3, 500, n))[None] for n in lengths]
    rows = []
    for ids in prompts:
        cache = lm.make_cache()
        mx.eval(lm.model(ids, cache=cache))
        rows.append(cache)
    return rows


def _merge(rows):
    """BatchCache.add's merge: each row merged alone, then extended onto the batch."""
    caches = [type(c).merge([c]) for c in rows[0]]
    for row in rows[1:]:
        for ours, theirs in zip(caches, [type(c).merge([c]) for c in row]):
            ours.extend(theirs)
    return caches


def _decode(lm, lengths, steps, join=None, leave=None, chunk=None, seed=0):
    """Logits of every step of a merged batch decoding `steps` tokens a row (row r's token at
    step s fixed by (r, s)); `join`: (step, length) of a row added then; `leave`: (step, row)
    removed then; `chunk`: (step, n) a step of n tokens a row (a verify chunk's shape).
    Returns {(row, step): logits} by each row's first index."""
    rows = _rows(lm, lengths, seed)
    live = list(range(len(lengths)))
    caches = _merge(rows)
    out = {}
    for s in range(steps):
        if join is not None and s == join[0]:
            for ours, theirs in zip(caches, [type(c).merge([c]) for c in
                                             _rows(lm, [join[1]], seed + 1)[0]]):
                ours.extend(theirs)
            live.append(len(lengths))
        if leave is not None and s == leave[0]:
            keep = [i for i, r in enumerate(live) if r != leave[1]]
            for c in caches:
                c.filter(keep)
            live = [live[i] for i in keep]
        n = chunk[1] if chunk is not None and s == chunk[0] else 1
        tokens = mx.array([[(7 * r + 13 * s + i) % 480 + 3 for i in range(n)] for r in live])
        logits = lm.model(tokens, cache=caches)[:, -1]
        mx.eval(logits)
        for i, r in enumerate(live):
            out[(r, s)] = logits[i]
    return out


def _same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert mx.array_equal(a[key], b[key]).item(), (key, mx.abs(a[key] - b[key]).max().item())


def _demo(tmp_path, monkeypatch):
    from test_native import _quantized_demo

    from forkv.engine import load_model
    from forkv.engine.native.blocks import _subclasses

    folder = _quantized_demo("demo:gemma3:tiny", tmp_path / "q8", 32, 8)
    fused = load_model(str(folder))
    monkeypatch.setenv("FORKV_NATIVE_BLOCKS", "off")
    separate = load_model(str(folder))
    monkeypatch.delenv("FORKV_NATIVE_BLOCKS")
    assert type(fused.model.layers[0]) in _subclasses.values()
    assert type(separate.model.layers[0]) not in _subclasses.values()
    return fused, separate


def test_a_batch_decodes_in_two_calls_a_layer_with_the_separate_calls_bits(lib, tmp_path,
                                                                            monkeypatch):
    from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

    from forkv.engine.native.blocks import _takes

    fused, separate = _demo(tmp_path, monkeypatch)  # sliding window of 128
    x = mx.zeros((2, 1, 8))
    assert _takes(x, None, BatchKVCache([0, 3]))
    assert _takes(x, mx.ones((2, 1, 1, 4), mx.bool_), BatchRotatingKVCache(128, [0, 3]))
    assert not _takes(x, None, BatchKVCache([0]))  # offsets not one per row
    # rows shorter than the window, one across it during decode, one wrapped already; a row
    # joins (its ring not yet wrapped), a step of 3 tokens a row, and a row leaves
    lengths, steps = [20, 100, 150], 60
    kwargs = {"join": (12, 70), "leave": (40, 0), "chunk": (30, 3)}
    _same(_decode(fused, lengths, steps, **kwargs), _decode(separate, lengths, steps, **kwargs))


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(lib, tmp_path, monkeypatch):
    # each row decoded alone on its own caches gives the bits it gets in the batch
    fused, _ = _demo(tmp_path, monkeypatch)
    lengths, steps = [20, 100, 150], 40
    batch = _decode(fused, lengths, steps)
    for r, row in enumerate(_rows(fused, lengths)):  # the same prompts
        for s in range(steps):
            tokens = mx.array([[(7 * r + 13 * s) % 480 + 3]])
            logits = fused.model(tokens, cache=row)[0, -1]
            assert mx.array_equal(logits, batch[(r, s)]).item(), (r, s)


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("symmetric", [False, True])
def test_a_tiles_rows_give_the_bits_of_one_row_calls(lib, bits, symmetric):
    # A batch's matmuls run rows in tiles of 4 x 4 whose sums are reduced together (qgemm.cpp,
    # reduce16); a lone row (plain decode) runs 1 x 1 tiles reduced one by one: each output
    # has the same bits either way. K = 640: groups of 32 leave a partial 16-lane tail.
    from test_native import _isas, _kernel_weight

    N, K, M = 37, 640, 9
    w, s, b = mx.quantize(mx.random.normal((N, K), key=mx.random.key(bits)), group_size=32,
                          bits=bits)
    s, b = (s.astype(mx.float16), None) if symmetric else (s, b)
    wk = _kernel_weight(lib, w, K, bits)
    x = mx.random.normal((M, K), key=mx.random.key(5)) * 3
    for isa in _isas(lib):
        lib.set_isa(isa)
        whole = lib.quantized_matmul(x, wk, s, b, bits, 32)
        rows = mx.concatenate([lib.quantized_matmul(x[i:i + 1], wk, s, b, bits, 32)
                               for i in range(M)])
        assert mx.array_equal(whole, rows).item(), isa
    lib.set_isa(lib.best_isa())


@pytest.mark.slow
def test_the_real_gemma3_decodes_a_batch_in_two_calls_a_layer_with_the_same_bits(lib,
                                                                                 monkeypatch):
    from forkv.engine import load_model
    from forkv.engine.models.named import NAMED_MODELS

    if not NAMED_MODELS["gemma3-270m"].is_local():
        pytest.skip("gemma3-270m is not here (the gemma extra)")
    fused = load_model("gemma3-270m")
    monkeypatch.setenv("FORKV_NATIVE_BLOCKS", "off")
    separate = load_model("gemma3-270m")
    lengths, steps = [30, 500, 530], 24  # window 512: one crosses it, one is past it
    kwargs = {"join": (6, 40), "leave": (16, 0)}
    _same(_decode(fused, lengths, steps, **kwargs), _decode(separate, lengths, steps, **kwargs))
