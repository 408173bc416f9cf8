"""Persistent mode: a store file at a user path that survives restarts under a user key.

Knows: how to create or open such a file safely (no symlinks, ours, private mode, safe
parents, exclusive lock), the order of checks on open (header bounds, then the key, then the
header MAC, then the index, whose every field is bounded), how to tell a wrong key from a
corrupt file before writing anything, how to tie the store to one model, and how to write the
index (sealed JSON) so a crash leaves the old one valid and the replaced one zeroed. The
header's layout lives in ``header``.
Does not know: eviction, queues or threads. Rolling the whole file back to an older copy is
out of scope (it looks like a valid, older store); see README.md.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
from dataclasses import replace

from .aead import NONCE_SIZE, RecordAuthError, sealed_size
from .alloc import GRAIN, Allocator
from .datafile import DataFile
from .errors import (
    CorruptStoreError,
    ModelMismatchError,
    StoreLockedError,
    UnsafePathError,
    WrongKeyError,
)
from .fileio import DiskIO
from .folder import check_parents, check_private
from .header import HEADER_BYTES, StoreHeader, checked_bytes, sign
from .index import MAX_KEY_BYTES, MAX_KIND_BYTES, Index
from .keys import MasterKey
from .settings import StoreSettings

__all__ = ["HEADER_BYTES", "bind_model", "open_persistent", "reset_space", "save_index"]

_MAX_SESSIONS = 1 << 16
_INDEX_AAD = b"forkv-index-v1|"


def _master_key(settings: StoreSettings, header: StoreHeader, path: str) -> MasterKey:
    if header.kdf == b"scrypt":
        if settings.passphrase is None:
            raise WrongKeyError(
                f"{path} was created with a passphrase; set FORKV_PASSPHRASE (or passphrase=)."
            )
        return MasterKey.from_passphrase(
            settings.passphrase, header.kdf_salt, header.n, header.r, header.p
        )
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
    check_parents(path, f"Store file {path}")
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
    header = StoreHeader(kdf, n, 8 if n else 0, 1 if n else 0, kdf_salt, store_id, bytes(32))
    header = replace(header, key_check=master.check_value(checked_bytes(header)))
    header = sign(master, header)
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
    header = StoreHeader.unpack(bytes(raw[:got]), path, size)  # bounds first: scrypt costs, sizes
    master = _master_key(settings, header, path)
    if not hmac.compare_digest(master.check_value(checked_bytes(header)), header.key_check):
        master.wipe()
        raise WrongKeyError(
            f"The key or passphrase does not open {path} (or its header was altered); nothing "
            "was changed."
        )
    if not hmac.compare_digest(sign(master, header).mac, header.mac):
        master.wipe()
        raise CorruptStoreError(
            f"The header of {path} failed authentication (tampered, or rolled back to an older "
            "header); restore the whole file from a backup or delete it."
        )
    alloc = Allocator(HEADER_BYTES)
    if header.index_length == 0:
        datafile = DataFile(io, fd, master, header.store_id, alloc, path=path)
        datafile.header = header
        return datafile, Index(), 1
    try:
        blob = bytearray(header.index_length)  # bounded by the file size above
        if io.pread_into(fd, memoryview(blob), header.index_offset) != len(blob):
            raise ValueError("index is truncated")
        probe = DataFile(
            io, fd, master, header.store_id, alloc, path=path, session_salts=[header.index_salt]
        )
        aad = _INDEX_AAD + checked_bytes(header) + header.index_salt
        plain = probe.sealer(0).open(blob, aad, header.index_nonce)
        sessions, index, next_generation = parse_index(plain, header, size, alloc)
    except (RecordAuthError, ValueError, TypeError, KeyError, OverflowError, RecursionError) as e:
        master.wipe()
        raise CorruptStoreError(
            f"The index of {path} failed verification ({_short(e)}); the file is damaged or "
            "tampered: restore it from a backup or delete it."
        ) from None
    datafile = DataFile(io, fd, master, header.store_id, alloc, path=path, session_salts=sessions)
    datafile.header = header
    return datafile, index, next_generation


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:80]}"


def parse_index(
    plain: bytes, header: StoreHeader, size: int, alloc: Allocator
) -> tuple[list[bytes], Index, int]:
    """Check an opened index against the file and fill ``alloc``; ValueError-family on any fault.

    Authentic input can still be inconsistent (a bug, a lying writer): every field is bounded
    here, so a bad index is a CorruptStoreError, never a crash or a wrong read later.
    """
    doc = json.loads(plain)
    if not isinstance(doc, dict):
        raise TypeError("index is not a JSON object")
    if doc.get("version") != 1:
        raise ValueError("index is not a version-1 document")
    salts = doc["sessions"]
    if not isinstance(salts, list) or not 0 < len(salts) <= _MAX_SESSIONS:
        raise ValueError("session table is malformed")
    sessions = [bytes.fromhex(s) for s in salts]
    if any(len(s) != 32 for s in sessions):
        raise ValueError("a session salt is not 32 bytes")
    next_generation = doc["next_generation"]
    if type(next_generation) is not int or not 0 < next_generation < 1 << 63:
        raise ValueError("next_generation is out of range")
    rows = doc["entries"]
    if not isinstance(rows, list):
        raise TypeError("entries is not a list")
    index = Index.from_json(rows)
    extents = [(header.index_offset, header.index_length)]
    for (key, kind), e in index.items():
        if (
            not 0 < len(key) <= MAX_KEY_BYTES
            or not 0 < len(kind.encode("utf-8")) <= MAX_KIND_BYTES
            or len(e.nonce) != NONCE_SIZE
            or e.session >= len(sessions)
            or e.generation >= next_generation
            or e.extent != Allocator.round(sealed_size(e.length))
            or e.offset < HEADER_BYTES
            or e.offset % GRAIN
            or e.offset + e.extent > Allocator.round(size)
        ):
            raise ValueError("index entry is inconsistent with the file")
        extents.append((e.offset, e.extent))
    alloc.mark_used(extents)  # ValueError on overlaps
    return sessions, index, next_generation


def _write_header(datafile: DataFile, header: StoreHeader) -> StoreHeader:
    """Sign, write and fsync a new header; the caller holds the store lock."""
    header = sign(datafile.master, header)
    datafile.io.pwrite(datafile.fd, memoryview(header.pack()), 0)
    datafile.io.fsync(datafile.fd)
    datafile.header = header
    return header


def bind_model(datafile: DataFile, fingerprint: bytes) -> None:
    """Record which model's checkpoints this store holds; refuse another model's."""
    header = datafile.header
    assert isinstance(header, StoreHeader), "bind_model needs a persistent store"
    if len(fingerprint) != 32:
        raise ValueError(f"model fingerprints are 32 bytes, got {len(fingerprint)}.")
    if hmac.compare_digest(header.model, fingerprint):
        return
    if header.model != bytes(32):
        raise ModelMismatchError(
            f"{datafile.path} holds checkpoints of model {header.model.hex()[:16]}, not of the "
            f"model being loaded ({fingerprint.hex()[:16]}: other weights, config or dtype); "
            "point FORKV_PERSIST_PATH at another file for this model, or delete the old file."
        )
    _write_header(datafile, replace(header, model=bytes(fingerprint)))


def save_index(datafile: DataFile, index: Index, next_generation: int) -> int:
    """Seal the index into fresh space, fsync, point the header at it, fsync, zero the old one.

    The caller holds the store lock. A crash at any point leaves a header that points at a
    complete, authentic index (old or new); the replaced index is overwritten with zeros, so
    an old header put back cannot bring an old index back. Returns the bytes written.
    """
    header = datafile.header
    assert isinstance(header, StoreHeader), "save_index needs a persistent store"
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
    aad = _INDEX_AAD + checked_bytes(header) + salt
    size = sealed_size(len(payload))
    offset = datafile.alloc.allocate(size)
    try:
        nonce, _ = datafile.write_blob(offset, payload, aad)
        datafile.io.fsync(datafile.fd)
        new = replace(
            header, index_offset=offset, index_length=size, index_salt=salt, index_nonce=nonce
        )
        _write_header(datafile, new)
    except BaseException:
        datafile.alloc.release(offset, size)
        raise
    written = size + HEADER_BYTES
    if header.index_length:
        datafile.io.pwrite(datafile.fd, memoryview(bytes(header.index_length)), header.index_offset)
        datafile.io.fsync(datafile.fd)
        written += header.index_length
        if datafile.alloc.release(header.index_offset, header.index_length):
            datafile.truncate(datafile.alloc.end)
    return written


def reset_space(datafile: DataFile) -> None:
    """Free every record's space (``wipe``) but keep the live index until a new one is saved."""
    header = datafile.header
    assert isinstance(header, StoreHeader), "reset_space needs a persistent store"
    datafile.alloc.reset()
    if header.index_length:
        datafile.alloc.mark_used([(header.index_offset, header.index_length)])
