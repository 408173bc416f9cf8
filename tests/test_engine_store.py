"""The engine over the real encrypted disk tier: reuse, tampering and disk faults."""

import errno
import shutil
import warnings

import pytest

from conftest import load_tiny, scoped_engine
from forkv.engine import ForkvWarning
from forkv.engine.engine import make_record_store
from forkv.security import BlobStore, FaultyIO, StoreSettings
from helpers import fresh_run, random_tokens


def _engine(lm, io=None, **settings):
    settings = StoreSettings.from_env(ram_budget=0, **settings)  # every record to disk
    store = make_record_store(settings)
    if io is not None:
        store.disk.close()
        store.disk = BlobStore(settings, io=io)
        store.disk.set_eviction_order(store._disk_order)
    return scoped_engine(lm, store=store)


def _plain(lm, tokens, n):
    return fresh_run(lm, tokens, max_tokens=n).token_ids


@pytest.mark.parametrize("arch_name", ["gemma3", "qwen3_5"])
def test_restore_from_encrypted_disk_tier(arch_name):
    lm = load_tiny(arch_name)
    engine = _engine(lm)
    tokens = random_tokens(700, seed=20)
    engine.generate(tokens, max_tokens=1)
    engine.store.flush()
    assert engine.store.ram_bytes == 0 and engine.store.disk.stats().num_records > 0
    r = engine.generate(tokens, max_tokens=6)
    assert r.timings.reused_tokens == 512 and r.token_ids == _plain(lm, tokens, 6)
    stats = engine.stats()
    assert stats["tokens_reused"] == 512 and stats["disk"]["records"] > 0
    assert stats["ram"]["bytes"] == 0 and stats["disk"]["bytes_written"] > 0
    engine.close()


def test_env_settings_reach_the_engine(monkeypatch):
    monkeypatch.setenv("FORKV_DISK", "off")
    monkeypatch.setenv("FORKV_RAM_BUDGET", "64MB")
    engine = scoped_engine(load_tiny("qwen3"))
    assert engine.store.disk is None and engine.store.ram_budget == 64 * 10**6


def test_disk_full_at_kth_write_still_generates_correctly():
    lm = load_tiny("gemma3")
    io = FaultyIO()
    io.fail("pwrite", errno.ENOSPC, at=3)
    engine = _engine(lm, io=io)
    tokens = random_tokens(1300, seed=21)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = engine.generate(tokens, max_tokens=6)
        engine.store.flush()
        again = engine.generate(tokens, max_tokens=6)
    assert out.token_ids == again.token_ids == _plain(lm, tokens, 6)
    assert any(issubclass(w.category, ForkvWarning) for w in caught)
    engine.close()


def test_folder_deleted_mid_run_still_generates_correctly():
    lm = load_tiny("qwen3_5")
    engine = _engine(lm)
    tokens = random_tokens(900, seed=22)
    engine.generate(tokens[:600], max_tokens=1)
    engine.store.flush()
    shutil.rmtree(engine.store.disk.folder, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ForkvWarning)
        r = engine.generate(tokens, max_tokens=6)
    assert r.token_ids == _plain(lm, tokens, 6)
    engine.close()


def test_tampered_disk_records_are_misses_not_wrong_output():
    lm = load_tiny("gemma3")
    io = FaultyIO()
    engine = _engine(lm, io=io)
    tokens = random_tokens(800, seed=23)
    engine.generate(tokens, max_tokens=1)
    engine.store.flush()
    disk = engine.store.disk
    import os

    # Flip a byte every 4 KiB of the (unlinked) data file: every record is hit.
    fd = disk._file.fd
    size = os.fstat(fd).st_size
    for off in range(100, size, 4096):
        b = os.pread(fd, 1, off)
        os.pwrite(fd, bytes([b[0] ^ 0x5A]), off)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ForkvWarning)
        r = engine.generate(tokens, max_tokens=6)
    assert r.token_ids == _plain(lm, tokens, 6)
    assert r.timings.reused_tokens == 0
    engine.close()
