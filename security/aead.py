"""AES-256-GCM sealing of records: self-describing header, counter nonces, bound AAD.

Knows: the sealed record layout ``header(32) | ciphertext | tag(16)``, where the header holds
magic, format version, cipher name and the 12-byte nonce; how nonces are made (a per-key
counter, never reused, capped); how associated data binds a record to its store, key, kind,
generation, length and metadata. Does not know: files, offsets, or where keys come from.
"""

from __future__ import annotations

import struct
import threading

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import ForkvError, NonceError
from .keys import KEY_SIZE, forget_in_child

__all__ = [
    "CIPHER_NAME",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "NONCE_SIZE",
    "TAG_SIZE",
    "RecordAuthError",
    "Sealer",
    "make_aad",
    "sealed_size",
]

CIPHER_NAME = b"aes-256-gcm"
FORMAT_VERSION = 1
NONCE_SIZE = 12
TAG_SIZE = 16
HEADER_SIZE = 32
_MAGIC = b"FKVR"
# magic, version, cipher-name length, cipher name (padded to 14), nonce
_HEADER = struct.Struct(f">4sBB14s{NONCE_SIZE}s")
assert _HEADER.size == HEADER_SIZE
# NIST SP 800-38D caps invocations per key; a counter makes reuse impossible below the cap.
DEFAULT_NONCE_LIMIT = 1 << 32


class RecordAuthError(ForkvError, ValueError):
    """A sealed record failed verification: wrong key, moved, replayed, truncated or tampered."""


def sealed_size(length: int) -> int:
    """Bytes on disk for a record of ``length`` plaintext bytes."""
    return HEADER_SIZE + length + TAG_SIZE


def make_aad(
    store_id: bytes, key: bytes, kind: str, generation: int, length: int, meta: bytes
) -> bytes:
    """Associated data: a record only opens in its own store, slot, version and length."""
    kind_b = kind.encode("utf-8")
    return b"".join(
        (
            b"forkv-record-aad-v1",
            struct.pack(
                ">16sQQHII", store_id, generation, length, len(kind_b), len(key), len(meta)
            ),
            kind_b,
            key,
            meta,
        )
    )


class Sealer:
    """Seals and opens records under one 32-byte key with unique counter nonces.

    The nonce is ``4 zero bytes | 64-bit counter``; each ``Sealer`` owns one key, and the
    store gives every session a fresh HKDF-derived key, so (key, nonce) never repeats.
    """

    __slots__ = ("__weakref__", "_aead", "_counter", "_limit", "_lock")

    def __init__(self, key: bytes | bytearray, *, nonce_limit: int = DEFAULT_NONCE_LIMIT) -> None:
        assert len(key) == KEY_SIZE, "AES-256 needs a 32-byte key"
        self._aead: AESGCM | None = AESGCM(bytes(key))
        self._counter = 0
        self._limit = nonce_limit
        self._lock = threading.Lock()
        forget_in_child(self)

    @property
    def num_sealed(self) -> int:
        return self._counter

    def _next_nonce(self) -> bytes:
        with self._lock:
            if self._counter >= self._limit:
                raise NonceError(
                    "Nonce space of this key is exhausted; the store must rotate keys."
                )
            self._counter += 1
            return self._counter.to_bytes(NONCE_SIZE, "big")

    def seal_into(self, data: bytes | memoryview, aad: bytes, out: memoryview) -> bytes:
        """Write ``header | ciphertext | tag`` for ``data`` into ``out``; return the nonce.

        ``out`` must be exactly ``sealed_size(len(data))`` bytes; no plaintext copy is made.
        """
        data = memoryview(data).cast("B")
        assert len(out) == sealed_size(len(data)), "output buffer has the wrong size"
        nonce = self._next_nonce()
        header = _HEADER.pack(_MAGIC, FORMAT_VERSION, len(CIPHER_NAME), CIPHER_NAME, nonce)
        out[:HEADER_SIZE] = header
        self._live().encrypt_into(nonce, data, header + aad, out[HEADER_SIZE:])
        return nonce

    def seal(self, data: bytes | memoryview, aad: bytes) -> tuple[bytes, bytes]:
        """Convenience form of ``seal_into``: returns (nonce, sealed record)."""
        out = bytearray(sealed_size(memoryview(data).nbytes))
        nonce = self.seal_into(data, aad, memoryview(out))
        return nonce, bytes(out)

    def open(self, record: bytes | memoryview, aad: bytes, nonce: bytes) -> bytes:
        """Verify then decrypt a sealed record; raise ``RecordAuthError`` on any mismatch.

        ``nonce`` is the one the index expects; a record whose header disagrees is refused
        before the cipher sees it.
        """
        record = memoryview(record).cast("B")
        header = self._check_header(record, nonce)
        try:
            return self._live().decrypt(nonce, record[HEADER_SIZE:], header + aad)
        except InvalidTag:
            raise RecordAuthError("record failed authentication") from None

    def open_into(
        self, record: bytes | memoryview, aad: bytes, nonce: bytes, out: memoryview
    ) -> None:
        """Like ``open`` but into ``out``; on failure ``out`` is zeroed, never left half-written."""
        record = memoryview(record).cast("B")
        header = self._check_header(record, nonce)
        try:
            self._live().decrypt_into(nonce, record[HEADER_SIZE:], header + aad, out)
        except (InvalidTag, ValueError):
            out[:] = bytes(len(out))  # decrypt_into may leave unverified plaintext behind
            raise RecordAuthError("record failed authentication") from None

    def _check_header(self, record: memoryview, nonce: bytes) -> bytes:
        if len(nonce) != NONCE_SIZE:
            raise NonceError(f"Nonces are {NONCE_SIZE} bytes, got {len(nonce)}.")
        if len(record) < HEADER_SIZE + TAG_SIZE:
            raise RecordAuthError("record is shorter than header and tag")
        header = bytes(record[:HEADER_SIZE])
        magic, version, name_len, name, stored_nonce = _HEADER.unpack(header)
        if magic != _MAGIC or version != FORMAT_VERSION or name[:name_len] != CIPHER_NAME:
            raise RecordAuthError("unknown record format or cipher")
        if stored_nonce != nonce:
            raise RecordAuthError("record nonce does not match the index")
        return header

    def _live(self) -> AESGCM:
        if self._aead is None:
            raise RuntimeError(
                "This sealer's key was dropped (store closed, or inherited across fork)."
            )
        return self._aead

    def forget(self) -> None:
        """Drop the cipher object (the key schedule goes with it, as far as Python allows)."""
        self._aead = None

    def _forget_after_fork(self) -> None:
        self.forget()

    def __repr__(self) -> str:
        return f"Sealer(cipher={CIPHER_NAME.decode()}, num_sealed={self._counter}, key=<redacted>)"

    def __reduce__(self):
        raise TypeError("Sealer cannot be pickled: key material never leaves process memory.")
