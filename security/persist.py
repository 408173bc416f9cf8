"""Persistent mode: a store file at a user path that survives restarts under a user key.

Knows: the 4 KiB file header (magic, version, cipher, KDF and its salt/cost, store id, key
check, where the sealed index lives), how to create or open such a file safely (no symlinks,
private mode, exclusive lock), how to tell a wrong key from a corrupt file before writing
anything, and how to write the index (sealed JSON) so a crash leaves the old one valid.
Does not know: eviction, queues or threads. Rolling the whole file back to an older copy is
out of scope (it looks like a valid, older store).
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import struct
from dataclasses import dataclass, replace

from .aead import CIPHER_NAME, RecordAuthError, sealed_size
from .alloc import Allocator
from .datafile import DataFile
from .errors import CorruptStoreError, StoreLockedError, UnsafePathError, WrongKeyError
from .fileio import DiskIO
from .folder import check_private
from .index import Index
from .keys import MasterKey
from .settings import StoreSettings

__all__ = ["HEADER_BYTES", "open_persistent", "reset_space", "save_index"]

HEADER_BYTES = 4096  # records start on the next page
_MAGIC = b"FKVSTORE"
_VERSION = 1
_HEADER = struct.Struct(">8sH16s8sIII16s16s32sQQ32s12s")
_KEYED_PART = _HEADER.size - 8 - 8 - 32 - 12  # everything before the index location
_CHECKED_PART = _KEYED_PART - 32  # everything before the key check itself
_MAX_SCRYPT_N = 1 << 22  # a hostile header must not make us allocate gigabytes
_INDEX_AAD = b"forkv-index-v1|"


@dataclass(slots=True, frozen=True)
class _Header:
    kdf: bytes  # b"scrypt" or b"raw"
    n: int
    r: int
    p: int
    kdf_salt: bytes
    store_id: bytes
    key_check: bytes
    index_offset: int = 0
    index_length: int = 0  # sealed bytes; 0 = no index written yet
    index_salt: bytes = bytes(32)
    index_nonce: bytes = bytes(12)

    def pack(self) -> bytes:
        raw = _HEADER.pack(
            _MAGIC,
            _VERSION,
            CIPHER_NAME,
            self.kdf,
            self.n,
            self.r,
            self.p,
            self.kdf_salt,
            self.store_id,
            self.key_check,
            self.index_offset,
            self.index_length,
            self.index_salt,
            self.index_nonce,
        )
        return raw.ljust(HEADER_BYTES, b"\0")

    @classmethod
    def unpack(cls, raw: bytes, path: str) -> _Header:
        if len(raw) < _HEADER.size or raw[:8] != _MAGIC:
            raise CorruptStoreError(f"{path} is not a forkv store (bad magic); pick another path.")
        _magic, version, cipher, kdf, *rest = _HEADER.unpack(raw[: _HEADER.size])
        if version != _VERSION or cipher.rstrip(b"\0") != CIPHER_NAME:
            raise CorruptStoreError(
                f"{path} uses store format {version}/{cipher!r}, which this forkv cannot read."
            )
        return cls(kdf.rstrip(b"\0"), *rest)


def _keyed_bytes(header: _Header) -> bytes:
    return header.pack()[:_KEYED_PART]


def _master_key(settings: StoreSettings, header: _Header, path: str) -> MasterKey:
    if header.kdf == b"scrypt":
        if settings.passphrase is None:
            raise WrongKeyError(
                f"{path} was created with a passphrase; set FORKV_PASSPHRASE (or passphrase=)."
            )
        if not (header.n <= _MAX_SCRYPT_N and 1 <= header.r <= 32 and 1 <= header.p <= 16):
            raise CorruptStoreError(
                f"{path} asks for out-of-range scrypt costs; the header is corrupt."
            )
        return MasterKey.from_passphrase(
            settings.passphrase, header.kdf_salt, header.n, header.r, header.p
        )
    if header.kdf != b"raw":
        raise CorruptStoreError(f"{path} names an unknown key derivation {header.kdf!r}.")
    if settings.passphrase is not None:
        raise WrongKeyError(f"{path} was created with a key file or key, not a passphrase.")
    if settings.key is not None:
        return MasterKey.from_secret(settings.key)
    return MasterKey.from_key_file(settings.key_file)


def _open_file(io: DiskIO, path: str) -> int:
    flags = os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        return io.open(path, flags)
    except FileNotFoundError:
        return io.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(
                f"{path} is a symlink; point FORKV_PERSIST_PATH at a real file."
            ) from None
        raise


def open_persistent(settings: StoreSettings, io: DiskIO) -> tuple[DataFile, Index, int]:
    """Open or create the store at ``settings.persist_path``; return (file, index, next generation).

    Raises WrongKeyError / CorruptStoreError / StoreLockedError / UnsafePathError before
    writing a single byte to an existing file.
    """
    path = settings.persist_path
    assert path is not None
    fd = _open_file(io, path)
    try:
        info = io.fstat(fd)
        check_private(info, f"Store file {path}", is_dir=False)
        try:
            io.lock(fd)
        except BlockingIOError:
            raise StoreLockedError(
                f"{path} is already open (in this or another process); close that store first."
            ) from None
        if info.st_size == 0:
            return _create(settings, io, fd, path)
        return _load(settings, io, fd, path, info.st_size)
    except BaseException:
        io.close(fd)
        raise


def _create(settings: StoreSettings, io: DiskIO, fd: int, path: str) -> tuple[DataFile, Index, int]:
    store_id, kdf_salt = os.urandom(16), os.urandom(16)
    if settings.passphrase is not None:
        kdf, n = b"scrypt", settings.scrypt_n
        master = MasterKey.from_passphrase(settings.passphrase, kdf_salt, n)
    else:
        kdf, n = b"raw", 0
        master = (
            MasterKey.from_secret(settings.key)
            if settings.key
            else MasterKey.from_key_file(settings.key_file)
        )
    header = _Header(kdf, n, 8 if n else 0, 1 if n else 0, kdf_salt, store_id, b"")
    header = replace(header, key_check=master.check_value(_keyed_bytes(header)[:_CHECKED_PART]))
    io.pwrite(fd, memoryview(header.pack()), 0)
    io.fsync(fd)
    datafile = DataFile(io, fd, master, store_id, Allocator(HEADER_BYTES), path=path)
    datafile.header = header
    return datafile, Index(), 1


def _load(
    settings: StoreSettings, io: DiskIO, fd: int, path: str, size: int
) -> tuple[DataFile, Index, int]:
    raw = bytearray(HEADER_BYTES)
    got = io.pread_into(fd, memoryview(raw), 0)
    header = _Header.unpack(bytes(raw[:got]), path)
    master = _master_key(settings, header, path)
    expected = master.check_value(_keyed_bytes(header)[:_CHECKED_PART])
    if not hmac.compare_digest(expected, header.key_check):
        master.wipe()
        raise WrongKeyError(f"The key or passphrase does not open {path}; nothing was changed.")
    alloc = Allocator(HEADER_BYTES)
    if header.index_length == 0:
        datafile = DataFile(io, fd, master, header.store_id, alloc, path=path)
        datafile.header = header
        return datafile, Index(), 1
    try:
        if header.index_offset < HEADER_BYTES or header.index_offset + header.index_length > size:
            raise ValueError("index lies outside the file")
        blob = bytearray(header.index_length)
        if io.pread_into(fd, memoryview(blob), header.index_offset) != len(blob):
            raise ValueError("index is truncated")
        probe = DataFile(
            io, fd, master, header.store_id, alloc, path=path, session_salts=[header.index_salt]
        )
        aad = _INDEX_AAD + _keyed_bytes(header) + header.index_salt
        doc = json.loads(probe.sealer(0).open(blob, aad, header.index_nonce))
        sessions = [bytes.fromhex(s) for s in doc["sessions"]]
        index = Index.from_json(doc["entries"])
        next_generation = int(doc["next_generation"])
        extents = [(e.offset, e.extent) for e in index.values()]
        extents.append((header.index_offset, header.index_length))
        for offset, extent in extents:
            if offset < HEADER_BYTES or offset + extent > Allocator.round(size):
                raise ValueError("a record lies outside the file")
        alloc.mark_used(extents)
        for e in index.values():
            if (
                e.session >= len(sessions)
                or e.generation >= next_generation
                or e.extent < sealed_size(e.length)
            ):
                raise ValueError("index entry is inconsistent")
    except (RecordAuthError, ValueError, TypeError, KeyError) as exc:
        master.wipe()
        raise CorruptStoreError(
            f"The index of {path} failed verification ({exc}); the file is damaged or tampered."
        ) from None
    datafile = DataFile(io, fd, master, header.store_id, alloc, path=path, session_salts=sessions)
    datafile.header = header
    return datafile, index, next_generation


def save_index(datafile: DataFile, index: Index, next_generation: int) -> int:
    """Seal the index into fresh space, fsync, point the header at it, fsync, free the old one.

    The caller holds the store lock. A crash at any point leaves a header that points at a
    complete, authentic index (old or new). Returns the bytes written.
    """
    header = datafile.header
    assert isinstance(header, _Header), "save_index needs a persistent store"
    # Only sessions that still own records (and the current one) are kept: reopening often
    # must not grow the table. In-memory ids stay; the saved ones are renumbered.
    used = sorted({e.session for e in index.values()} | {datafile.current})
    remap = {old: new for new, old in enumerate(used)}
    doc = {
        "version": 1,
        "next_generation": next_generation,
        "sessions": [datafile.session_salts[old].hex() for old in used],
        "entries": index.to_json(remap),
    }
    payload = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    salt = datafile.session_salts[datafile.current]
    aad = _INDEX_AAD + _keyed_bytes(header) + salt
    size = sealed_size(len(payload))
    offset = datafile.alloc.allocate(size)
    try:
        nonce, _ = datafile.write_blob(offset, payload, aad)
        datafile.io.fsync(datafile.fd)
        new = replace(
            header, index_offset=offset, index_length=size, index_salt=salt, index_nonce=nonce
        )
        datafile.io.pwrite(datafile.fd, memoryview(new.pack()), 0)
        datafile.io.fsync(datafile.fd)
    except BaseException:
        datafile.alloc.release(offset, size)
        raise
    datafile.header = new
    if header.index_length and datafile.alloc.release(header.index_offset, header.index_length):
        datafile.truncate(datafile.alloc.end)
    return size + HEADER_BYTES


def reset_space(datafile: DataFile) -> None:
    """Free every record's space (``wipe``) but keep the live index until a new one is saved."""
    header = datafile.header
    assert isinstance(header, _Header), "reset_space needs a persistent store"
    datafile.alloc.reset()
    if header.index_length:
        datafile.alloc.mark_used([(header.index_offset, header.index_length)])
