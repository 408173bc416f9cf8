"""BlobStore: API, budget and eviction, tamper resistance, secrecy of the key, concurrency."""

import logging
import os
import pickle
import threading
import warnings

import pytest
from forkv.security import Blob, BlobStore, DiskIO, ForkvWarning, StoreSettings
from forkv.security.aead import sealed_size
from forkv.security.alloc import Allocator
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule


@pytest.fixture(autouse=True)
def no_unexpected_warnings():
    """A ForkvWarning that no test expected (with pytest.warns) fails the test."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ForkvWarning)
        yield
    assert [str(w.message) for w in caught if issubclass(w.category, ForkvWarning)] == []


def session_key(store: BlobStore) -> bytes:
    """The current session's data key, derived again the way the store does."""
    df = store._file
    info = b"forkv session key v1|" + df.store_id
    return bytes(df.master.derive(df.session_salts[df.current], info))


def make_store(tmp_path, io=None, **kw) -> BlobStore:
    kw.setdefault("disk_budget", 64 << 20)
    settings = StoreSettings.from_env({}, disk_dir=str(tmp_path), handle_signals=False, **kw)
    return BlobStore(settings, io=io)


class GatedIO(DiskIO):
    """Record writes wait for ``gate``: holds items in the queue on purpose."""

    def __init__(self):
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def pwrite(self, fd, data, offset):
        self.waiting.set()
        self.gate.wait(10)
        super().pwrite(fd, data, offset)


def extent(n: int) -> int:
    return Allocator.round(sealed_size(n))


def on_disk(store: BlobStore, key: bytes, kind: str) -> tuple[int, int]:
    entry = store._index.get((key, kind))
    return entry.offset, sealed_size(entry.length)


# -- API ---------------------------------------------------------------------------------


def test_put_get_contains_delete(tmp_path):
    with make_store(tmp_path) as store:
        assert store.get(b"k", "global") is None
        assert store.put(b"k", "global", b"data", {"layers": "4"})
        assert store.contains(b"k", "global") and not store.contains(b"k", "window")
        assert store.get(b"k", "global") == Blob(b"data", {"layers": "4"})  # maybe from the queue
        assert store.flush()
        assert store.get(b"k", "global") == Blob(b"data", {"layers": "4"})  # from disk
        store.delete(b"k", "global")
        assert store.get(b"k", "global") is None and not store.contains(b"k", "global")
        s = store.stats()
        assert (s.num_hits, s.num_misses, s.num_records, s.bytes_on_disk) == (2, 2, 0, 0)
        assert s.bytes_written == sealed_size(4) and s.mode == "ephemeral" and s.is_enabled


def test_memoryview_and_empty_and_overwrite(tmp_path):
    with make_store(tmp_path) as store:
        buf = bytearray(b"abc" * 1000)
        store.put(b"k", "state", memoryview(buf))
        buf[:3] = b"zzz"  # the store copied the mutable buffer
        store.put(b"e", "state", b"")
        store.flush()
        assert store.get(b"k", "state").data == b"abc" * 1000
        assert store.get(b"e", "state").data == b""
        store.put(b"k", "state", b"v2")
        store.put(b"k", "state", b"v3")
        store.flush()
        assert store.get(b"k", "state").data == b"v3" and store.stats().num_records == 2


def test_served_from_queue_before_write(tmp_path):
    io = GatedIO()
    with make_store(tmp_path, io=io) as store:
        store.put(b"k", "global", b"queued")
        assert store.get(b"k", "global").data == b"queued"
        io.gate.set()
        store.flush()
        assert store.get(b"k", "global").data == b"queued"


def test_get_into_decrypts_into_the_callers_buffer(tmp_path):
    io = GatedIO()
    asked = []

    def alloc(n):
        asked.append(n)
        return bytearray(b"\xff" * (n + 7))  # larger than asked: only a prefix is used

    with make_store(tmp_path, io=io) as store:
        assert store.get_into(b"k", "state", alloc) is None and asked == []  # a miss
        store.put(b"k", "state", b"payload" * 100, {"m": "1"})
        blob = store.get_into(b"k", "state", alloc)  # still queued: copied from the queue
        assert bytes(blob.data) == b"payload" * 100 and blob.meta == {"m": "1"}
        io.gate.set()
        store.flush()
        blob = store.get_into(b"k", "state", alloc)  # from disk
        assert bytes(blob.data) == b"payload" * 100 and blob.meta == {"m": "1"}
        assert isinstance(blob.data, memoryview) and asked == [700, 700]
        s = store.stats()
        assert (s.num_hits, s.num_misses) == (2, 1)


