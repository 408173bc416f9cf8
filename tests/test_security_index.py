"""Index: LRU order, custom eviction order, metadata encoding, JSON round trip."""

import pytest
from forkv.security.index import MAX_META_BYTES, Entry, Index, encode_meta


def _entry(extent=64, gen=1):
    return Entry(0, extent, 1, bytes(12), gen, 0)


def test_lru_eviction_order_and_touch():
    idx = Index()
    for i in range(4):
        idx.put((b"k%d" % i, "global"), _entry())
    idx.touch((b"k0", "global"))
    evicted = idx.evict(128, None)
    assert [e for e in evicted] and len(idx) == 2 and idx.bytes_used == 128
    assert (b"k0", "global") in idx and (b"k3", "global") in idx


def test_custom_order_window_before_state_later_blocks_first():
    idx = Index()
    for block in range(3):
        for kind in ("state", "window"):
            idx.put((bytes([block]), kind), _entry())
    rank = {"window": 0, "state": 1}
    def order(key, kind):
        return rank[kind], -key[0]

    idx.evict(4 * 64, order)  # room for two more: two windows go, latest block first
    left = {slot for slot, _ in idx.items()}
    assert left == {(b"\x00", "window"), (b"\x00", "state"), (b"\x01", "state"), (b"\x02", "state")}


def test_replace_returns_old_and_tracks_bytes():
    idx = Index()
    assert idx.put((b"k", "g"), _entry(64)) is None
    old = idx.put((b"k", "g"), _entry(128, 2))
    assert old.generation == 1 and idx.bytes_used == 128 and len(idx) == 1
    assert idx.pop((b"k", "g")).extent == 128 and idx.bytes_used == 0


def test_encode_meta():
    assert encode_meta(None) == encode_meta({}) == b"{}"
    assert encode_meta({"b": "2", "a": "é"}) == '{"a":"é","b":"2"}'.encode()
    with pytest.raises(TypeError):
        encode_meta({"a": 1})
    with pytest.raises(ValueError):
        encode_meta({"a": "x" * MAX_META_BYTES})


def test_json_round_trip_and_rejects_bad_rows():
    idx = Index()
    idx.put((b"\x01\x02", "state"), Entry(4096, 128, 50, b"n" * 12, 3, 1, b'{"a":"b"}', {"a": "b"}))
    back = Index.from_json(idx.to_json())
    ((slot, entry),) = back.items()
    assert slot == (b"\x01\x02", "state") and entry == idx.get(slot)
    row = idx.to_json()[0]
    row[2] = -1
    with pytest.raises(ValueError):
        Index.from_json([row])
