"""`forkv bench contention`: the fair-share target, and a smoke run that leaves no busy loop."""

import json
import os
import subprocess
import sys

import pytest

from forkv.bench.contention import fair_target


def test_fair_share_targets_on_two_cores():
    assert fair_target(2, 2) == 2.6 and fair_target(4, 2) == 3.9 and fair_target(0, 2) == 1.3


def test_blas_shim_builds_with_the_thread_policy():
    from forkv.engine.models import blas, blas_threads

    src = blas._shim_source(ilp64=False)
    assert "forkv_one_thread(m, n, k)" in src and "forkv_threads_init(lib)" in src
    assert os.environ.get("OPENBLAS_THREAD_TIMEOUT")  # set before OpenBLAS loaded (conftest)
    assert blas_threads.SPIN_TIMEOUT == "18"


@pytest.mark.slow  # a model load and a few timed requests beside busy processes (~10 s)
def test_quick_run_writes_json_and_stops_its_busy_processes(tmp_path):
    out = tmp_path / "c.json"
    p = subprocess.run([sys.executable, "-m", "forkv.cli", "bench", "contention", "--quick",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert {"headline", "targets", "machine", "settings", "cases", "notes"} <= set(res)
    assert [c["busy"] for c in res["cases"]] == [0, 2]
    assert res["targets"]["slowdown_busy2"]["target"].startswith("<=")
    busy = subprocess.run(["pgrep", "-f", "while time.monotonic\\(\\) < t"],
                          capture_output=True, text=True).stdout.split()
    assert not busy  # every busy loop it started is gone
