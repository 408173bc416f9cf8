"""Checkpoints of vision sequences: a position record at every boundary, checkpoints right
after images, and the restore that uses both.

A vision model may keep one number outside its caches: the position state (Qwen's M-RoPE runs
ahead of the token count after an image; see qwen.py). Every recorded boundary gets an
EXTRA record holding it — inside images too, where it is the image's base position — and
checkpoint.py treats a boundary without one as a miss. Block records (global, window, state)
are taken by the Checkpointer's own recorder at every boundary, inside and after images, as for
text; a restore may end inside an image, whose remaining tokens then take their features from
the feature cache.

An image usually ends mid-block and the question after it differs between requests, so the
last common block boundary falls before the image end and the image's tail would be recomputed.
So the end of each image is checkpointed too, under a key chained from the previous block's key,
the partial block's tokens and the images in it: the K/V of the partial block for global layers,
and the whole cache object of every other layer (sliding-window rings, recurrent state) copied
attribute by attribute, plus the position state. Every vision run cuts its chunks at image
ends (see `VisionSequence`), so the caches at an image end are exactly what a fresh run of the
same tokens holds there, and restoring them is exact against it.
"""

from __future__ import annotations

from ..cache import partial
from ..cache.blocks import tokens_bytes
from ..cache.cuts import IMAGE_END, cut_key
from ..cache.layout import CacheKind
from ..cache.records import Record
from .images import VisionPrompt

IMAGE_END_TAG = b"forkv-image-end-v2"
# Tests switch this off to show what restoring without the position state costs.
RESTORE_POSITION_STATE = True


def position_record(block: int, tokens: bytes, state: int, namespace: bytes) -> Record:
    import mlx.core as mx

    return Record(CacheKind.EXTRA, block, tokens, {"next_pos": mx.array([state], mx.int64)},
                  namespace)


def image_end_key(keyer, keys: list[bytes], request: VisionPrompt, end: int) -> bytes:
    """Chained from the block before (or the seed of the request's namespace, `keyer`), the
    partial block's tokens and the images in it."""
    lo = end // keyer.block_size * keyer.block_size
    return cut_key(IMAGE_END_TAG, keyer, keys, request.tokens, end, request.extras_in(lo, end))


class VisionRecorder:
    """The boundary hook of a vision sequence: the Checkpointer's block recorder (recomputing
    decoded blocks through the sequence), plus position records and image ends."""

    def __init__(self, ck, keys: list[bytes], request: VisionPrompt, seq, keyer=None):
        self.ck = ck
        self.keyer = keyer or ck.keyer
        self.blocks = ck.recorder(keys, request.extras(ck.block_size), self.keyer)
        self.blocks.model = seq  # decoded blocks are recomputed with the sequence's positions
        self.seq = seq
        self.request = request
        if partial.supports_partial(ck):
            seq.on_image_end = self.record_image_end

    def __call__(self, pos, tokens, cache, in_decode: bool) -> bool:
        ck, B = self.ck, self.ck.block_size
        recomputed = self.blocks(pos, tokens, cache, in_decode)
        # Position state depends on tokens and images only (if the block's cache records could
        # not be made, it is simply never used).
        key = self.blocks.keys[pos // B - 1]
        if not ck.store.contains(key, CacheKind.EXTRA):
            ck.put_record(key, position_record(pos // B - 1, tokens_bytes(tokens[pos - B:pos]),
                                               self.seq.positions.state_at(pos),
                                               self.keyer.tag))
        return recomputed

    def record_image_end(self, end: int, cache: list) -> None:
        import mlx.core as mx

        ck = self.ck
        key = image_end_key(self.keyer, self.blocks.keys, self.request, end)
        state = {"next_pos": mx.array([self.seq.positions.state_at(end)], mx.int64)}
        ck.cuts.record(IMAGE_END, key, cache, end, self.request.tokens, self.keyer.tag, state)


def restore(ck, request: VisionPrompt, stats, keyer=None) -> tuple[list, int, list[bytes], int]:
    """(cache, tokens it holds, block keys, position state there) for the furthest restorable
    point in `keyer`'s namespace: a block boundary, or the end of an image past it."""
    B, tokens = ck.block_size, request.tokens
    r = ck.restore(tokens, request.extras(B), keyer=keyer)
    n, state = r.position, _state(r.extra, r.position)
    if partial.supports_partial(ck):
        # image ends past the restored boundary with something left to compute after them
        candidates = ((e, image_end_key(r.keyer, r.keys, request, e), frozenset())
                      for e in sorted({s.end for s in request.images}, reverse=True)
                      if e < len(tokens))
        got = ck.cuts.advance(IMAGE_END, r, tokens, candidates, {"next_pos"})
        if got is not None:
            stats.tail_restores += 1
            return r.cache, r.position, r.keys, _state(got, r.position)
    return r.cache, n, r.keys, state


def _state(extra: dict, position: int) -> int:
    if position == 0:
        return 0
    if not RESTORE_POSITION_STATE:
        return position  # what a model without the stored state would assume
    return int(extra["next_pos"].item())