def test_get_into_tampered_is_a_miss_and_leaves_zeros(tmp_path):
    with make_store(tmp_path) as store:
        store.put(b"k", "global", b"secret" * 50)
        store.flush()
        fd, (offset, _) = store._file.fd, on_disk(store, b"k", "global")
        os.pwrite(fd, bytes([os.pread(fd, 1, offset + 40)[0] ^ 1]), offset + 40)
        buf = bytearray(b"\xff" * 300)
        with pytest.warns(ForkvWarning, match="authentication"):
            assert store.get_into(b"k", "global", lambda n: buf) is None
        assert buf == bytes(300)  # never unverified plaintext
        s = store.stats()
        assert (s.num_tampered, s.num_misses, s.num_hits) == (1, 1, 0)
        assert not store.contains(b"k", "global")
    assert store.get_into(b"k", "global", bytearray) is None  # closed: a miss


def test_off_switch_is_a_cheap_no_op(tmp_path):
    store = make_store(tmp_path, disk=False)
    assert not store.put(b"k", "global", b"x") and store.get(b"k", "global") is None
    assert not store.contains(b"k", "global") and store.flush()
    store.delete(b"k", "global")
    store.wipe()
    s = store.stats()
    assert s.mode == "off" and not s.is_enabled and s.num_dropped == 0 and store.folder is None
    store.close()
    assert os.listdir(tmp_path) == []


def test_closed_store_is_inert(tmp_path):
    store = make_store(tmp_path)
    store.put(b"k", "global", b"x")
    store.close()
    store.close()
    assert not store.put(b"k", "global", b"x") and store.get(b"k", "global") is None
    assert os.listdir(tmp_path) == []


def test_wipe(tmp_path):
    with make_store(tmp_path) as store:
        for i in range(5):
            store.put(b"k%d" % i, "global", os.urandom(1000))
        store.flush()
        old = store._file.sealer(store._file.current)
        store.wipe()
        assert store.stats().num_records == 0 and os.fstat(store._file.fd).st_size == 0
        assert old._aead is None  # the old session key is gone
        assert store.put(b"k0", "global", b"new") and store.flush()
        assert store.get(b"k0", "global").data == b"new"


# -- budget and eviction ------------------------------------------------------------------


def test_lru_eviction_under_budget(tmp_path):
    with make_store(tmp_path, disk_budget=3 * extent(1000)) as store:
        for i in range(3):
            store.put(b"k%d" % i, "global", bytes(1000))
        store.flush()
        store.get(b"k0", "global")  # k0 is now the most recent
        store.put(b"k3", "global", bytes(1000))
        store.flush()
        assert store.get(b"k1", "global") is None
        assert all(store.get(b"k%d" % i, "global") for i in (0, 2, 3))
        s = store.stats()
        assert s.num_evictions == 1 and s.bytes_on_disk <= s.disk_budget


def test_custom_eviction_order(tmp_path):
    with make_store(tmp_path, disk_budget=4 * extent(1000)) as store:
        rank = {"window": 0, "state": 1}
        store.set_eviction_order(lambda key, kind: (rank[kind], -key[0]))
        for block in range(2):
            for kind in ("state", "window"):
                store.put(bytes([block]), kind, bytes(1000))
        store.flush()
        store.put(bytes([9]), "state", bytes(1000))
        store.flush()
        assert store.get(bytes([1]), "window") is None  # later block's window goes first
        assert store.get(bytes([0]), "window") and store.get(bytes([1]), "state")


def test_broken_eviction_hook_falls_back_to_lru(tmp_path):
    with make_store(tmp_path, disk_budget=extent(1000)) as store:
        store.set_eviction_order(lambda key, kind: 1 / 0)
        store.put(b"a", "global", bytes(1000))
        store.flush()
        with pytest.warns(ForkvWarning, match="eviction order"):  # raised on the writer thread
            (store.put(b"b", "global", bytes(1000)), store.flush())
        assert store.get(b"b", "global") and store.get(b"a", "global") is None


def test_too_big_and_queue_full_are_dropped(tmp_path):
    io = GatedIO()
    with make_store(tmp_path, io=io, disk_budget=extent(100), queue_max=1) as store:
        assert not store.put(b"big", "global", bytes(200))
        assert store.put(b"a", "global", bytes(10))
        assert io.waiting.wait(5)  # the writer took it and is blocked
        assert store.put(b"b", "global", bytes(10))  # fills the queue
        assert not store.put(b"c", "global", bytes(10))  # full: dropped, not blocking
        io.gate.set()
        store.flush()
        assert store.stats().num_dropped == 2


