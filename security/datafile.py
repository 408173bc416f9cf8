"""An open data file: its descriptor, free space, session keys, and sealed record I/O.

Knows: how to write a record sealed straight into a reusable buffer with ``pwrite`` and read
it back with ``pread`` into one buffer (no plaintext copy), which session key sealed what,
and how to release the file (close, remove the private folder, wipe keys). Does not know:
locking, budgets, the writer queue or eviction — ``BlobStore`` owns those.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from .aead import RecordAuthError, Sealer, sealed_size
from .alloc import Allocator
from .blob import ThreadScratch
from .errors import ForkvError
from .fileio import DiskIO
from .folder import PrivateFolder, make_private_folder, open_data_file, sweep_stale_folders
from .index import Entry
from .keys import MasterKey

__all__ = ["DataFile", "TruncatedRecordError", "open_ephemeral"]

_SESSION_INFO = b"forkv session key v1|"
_swept: set[str] = set()  # parents already swept by this process
_SCRATCH_KEEP = 64 << 20  # keep one write buffer up to this size; page faults cost more than AES


class TruncatedRecordError(ForkvError, OSError):
    """The file ended before the record did (truncated or shrunk under us)."""


@dataclass(slots=True)
class DataFile:
    io: DiskIO
    fd: int
    master: MasterKey
    store_id: bytes
    alloc: Allocator
    folder: PrivateFolder | None = None  # ephemeral stores only
    path: str | None = None  # persistent stores only
    session_salts: list[bytes] | None = None
    _sealers: dict[int, Sealer] | None = None
    header: object | None = None  # persistent stores: the current file header
    current: int = -1
    _scratch: bytearray | None = field(default=None, repr=False)  # the writer's sealing buffer
    _read_scratch: ThreadScratch = field(
        default_factory=lambda: ThreadScratch(_SCRATCH_KEEP), repr=False
    )  # decrypted records: plaintext, never in a repr
    _sealer_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.session_salts = self.session_salts or []
        self._sealers = {}
        self.current = self.new_session()

    def new_session(self) -> int:
        """Start a fresh session key (new random salt): nonces restart safely at 1."""
        self.session_salts.append(os.urandom(32))
        return len(self.session_salts) - 1

    def reset_sessions(self) -> None:
        """Forget every session key and start one fresh session (used by ``wipe``)."""
        with self._sealer_lock:
            for sealer in self._sealers.values():
                sealer.forget()
            self._sealers.clear()
            self.session_salts.clear()
            self.current = self.new_session()

    def sealer(self, session: int) -> Sealer:
        # One Sealer per session key, ever: two would both count nonces from 1 (reuse).
        with self._sealer_lock:
            sealer = self._sealers.get(session)
            if sealer is None:
                salt = self.session_salts[session]
                key = self.master.derive(salt, _SESSION_INFO + self.store_id)
                sealer = self._sealers[session] = Sealer(key)
                key[:] = bytes(len(key))  # the Sealer keeps its own copy inside OpenSSL
            return sealer

    def write_record(
        self, offset: int, data: bytes | memoryview, aad: bytes, session: int
    ) -> tuple[bytes, int]:
        """Seal ``data`` under ``session``'s key into the reusable buffer and ``pwrite`` it.

        Returns (nonce, bytes written).
        Only the writer thread calls this (the buffer is not shared).
        """
        size = sealed_size(memoryview(data).nbytes)
        buf = self._scratch
        if buf is None or len(buf) < size:
            buf = bytearray(size)
            self._scratch = buf if size <= _SCRATCH_KEEP else self._scratch
        out = memoryview(buf)[:size]
        nonce = self.sealer(session).seal_into(data, aad, out)
        self.io.pwrite(self.fd, out, offset)
        return nonce, size

    def write_blob(self, offset: int, data: bytes, aad: bytes) -> tuple[bytes, int]:
        """Seal and write a small blob (the persistent index) without the shared buffer."""
        out = bytearray(sealed_size(len(data)))
        nonce = self.sealer(self.current).seal_into(data, aad, memoryview(out))
        self.io.pwrite(self.fd, memoryview(out), offset)
        return nonce, len(out)

    def read_record(self, entry: Entry, aad: bytes) -> bytes:
        """``pread`` the sealed record and open it; RecordAuthError/OSError on any failure."""
        sealed = self._read_sealed(entry)
        return self.sealer(entry.session).open(sealed, aad, entry.nonce)

    def read_record_into(self, entry: Entry, aad: bytes, out: memoryview) -> None:
        """Like ``read_record`` but decrypts into ``out`` (``entry.length`` bytes): no plaintext
        ``bytes`` is made. Nothing is written to ``out`` unless the tag verifies (on failure it is
        zeroed)."""
        sealed = self._read_sealed(entry)
        self.sealer(entry.session).open_into(sealed, aad, entry.nonce, out)

    def _read_sealed(self, entry: Entry) -> memoryview:
        size = sealed_size(entry.length)
        buf = self._read_scratch(size)
        if self.io.pread_into(self.fd, buf, entry.offset) != size:
            raise TruncatedRecordError("data file ends inside a record")
        if entry.session >= len(self.session_salts):
            raise RecordAuthError("record names an unknown session")
        return buf

    def truncate(self, size: int) -> None:
        self.io.ftruncate(self.fd, size)

    def wipe_keys(self) -> None:
        with self._sealer_lock:
            for sealer in self._sealers.values():
                sealer.forget()
            self._sealers.clear()
            self.master.wipe()

    def close(self, *, remove_folder: bool) -> None:
        """Close descriptors, remove the private folder (if it still exists), forget keys."""
        for fd in (self.fd, self.folder.dir_fd if self.folder else -1):
            if fd >= 0:
                try:
                    self.io.close(fd)
                except OSError:
                    pass
        self.fd = -1
        if self.folder is not None and remove_folder:
            try:
                self.io.rmtree(self.folder.path)
            except FileNotFoundError:
                pass
            except OSError:
                pass  # the start-up sweep of a later process removes what is left
        self._scratch = None
        self._read_scratch.release()
        self.wipe_keys()


def open_ephemeral(io: DiskIO, parent: str | None) -> DataFile:
    """A new private folder and nameless data file under a fresh random key.

    The first store of a process under ``parent`` first sweeps folders of dead processes.
    """
    if (parent or "") not in _swept:
        _swept.add(parent or "")
        sweep_stale_folders(io, parent)
    folder = make_private_folder(io, parent)
    try:
        fd = open_data_file(io, folder)
    except BaseException:
        io.close(folder.dir_fd)
        io.rmtree(folder.path)
        raise
    return DataFile(io, fd, MasterKey.make_ephemeral(), os.urandom(16), Allocator(0), folder=folder)
