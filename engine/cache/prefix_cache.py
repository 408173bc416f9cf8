"""The prefix cache: the one owner of reuse — keys, records, cuts, live caches, record jobs.

The scheduler asks it three things. `plan(...)` computes a request's namespace, block keys and
turn ends once, at submit; the `Plan` rides on the sequence. `match(seq)` gives an admitted
sequence its cache, position, model callable and boundary hook: restored from the records (the
checkpointer: block boundaries, turn ends, image ends), or — for `reuse="fast"` — a live cache
of a recently finished request cut back to what the two share (live.py), whichever goes
further. `commit(seq)` runs when a sequence's prompt is prefilled and when it finishes: a fast
request's cache joins the live pool, and the blocks a text row decoded are queued as a record
job (record_jobs.py), which `work` runs a chunk of when the engine has room. Besides, `waits`
holds back a request whose prefix another sequence is computing right now (forks and n > 1
compute it once), and `decoded` handles a row that decodes onto a block boundary.

Text rows leave decoded blocks to a record job; vision rows (a job would need the images)
recompute each decoded block in the step that reaches it (recorder.py). Knows nothing about
batches, threads or handles.
"""

from __future__ import annotations

import itertools
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from ..vision import ckpt as vision_ckpt
from .blocks import shared_prefix
from .kinds import kind_of as _kind_of
from .kinds.kv import GlobalKind
from .layout import CacheKind
from .live import LivePool, rings, share, widen
from .record_jobs import RecordJobs

_LIVE_WAIT_MIN = 32  # a fast request waits for another's prompt to share at least this


@dataclass(slots=True)
class Plan:
    """What the prefix cache knows about one request: computed once, carried on it."""

    keyer: object = None  # its namespace (a BlockKeyer; None without checkpoints)
    keys: list = field(default_factory=list)  # block keys of the prompt (its images folded in)
    turn_ends: list = field(default_factory=list)  # restorable turn ends of the prompt
    fast: bool = False  # reuse="fast": may continue a live cache
    # What match and decoding found, for commit:
    live_from: int = 0  # tokens taken from a live cache (0: from records, or none)
    recorded_to: int = 0  # tokens the records restored when it was admitted
    rings: tuple | None = None  # (start, window rings) from before the last prefill chunk
    deferred_to: int = 0  # the last block boundary crossed while decoding, not yet recorded
    # (a live entry, n): this request's global K/V of its first n tokens are that entry's,
    # bit for bit (it continued that entry's cache, or it is its own prompt's): the pool
    # compares none of them (live.py)
    live_source: tuple | None = None


