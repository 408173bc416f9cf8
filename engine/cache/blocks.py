"""Chained block keys: key(i) = H(key(i-1) || tokens of block i || extra hashes of block i).

The chain is seeded with the model fingerprint, the block size, a namespace (tenant) salt and
the chunking (turn ends, see turns.py), so blocks never match across models, block sizes,
tenants or chunkings. A key only finds a candidate
record; the record's stored tokens confirm the hit. Knows nothing about caches or stores.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

KEY_VERSION = b"forkv-block-v1"
NAMESPACE_TAG = b"forkv-namespace-v1"


def namespace_tag(namespace: str | bytes) -> bytes:
    """16 bytes that name a namespace in its records (bound into each one, and checked on every
    restore), without the namespace itself (an API key's tenant id) appearing anywhere."""
    if isinstance(namespace, str):
        namespace = namespace.encode()
    return hashlib.sha256(NAMESPACE_TAG + namespace).digest()[:16]


def tokens_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def as_list(tokens: Sequence[int]) -> list[int]:
    """`tokens` as a list of its own (a slice of a list is one already: no second copy)."""
    return tokens if type(tokens) is list else list(tokens)


def shared_prefix(a: Sequence, b: Sequence) -> int:
    """How many leading items (tokens, block keys) `a` and `b` have in common. Two sequences of
    one type (lists, int arrays) compare by slices, in C; others item by item."""
    if a is b:
        return len(a)
    n = min(len(a), len(b))
    if type(a) is not type(b):
        return next((i for i in range(n) if a[i] != b[i]), n)
    # (the shorter one whole, not a copy of it: a deep path's prefix is compared every call)
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


class BlockKeyer:
    def __init__(self, fingerprint: bytes, block_size: int = 256, namespace: str | bytes = b"",
                 chunking: bytes = b""):
        if isinstance(namespace, str):
            namespace = namespace.encode()
        self.block_size = block_size
        self.namespace = namespace
        self.tag = namespace_tag(namespace)
        h = hashlib.sha256(KEY_VERSION)
        for part in (fingerprint, str(block_size).encode(), namespace):
            h.update(len(part).to_bytes(8, "little") + part)  # length-prefixed: no ambiguity
        if chunking:  # (absent for block-aligned chunks only, so those keys stay as they were)
            h.update(b"chunking" + len(chunking).to_bytes(8, "little") + chunking)
        self.seed = h.digest()
        # The last text-only run keyed whole: (its full blocks' tokens, their keys). A turn's
        # render, its prompt and its run share all but their last blocks, so each keys only
        # its new blocks. Replaced whole (one assignment): safe to read from any thread. A
        # list, not an int array: a list's slice copies pointers, ~10x faster than packing.
        self._last: tuple[list[int], list[bytes]] = ([], [])

    def keys(self, tokens: Sequence[int], extras: dict[int, Sequence[bytes]] | None = None,
             start: int = 0, prev: bytes | None = None) -> list[bytes]:
        """Keys of the full blocks of `tokens` from block `start` on (`prev` = key of block
        start-1). `extras[i]` are content hashes (e.g. images) that overlap block i."""
        if start == 0 and not extras:
            return self._keys_from_last(tokens)
        return self._chain(tokens, extras, start, prev)

    def _keys_from_last(self, tokens: Sequence[int]) -> list[bytes]:
        B = self.block_size
        full = as_list(tokens[: len(tokens) // B * B])
        last_tokens, last_keys = self._last
        same = shared_prefix(full, last_tokens) // B
        keys = last_keys[:same] + self._chain(full, None, same, last_keys[same - 1]
                                              if same else None)
        self._last = (full, keys)
        return list(keys)

    def _chain(self, tokens: Sequence[int], extras: dict[int, Sequence[bytes]] | None,
               start: int, prev: bytes | None) -> list[bytes]:
        B = self.block_size
        prev = self.seed if start == 0 else prev
        assert prev is not None, "continuing a chain needs the previous key"
        out = []
        for i in range(start, len(tokens) // B):
            h = hashlib.sha256(prev)
            h.update(tokens_bytes(tokens[i * B:(i + 1) * B]))
            for extra in (extras or {}).get(i, ()):
                h.update(b"\x01" + extra)
            prev = h.digest()
            out.append(prev)
        return out
