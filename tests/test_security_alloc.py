"""Allocator: best-fit reuse, coalescing, tail shrinking, rebuild from extents."""

import itertools

import pytest
from forkv.security.alloc import GRAIN, Allocator
from hypothesis import given, settings
from hypothesis import strategies as st


def test_reuse_and_tail_shrink():
    a = Allocator(4096)
    x, y, z = a.allocate(100), a.allocate(1000), a.allocate(10)
    assert (x, y) == (4096, 4096 + 128) and a.end == z + GRAIN
    assert not a.release(x, 100)
    assert a.allocate(64) == x  # best fit reuses the freed hole
    assert a.release(z, 10)  # freeing the tail shrinks the file
    assert a.end == y + Allocator.round(1000)


def test_coalesce_then_shrink_everything():
    a = Allocator(0)
    offsets = [a.allocate(64) for _ in range(5)]
    for off in (offsets[1], offsets[3], offsets[2], offsets[0]):
        a.release(off, 64)
    assert a.free_bytes == 4 * 64 and a.used_bytes == 64
    assert a.release(offsets[4], 64) and a.end == 0 and a.free_bytes == 0


def test_double_free_is_caught():
    a = Allocator(0)
    off = a.allocate(64)
    a.allocate(64)
    a.release(off, 64)
    with pytest.raises(AssertionError):
        a.release(off, 64)


def test_mark_used_rebuilds_free_list():
    a = Allocator(4096)
    a.mark_used([(4096 + 640, 64), (4096, 128)])
    assert a.end == 4096 + 704 and a.free_bytes == 512
    assert a.allocate(500) == 4096 + 128
    with pytest.raises(ValueError):
        Allocator(0).mark_used([(0, 128), (64, 64)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=80))
def test_extents_never_overlap(ops):
    a = Allocator(4096)
    live: dict[int, int] = {}
    for is_alloc, size in ops:
        if is_alloc or not live:
            off = a.allocate(size)
            assert off >= 4096 and off % GRAIN == 0
            live[off] = Allocator.round(size)
        else:
            off = sorted(live)[size % len(live)]
            a.release(off, live.pop(off))
        spans = sorted(live.items())
        for (o1, s1), (o2, _) in itertools.pairwise(spans):
            assert o1 + s1 <= o2
        assert all(o + s <= a.end for o, s in spans)
        assert a.used_bytes == sum(live.values())
    for off, size in list(live.items()):
        a.release(off, size)
    assert a.end == 4096 and a.free_bytes == 0