def test_freed_space_is_reused_and_file_shrinks(tmp_path):
    with make_store(tmp_path) as store:
        for i in range(4):
            store.put(b"k%d" % i, "global", bytes(5000))
        store.flush()
        size = os.fstat(store._file.fd).st_size
        store.delete(b"k1", "global")
        store.put(b"k9", "global", bytes(4000))
        store.flush()
        assert os.fstat(store._file.fd).st_size == size  # k9 went into k1's hole
        for key in (b"k3", b"k2"):
            store.delete(key, "global")
        assert os.fstat(store._file.fd).st_size < size


# -- tampering ----------------------------------------------------------------------------


def test_flip_every_byte_of_a_record(tmp_path):
    with make_store(tmp_path) as store:
        store.put(b"k", "global", b"sample record payload", {"m": "1"})
        store.flush()
        entry = store._index.get((b"k", "global"))
        aad = store._aad((b"k", "global"), entry)
        fd, (offset, size) = store._file.fd, on_disk(store, b"k", "global")
        original = os.pread(fd, size, offset)
        for pos in range(size):
            os.pwrite(fd, bytes([original[pos] ^ 0x5A]), offset + pos)
            with pytest.raises(Exception):  # noqa: B017 - any refusal; never plaintext
                store._file.read_record(entry, aad)
            os.pwrite(fd, original[pos : pos + 1], offset + pos)
        assert store.get(b"k", "global").data == b"sample record payload"
        os.pwrite(fd, bytes([original[40] ^ 1]), offset + 40)
        with pytest.warns(ForkvWarning, match="authentication"):
            assert store.get(b"k", "global") is None
        assert store.stats().num_tampered == 1 and not store.contains(b"k", "global")


