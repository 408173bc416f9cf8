from forkv.engine.cache.layout import CacheKind
from forkv.engine.cache.records import Record
from forkv.engine.cache.recordstore import RecordStore
from helpers import MemoryDisk


def _rec(kind, block, nbytes=1000):
    import mlx.core as mx

    return Record(kind, block, b"\0" * 4, {"0.k": mx.zeros((nbytes // 4,), mx.float32)})


def _key(block, kind=""):
    return f"{kind}{block}".encode().ljust(32, b"\0")


def test_ram_lru_within_budget_without_disk():
    store = RecordStore(ram_budget=3500, disk=None)
    for b in range(5):
        store.put(_key(b), _rec(CacheKind.GLOBAL, b))
    assert store.ram_bytes <= 3500
    # later blocks go first: the earliest blocks (a restorable prefix) survive
    assert [store.contains(_key(b), CacheKind.GLOBAL) for b in range(5)] == [
        True, True, True, False, False]
    assert store.stats.ram_evictions == 2


def test_eviction_takes_later_blocks_then_window_state_global():
    store = RecordStore(ram_budget=4200, disk=None)
    for kind in (CacheKind.GLOBAL, CacheKind.STATE, CacheKind.WINDOW):
        store.put(_key(1), _rec(kind, 1))
    store.put(_key(0), _rec(CacheKind.GLOBAL, 0))
    store.put(_key(0), _rec(CacheKind.WINDOW, 0))  # over budget: block 1's window goes
    assert not store.contains(_key(1), CacheKind.WINDOW)
    assert store.contains(_key(1), CacheKind.STATE)
    store.put(_key(0), _rec(CacheKind.STATE, 0))  # then block 1's state
    assert not store.contains(_key(1), CacheKind.STATE)
    assert store.contains(_key(1), CacheKind.GLOBAL)
    assert all(store.contains(_key(0), k) for k in (CacheKind.GLOBAL, CacheKind.WINDOW,
                                                    CacheKind.STATE))


def test_window_and_state_go_to_disk_and_leave_ram():
    disk = MemoryDisk()
    store = RecordStore(ram_budget=1 << 30, disk=disk, block_size=4)
    store.put(_key(0), _rec(CacheKind.GLOBAL, 0))
    store.put(_key(0), _rec(CacheKind.STATE, 0))
    store.put(_key(0), _rec(CacheKind.WINDOW, 0))
    assert store.stats.by_kind == {"global": 1004}
    assert set(disk.blobs) == {(_key(0), "state"), (_key(0), "window")}
    back = store.get(_key(0), CacheKind.STATE)
    assert back.kind == CacheKind.STATE and back.block == 0 and back.arrays["0.k"].size == 250


def test_global_spills_to_disk_over_budget():
    disk = MemoryDisk()
    store = RecordStore(ram_budget=2500, disk=disk, block_size=4)
    for b in range(4):
        store.put(_key(b), _rec(CacheKind.GLOBAL, b))
    assert store.stats.spilled == 2 and store.ram_bytes <= 2500
    assert all(store.contains(_key(b), CacheKind.GLOBAL) for b in range(4))
    assert store.get(_key(3), CacheKind.GLOBAL).block == 3
    # the disk tier is steered the same way: later blocks, window records first
    assert disk.order(_key(3), "global") < disk.order(_key(1), "window")
    assert (disk.order(_key(1), "window") < disk.order(_key(1), "state")
            < disk.order(_key(1), "global"))


def test_corrupt_disk_record_is_a_miss():
    disk = MemoryDisk()
    store = RecordStore(ram_budget=1 << 30, disk=disk, block_size=4)
    store.put(_key(0), _rec(CacheKind.STATE, 0))
    disk.blobs[(_key(0), "state")] = b"garbage"
    disk.digests[(_key(0), "state")] = __import__("hashlib").sha256(b"garbage").digest()
    assert store.get(_key(0), CacheKind.STATE) is None
    assert store.stats.decode_errors == 1 and not disk.blobs


def test_wrong_block_size_is_a_miss():
    disk = MemoryDisk()
    RecordStore(1 << 30, disk, block_size=4).put(_key(0), _rec(CacheKind.STATE, 0))
    assert RecordStore(1 << 30, disk, block_size=8).get(_key(0), CacheKind.STATE) is None


def test_disk_reads_go_through_get_into_and_the_scratch_is_reused():
    import mlx.core as mx

    disk = MemoryDisk()
    store = RecordStore(ram_budget=1 << 30, disk=disk, block_size=4)
    a, b = _rec(CacheKind.STATE, 0), _rec(CacheKind.STATE, 1)
    a.arrays["0.k"] = mx.arange(250, dtype=mx.float32)
    store.put(_key(0), a)
    store.put(_key(1), b)
    first = store.get(_key(0), CacheKind.STATE)
    second = store.get(_key(1), CacheKind.STATE)  # decoded from the same scratch buffer
    assert disk.reads == 2 and second.block == 1
    assert mx.array_equal(first.arrays["0.k"], a.arrays["0.k"]).item()  # not overwritten
    assert store.get(_key(2), CacheKind.STATE) is None and store.stats.disk_misses == 1


def test_every_tier_implements_the_protocol():
    from forkv.bench.store import _PlainFileDisk
    from forkv.engine.cache.tiers import RamTier, Tier
    from forkv.security import BlobStore, StoreSettings

    plain = _PlainFileDisk()
    with BlobStore(StoreSettings(ram_budget=0, disk_budget=1 << 20)) as blob:
        for tier in (RamTier(0), blob, MemoryDisk(), plain):
            assert isinstance(tier, Tier), type(tier).__name__
    plain.close()


def test_tiers_are_an_ordered_list():
    """Records spill from RAM to the first byte tier; a get finds a record in any tier, and
    a corrupt copy in one tier is dropped before the next is read."""
    first, second = MemoryDisk(), MemoryDisk()
    store = RecordStore(ram_budget=1500, disk=first, block_size=4, tiers=[second])
    assert store.disk is first and len(store.tiers) == 3
    for b in range(2):
        store.put(_key(b), _rec(CacheKind.GLOBAL, b))
    assert (_key(1), "global") in first.blobs and not second.blobs  # spilled to the next tier
    second.put(_key(1), "global", first.blobs[(_key(1), "global")])
    first.blobs[(_key(1), "global")] = b"garbage"
    first.digests[(_key(1), "global")] = __import__("hashlib").sha256(b"garbage").digest()
    assert store.get(_key(1), CacheKind.GLOBAL).block == 1  # from the second tier
    assert store.stats.decode_errors == 1 and (_key(1), "global") not in first.blobs
    store.discard(_key(1), CacheKind.GLOBAL)
    assert not store.contains(_key(1), CacheKind.GLOBAL)
