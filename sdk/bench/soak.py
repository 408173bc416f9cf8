"""`forkv bench soak`: one real `forkv serve` process kept busy with mixed traffic for a bounded
time, sampled every `sample_s` seconds, judged on whether anything grows.

The server runs on a free loopback port with a few `--api-key` tenants (the other tenants add
a `cache_salt`), and, where the server loads models on demand, no `--model`: each model is
loaded by the first request naming it. Where it cannot (the option is still required, or a
second model answers 404), the soak serves the first model only and says so in the notes.
Client threads send the mix in `soak_traffic`. Each sample reads the server's process tree
from /proc (resident memory, open files, sockets, threads) and its /metrics (checkpoint bytes
per tier, namespaces, requests by status).

Pass (`soak_ok`): from the warm-up sample (the one at a sixth of the run: minute 5 of 30) to the
end, RSS, checkpoint bytes, open files (sockets apart) and threads each stay within 10% of
their warm-up value, with a small absolute slack for small counts (`LIMITS`). RSS is judged on
its level, the median of three neighbouring samples, since one sample can catch a burst of
requests in flight; a single sample may not pass +25% (`RSS_SPIKE`). Sockets never
exceed one per client plus a few; no request fails unexpectedly; and once traffic stops no
request is left in flight. Knows the run and the judgement; the requests are in
`soak_traffic`, the plot in `soak_plot`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request

from forkv.security import parse_size

from .common import result
from .serve_procs import ServerProcess, _children, _free_port, _status
from .soak_traffic import Tally, make_tenants, run_client

__all__ = ["LIMITS", "judge", "run_soak", "serve_command", "warm_index"]

DEFAULT_MODELS = ("demo:qwen3:tiny", "demo:gemma3:tiny")
NUM_KEYS = 4  # API-key tenants; the rest are salts on top of them
# Small checkpoint tiers, full well before the warm-up sample: from there eviction must hold
# the bytes flat (with the 4 GiB default disk tier a 30-minute run would only be filling it).
RAM_BUDGET, DISK_BUDGET = "4MiB", "16MiB"
# The same for fast reuse's live caches (512 MiB by default: a 3-minute run on tiny models
# was still filling it after its warm-up sample, RSS +10% on a bounded cache).
LIVE_CACHE_MIB = "16"
# And for speculation's index of recent outputs (128K tokens, ~40 MB by default: a 30-minute
# soak was still filling it at the end, RSS +19% on a bounded index).
RECENT_TOKENS = "8192"
# curve -> (relative allowance, absolute slack): limit = max(warm * (1 + rel), warm + slack)
LIMITS = {"rss_mib": (0.10, 0.0), "store_bytes": (0.10, float(1 << 20)), "files": (0.10, 4.0),
          "threads": (0.10, 2.0)}
# RSS moves with the requests in flight at the moment of a sample (a clean clone's 3-minute soak
# read 345, 363, 359, 358, 395, 356, 364 MiB on a flat server): its level is the median of three
# neighbouring samples, and one sample alone may reach +25% before it fails.
RSS_SPIKE = 0.25
SOCKET_SLACK = 4  # listening socket and connections being torn down, beyond one per client
CURVES = ("t_s", "rss_mib", "store_bytes", "ram_bytes", "disk_bytes", "files", "sockets",
          "threads", "namespaces", "in_flight", "requests", "expected_4xx", "unexpected",
          "server_5xx", "mlx_active_mib", "mlx_cache_mib", "live_mib", "malloc_in_use_mib",
          "malloc_free_mib", "responses_stored")


def serve_command(port: int, keys: list[str], model: str | None = None) -> list[str]:
    """`forkv serve` on loopback with `keys`; without `model`, models load on demand."""
    cmd = [sys.executable, "-m", "forkv.cli", "serve", "--host", "127.0.0.1",
           "--port", str(port)]
    for key in keys:
        cmd += ["--api-key", key]
    return cmd + (["--model", model] if model else [])


def _start(models: list[str], keys: list[str], env: dict[str, str],
           notes: list[str]) -> ServerProcess:
    """The server without --model if it starts so (noted), else with the first model."""
    port = _free_port()
    server = ServerProcess("forkv serve", serve_command(port, keys), port, models[0], env)
    try:
        server.wait_ready(timeout=600)
        notes.append("forkv serve started without --model: each model is loaded by the first "
                     "request naming it.")
        return server
    except RuntimeError as e:
        last = str(e).strip().splitlines()[-1][:300]
        notes.append(f"forkv serve did not start without --model ({last}); started with "
                     f"--model {models[0]}.")
    port = _free_port()
    server = ServerProcess("forkv serve", serve_command(port, keys, models[0]), port, models[0],
                           env)
    server.wait_ready(timeout=600)
    return server


def _served(tenant, models: list[str], notes: list[str]) -> list[str]:
    """The models a one-token chat request is answered for (the first load happens here)."""
    import openai

    out = []
    for model in models:
        try:
            tenant.client.with_options(timeout=600).chat.completions.create(
                model=model, messages=[{"role": "user", "content": "warm up"}], max_tokens=1)
            out.append(model)
        except openai.NotFoundError as e:
            notes.append(f"{model} answered 404 ({str(e)[:200]}): no on-demand model loading "
                         "yet, so this soak sends no traffic to it.")
    if not out:
        raise RuntimeError(f"forkv serve answered none of {', '.join(models)}.")
    return out


def _has_completions(tenant, model: str, notes: list[str]) -> bool:
    import openai

    try:
        tenant.client.completions.create(model=model, prompt="warm up", max_tokens=1)
        return True
    except openai.NotFoundError:
        notes.append("POST /v1/completions answered 404: not on this server yet, skipped.")
        return False


# -- sampling ---------------------------------------------------------------------------------
def _tree(pid: int) -> list[int]:
    pids, children = [pid], _children()
    for p in pids:
        pids += children.get(p, [])
    return pids


def _fds(pid: int) -> tuple[int, int]:
    """(open files that are not sockets, sockets) of one process."""
    files = sockets = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0, 0
    for name in names:
        try:
            is_socket = os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
        except OSError:
            continue  # closed between listdir and readlink
        sockets += is_socket
        files += not is_socket
    return files, sockets


# Where RSS goes, followed and not judged: malloc's split tells live native allocations from
# freed memory it holds (fragmentation) when RSS grows.
_PARTS = ("mlx_active", "mlx_cache", "live", "malloc_in_use", "malloc_free")
_GAUGES = {"forkv_namespaces": "namespaces", "forkv_requests_in_flight": "in_flight",
           "forkv_responses_stored": "responses_stored"}


def read_metrics(url: str, key: str) -> dict[str, float]:
    """The /metrics samples the soak follows, summed over labels where it matters (`key`: an
    API key of the server, which guards /metrics too)."""
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        text = r.read().decode()
    out = {"ram_bytes": 0.0, "disk_bytes": 0.0, "namespaces": 0.0, "in_flight": 0.0,
           "responses_stored": 0.0, "server_5xx": 0.0, **dict.fromkeys(_PARTS, 0.0)}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        base = name.split("{", 1)[0]  # labels (tier, model, status) summed over
        if base == "forkv_tier_bytes":
            out["disk_bytes" if 'tier="disk"' in name else "ram_bytes"] += float(value)
        elif base == "forkv_memory_bytes":  # where RSS goes: followed, not judged
            part = name.split('part="', 1)[-1].split('"', 1)[0]
            if part in _PARTS:
                out[part] += float(value)
        elif base in _GAUGES:
            out[_GAUGES[base]] += float(value)
        elif base == "forkv_requests_total" and 'status="5' in name:
            out["server_5xx"] += float(value)
    return out


def take_sample(pid: int, url: str, key: str, t_s: float, tally: Tally) -> dict:
    """One point of every curve: the server's process tree, its /metrics, the tally so far."""
    rss = files = sockets = threads = 0
    for p in _tree(pid):
        st = _status(p)
        rss, threads = rss + st.get("VmRSS", 0), threads + st.get("Threads", 0)
        f, s = _fds(p)
        files, sockets = files + f, sockets + s
    m = read_metrics(url, key)
    totals = tally.totals()
    return {"t_s": round(t_s, 1), "rss_mib": round(rss / 1024, 1),
            "store_bytes": int(m["ram_bytes"] + m["disk_bytes"]),
            "ram_bytes": int(m["ram_bytes"]), "disk_bytes": int(m["disk_bytes"]),
            "files": files, "sockets": sockets, "threads": threads,
            "namespaces": int(m["namespaces"]), "in_flight": int(m["in_flight"]),
            "responses_stored": int(m["responses_stored"]), "requests": totals["requests"],
            "expected_4xx": totals["expected_4xx"],
            "unexpected": totals["unexpected"], "server_5xx": int(m["server_5xx"]),
            **{f"{k}_mib": round(m[k] / 2**20, 1) for k in _PARTS}}


