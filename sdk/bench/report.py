"""`forkv bench all --report DIR`: plots and a Markdown summary of benchmark results.

Reads the dicts the benchmarks return (one per name, possibly with per-model `runs`) and
writes PNG plots with matplotlib (the `bench` extra) plus `summary.md`; `missed_targets` lists
the figures that missed their targets (`forkv bench --check`).
"""

from __future__ import annotations

from pathlib import Path

_HEADLINES = {
    "rewind": ["speedup_8k", "exact"],
    "agent": ["turn_speedup", "turn_ttft_speedup", "tot_speedup", "speedup", "prefill_ratio"],
    "parallel": ["throughput_ratio"], "memory": ["extra_ram_reduction", "peak_reduction"],
    "image": ["repeat_speedup"],
    "store": ["encryption_overhead", "encrypted_over_plain_files", "aead_gbps"],
    "blas": ["prefill_speedup"],
    "constrained": ["overhead_percent", "schema_held"],
}


def _runs(res: dict) -> list[dict]:
    return res.get("runs") or [res]


def write_report(results: dict, folder: str) -> Path:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    plots = []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is not None:
        for name, fn in (("rewind", _plot_rewind), ("parallel", _plot_parallel),
                         ("memory", _plot_memory)):
            if name in results:
                path = out / f"{name}.png"
                fn(plt, results[name], path)
                plots.append(path.name)
    (out / "summary.md").write_text(_summary(results, plots))
    (out / "table.md").write_text(readme_table(results))
    return out / "summary.md"


# (benchmark, headline key, what it measures) for the README's performance table
_README_ROWS = [
    ("rewind", "speedup_8k",
     "time to first token after rewinding to 8K tokens, recompute ÷ restore"),
    ("rewind", "exact", "restored greedy tokens equal a fresh block-aligned run"),
    ("agent", "turn_speedup",
     "branch-and-prune (4K document), wall time of each turn after a prune, mlx-lm ÷ forkv"),
    ("agent", "turn_ttft_speedup",
     "branch-and-prune, time to first token of each turn after a prune (median), mlx-lm ÷ forkv"),
    ("agent", "speedup", "branch-and-prune (4 turns), whole workflow, mlx-lm ÷ forkv"),
    ("agent", "prefill_ratio", "branch-and-prune prefill tokens, mlx-lm ÷ forkv"),
    ("agent", "tot_speedup", "tree-of-thought (k=8, 2K prompt) wall time, mlx-lm ÷ forkv"),
    ("parallel", "throughput_ratio", "8 conversations: batched ÷ one-after-another tokens/s"),
    ("memory", "extra_ram_reduction",
     "4 live 8K prompts: 1 − checkpoint RAM ÷ the records' bytes (all kept in RAM costs ≥ that)"),
    ("memory", "peak_reduction", "the same, whole peak above the weights (live caches included)"),
    ("image", "repeat_speedup", "same image, new question: first ÷ second time to first token"),
    ("store", "encryption_overhead",
     "8K restore: encrypted tier ÷ the same tier without AES (median of 3 fresh processes)"),
    ("store", "encrypted_over_plain_files",
     "8K restore: encrypted tier ÷ plain safetensors files read with mx.load"),
    ("store", "aead_gbps", "AES-256-GCM seal GB/s"),
    ("blas", "prefill_speedup", "prefill tok/s, OpenBLAS ÷ mlx's stock BLAS"),
    ("constrained", "overhead_percent",
     "decode cost to 7 free rows of 1 JSON-schema-constrained row in their batch, %"),
]


def readme_table(results: dict) -> str:
    """The README's performance table (Markdown) from one run's results."""
    machine = next(iter(results.values()))["machine"]
    lines = [f"Measured on {machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB, "
             f"{machine['os']}, mlx {machine['mlx']}, mlx-lm {machine['mlx_lm']}, mlx-vlm "
             f"{machine['mlx_vlm']}, {machine['blas']}, `small` demo models.", "",
             "| benchmark | figure | value | target | command |", "|---|---|---|---|---|"]
    for name, key, what in _README_ROWS:
        if name not in results:
            continue
        runs = _runs(results[name])
        values = "; ".join(f"{_fmt(run['headline'].get(key))} "
                           f"({str(run['model']).replace('demo:', '').replace(':small', '')})"
                           for run in runs)
        target = (runs[0]["targets"].get(key) or {}).get("target", "")
        lines.append(f"| {name} | {what} | {values} | {target} | `forkv bench {name}` |")
    return "\n".join(lines) + "\n"


