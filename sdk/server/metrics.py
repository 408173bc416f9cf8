"""Prometheus text exposition (format 0.0.4) of the server's counters and the engine's stats.

Names are prefixed `forkv_`: requests by endpoint and status, tokens reused / computed /
generated, record hits and misses per kind, bytes per tier, queue depth, requests running,
a time-to-first-token histogram, where the process's memory goes (`memory_bytes`: resident
set, mlx's arrays and its buffer cache, fast reuse's live caches, malloc's heap in use and held
free; records by tier are in `tier_bytes`) and the RAM budget's split (`ram_budget_bytes`,
`ram_bytes` by part), and what the Responses API keeps (`responses_stored`,
`response_tree_nodes`). Written by hand (a few lines) rather than with prometheus_client. Knows
nothing about HTTP routing or models.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter

from .. import arenas

__all__ = ["Metrics"]

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (endpoint, status) -> count
        self.generated = 0
        self.cancelled = 0
        self._ttft = [0] * (len(TTFT_BUCKETS) + 1)
        self._ttft_sum = 0.0

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, str(status))] += 1

    def tokens(self, generated: int) -> None:
        with self._lock:
            self.generated += generated

    def cancel(self) -> None:
        with self._lock:
            self.cancelled += 1

    def ttft(self, seconds: float) -> None:
        with self._lock:
            i = next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))
            self._ttft[i] += 1
            self._ttft_sum += seconds

    def render(self, stats: dict) -> str:
        """The exposition text; `stats` is `ModelPool.stats()` (or one `ServedEngine.stats()`)."""
        out: list[str] = []

        def metric(name, kind, doc, samples):
            out.append(f"# HELP forkv_{name} {doc}")
            out.append(f"# TYPE forkv_{name} {kind}")
            for labels, value in samples:
                lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
                out.append(f"forkv_{name}{{{lab}}} {value}" if lab else f"forkv_{name} {value}")

        with self._lock:
            requests = sorted(self.requests.items())
            generated, cancelled = self.generated, self.cancelled
            ttft, ttft_sum = list(self._ttft), self._ttft_sum
        metric("requests_total", "counter", "HTTP requests answered, by endpoint and status.",
               [({"endpoint": e, "status": s}, n) for (e, s), n in requests])
        metric("requests_cancelled_total", "counter",
               "Requests cancelled because their client went away.", [({}, cancelled)])
        metric("tokens_reused_total", "counter", "Prompt tokens restored from checkpoints.",
               [({}, stats["tokens_reused"])])
        metric("tokens_computed_total", "counter", "Prompt tokens prefilled.",
               [({}, stats["tokens_computed"])])
        metric("tokens_generated_total", "counter", "Tokens generated.", [({}, generated)])
        metric("tokens_drafted_total", "counter", "Draft tokens verified (speculation).",
               [({}, stats.get("tokens_drafted", 0))])
        metric("tokens_accepted_total", "counter", "Draft tokens the model drew itself.",
               [({}, stats.get("tokens_accepted", 0))])
        metric("steps_taken_back_total", "counter", "Decode steps queued ahead and taken back "
               "(a row's drafter drafted after all, or a row stopped or was cancelled): a "
               "wasted step each.",
               [({}, stats.get("steps_taken_back", 0))])
        metric("record_hits_total", "counter", "Checkpoint records found, by kind.",
               [({"kind": k}, n) for k, n in sorted(stats["hits"].items())])
        metric("record_misses_total", "counter", "Checkpoint records missing, by kind.",
               [({"kind": k}, n) for k, n in sorted(stats["misses"].items())])
        metric("tier_bytes", "gauge", "Bytes of checkpoint records held, by tier.",
               [({"tier": t}, b) for t, b in sorted(stats["tier_bytes"].items())])
        metric("queue_depth", "gauge", "Requests waiting for a batch slot.",
               [({}, stats["waiting"])])
        metric("requests_running", "gauge", "Requests prefilling or decoding.",
               [({}, stats["running"])])
        metric("requests_in_flight", "gauge", "Requests accepted and not finished.",
               [({}, stats["in_flight"])])
        metric("namespaces", "gauge", "Checkpoint namespaces (tenants, salts) seen recently.",
               [({}, stats["namespaces"])])
        if "responses_stored" in stats:
            metric("responses_stored", "gauge", "Responses API responses kept in memory "
                   "(store: true, not deleted), over loaded models and namespaces.",
                   [({}, stats["responses_stored"])])
            metric("response_tree_nodes", "gauge", "Nodes of the Responses API's conversation "
                   "trees (the kept responses' turns and answers).",
                   [({}, stats["response_nodes"])])
        metric("memory_bytes", "gauge", "Memory by part: the process's resident set (rss), "
               "mlx's arrays (mlx_active) and freed buffers it keeps (mlx_cache), fast "
               "reuse's live caches (live, part of mlx_active), malloc's allocated bytes "
               "(malloc_in_use) and freed bytes it holds (malloc_free).",
               [({"part": k}, v) for k, v in memory_split(stats.get("live_bytes", 0)).items()])
        ram = stats.get("ram")
        if ram is not None:
            metric("ram_budget_bytes", "gauge", "The RAM budget over what forkv holds beyond "
                   "the weights (--ram; summed over loaded models; 0: none).",
                   [({}, ram["budget"])])
            metric("ram_bytes", "gauge", "What the RAM budget counts, by part: running "
                   "requests' caches (the most they can come to hold), fast reuse's live pool, "
                   "the RAM tier's records, vision features.",
                   [({"part": k}, v) for k, v in ram["parts"].items()])
            metric("ram_waits_total", "counter", "Requests that waited for room in the RAM "
                   "budget.", [({}, ram["waits"])])
        if "models_loaded" in stats:
            metric("models_loaded", "gauge", "Models loaded now.", [({}, stats["models_loaded"])])
            metric("model_loads_total", "counter", "Models loaded on demand.",
                   [({}, stats["model_loads"])])
            metric("model_unloads_total", "counter", "Idle models unloaded.",
                   [({}, stats["model_unloads"])])
        out.append("# HELP forkv_time_to_first_token_seconds From request to first token.")
        out.append("# TYPE forkv_time_to_first_token_seconds histogram")
        acc = 0
        for bound, n in zip((*TTFT_BUCKETS, "+Inf"), ttft):
            acc += n
            out.append(f'forkv_time_to_first_token_seconds_bucket{{le="{bound}"}} {acc}')
        out.append(f"forkv_time_to_first_token_seconds_sum {ttft_sum}")
        out.append(f"forkv_time_to_first_token_seconds_count {acc}")
        return "\n".join(out) + "\n"


def memory_split(live_bytes: int = 0) -> dict[str, int]:
    """{part: bytes}: the process's resident set (Linux), mlx's active and cached buffers
    (where mlx is loaded), `live_bytes`, and malloc's allocated and freed-but-held bytes
    (glibc; mlx's CPU buffers are among the allocated ones)."""
    out = {}
    try:
        with open("/proc/self/statm") as f:
            out["rss"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        out["mlx_active"], out["mlx_cache"] = mx.get_active_memory(), mx.get_cache_memory()
    out["live"] = int(live_bytes)
    out.update(arenas.usage())
    return out
