"""A byte-level tokenizer and chat template for the built-in demo models.

Knows how to write `tokenizer.json` and `tokenizer_config.json` into a model folder so that
`transformers`/`mlx_lm.load` read them offline. Every byte is one token (no merges), so short
texts already span several 256-token blocks. Knows nothing about models or weights.
"""

from __future__ import annotations

import json
from pathlib import Path

# Special tokens follow the Qwen chat format; ids come right after the 256 byte tokens.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<image>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen3-style: reasoning is rendered only for assistant turns after the last user turn, so
# earlier turns render differently once a new user turn follows (reuse is decided on tokens).
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['role'] == 'assistant' and loop.index0 > ns.last_user"
    " and m.get('reasoning_content') -%}"
    "{{- '<think>\\n' + m['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- else -%}{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- else -%}{{- '<image>' -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(folder: Path) -> int:
    """Write the tokenizer files into `folder`; return the number of tokens it knows."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "bos_token": None,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return 256 + len(SPECIAL_TOKENS)


def special_token_id(name: str) -> int:
    return 256 + SPECIAL_TOKENS.index(name)