def test_swap_replay_zero_and_truncate(tmp_path):
    with make_store(tmp_path) as store, warnings.catch_warnings():
        warnings.simplefilter("ignore", ForkvWarning)
        fd = store._file.fd
        store.put(b"a", "global", b"A" * 100)
        store.put(b"b", "global", b"B" * 100)
        store.flush()
        (oa, n), (ob, _) = on_disk(store, b"a", "global"), on_disk(store, b"b", "global")
        ra, rb = os.pread(fd, n, oa), os.pread(fd, n, ob)
        os.pwrite(fd, rb, oa)
        os.pwrite(fd, ra, ob)  # swapped: each is a valid record of the other slot
        assert store.get(b"a", "global") is None and store.get(b"b", "global") is None

        store.put(b"r", "global", b"old" * 30)
        store.flush()
        offset, n = on_disk(store, b"r", "global")
        old = os.pread(fd, n, offset)
        store.put(b"r", "global", b"new" * 30)
        store.flush()
        offset, _ = on_disk(store, b"r", "global")
        os.pwrite(fd, old, offset)  # replay the older version in place of the new one
        assert store.get(b"r", "global") is None

        store.put(b"z", "global", b"Z" * 100)
        store.flush()
        offset, n = on_disk(store, b"z", "global")
        os.pwrite(fd, bytes(n), offset)  # an all-zero region
        assert store.get(b"z", "global") is None

        store.put(b"t", "global", b"T" * 5000)
        store.flush()
        offset, n = on_disk(store, b"t", "global")
        os.ftruncate(fd, offset + n // 2)
        assert store.get(b"t", "global") is None
        assert store.stats().num_tampered == 4 and store.stats().num_failed == 1


def test_record_copied_between_stores_is_refused(tmp_path):
    with make_store(tmp_path) as one, make_store(tmp_path) as two, warnings.catch_warnings():
        warnings.simplefilter("ignore", ForkvWarning)
        for store in (one, two):
            store.put(b"k", "global", b"P" * 64)
            store.flush()
        o1, n = on_disk(one, b"k", "global")
        o2, _ = on_disk(two, b"k", "global")
        os.pwrite(two._file.fd, os.pread(one._file.fd, n, o1), o2)
        assert two.get(b"k", "global") is None and one.get(b"k", "global").data == b"P" * 64


# -- secrecy of the key -------------------------------------------------------------------


def _key_forms(store: BlobStore) -> list[bytes]:
    master = bytes(store._file.master._buf)
    session = session_key(store)
    forms = []
    for key in (master, session):
        forms += [key, key.hex().encode(), key.hex().upper().encode(), repr(key).encode()]
    return forms


def test_key_never_persisted_or_shown(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with make_store(tmp_path) as store:
        for i in range(20):
            store.put(b"k%d" % i, "state", os.urandom(3000), {"i": str(i)})
        store.flush()
        store.get(b"k3", "state")
        forms = _key_forms(store)
        size = os.fstat(store._file.fd).st_size
        data_file = os.pread(store._file.fd, size, 0)
        texts = [repr(store), str(store), repr(store.stats()), repr(store.settings),
                 repr(store._file.master), repr(store._file.sealer(0)), caplog.text,
                 repr(store.get(b"k3", "state")), repr(os.environ)]  # fmt: skip
        pickles = [
            pickle.dumps(store.stats()),
            pickle.dumps(store.settings),
            pickle.dumps(store.get(b"k3", "state")),
        ]
        assert os.listdir(store.folder) == []  # the data file has no name to find
        for form in forms:
            assert form not in data_file
            assert all(form.decode("latin-1") not in t for t in texts)
            assert all(form not in p for p in pickles)
        for obj in (store, store._file.master, store._file.sealer(0)):
            with pytest.raises(TypeError, match="pickled"):
                pickle.dumps(obj)


# -- model-based and concurrent -----------------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    """put/get/delete/flush/wipe against a dict; a small budget forces evictions."""

    def __init__(self):
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp()
        self.store = make_store(self.dir, disk_budget=6 * extent(200))
        self.model: dict[tuple[bytes, str], bytes] = {}

    keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"])
    kinds = st.sampled_from(["global", "window", "state"])

    @rule(key=keys, kind=kinds, data=st.binary(max_size=200))
    def put(self, key, kind, data):
        assert self.store.put(key, kind, data, {"n": str(len(data))})
        self.model[(key, kind)] = data

    @rule(key=keys, kind=kinds)
    def get(self, key, kind):
        blob = self.store.get(key, kind)
        if blob is not None:  # evicted is fine; wrong is never fine
            assert (key, kind) in self.model and blob.data == self.model[(key, kind)]
            assert blob.meta == {"n": str(len(blob.data))}

    @rule(key=keys, kind=kinds)
    def delete(self, key, kind):
        self.store.delete(key, kind)
        self.model.pop((key, kind), None)
        assert not self.store.contains(key, kind)

    @rule()
    def concurrent_gets(self):
        """Three threads read every slot while the writer may be evicting."""
        seen = []

        def read_all():
            for slot in list(self.model):
                blob = self.store.get(*slot)
                seen.append(blob is None or blob.data == self.model[slot])

        threads = [threading.Thread(target=read_all) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(seen)

    @rule()
    def flush(self):
        assert self.store.flush()

    @precondition(lambda self: len(self.model) > 3)
    @rule()
    def wipe(self):
        self.store.wipe()
        self.model.clear()

    @invariant()
    def within_budget(self):
        s = self.store.stats()
        assert s.bytes_on_disk <= s.disk_budget and s.num_tampered == 0 and s.is_enabled

    def teardown(self):
        self.store.close()
        os.rmdir(self.dir)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


def test_concurrent_threads_never_see_wrong_data(tmp_path):
    errors = []
    with make_store(tmp_path, disk_budget=40 * extent(2000)) as store:

        def worker(tid: int) -> None:
            rng = __import__("random").Random(tid)
            model = {}
            try:
                for step in range(300):
                    key = b"t%d-%d" % (tid, rng.randrange(12))
                    op = rng.random()
                    if op < 0.4:
                        data = os.urandom(rng.randrange(2000))
                        if store.put(key, "global", data):
                            model[key] = data
                    elif op < 0.65:
                        blob = store.get(key, "global")
                        assert blob is None or blob.data == model.get(key), "wrong data"
                    elif op < 0.9:
                        blob = store.get_into(key, "global", bytearray)
                        assert blob is None or blob.data == model.get(key), "wrong data"
                    else:
                        store.delete(key, "global")
                        model.pop(key, None)
            except AssertionError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        s = store.stats()
        assert s.num_tampered == 0 and s.num_failed == 0 and s.bytes_on_disk <= s.disk_budget


def test_read_during_eviction(tmp_path):
    stop, errors = threading.Event(), []
    with make_store(tmp_path, disk_budget=4 * extent(4096)) as store:
        values = {b"r%d" % i: os.urandom(4096) for i in range(32)}

        def reader():
            while not stop.is_set():
                for key, value in values.items():
                    blob = store.get(key, "window")
                    if blob is not None and blob.data != value:
                        errors.append(key)

        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in readers:
            t.start()
        for _ in range(5):
            for key, value in values.items():
                store.put(key, "window", value)  # constant eviction churn
            store.flush()
        stop.set()
        for t in readers:
            t.join()
        assert not errors and store.stats().num_evictions > 0 and store.stats().num_tampered == 0
