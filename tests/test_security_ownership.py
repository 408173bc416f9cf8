"""Ownership: key and store files must be ours, and no folder above them (or above the disk
tier's folder) may be writable by other users without the sticky bit (issue 15, item 4).

The tests run as root in CI; files of "another user" are made with os.chown."""

import os
import warnings

import pytest
from forkv.security import (
    BlobStore,
    ForkvWarning,
    StoreSettings,
    UnsafePathError,
    make_key_file,
)
from forkv.security.keys import MasterKey

OTHER_UID = 4242

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def persist(path, **kw) -> StoreSettings:
    return StoreSettings.from_env({}, persist_path=str(path), handle_signals=False, **kw)


@needs_root
def test_key_file_of_another_user_is_refused(tmp_path):
    key = tmp_path / "key"
    make_key_file(str(key))
    os.chown(key, OTHER_UID, OTHER_UID)  # still 0600: root could read it before
    with pytest.raises(UnsafePathError, match=f"uid {OTHER_UID}.*copy it to a file you own"):
        MasterKey.from_key_file(str(key))
    with pytest.raises(UnsafePathError):
        BlobStore(persist(tmp_path / "s.fkv", key_file=str(key)))


@needs_root
def test_store_file_of_another_user_is_refused(tmp_path):
    path = tmp_path / "s.fkv"
    with BlobStore(persist(path, key=os.urandom(32))):
        pass
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError, match=f"uid {OTHER_UID}"):
        BlobStore(persist(path, key=os.urandom(32)))


@pytest.mark.parametrize("what", ["key_file", "store", "disk_dir"])
def test_world_writable_parent_without_sticky_bit_is_refused(tmp_path, what):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    fix = f"chmod go-w {shared}"
    if what == "key_file":
        make_key_file(str(shared / "key"))
        with pytest.raises(UnsafePathError, match=fix):
            MasterKey.from_key_file(str(shared / "key"))
    elif what == "store":
        with pytest.raises(UnsafePathError, match=fix):
            BlobStore(persist(shared / "s.fkv", key=os.urandom(32)))
        assert not (shared / "s.fkv").exists()  # refused before creating anything
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ForkvWarning)
            store = BlobStore(StoreSettings.from_env({}, disk_dir=str(shared)))
        assert not store.stats().is_enabled and store.stats().is_degraded
        assert any(fix in str(w.message) for w in caught)
        assert os.listdir(shared) == []
        store.close()


def test_grandparent_counts_too(tmp_path):
    shared = tmp_path / "shared"
    (shared / "mine").mkdir(parents=True)
    os.chmod(shared, 0o777)  # others can rename "mine" away and put their own in its place
    with pytest.raises(UnsafePathError, match=str(shared)):
        BlobStore(persist(shared / "mine" / "s.fkv", key=os.urandom(32)))


def test_sticky_or_private_parents_are_fine(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # like /tmp
    make_key_file(str(sticky / "key"))
    MasterKey.from_key_file(str(sticky / "key")).wipe()
    with BlobStore(persist(sticky / "s.fkv", key_file=str(sticky / "key"))) as store:
        assert store.stats().is_enabled
    with BlobStore(StoreSettings.from_env({}, disk_dir=str(sticky))) as store:
        assert store.stats().is_enabled
