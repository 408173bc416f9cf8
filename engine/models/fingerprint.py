"""Model fingerprints: what block keys are seeded with, so two models never share a key.

Knows: how to hash a model folder's config, dtype, quantization choice (kept or dequantized)
and the whole content of every ``*.safetensors`` file (BLAKE3 on every core: ~1 GB/s on one
loaded core of the 2-core CI box, 5x hashlib's BLAKE2b there, and memory speed on a multi-core
machine), and a private cache of the per-file digests keyed by (device, inode, size, mtime_ns),
so a second load reads no weight byte.
Does not know: mlx, or what a block key is (``blocks.BlockKeyer`` seeds itself with this).

The cache lives in ``<forkv cache>/fingerprints`` (mode 0700, one 0600 file per weight
file); an entry that is not ours, is open to other users or does not parse is ignored and
the file is hashed again, so a planted entry can cost time but never a wrong fingerprint
for a file it does not describe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import stat
import tempfile
import threading
from pathlib import Path

__all__ = ["file_digest", "fingerprint"]

_VERSION = "forkv-model-v2"  # v1 hashed only headers and the first and last MiB
_memo: dict[tuple[int, int, int, int], str] = {}
_memo_lock = threading.Lock()


def fingerprint(path: Path, config: dict, dtype: str, quantization: str = "none",
                kernels: str = "") -> bytes:
    """Identify architecture, every weight byte, the compute dtype, what was done with
    quantized weights (kept or dequantized: they compute differently) and the kernel path
    where it changes results (`kernels`, e.g. the BLAS shim's thread policy) (32 bytes)."""
    h = hashlib.sha256(_VERSION.encode() + b"\0")
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    h.update(dtype.encode())
    if quantization != "none":  # unquantized models keep the fingerprints they always had
        h.update(b"\0quantization:" + quantization.encode())
    if kernels:
        h.update(b"\0kernels:" + kernels.encode())
    for f in sorted(Path(path).glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}:{file_digest(f)}".encode())
    return h.digest()


def file_digest(path: Path) -> str:
    """BLAKE3-256 (hex) of the whole file; cached while (dev, inode, size, mtime_ns) hold."""
    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    with _memo_lock:
        found = _memo.get(key)
    if found is None:
        found = _read_entry(key)
    if found is None:
        found = _hash_file(path, key)
        _write_entry(key, found)
    with _memo_lock:
        _memo[key] = found
    return found


def _hash_file(path: Path, key: tuple) -> str:
    from blake3 import blake3

    h = blake3(max_threads=blake3.AUTO)
    with open(path, "rb", buffering=0) as fh:
        info = os.fstat(fh.fileno())
        if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != key:
            raise OSError(f"{path} changed while forkv was fingerprinting it; load it again.")
        if info.st_size:
            # Mapped, not read: no copy through a buffer; BLAKE3 splits it across cores.
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                h.update(mapped)
    return h.hexdigest()


def _cache_dir() -> Path:
    root = os.environ.get("FORKV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "forkv"
    )
    return Path(root) / "fingerprints"


def _entry_name(key: tuple) -> str:
    return hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:32] + ".json"


def _is_private(info: os.stat_result, is_dir: bool) -> bool:
    kind = stat.S_ISDIR if is_dir else stat.S_ISREG
    return kind(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _private_dir() -> Path | None:
    """The cache folder, made 0700 if missing; None if it is a link, not ours or shared."""
    folder = _cache_dir()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder if _is_private(os.lstat(folder), is_dir=True) else None
    except OSError:
        return None


def _read_entry(key: tuple) -> str | None:
    folder = _private_dir()
    if folder is None:
        return None
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(folder / _entry_name(key), flags)
    except OSError:
        return None
    try:
        if not _is_private(os.fstat(fd), is_dir=False):
            return None
        doc = json.loads(os.read(fd, 4096))
        digest = doc["blake3"]
        if doc["key"] != list(key) or len(bytes.fromhex(digest)) != 32:
            return None
        return digest
    except (ValueError, TypeError, KeyError, OSError):
        return None
    finally:
        os.close(fd)


def _write_entry(key: tuple, digest: str) -> None:
    folder = _private_dir()
    if folder is None:
        return  # no private place: the in-process memo still saves re-reads
    data = json.dumps({"key": list(key), "blake3": digest}).encode()
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")  # 0600, O_EXCL
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        return
    try:
        os.replace(tmp, folder / _entry_name(key))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a read-only or full cache folder only costs a re-hash next time
