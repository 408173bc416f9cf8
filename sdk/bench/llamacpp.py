"""llama.cpp's `llama-server` as a peer for `forkv bench serve`: where it is, how it is built,
how it is started, and what its responses say about prompt reuse.

`llama_server_path` finds the binary: `FORKV_LLAMA_SERVER`, else `llama-server` on PATH, else
the build cached at `<forkv cache>/llamacpp/<version>/bin/llama-server`; with `build=True` it
builds that one from the `llama-cpp-python` sdist (which vendors llama.cpp at a fixed commit):
pip downloads it, cmake builds only the server target (and llama-quantize, below), in a
temporary folder beside the cache that is renamed into place at the end, so a killed build never
leaves half a binary. The build's log stays in the cache folder; a failure raises with its tail.
`python -m forkv.bench.llamacpp --build` does that once (`.ci/run` calls it). The same build
also makes `llama-quantize` (one more small target over the same libraries), and
`llama_quantize_path` finds or builds it alone into the same version folder, so GGUFs made for
the benches are quantized by the very llama.cpp that serves them (`forkv.bench.big_gguf`).

`start_llama_server` runs it on a GGUF file with threads = cores, at its defaults or `tuned`
for reuse (one slot per client, dense context checkpoints, full-size sliding-window caches, a
larger host-RAM prompt cache). On some CPUs (seen on AVX-512/AMX machines) the vendored
llama.cpp segfaults at start while repacking weights for its CPU kernels: `repack_crashes`
starts it once per binary and file to find out, and then every start passes `--no-repack` (the
bench says so in its notes). `llama_counts` reads `timings.prompt_n` (tokens computed) and
`timings.cache_n` (tokens reused) from a response: non-streaming ones carry `timings` at the
top level, streamed ones on their last chunk. Knows nothing about the cases.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .serve_procs import ServerProcess, _free_port

__all__ = ["LLAMA_CPP_PYTHON", "LlamaServerMissing", "build_llama_quantize",
           "build_llama_server", "gguf_of", "llama_counts", "llama_quantize_path",
           "llama_server_path", "repack_crashes", "start_llama_server"]

LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp we build
_BUILD_TIMEOUT_S = 1800
_repack_crashes: dict[tuple[str, str], bool] = {}


class LlamaServerMissing(RuntimeError):
    """No llama-server binary, or its build failed (the message says which and what to do)."""


def _cached_binary(name: str = "llama-server") -> Path:
    from forkv.engine.paths import cache_root

    return cache_root() / "llamacpp" / LLAMA_CPP_PYTHON / "bin" / name


def _from_env(var: str, binary: str) -> Path | None:
    """The executable `var` names (None when unset); LlamaServerMissing when it is not one."""
    env = os.environ.get(var)
    if not env:
        return None
    if not os.access(env, os.X_OK):
        raise LlamaServerMissing(f"{var}={env!r} is not an executable file; point it at a "
                                 f"{binary} binary or unset it.")
    return Path(env)


def llama_server_path(build: bool = False) -> Path:
    """The llama-server to run: FORKV_LLAMA_SERVER, PATH, the cached build, or (build=True)
    a fresh build into the cache. Raises LlamaServerMissing when there is none."""
    env = _from_env("FORKV_LLAMA_SERVER", "llama-server")
    if env:
        return env
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    cached = _cached_binary()
    if os.access(cached, os.X_OK):
        return cached
    if not build:
        raise LlamaServerMissing(
            "no llama-server (FORKV_LLAMA_SERVER, PATH or the cached build at "
            f"{cached}); build it once with `python -m forkv.bench.llamacpp --build`.")
    return build_llama_server(timeout_s=_BUILD_TIMEOUT_S)


def _run_logged(cmd: list[str], log, cwd: Path, deadline: float) -> None:
    log.write(f"$ {' '.join(cmd)}\n".encode())
    log.flush()
    left = deadline - time.monotonic()
    if left <= 0:
        raise subprocess.TimeoutExpired(cmd, 0)
    subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=True,
                   timeout=left)


def build_llama_server(timeout_s: float = _BUILD_TIMEOUT_S, jobs: int | None = None) -> Path:
    """Build llama-server (and llama-quantize beside it) from the llama-cpp-python sdist into
    the cache (minutes: about 8 on 2 cores); returns the server binary. Raises
    LlamaServerMissing with the log's tail."""
    target = _cached_binary()
    version_dir = target.parent.parent
    log_path = version_dir.parent / f"build-{LLAMA_CPP_PYTHON}.log"

    def place(built: Path, tmp: Path) -> None:
        staged = tmp / "out" / "bin"
        staged.mkdir(parents=True)
        shutil.copy2(built / "llama-server", staged / "llama-server")
        if (built / "llama-quantize").is_file():  # an extra: the server is what must be there
            shutil.copy2(built / "llama-quantize", staged / "llama-quantize")
        # One rename: a concurrent reader sees no version folder or a whole one.
        if version_dir.exists():
            shutil.rmtree(version_dir)
        os.replace(tmp / "out", version_dir)

    _build(("llama-server", "llama-quantize"), log_path, place, timeout_s, jobs)
    return target


