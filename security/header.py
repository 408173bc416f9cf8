"""The 4 KiB header of a persistent store file: layout, field bounds, and its MAC.

Knows: the fields (magic, version, cipher, KDF and its salt/cost, store id, key check, the
model the store belongs to, where the sealed index lives, a MAC over all of it) and the bounds
each must meet before anything derives a key or allocates by it. Does not know: files, locks
or the index itself (``persist`` does those).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from .aead import CIPHER_NAME, sealed_size
from .alloc import GRAIN
from .errors import CorruptStoreError
from .keys import MasterKey
from .settings import MAX_SCRYPT_N, MIN_SCRYPT_N

__all__ = ["HEADER_BYTES", "StoreHeader", "checked_bytes", "sign"]

HEADER_BYTES = 4096  # records start on the next page
_MAGIC = b"FKVSTORE"
_VERSION = 2  # 1 had no header MAC and no model fingerprint
_HEADER = struct.Struct(">8sH16s8sIII16s16s32s32sQQ32s12s32s")
_CHECKED_PART = 8 + 2 + 16 + 8 + 12 + 16 + 16  # magic .. store id: what the key check covers
_MAC_PART = _HEADER.size - 32  # everything but the MAC itself
_MAX_SCRYPT_BYTES = 1 << 30  # 128 * r * n * p: memory (and time) a header may ask us to spend
_HEADER_MAC = b"forkv store header v2"


@dataclass(slots=True, frozen=True)
class StoreHeader:
    kdf: bytes  # b"scrypt" or b"raw"
    n: int
    r: int
    p: int
    kdf_salt: bytes
    store_id: bytes
    key_check: bytes
    model: bytes = bytes(32)  # fingerprint of the model whose checkpoints this holds; 0 = none yet
    index_offset: int = 0
    index_length: int = 0  # sealed bytes; 0 = no index written yet
    index_salt: bytes = bytes(32)
    index_nonce: bytes = bytes(12)
    mac: bytes = bytes(32)

    def pack(self) -> bytes:
        raw = _HEADER.pack(
            _MAGIC, _VERSION, CIPHER_NAME, self.kdf, self.n, self.r, self.p, self.kdf_salt,
            self.store_id, self.key_check, self.model, self.index_offset, self.index_length,
            self.index_salt, self.index_nonce, self.mac,
        )  # fmt: skip
        return raw.ljust(HEADER_BYTES, b"\0")

    @classmethod
    def unpack(cls, raw: bytes, path: str, size: int) -> StoreHeader:
        """Parse and bound every field; nothing here derives a key or allocates by a field."""
        if len(raw) < _HEADER.size or raw[:8] != _MAGIC:
            raise CorruptStoreError(f"{path} is not a forkv store (bad magic); pick another path.")
        if len(raw) != HEADER_BYTES or any(raw[_HEADER.size :]):
            raise CorruptStoreError(
                f"{path} has a truncated or altered header; restore it from a backup."
            )
        _magic, version, cipher, kdf, *rest = _HEADER.unpack(raw[: _HEADER.size])
        if version != _VERSION or cipher.rstrip(b"\0") != CIPHER_NAME:
            raise CorruptStoreError(
                f"{path} uses store format {version}/{cipher.rstrip(bytes(1))!r}, which this forkv "
                "cannot read; move it away (its checkpoints are recomputed) or use the forkv "
                "that wrote it."
            )
        header = cls(kdf.rstrip(b"\0"), *rest)
        header.check_bounds(path, size)
        return header

    def check_bounds(self, path: str, size: int) -> None:
        n, r, p = self.n, self.r, self.p
        if self.kdf == b"scrypt":
            is_ok = n & (n - 1) == 0 and MIN_SCRYPT_N <= n <= MAX_SCRYPT_N and r >= 1 and p >= 1
            if not is_ok or 128 * r * n * p > _MAX_SCRYPT_BYTES:
                raise CorruptStoreError(
                    f"{path} asks for scrypt costs n={n}, r={r}, p={p}, outside what forkv writes; "
                    "the header is corrupt or hostile: restore the file from a backup."
                )
        elif self.kdf != b"raw" or (n, r, p) != (0, 0, 0):
            raise CorruptStoreError(f"{path} names an unknown key derivation {self.kdf!r}.")
        offset, length = self.index_offset, self.index_length
        if length == 0:
            is_ok = offset == 0
        else:
            is_ok = (
                offset >= HEADER_BYTES
                and offset % GRAIN == 0
                and sealed_size(2) <= length <= size - offset
            )
        if not is_ok:
            raise CorruptStoreError(
                f"{path} points at an index outside the file (offset {offset}, length {length}); "
                "the file is truncated or tampered: restore it from a backup."
            )


def checked_bytes(header: StoreHeader) -> bytes:
    """The fields fixed at creation (magic .. store id): what the key check covers."""
    return header.pack()[:_CHECKED_PART]


def sign(master: MasterKey, header: StoreHeader) -> StoreHeader:
    """``header`` with its MAC set: HMAC-SHA256 of every other field under a store subkey."""
    unsigned = replace(header, mac=bytes(32))
    return replace(header, mac=master.mac(_HEADER_MAC, unsigned.pack()[:_MAC_PART]))
