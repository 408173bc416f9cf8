"""The Hugging Face tokenizer a GGUF file's metadata describes, saved as tokenizer files.

Builds the `tokenizers` backend with transformers' torch-free GGUF converter (SentencePiece-style
`llama` vocabularies, Gemma's respelling and merge order, byte-level `gpt2` ones with the split
regex of `tokenizer.ggml.pre`), adds BOS the way llama.cpp does, and writes `tokenizer.json`,
`tokenizer_config.json` (with the file's chat template, if any) and the special tokens map.
The chat template stays data: transformers renders it in its sandboxed Jinja environment.
Knows nothing about weights or model configs.
"""

from __future__ import annotations

import json
from pathlib import Path

from .header import GGUFError, GGUFHeader

__all__ = ["save_tokenizer"]

_SPECIAL = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
            "unk_token": "tokenizer.ggml.unknown_token_id",
            "pad_token": "tokenizer.ggml.padding_token_id"}


def _tokenizer_dict(md: dict) -> dict:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    return {name: md[f"tokenizer.{key}"] for key, name in renames.items()
            if f"tokenizer.{key}" in md}


def save_tokenizer(header: GGUFHeader, out: Path) -> None:
    """Write the tokenizer files of `header`'s vocabulary into `out`."""
    md, path = header.metadata, header.path
    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise GGUFError(f"GGUF file {path}: no tokenizer.ggml.tokens vocabulary in its metadata; "
                        f"forkv needs the tokenizer in the file.")
    kind = md.get("tokenizer.ggml.model")
    if kind not in ("llama", "gpt2"):
        raise GGUFError(f"GGUF file {path}: tokenizer type {kind!r} cannot be converted; forkv "
                        f"converts 'llama' (SentencePiece) and 'gpt2' (byte-level BPE).")
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    names = {}
    for name, key in _SPECIAL.items():
        index = md.get(key)
        if type(index) is int and 0 <= index < len(tokens):
            names[name] = tokens[index]
    try:
        backend, _ = convert_gguf_tokenizer(md["general.architecture"], _tokenizer_dict(md))
    except (ValueError, KeyError, TypeError) as e:
        raise GGUFError(f"GGUF file {path}: its tokenizer metadata cannot be converted "
                        f"({str(e).splitlines()[0] if str(e) else type(e).__name__}).") from None
    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
    add_bos = md.get("tokenizer.ggml.add_bos_token", kind == "llama") is True
    add_eos = md.get("tokenizer.ggml.add_eos_token", False) is True
    single, pair, special = "$A", "$A $B", []
    if add_bos and "bos_token" in names:
        bos = names["bos_token"]
        single, pair = f"{bos} {single}", f"{bos} $A {bos} $B" if kind == "gpt2" else f"{bos} $A $B"
        special.append((bos, md["tokenizer.ggml.bos_token_id"]))
    if add_eos and "eos_token" in names:
        eos = names["eos_token"]
        single, pair = f"{single} {eos}", f"{pair} {eos}"
        if eos not in dict(special):
            special.append((eos, md["tokenizer.ggml.eos_token_id"]))
    if special:
        backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special)
    PreTrainedTokenizerFast(tokenizer_object=backend, **names).save_pretrained(str(out))
    template = md.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        # In tokenizer_config.json, where forkv's demo folders and older readers keep it.
        config_path = out / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = template
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