def llama_quantize_path(build: bool = False) -> Path:
    """The llama-quantize to run: FORKV_LLAMA_QUANTIZE, the one beside the llama-server that
    `llama_server_path` finds, `llama-quantize` on PATH, the cached build, or (build=True) a
    fresh build into the cache. Raises LlamaServerMissing when there is none."""
    env = _from_env("FORKV_LLAMA_QUANTIZE", "llama-quantize")
    if env:
        return env
    try:
        beside = llama_server_path(build=False).with_name("llama-quantize")
        if os.access(beside, os.X_OK):
            return beside
    except LlamaServerMissing:
        pass
    found = shutil.which("llama-quantize")
    if found:
        return Path(found)
    cached = _cached_binary("llama-quantize")
    if os.access(cached, os.X_OK):
        return cached
    if not build:
        raise LlamaServerMissing(
            f"no llama-quantize (FORKV_LLAMA_QUANTIZE, beside llama-server, PATH or {cached}); "
            "build it once with `python -m forkv.bench.llamacpp --build-quantize`.")
    return build_llama_quantize(timeout_s=_BUILD_TIMEOUT_S)


def build_llama_quantize(timeout_s: float = _BUILD_TIMEOUT_S, jobs: int | None = None) -> Path:
    """Build only llama-quantize from the same sdist into the cached version folder, beside a
    llama-server already there (minutes); returns the binary. Raises LlamaServerMissing."""
    target = _cached_binary("llama-quantize")
    version_dir = target.parent.parent
    log_path = version_dir.parent / f"build-quantize-{LLAMA_CPP_PYTHON}.log"

    def place(built: Path, tmp: Path) -> None:
        if not version_dir.exists():  # no server yet: a whole folder, renamed into place
            (tmp / "out" / "bin").mkdir(parents=True)
            shutil.copy2(built / "llama-quantize", tmp / "out" / "bin" / "llama-quantize")
            try:
                os.rename(tmp / "out", version_dir)
                return
            except OSError:
                pass  # a server build renamed its folder first: add ours to it
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        staged = target.with_name(f".llama-quantize-{os.getpid()}")
        shutil.copy2(built / "llama-quantize", staged)
        os.replace(staged, target)  # one rename: never half a binary

    _build(("llama-quantize",), log_path, place, timeout_s, jobs)
    return target