def missed_targets(results: dict) -> list[str]:
    """Each figure that missed its target in `results` (benchmark name -> result), as
    "rewind speedup_8k (gemma3:tiny) 12.3, target >= 20"; empty when every target was met."""
    out = []
    for name, res in results.items():
        for run in _runs(res):
            model = str(run.get("model", "")).replace("demo:", "")
            for key, target in (run.get("targets") or {}).items():
                if target.get("met") is False:
                    value = _fmt(run.get("headline", {}).get(key))
                    out.append(f"{name} {key} ({model}) {value}, target {target.get('target')}")
    return out


def _summary(results: dict, plots: list[str]) -> str:
    machine = next(iter(results.values()))["machine"]
    lines = ["# forkv benchmark report", "",
             f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB RAM, "
             f"{machine['os']}; mlx {machine['mlx']}, mlx-lm {machine['mlx_lm']}, "
             f"mlx-vlm {machine['mlx_vlm']}; BLAS {machine['blas']}; device {machine['device']}.",
             "", "| benchmark | model | figure | value | target | met |",
             "|---|---|---|---|---|---|"]
    for name, res in results.items():
        for run in _runs(res):
            for key in _HEADLINES.get(name, list(run["headline"])):
                target = run["targets"].get(key, {})
                value = run["headline"].get(key)
                met = target.get("met")
                lines.append(f"| {name} | {run['model']} | {key} | {_fmt(value)} | "
                             f"{target.get('target', '')} | "
                             f"{'yes' if met else 'no' if met is False else ''} |")
    lines += ["", "Every figure: `forkv bench NAME --json PATH` (see each JSON's settings).", ""]
    lines += [f"![{p}]({p})" for p in plots]
    for name, res in results.items():
        for run in _runs(res):
            for note in run.get("notes", []):
                lines.append(f"- {name} ({run['model']}): {note}")
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _plot_rewind(plt, res, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in _runs(res):
        xs = [c["prefix_tokens"] for c in run["cases"]]
        ax.plot(xs, [c["baseline_ttft_s"]["median"] for c in run["cases"]], "o--",
                label=f"recompute ({run['model']})")
        ax.plot(xs, [c["ours_ttft_s"]["median"] for c in run["cases"]], "o-",
                label=f"forkv restore ({run['model']})")
    ax.set(xlabel="prefix tokens", ylabel="time to first token (s)", yscale="log",
           title="Rewind: restore vs recompute")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_parallel(plt, res, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in _runs(res):
        curve = sorted((c["concurrency"], c) for c in run["cases"]
                       if c.get("case") == "concurrency")
        if curve:
            xs = [x for x, _ in curve]
            ax.plot(xs, [c["ours_tps"]["median"] for _, c in curve], "o-",
                    label=f"forkv, whole run ({run['model']})")
            if "decode_tps" in curve[0][1]:
                ax.plot(xs, [c["decode_tps"] for _, c in curve], "s-",
                        label="forkv, decode steps only")
                ax.plot(xs, [c["roofline_tps"] for _, c in curve], "k:",
                        label="decode roofline (bandwidth, FLOP/s)")
        for key, style, label in (("baseline_tps", "--", "mlx-lm, one after another"),
                                  ("mlx_lm_batched_tps", "-.", "mlx-lm batch_generate (8)")):
            if run["headline"].get(key):
                ax.axhline(run["headline"][key], linestyle=style, color="gray", label=label)
    ax.set(xlabel="concurrent conversations", ylabel="generated tokens/s", yscale="log",
           title="Parallel decoding")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_memory(plt, res, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in _runs(res):
        modes = {}
        for case in run["cases"]:
            pts = case.get("rss_over_time") or []
            modes[case["mode"]] = case
            line, = ax.plot([t for t, _ in pts], [v / 2**20 for _, v in pts],
                            label=f"{case['mode']} ({run['model']})")
        extra = run["settings"].get("baseline_extra_bytes")
        if "baseline" not in modes and extra and "none" in modes:
            # Unmeasured baseline: at least the no-checkpoint peak plus every record's bytes.
            ax.axhline((modes["none"]["peak_extra_bytes"] + extra) / 2**20, ls="--",
                       color=line.get_color(), label=f"all in RAM, at least ({run['model']})")
    ax.set(xlabel="seconds", ylabel="RSS above model (MiB)", title="RAM while prefilling")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