class PrefixCache:
    def __init__(self, lm, checkpointer, block_size: int, *, make_seq: Callable,
                 vision=None, mergeable: bool = True, live_bytes: int = 0):
        self.lm = lm
        self.ck = checkpointer
        self.block_size = block_size
        self.vision = vision  # VisionSupport on vision models: their requests' model callables
        self.mergeable = mergeable
        enabled = checkpointer is not None and checkpointer.enabled
        # Text rows defer decoded blocks to jobs and keep live caches (vision rows cannot).
        self.defers = enabled and vision is None
        self.live = (LivePool(lm.make_cache, live_bytes, block_size=block_size)
                     if self.defers else None)
        # Exact prompts' caches are handed over (`_hand_off`) where every layer is global K/V
        # and the batch merges copies of them (nothing writes into the one kept).
        self.hands_off = (self.live is not None and mergeable
                          and all(_kind_of(c) is GlobalKind for c in lm.make_cache()))
        self._make_seq = make_seq
        self.jobs = RecordJobs(self._job_seq, self._match_job, self._is_recorded,
                               self._writes, block_size)

    # -- plan --------------------------------------------------------------------------------
    def plan(self, tokens: list[int], namespace: str | None = None, reuse: str = "exact",
             request=None) -> Plan:
        """Keys and cuts of a request's prompt (`request`: a vision prompt, whose images its
        keys fold in), in `namespace` (None: the engine's own)."""
        ck = self.ck
        if ck is None:
            return Plan(fast=reuse == "fast")
        keyer = ck.keyer_for(namespace)
        if request is not None:  # (its cuts are image ends, which its restore finds)
            return Plan(keyer, keyer.keys(tokens, request.extras(self.block_size)))
        ends = ck.turns.ends(tokens) if ck.turns is not None else []
        return Plan(keyer, keyer.keys(tokens), ends, reuse == "fast")

    def keyer(self, namespace: str | None = None):
        return self.ck.keyer_for(namespace) if self.ck is not None else None

    # -- match -------------------------------------------------------------------------------
    def match(self, seq) -> None:
        """Give `seq` its cache, position, model callable and boundary hook: the longest
        prefix the records (or, for a fast request, a live cache) hold."""
        t, t0 = seq.timings, time.perf_counter()
        if seq.request is not None and self.vision is not None:
            seq.model, seq.cache, seq.pos, seq.hook = self.restore_vision(seq.request,
                                                                          seq.plan.keyer)
        else:
            self._match_text(seq, self.live if seq.plan.fast else None, count=True)
        t.restore_s, t.reused_tokens = time.perf_counter() - t0, seq.pos
        t.computed_tokens = seq.prompt_len - seq.pos

    def restore_vision(self, request, keyer=None) -> tuple:
        """(model callable, cache, tokens it holds, boundary hook) of a vision request in
        `keyer`'s namespace: restored to a block boundary or an image end past it."""
        ck, vision = self.ck, self.vision
        if ck is None or not ck.enabled:
            return vision.sequence(request), self.lm.make_cache(), 0, None
        cache, start, keys, state = vision_ckpt.restore(ck, request, vision.stats, keyer)
        # A restore right after an image ends mid-block; a decode boundary later recomputes
        # that whole block, so the sequence must know positions from the block's start.
        model = vision.sequence(request, start, state, lo=start // self.block_size
                                * self.block_size)
        return model, cache, start, vision_ckpt.VisionRecorder(ck, keys, request, model, keyer)

    def _match_text(self, seq, live: LivePool | None, count: bool) -> None:
        ck, plan, B = self.ck, seq.plan, self.block_size
        if ck is None:
            seq.cache, seq.pos, seq.hook, seq.model = self.lm.make_cache(), 0, None, self.lm.model
            return
        if live is None and self._hand_off(seq, count):
            return
        entry, u = live.best(seq.tokens, plan.keyer.tag) if live is not None else (None, 0)
        if entry is not None and u // B < seq.prompt_len // B - 1:
            # What is left would cross more than one block boundary, which a run from a live
            # cache cannot record (its chunks start off the canonical cuts; its record job
            # does, once its cache leaves the pool): run it from the records, which records
            # every block it computes, rather than leave later requests without them.
            entry, u = None, 0
        bound = ck.restore_bound(seq.tokens, plan.keyer) if entry is not None else 0
        if entry is not None and u >= bound:
            ck.count_restore(len(seq.tokens), 0)  # no record could restore more: none read
            restored, n, past = None, 0, bound
        else:
            restored = ck.restore_run(seq.tokens, count=count, keyer=plan.keyer)
            n = past = restored.position
        if entry is not None and u > n:
            # Continue the live cache: nothing this run computes is recorded from it (its
            # chunks start off the canonical cuts); a record job does that when it leaves.
            ck.count_restore(0, u - n)
            seq.cache, seq.pos, seq.hook, seq.model = live.take(entry, u), u, None, self.lm.model
            seq.chunk_base, plan.live_from, plan.recorded_to = u, u, n
            plan.live_source = (entry, u)
            live.stats.beyond_records += u - past  # (past the most records could give)
        else:
            seq.cache, seq.pos = restored.cache, n
            seq.hook = ck.recorder(restored.keys, keyer=restored.keyer)
            seq.model = ck.model_for(seq.tokens, restored.keys, restored.keyer)
            seq.last_logits = restored.logits  # (the whole prompt restored: no prefill)
        if live is not None:
            seq.model = _KeepRings(seq.model, plan, seq.prompt_len)

    def _hand_off(self, seq, count: bool) -> bool:
        """Start an exact request from an exact prompt's live cache (live.py) at the last
        canonical cut they share, where no record could restore further; whether it did."""
        live, ck, plan, B = self.live, self.ck, seq.plan, self.block_size
        if not self.hands_off or not live.enabled or not count:  # (jobs restore from records)
            return False
        entry, u = live.best_canonical(seq.tokens, plan.keyer.tag,
                                       partial(_last_cut, plan.turn_ends, seq.prompt_len, B))
        if entry is None or self._recorded_past(seq, u):
            return False
        seq.cache, seq.pos = live.hand_off(entry, u), u
        seq.hook = ck.recorder(plan.keys, keyer=plan.keyer)
        seq.model = ck.model_for(seq.tokens, plan.keys, plan.keyer)
        ck.count_restore(seq.prompt_len, u)
        return True

    def _recorded_past(self, seq, u: int) -> bool:
        """Whether the records may restore `seq` past `u`: a turn end after it recorded, or
        the last block before the prompt's end (a run that reached it recorded those before;
        a gap in the chain only costs a restore that stops short, never a wrong state)."""
        ck, plan, B = self.ck, seq.plan, self.block_size
        k = (seq.prompt_len - 1) // B
        if k * B > u and plan.keys[k - 1:k] and all(
                ck.store.contains(plan.keys[k - 1], kind) for kind in ck.kinds
                if kind != CacheKind.EXTRA):
            return True
        if ck.turns is None or not plan.turn_ends or plan.turn_ends[-1] <= u:
            return False
        ends = ck.turns.keys(seq.tokens, plan.keys, plan.keyer)  # (by end, ascending)
        after = itertools.islice(ends.values(), bisect_right(list(ends), u), None)
        return any(ck.store.contains(key, CacheKind.EXTRA) for key in after)

    def waits(self, seq, prefilling) -> bool:
        """Whether a prefilling sequence (or record job) has yet to record blocks `seq` starts
        with, or a turn end past them (forks of one prompt: tree of thought); a fast request
        waits instead for another fast prompt whose cache it would continue."""
        plan = seq.plan
        if not (plan.keys or plan.turn_ends or plan.fast):
            return False
        job = self.jobs.current
        others = [(p, False) for p in prefilling]
        if job is not None and not plan.fast:  # (fast requests never wait on record jobs)
            others.append((job.seq, True))
        B = self.block_size
        for p, is_job in others:
            if not _same_namespace(plan, p.plan):
                continue  # its records are never restored for seq: never wait on them
            if plan.fast and p.plan.fast and not is_job:
                # p's prompt cache, once prefilled, serves seq: worth waiting for when p has
                # little left beyond what they share (branches of one prompt); otherwise
                # wait only for the records, as an exact request does.
                ahead = shared_prefix(seq.tokens[:-1], p.tokens)
                if ahead >= _LIVE_WAIT_MIN and p.prompt_len - p.pos <= ahead + _LIVE_WAIT_MIN:
                    return True
            shared = shared_prefix(plan.keys, p.plan.keys)
            if shared and p.pos < shared * B:
                return True
            # turn ends of seq past p's position, in or right after the blocks they share
            ahead = [e for e in plan.turn_ends if e > p.pos and e // B <= shared]
            if ahead and any(e <= shared_prefix(seq.tokens[:ahead[-1]], p.tokens)
                             for e in ahead):
                return True
        return False

    # -- decode and commit -------------------------------------------------------------------
    def decoded(self, seq, take_row: Callable[[], list]) -> list | None:
        """`seq`'s row holds all its tokens after a decode step: at a block boundary, note it
        for a record job (text) or recompute the block canonically (vision: `take_row()` is
        the row's cache); the recomputed row to swap into the batch, or None."""
        if seq.hook is None or seq.pos % self.block_size:
            return None
        if self.defers:
            seq.plan.deferred_to = seq.pos
            return None
        row = take_row()
        return row if seq.hook(seq.pos, seq.tokens, row, True) else None

    def commit(self, seq, take_cache: Callable[[], list]) -> None:
        """`seq` has prefilled its prompt or finished: keep a fast request's cache (what
        `take_cache()` gives, holding its first `seq.pos` tokens) live, and on finish queue the
        record job of the blocks it decoded."""
        plan = seq.plan
        if seq.finish_reason is not None and plan.deferred_to:
            self.jobs.add(seq.tokens[:plan.deferred_to], seq.prompt_len // self.block_size,
                          plan.keyer)
        if self._keep_canonical(seq, take_cache):
            return
        if self.live is None or not plan.fast or seq.pos < 1:
            plan.rings = None
            return
        cache = take_cache()
        if seq.finish_reason is None and not self.mergeable:
            cache = share(cache, self.lm.make_cache)  # the batch runs its one row's objects
        self._keep_live(seq, cache, seq.pos)

    def _keep_canonical(self, seq, take_cache: Callable[[], list]) -> bool:
        """Keep an exact request's prompt cache for the next turn (`_hand_off`); whether it
        was offered."""
        plan = seq.plan
        if (not self.hands_off or plan.fast or plan.live_from
                or seq.finish_reason is not None or seq.pos != seq.prompt_len):
            return False
        cache = take_cache()
        tokens = seq.tokens[:seq.pos]  # (the prompt: its block keys are the plan's)
        self.live.put(tokens, cache, plan.keyer.tag,
                      self.ck.checkpoint_keys(tokens, plan.keyer, plan.keys),
                      canonical_to=seq.pos)
        return True

    def _keep_live(self, seq, cache: list, n_tokens: int) -> None:
        """Offer a fast request's cache to later fast requests of its namespace. One that
        continued a live cache leaves with its record job: when the entry leaves the pool,
        its tokens are prefilled canonically and recorded (a second job of the same tokens
        finds them recorded and does nothing)."""
        plan, live, B = seq.plan, self.live, self.block_size
        tokens, before, plan.rings = seq.tokens[:n_tokens], plan.rings, None
        if before is not None and n_tokens > before[0]:
            cache = widen(cache, before[1], n_tokens - before[0], self.lm.make_cache)
        if n_tokens == seq.prompt_len and live.enabled:
            # the prompt's rings, for the answer's cache (decoding trims them to W)
            plan.rings = (n_tokens, rings(cache))
        on_leave = None
        if plan.live_from:
            upto = max(seq.prompt_len, n_tokens // B * B)
            on_leave = partial(self.jobs.add, seq.tokens[:upto], plan.recorded_to // B,
                               plan.keyer)
        entry = live.put(tokens, cache, plan.keyer.tag, self._writes_tokens(tokens, plan.keyer),
                         on_leave, same_as=plan.live_source)
        if entry is not None and n_tokens == seq.prompt_len:
            plan.live_source = (entry, n_tokens)  # its answer continues this very cache

    # -- record jobs -------------------------------------------------------------------------
    def work(self, waiting, idle: bool) -> int:
        """One chunk of a record job if the engine is idle or a waiting request needs it;
        the tokens computed."""
        return self.jobs.run(waiting, idle)

    def _job_seq(self, tokens: list[int], keyer):
        seq = self._make_seq(tokens)
        seq.plan = Plan(keyer, keyer.keys(tokens))
        return seq

    def _match_job(self, seq) -> None:
        self._match_text(seq, None, count=False)  # restores what is recorded already

    def _is_recorded(self, seq) -> bool:
        """Whether every record of `seq`'s last block exists, and its turn ends after it (a
        request that needed them prefilled them itself)."""
        ck, keys = self.ck, seq.plan.keys
        if not (keys and all(ck.store.contains(keys[-1], k) for k in ck.kinds)):
            return False
        ends = ck.turns.keys(seq.tokens, keys, seq.plan.keyer) if ck.turns else {}
        return all(ck.store.contains(key, "extra") for end, key in ends.items()
                   if end > len(keys) * self.block_size)

    def _writes(self, seq) -> list[bytes]:
        return self._writes_tokens(seq.tokens, seq.plan.keyer)

    def _writes_tokens(self, tokens, keyer) -> list[bytes]:
        return self.ck.checkpoint_keys(tokens, keyer)

    # -- release and lifetime ----------------------------------------------------------------
    def forget(self, keys: frozenset) -> int:
        """Drop the live caches holding released keys, then the jobs that would record them
        (engine thread); how many live caches went."""
        dropped = self.live.release(keys) if self.live is not None else 0
        self.jobs.drop(keys)
        return dropped

    def reset(self) -> None:
        """Forget the record jobs (after a failed step: their state may be half-updated)."""
        self.jobs.clear()

    def close(self) -> None:
        if self.live is not None:
            self.live.clear()


class _KeepRings:
    """A fast request's model callable: before its prompt's last chunk (from a position past
    0) it keeps the sliding-window rings (references), which that chunk trims to W - 1, so the
    pooled prompt cache can be cut back into that chunk (live.widen)."""

    def __init__(self, model, plan: Plan, prompt_len: int):
        self.model, self.plan, self.prompt_len = model, plan, prompt_len

    def __call__(self, inputs, cache):
        first = next((c.offset for c in cache if hasattr(c, "offset")), 0)
        if first and first + inputs.shape[1] == self.prompt_len:
            self.plan.rings = (first, rings(cache))
        return self.model(inputs, cache=cache)


def _last_cut(turn_ends: list[int], n: int, block_size: int, upto: int) -> int:
    """The last canonical cut (a block boundary or one of `turn_ends`, ascending) of an
    `n`-token prompt at or before `upto` and before `n`; 0 when none (found by bisection: a
    deep chat has a turn end a turn)."""
    upto = min(upto, n - 1)
    i = bisect_right(turn_ends, upto)
    return max(upto // block_size * block_size, turn_ends[i - 1] if i else 0, 0)


def _same_namespace(a: Plan, b: Plan) -> bool:
    ka, kb = a.keyer, b.keyer
    return ka is kb or (ka is not None and kb is not None and ka.tag == kb.tag)