def _build(targets: tuple[str, ...], log_path: Path, place, timeout_s: float,
           jobs: int | None) -> None:
    """Download the sdist, configure llama.cpp and build `targets` in a temporary folder beside
    the cache, then `place(build/bin, tmp)`; the folder is removed however it ends."""
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 2
    deadline = time.monotonic() + timeout_s
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{LLAMA_CPP_PYTHON}-", dir=log_path.parent))
    try:
        with open(log_path, "wb") as log:
            try:
                # The sdist only: ":all:" would also build pip's build requirements
                # (cmake itself) from source, which takes longer than llama-server.
                _run_logged([sys.executable, "-m", "pip", "download", "--no-binary",
                             "llama-cpp-python", "--no-deps", "-d", str(tmp),
                             f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], log, tmp, deadline)
                sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
                with tarfile.open(sdist) as tar:
                    tar.extractall(tmp, filter="data")
                src = tmp / sdist.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
                _run_logged(["cmake", "-S", str(src), "-B", "build", "-DLLAMA_CURL=OFF",
                             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=ON",
                             "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF"],
                            log, tmp, deadline)
                _run_logged(["cmake", "--build", "build", "--target", *targets,
                             f"-j{jobs}"], log, tmp, deadline)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError,
                    StopIteration, tarfile.TarError) as e:
                log.write(f"\nfailed: {e!r}\n".encode())
                log.flush()
                raise LlamaServerMissing(_failure(e, log_path, targets[0])) from None
        place(tmp / "build" / "bin", tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _failure(e: Exception, log_path: Path, what_built: str = "llama-server") -> str:
    try:
        tail = log_path.read_text(errors="replace")[-2500:]
    except OSError:
        tail = ""
    what = "timed out" if isinstance(e, subprocess.TimeoutExpired) else "failed"
    return (f"building {what_built} {what} (log: {log_path}); it needs cmake, a C++ compiler "
            f"and pip access to the llama-cpp-python=={LLAMA_CPP_PYTHON} sdist:\n{tail}")


def start_llama_server(binary: Path, gguf: str, *, chat_template: str | None = None,
                       threads: int | None = None, tuned: bool = False, slots: int = 1,
                       context: int | None = None, kv_type: str | None = None,
                       ) -> ServerProcess:
    """llama-server on `gguf` on a free loopback port, serving it as "gguf": its defaults
    (4 slots sharing the model's context, checkpoints every 8192 tokens, an 8 GiB prompt
    cache) with threads = cores and `chat_template` (Jinja; default the GGUF's). `context`:
    `slots` slots over a context of that many tokens (`-np`, `-c`) instead; `kv_type`: K and V
    cached in that type (`-ctk`, `-ctv`: q8_0; its default is f16). `tuned`: `slots` slots
    over one 64K-token KV pool, 64 context checkpoints 256 tokens apart, full-size
    sliding-window caches (any prefix can be kept), a 16 GiB prompt cache."""
    port = _free_port()
    threads = threads or os.cpu_count() or 1
    cmd = [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "--alias", "gguf", "--no-webui"]
    files = []
    if chat_template is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as tmp:
            tmp.write(chat_template)
        files.append(tmp.name)
        cmd += ["--jinja", "--chat-template-file", tmp.name]
    if repack_crashes(binary, gguf):
        cmd.append("--no-repack")
    if kv_type is not None:
        cmd += ["-ctk", kv_type, "-ctv", kv_type]
    if tuned:
        cmd += ["-np", str(slots), "--kv-unified", "-c", "65536", "--ctx-checkpoints", "64",
                "--checkpoint-min-step", "256", "--swa-full", "--cache-ram", "16384"]
    elif context is not None:
        cmd += ["-np", str(slots), "-c", str(context)]
    name = "llama-server" + (" tuned" if tuned else "") + (f" {kv_type}" if kv_type else "")
    server = ServerProcess(name, cmd, port, "gguf")
    server.cleanup = files  # removed when the server stops
    return server


def repack_crashes(binary: Path, gguf: str, timeout: float = 300.0) -> bool:
    """Whether llama-server dies by a signal at start with weight repacking on (its default):
    one probe per binary and file per process."""
    key = (str(binary), gguf)
    if key not in _repack_crashes:
        port = _free_port()
        cmd = [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "512",
               "--no-webui"]
        probe = ServerProcess("llama-server (repack probe)", cmd, port, "gguf")
        try:
            probe.wait_ready(timeout=timeout)
            _repack_crashes[key] = False
        except RuntimeError:
            _repack_crashes[key] = (probe.proc.returncode or 0) < 0  # killed by a signal
            if not _repack_crashes[key]:
                raise  # it failed for another reason: the message has its log
        finally:
            probe.stop()
    return _repack_crashes[key]


def gguf_of(model: str) -> tuple[str, str | None] | None:
    """The GGUF llama-server runs for forkv's model name `model` and the chat template forkv
    uses with it (None: the GGUF's own); None where the model is no GGUF (demo models,
    folders)."""
    from forkv.engine.models.named import NAMED_MODELS

    if model in NAMED_MODELS:
        named = NAMED_MODELS[model]
        return str(named.gguf_path()), named.chat_template
    if model.endswith(".gguf") and Path(model).is_file():
        return model, None
    return None


def llama_counts(response: dict) -> tuple[int | None, int | None]:
    """(prompt tokens computed, prompt tokens reused) from a llama-server response or final
    stream chunk: its `timings` object's prompt_n and cache_n; (None, None) without one."""
    timings = response.get("timings") or {}
    return timings.get("prompt_n"), timings.get("cache_n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m forkv.bench.llamacpp",
                                description="Find or build llama-server for forkv bench serve.")
    p.add_argument("--build", action="store_true", help="build it into forkv's cache if absent")
    p.add_argument("--build-quantize", action="store_true",
                   help="build llama-quantize alone into forkv's cache if absent")
    p.add_argument("--timeout", type=float, default=_BUILD_TIMEOUT_S, help="build limit, s")
    args = p.parse_args(argv)
    try:
        if args.build_quantize:
            try:
                quantize = llama_quantize_path(build=False)
            except LlamaServerMissing:
                quantize = build_llama_quantize(timeout_s=args.timeout)
            print(quantize)
            if not args.build:
                return 0
        if args.build:
            try:
                path = llama_server_path(build=False)
            except LlamaServerMissing:
                path = build_llama_server(timeout_s=args.timeout)
        else:
            path = llama_server_path(build=False)
    except LlamaServerMissing as e:
        print(e, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
