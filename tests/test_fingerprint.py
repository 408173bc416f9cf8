"""Model fingerprints cover every weight byte, are cached privately by (dev, inode, size,
mtime_ns), and tie a persistent store to one model (issue 15, item 1)."""

import json
import os
import shutil
import struct

import pytest
from forkv.engine.models import fingerprint as fp
from forkv.engine.models.loader import fingerprint

CONFIG = {"model_type": "qwen3", "hidden_size": 8}
MIB = 1 << 20


def make_model(folder, weights: bytes):
    folder.mkdir(parents=True)
    header = json.dumps(
        {"w": {"dtype": "U8", "shape": [len(weights)], "data_offsets": [0, len(weights)]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + weights)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    fp._memo.clear()
    yield tmp_path / "cache" / "fingerprints"
    fp._memo.clear()


def test_a_changed_tensor_in_the_middle_changes_the_fingerprint(tmp_path):
    weights = bytearray(os.urandom(4 * MIB))  # more than the first and last MiB
    a = make_model(tmp_path / "a", bytes(weights))
    weights[2 * MIB] ^= 1  # an in-place fine-tune of the same size
    b = make_model(tmp_path / "b", bytes(weights))
    assert fingerprint(a, CONFIG, "float32") != fingerprint(b, CONFIG, "float32")
    assert fingerprint(a, CONFIG, "float32") == fingerprint(a, CONFIG, "float32")
    assert fingerprint(a, CONFIG, "float32") != fingerprint(a, CONFIG, "bfloat16")


def test_second_load_reads_no_weight_byte(tmp_path, monkeypatch, private_cache):
    model = make_model(tmp_path / "m", os.urandom(MIB))
    calls = []
    real = fp._hash_file
    monkeypatch.setattr(fp, "_hash_file", lambda *a: calls.append(a) or real(*a))
    first = fingerprint(model, CONFIG, "float32")
    assert len(calls) == 1
    fp._memo.clear()  # a new process: only the on-disk cache is left
    assert fingerprint(model, CONFIG, "float32") == first and len(calls) == 1
    os.utime(model / "model.safetensors", ns=(1, 1))  # touched: hashed again
    assert fingerprint(model, CONFIG, "float32") == first and len(calls) == 2
    folder_mode = os.stat(private_cache).st_mode & 0o777
    entry_modes = {os.stat(private_cache / n).st_mode & 0o777 for n in os.listdir(private_cache)}
    assert folder_mode == 0o700 and entry_modes == {0o600}


def test_planted_or_loose_cache_entries_are_ignored(tmp_path, private_cache):
    model = make_model(tmp_path / "m", os.urandom(MIB))
    good = fingerprint(model, CONFIG, "float32")
    (entry,) = os.listdir(private_cache)
    doc = json.loads((private_cache / entry).read_text())
    doc["blake3"] = "00" * 32  # what another user would like us to believe
    (private_cache / entry).write_text(json.dumps(doc))
    os.chmod(private_cache / entry, 0o644)  # open to others: not trusted
    fp._memo.clear()
    assert fingerprint(model, CONFIG, "float32") == good
    if os.geteuid() == 0:
        (private_cache / entry).write_text(json.dumps(doc))
        os.chmod(private_cache / entry, 0o600)
        os.chown(private_cache / entry, 4242, 4242)  # private, but not ours
        fp._memo.clear()
        assert fingerprint(model, CONFIG, "float32") == good


def test_unusable_cache_folder_still_fingerprints(tmp_path, private_cache):
    private_cache.parent.mkdir(parents=True)
    private_cache.symlink_to(tmp_path)  # a link is never used
    model = make_model(tmp_path / "m", os.urandom(1000))
    assert len(fingerprint(model, CONFIG, "float32")) == 32


def test_persistent_store_refuses_another_model(tmp_path, monkeypatch):
    """End to end: the engine binds its persistent disk tier to the model it serves."""
    from forkv.engine import Engine
    from forkv.engine.demo.models import ensure_demo_model
    from forkv.security import ModelMismatchError, StoreSettings

    monkeypatch.delenv("FORKV_CACHE_DIR")  # the demo models live in the shared test cache
    original = ensure_demo_model("qwen3", "tiny")
    tuned = tmp_path / "tuned"
    shutil.copytree(original, tuned)
    raw = bytearray((tuned / "model.safetensors").read_bytes())
    raw[len(raw) // 2] ^= 1  # one weight byte in the middle, same size
    (tuned / "model.safetensors").write_bytes(raw)

    settings = StoreSettings.from_env(
        {}, persist_path=str(tmp_path / "s.fkv"), key=os.urandom(32), handle_signals=False
    )
    Engine(str(original), settings=settings).close()
    with pytest.raises(ModelMismatchError, match="another file for this model"):
        Engine(str(tuned), settings=settings)
    Engine(str(original), settings=settings).close()  # the store was closed, not damaged