# -- judgement --------------------------------------------------------------------------------
def warm_index(times: list[float], duration_s: float, warmup_s: float | None = None) -> int:
    """The warm-up sample: the first at or after `warmup_s` (default: a sixth of the run; the
    last sample if none is)."""
    at = duration_s / 6 if warmup_s is None else warmup_s
    return next((i for i, t in enumerate(times) if t >= at - 1e-6), len(times) - 1)


def _level(curve: list[float], i: int) -> float:
    """The median of sample `i` and its two neighbours (the two nearest at either end)."""
    lo = min(max(i - 1, 0), max(len(curve) - 3, 0))
    return sorted(curve[lo:lo + 3])[len(curve[lo:lo + 3]) // 2]


def judge(curves: dict[str, list], warm: int, clients: int,
          store_budget: float | None = None) -> dict:
    """Per judged curve: warm-up value, peak after it, limit, growth, ok; and `ok` overall.
    `store_budget` (bytes the tiers may hold in all) lets checkpoint bytes still filling at
    warm-up fill up to it, +10%: a cache reaching its budget is not a leak."""
    out: dict = {}
    for name, (rel, slack) in LIMITS.items():
        curve = curves[name]
        if name == "rss_mib":
            base, peak = _level(curve, warm), max(_level(curve, i) for i in range(warm, len(curve)))
        else:
            base, peak = curve[warm], max(curve[warm:])
        limit = max(base * (1 + rel), base + slack)
        if name == "store_bytes" and store_budget:
            limit = max(limit, store_budget * (1 + rel))
        out[name] = {"warm": base, "peak": peak, "limit": round(limit, 3),
                     "growth": round(peak - base, 3),
                     "ratio": round(peak / base, 4) if base else None, "ok": peak <= limit}
        if name == "rss_mib":
            top = max(curve[warm:])
            out[name].update(sample_peak=top, sample_limit=round(base * (1 + RSS_SPIKE), 3))
            out[name]["ok"] = out[name]["ok"] and top <= base * (1 + RSS_SPIKE)
    peak = max(curves["sockets"])
    out["sockets"] = {"peak": peak, "limit": clients + SOCKET_SLACK,
                      "ok": peak <= clients + SOCKET_SLACK}
    out["ok"] = all(v["ok"] for v in out.values())
    return out


def _drain(url: str, key: str, timeout: float = 60.0) -> int:
    """Requests still in flight once traffic has stopped (waits for cut streams to notice)."""
    deadline = time.monotonic() + timeout
    while True:
        left = int(read_metrics(url, key)["in_flight"])
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def run_soak(minutes: float = 30.0, tenants: int = 16, models: tuple[str, ...] = DEFAULT_MODELS,
             clients: int = 8, sample_s: float = 60.0, seed: int = 0,
             ram_budget: str = RAM_BUDGET, disk_budget: str = DISK_BUDGET,
             warmup_s: float | None = None, plot: str | None = None) -> dict:
    """Run the soak (see the module docstring) and return its result; `warmup_s` moves the
    warm-up sample (default: a sixth of the run); `plot` also writes the curves (SVG, or PNG
    and others through matplotlib)."""
    import openai

    if minutes <= 0 or sample_s <= 0 or tenants < 1 or clients < 1 or not models:
        raise ValueError("soak needs --minutes and --sample-s above 0, at least one tenant, "
                         "client and model.")
    if warmup_s is not None and not 0 <= warmup_s < minutes * 60:
        raise ValueError(f"--warmup-s must be from 0 to the run's {minutes * 60:g} s.")
    duration = minutes * 60
    notes: list[str] = []
    keys = [f"soak-key-{i}" for i in range(min(NUM_KEYS, tenants))]
    env = {"FORKV_RAM_BUDGET": ram_budget, "FORKV_DISK_BUDGET": disk_budget,
           "FORKV_LIVE_CACHE_MIB": LIVE_CACHE_MIB, "FORKV_RECENT_TOKENS": RECENT_TOKENS}
    server = _start(list(models), keys, env, notes)
    url = f"http://127.0.0.1:{server.port}"
    http = openai.DefaultHttpxClient()  # one pool: at most one connection per client thread
    try:
        people = make_tenants(tenants, keys, server.base_url, http, seed)
        served = _served(people[0], list(models), notes)
        ctx = {"http": http, "base_url": server.base_url,
               "has_completions": _has_completions(people[0], served[0], notes)}
        tally, stop = Tally(), threading.Event()
        t0 = time.monotonic()
        threads = [threading.Thread(target=run_client, daemon=True, name=f"soak-client-{i}",
                                    args=(i, seed, t0 + duration, stop, people, served, tally,
                                          ctx)) for i in range(clients)]
        samples = [take_sample(server.proc.pid, url, keys[0], 0.0, tally)]
        for th in threads:
            th.start()
        try:
            for k in range(1, int(-(-duration // sample_s)) + 1):  # at k * sample_s, and the end
                time.sleep(max(0.0, t0 + min(k * sample_s, duration) - time.monotonic()))
                samples.append(take_sample(server.proc.pid, url, keys[0],
                                           time.monotonic() - t0, tally))
                print(f"  soak {samples[-1]['t_s']:.0f} s: {_line(samples[-1])}",
                      file=sys.stderr, flush=True)  # a long run: show where it is
        finally:
            stop.set()
            for th in threads:
                th.join(timeout=180)
        left = _drain(url, keys[0])
    finally:
        http.close()
        server.stop()
    settings = {"minutes": minutes, "tenants": tenants, "api_keys": len(keys),
                "models": list(models), "clients": clients, "sample_s": sample_s, "seed": seed,
                "warmup_s": warmup_s, "ram_budget": ram_budget, "disk_budget": disk_budget,
                "live_cache_mib": LIVE_CACHE_MIB, "recent_tokens": RECENT_TOKENS,
                "store_budget_bytes": len(served) * (parse_size(ram_budget) +
                                                     parse_size(disk_budget))}
    res = _result(samples, tally, left, duration, served, notes, settings)
    if plot:
        from .soak_plot import write_plot

        res["plot"] = str(write_plot(res, plot))
    return res


def _warm_rule(warmup_s: float | None) -> str:
    return "a sixth of the run" if warmup_s is None else f"--warmup-s {warmup_s:g}"


def _line(s: dict) -> str:
    return (f"rss {s['rss_mib']} MiB (mlx {s['mlx_active_mib']} + cache {s['mlx_cache_mib']}, "
            f"malloc {s['malloc_in_use_mib']} used + {s['malloc_free_mib']} free, "
            f"live {s['live_mib']}), store {s['store_bytes'] / 2**20:.1f} MiB, responses "
            f"{s['responses_stored']}, files "
            f"{s['files']}, sockets {s['sockets']}, threads {s['threads']}, requests "
            f"{s['requests']}, unexpected {s['unexpected']}")


def _result(samples: list[dict], tally: Tally, in_flight_left: int, duration: float,
            served: list[str], notes: list[str], settings: dict) -> dict:
    curves = {k: [s[k] for s in samples] for k in CURVES}
    warm = warm_index(curves["t_s"], duration, settings.get("warmup_s"))
    budget = settings.get("store_budget_bytes")
    verdict = judge(curves, warm, settings["clients"], budget)
    totals = tally.totals()
    ok = verdict["ok"] and totals["unexpected"] == 0 and in_flight_left == 0
    v = verdict
    headline = {"soak_ok": ok, "rss_growth_ratio": v["rss_mib"]["ratio"],
                "store_growth_ratio": v["store_bytes"]["ratio"],
                "fd_growth": v["files"]["growth"], "thread_growth": v["threads"]["growth"],
                "sockets_max": v["sockets"]["peak"], "requests": totals["requests"],
                "unexpected_errors": totals["unexpected"], "in_flight_after": in_flight_left}
    targets = {"soak_ok": "== true", "unexpected_errors": "<= 0", "in_flight_after": "<= 0",
               "rss_growth_ratio": "<= 1.1", "sockets_max": f"<= {v['sockets']['limit']}",
               "fd_growth": f"<= {v['files']['limit'] - v['files']['warm']:g}",
               "thread_growth": f"<= {v['threads']['limit'] - v['threads']['warm']:g}"}
    if v["store_bytes"]["warm"]:
        targets["store_growth_ratio"] = \
            f"<= {v['store_bytes']['limit'] / v['store_bytes']['warm']:.4g}"
    notes = notes + [
        (f"Served: {', '.join(served)}; {settings['tenants']} tenants over "
         f"{settings['api_keys']} API keys (the tenants past the keys add their own cache_salt), "
         f"{settings['clients']} client threads, seed {settings['seed']}."),
        (f"Warm-up: the sample at {curves['t_s'][warm]:.0f} s (the first at or after "
         f"{_warm_rule(settings.get('warmup_s'))}). Limits from it, whichever is larger: RSS "
         "+10% on its level (the median of three neighbouring samples; one sample alone "
         "+25%); checkpoint bytes +10% or +1 MiB, or the tiers' budgets +10% where they are "
         "still filling at warm-up; open files +10% or +4; threads +10% or +2. Sockets are "
         "counted apart from files (the clients' keep-alive connections come and go) and may "
         "not exceed one per client plus "
         f"{SOCKET_SLACK}."),
        (f"The server runs with FORKV_RAM_BUDGET={settings['ram_budget']} and "
         f"FORKV_DISK_BUDGET={settings['disk_budget']} per model "
         f"({settings['store_budget_bytes'] / 2**20:.0f} MiB for {len(served)}) and "
         f"FORKV_LIVE_CACHE_MIB={settings.get('live_cache_mib', LIVE_CACHE_MIB)} and "
         f"FORKV_RECENT_TOKENS={settings.get('recent_tokens', RECENT_TOKENS)}, so its "
         "tiers, live caches and draft index fill early and eviction then has to hold them. "
         "Every "
         "figure sums the server's process tree; checkpoint bytes are forkv_tier_bytes (RAM "
         "and disk) from /metrics."),
        ("Expected 4xx: invalid JSON (400), no model (400), an unknown model (404), a deleted "
         "response's child (404); any other 4xx, a 5xx, a timeout or a dropped connection is "
         "unexpected."),
    ]
    cases = [*tally.by_action(), {"case": "judgement", **verdict}]
    res = result("soak", ", ".join(served), settings, cases, headline, targets, notes)
    res["curves"] = curves
    res["unexpected_examples"] = list(tally.examples)
    res["warm_index"] = warm
    return res
