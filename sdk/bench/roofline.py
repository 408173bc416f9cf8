"""The decode roofline: how many tokens/s this machine can give a model at each batch size.

One decode step reads every weight once (a tied LM head counts once; an untied embedding
table is only gathered, B rows) plus each row's K/V, and does 2 FLOPs per weight per row plus
the attention products. The step can go no faster than the slower of reading those bytes at
the measured bandwidth and doing those FLOPs at the measured matmul rate; B rows per step give
the limit in tokens/s. Bandwidth and FLOP/s are measured here with the very kernel the model
uses (mlx matmul on BLAS): a matrix-vector product over a weight-sized matrix, and a large
square product. Knows nothing about forkv's engine.
"""

from __future__ import annotations

import statistics
import time


def measure_machine(reps: int = 5) -> dict:
    """Matmul-visible memory bandwidth (GB/s) and float32 FLOP/s (GFLOP/s), medians."""
    import mlx.core as mx

    def best(fn) -> float:
        fn()  # warm up (kernel selection, page faults)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    # 256 MiB of weights: far beyond any cache, so this reads memory.
    w = mx.random.normal((4096, 16384)).astype(mx.float32)
    x = mx.random.normal((1, 4096)).astype(mx.float32)
    mx.eval(w, x)
    gemv = best(lambda: mx.eval(x @ w))
    a = mx.random.normal((1024, 2048)).astype(mx.float32)
    b = mx.random.normal((2048, 2048)).astype(mx.float32)
    mx.eval(a, b)
    gemm = best(lambda: mx.eval(a @ b))
    return {"bandwidth_gbs": w.nbytes / gemv / 1e9,
            "gflops": 2 * 1024 * 2048 * 2048 / gemm / 1e9}


def model_costs(lm, row_cache: list) -> dict:
    """Bytes one decode step reads for the weights, and the K/V (or recurrent state) bytes
    and attention FLOPs one row adds, from the model's parameters and `row_cache`: a single
    row's cache prefilled to the context the benchmark decodes at."""
    from mlx.utils import tree_flatten

    params = dict(tree_flatten(lm.model.parameters()))
    weight_bytes = sum(v.nbytes for v in params.values())
    embed = [v for k, v in params.items() if k.endswith("embed_tokens.weight")]
    if embed and any(k.endswith("lm_head.weight") for k in params):
        weight_bytes -= embed[0].nbytes  # untied: the table is gathered, B rows, not read
    itemsize = next(iter(params.values())).itemsize
    import mlx.core as mx

    state = [a for _, a in tree_flatten([c.state for c in row_cache]) if isinstance(a, mx.array)]
    kv_bytes = sum(a.nbytes for a in state)
    cfg = lm.config.get("text_config", lm.config)
    gqa = cfg.get("num_attention_heads", 1) / max(cfg.get("num_key_value_heads", 1), 1)
    # q.k and p.v: 2 FLOPs per cached element per query head sharing it.
    return {"weight_bytes": weight_bytes, "weights": weight_bytes // itemsize,
            "kv_bytes_per_row": kv_bytes,
            "attention_flops_per_row": int(2 * gqa * kv_bytes // state[0].itemsize) if state
            else 0}


def roofline(costs: dict, machine: dict, batch: int) -> float:
    """Decode tokens/s no implementation can beat at `batch` rows on this machine."""
    step_bytes = costs["weight_bytes"] + batch * costs["kv_bytes_per_row"]
    step_flops = batch * (2 * costs["weights"] + costs["attention_flops_per_row"])
    step_s = max(step_bytes / (machine["bandwidth_gbs"] * 1e9),
                 step_flops / (machine["gflops"] * 1e9))
    return batch / step_s
