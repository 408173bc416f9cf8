"""A decode step's temporaries are reused, not mapped afresh each step, in the `forkv` process
(engine/request/buffers.py): there malloc maps every block of 1 MiB and up (sdk/arenas.py), so
each one mlx's buffer cache does not keep is a fresh mapping whose pages fault in again."""

import os
import subprocess
import sys

import pytest

from forkv import arenas

pytestmark = pytest.mark.skipif(not arenas._is_glibc(), reason="glibc's malloc only")

# Minor page faults a "decode step" takes once warm: four 8 MiB temporaries (an 8-row step's
# logits, log-probabilities, tempered scores and draws over a 262K vocabulary), after the cache
# was filled by another shape's buffers (a prefill's, or another row count's).
_STEPS = """
import resource, sys
sys.orig_argv = sys.argv = ["forkv", "serve"]
import forkv  # arenas.limit(): 1 MiB mmap threshold
from forkv import arenas
assert arenas.threshold_fixed()
import mlx.core as mx
from forkv.engine.request.buffers import StepBuffers

buffers = StepBuffers()
buffers.enabled = {enabled}
x = mx.random.normal((8, 262144))
mx.eval(x)
def step(rows):
    buffers.decode(rows)
    logits = x * 1.5
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    scores = lp / 0.8
    mx.eval(mx.argmax(scores + x, axis=-1))
junk = [mx.zeros((n * 1000 + 7,)) for n in range(1, 40)]  # a prefill's odd sizes, ~3 MiB
mx.eval(junk)
buffers.prefill()
del junk
for _ in range(3):
    step(8)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step(8)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) // 10)
"""


def _faults_a_step(enabled: bool) -> int:
    out = subprocess.run([sys.executable, "-c", _STEPS.format(enabled=enabled)], text=True,
                         capture_output=True, timeout=120,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("MALLOC_")})
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_a_decode_step_reuses_its_buffers_in_the_forkv_process():
    # 8 MiB is 2,048 pages: a step mapping even one of its buffers afresh faults that many.
    assert _faults_a_step(True) < 300
    assert _faults_a_step(False) > 1500  # mlx's 32 MiB cache alone does not hold the step


def test_the_cache_follows_the_step_kind():
    import mlx.core as mx

    from forkv.engine.request import buffers

    b = buffers.StepBuffers(enabled=True)
    try:
        b.decode(8)
        assert mx.set_cache_limit(buffers.DECODE_LIMIT) == buffers.DECODE_LIMIT
        mx.eval(mx.zeros((1 << 20,)))  # freed into the cache
        assert mx.get_cache_memory() >= 4 << 20
        b.decode(8)  # same shape: its buffers stay for the next step
        assert mx.get_cache_memory() >= 4 << 20
        b.decode(8)  # measured: cut to what a step leaves cached, 1.5x, and some slack
        assert mx.set_cache_limit(buffers.DECODE_LIMIT) == buffers.PREFILL_LIMIT
        b.decode(1)  # another row count: the last shape's buffers are let go
        assert mx.get_cache_memory() == 0
        mx.eval(mx.zeros((16 << 20,)))  # a step that leaves 64 MiB cached
        b.decode(1)
        b.decode(1)
        limit = mx.set_cache_limit(buffers.DECODE_LIMIT)
        assert abs(limit - (96 + 16 << 20)) < 1024  # 1.5 x 64 MiB + 16
        b.prefill()
        assert mx.set_cache_limit(buffers.PREFILL_LIMIT) == buffers.PREFILL_LIMIT
    finally:
        mx.set_cache_limit(buffers.PREFILL_LIMIT)
        mx.clear_cache()


def test_a_program_importing_forkv_keeps_its_mlx_settings():
    from forkv.engine.request.buffers import StepBuffers

    assert not arenas.threshold_fixed()  # pytest is not the forkv CLI
    assert not StepBuffers().enabled
