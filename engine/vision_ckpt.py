"""Checkpoints of vision sequences: a position record at every boundary, checkpoints right
after images, and the restore that uses both.

Qwen-VL keeps one number outside its caches: the next text position (M-RoPE), which after an
image runs ahead of the token count. Every recorded boundary gets an EXTRA record holding it;
checkpoint.py treats a boundary without one as a miss. Boundaries strictly inside an image
never get one, so no restore can end inside an image (the restore barriers say so too).

An image usually ends mid-block and the question after it differs between requests, so the
last common block boundary falls inside the image and a block-aligned restore would go back to
before it, recomputing the whole image. So on models whose caches are all global K/V, the end of
each image is checkpointed too: the K/V of the partial block up to the image end plus the
position record, under a key chained from the previous block's key, the partial block's tokens
and the digests of the images in it. Every vision run cuts its chunks at image ends (see
`VisionSequence`), so restoring there is exact against a fresh run.
"""

from __future__ import annotations

import hashlib

from .blocks import tokens_bytes
from .images import VisionPrompt
from .layout import CacheKind
from .recorder import SequenceRecorder
from .records import Record, rebuild

IMAGE_END_TAG = b"forkv-image-end-v1"
# Tests switch this off to show what restoring without the position state costs.
RESTORE_POSITION_STATE = True


def position_record(block: int, tokens: bytes, next_pos: int) -> Record:
    import mlx.core as mx

    return Record(CacheKind.EXTRA, block, tokens, {"next_pos": mx.array([next_pos], mx.int64)})


def supports_image_ends(ck) -> bool:
    return ck.enabled and ck.kinds - {CacheKind.EXTRA} == {CacheKind.GLOBAL}


def image_end_key(ck, keys: list[bytes], request: VisionPrompt, end: int) -> bytes:
    B = ck.block_size
    lo = end // B * B
    h = hashlib.sha256(IMAGE_END_TAG)
    h.update(keys[end // B - 1] if end >= B else ck.keyer.seed)
    h.update(tokens_bytes(request.tokens[lo:end]))
    for digest in request.digests_in(lo, end):
        h.update(b"\x01" + digest)
    return h.digest()


class VisionRecorder(SequenceRecorder):
    """The boundary hook of a vision sequence: block records, position records, image ends."""

    def __init__(self, ck, keys: list[bytes], request: VisionPrompt, seq):
        super().__init__(ck, keys, request.extras(ck.block_size))
        self.model = seq  # decoded blocks are recomputed with the sequence's positions
        self.seq = seq
        self.request = request
        if supports_image_ends(ck):
            seq.on_image_end = self.record_image_end

    def __call__(self, pos, tokens, cache, in_decode: bool) -> bool:
        ck, B = self.ck, self.ck.block_size
        if pos // B > len(self.keys):  # decode went past the prompt's blocks
            self.keys.extend(ck.keyer.keys(tokens[:pos], self.extras, start=len(self.keys),
                                           prev=self.keys[-1] if self.keys else None))
        # Position state depends on tokens and images only, so it is recorded up front (if the
        # block's cache records then fail to be made, it is simply never used).
        next_pos, key = self.seq.next_pos_at(pos), self.keys[pos // B - 1]
        if next_pos is not None and not ck.store.contains(key, CacheKind.EXTRA):
            ck.store.put(key, position_record(pos // B - 1, tokens_bytes(tokens[pos - B:pos]),
                                              next_pos))
        return super().__call__(pos, tokens, cache, in_decode)

    def record_image_end(self, end: int, cache: list) -> None:
        import mlx.core as mx

        ck, B = self.ck, self.ck.block_size
        key = image_end_key(ck, self.keys, self.request, end)
        if ck.store.contains(key, CacheKind.GLOBAL) and ck.store.contains(key, CacheKind.EXTRA):
            return
        lo, arrays = end // B * B, {}
        for i in ck.layout.indices(CacheKind.GLOBAL):
            c = cache[i]
            assert c.offset == end, f"layer {i} holds {c.offset} tokens, expected {end}"
            arrays[f"{i}.k"] = mx.array(c.keys[..., lo:end, :])  # copies: caches update
            arrays[f"{i}.v"] = mx.array(c.values[..., lo:end, :])  # in place
        mx.eval(arrays)
        tokens = tokens_bytes(self.request.tokens[lo:end])
        ck.store.put(key, Record(CacheKind.GLOBAL, end // B, tokens, arrays))
        ck.store.put(key, position_record(end // B, tokens, self.seq.next_pos_at(end)))


def restore(ck, request: VisionPrompt, stats) -> tuple[list, int, list[bytes], int]:
    """(cache, tokens it holds, block keys, next position) for the furthest restorable point:
    a block boundary outside every image, or the end of an image."""
    B, tokens = ck.block_size, request.tokens
    r = ck.restore(tokens, request.extras(B), request.barriers)
    n, next_pos = r.position, _next_pos(r.extra, r.position)
    if supports_image_ends(ck):
        for end in sorted({s.end for s in request.images}, reverse=True):
            if end <= n:
                break
            if end % B == 0 or end >= len(tokens):
                continue  # a block boundary (restored above if it could be), or nothing left
            got = _restore_image_end(ck, r.keys, request, end)
            if got is not None:
                ck.stats.tokens_reused += end - n
                ck.stats.tokens_computed -= end - n
                stats.tail_restores += 1
                return got[0], end, r.keys, _next_pos(got[1], end)
    return r.cache, n, r.keys, next_pos


def _next_pos(extra: dict, position: int) -> int:
    if position == 0:
        return 0
    if not RESTORE_POSITION_STATE:
        return position  # what a model without the stored offset would assume
    return int(extra["next_pos"].item())


def _restore_image_end(ck, keys, request: VisionPrompt, end: int):
    B, tokens = ck.block_size, request.tokens
    b = end // B
    key = image_end_key(ck, keys, request, end)
    if not ck.store.contains(key, CacheKind.GLOBAL):
        return None
    # Checkpointer._load verifies tokens and shapes, counts hits and drops bad records.
    expect = tokens_bytes(tokens[b * B:end])
    tail = ck._load(key, CacheKind.GLOBAL, expect)
    position = ck._load(key, CacheKind.EXTRA, expect) if tail is not None else None
    if position is None:
        return None
    records = []
    for i in range(b):
        record = ck._load(keys[i], CacheKind.GLOBAL, tokens_bytes(tokens[i * B:(i + 1) * B]))
        if record is None:
            return None
        records.append(record)
    try:
        cache = rebuild(ck.lm.make_cache(), ck.layout, end, B, records + [tail], {}, None)
    except (KeyError, ValueError, AssertionError):
        ck.stats.rejected += 1
        return None
    return cache, position.arrays
