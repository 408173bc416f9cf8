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
# Tools render the way each demo's real family writes them (`TOOL_FORMATS`): Qwen's JSON in
# <tool_call> tags with <tool_response> turns, FunctionGemma's call:name{k:<escape>v<escape>}
# and Gemma 4's <|tool_call>call:name{k:<|"|>v<|"|>}<tool_call|>; mlx-lm infers its tool parser
# from these tags. Without tools, every template renders exactly as before tools existed.
_HEAD = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
)
_TURN = (
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['role'] == 'assistant' and loop.index0 > ns.last_user"
    " and m.get('reasoning_content') -%}"
    "{{- '<think>\\n' + m['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- elif m['content'] -%}{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- else -%}{{- '<image>' -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
)
_TAIL = (
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# With tools, the system turn (given or not) carries the declarations; skip the given one.
_SYSTEM_WITH_TOOLS = (
    "{%- if tools -%}{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "@DECLARE@{{- '<|im_end|>\\n' -}}{%- endif -%}"
)
_LOOP = (
    "{%- for m in messages -%}"
    "{%- if tools and loop.first and m['role'] == 'system' -%}"
)

_QWEN = {
    "declare": (
        "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
        "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
        "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
        "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
        "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' -}}"),
    "tool_turn": (
        "{%- elif m['role'] == 'tool' -%}"
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}"
        "{{- '<|im_start|>user' -}}{%- endif -%}"
        "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' -}}"
        "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}"
        "{{- '<|im_end|>\\n' -}}{%- endif -%}"),
    "calls": (
        "{%- for tool_call in m.get('tool_calls') or [] -%}"
        "{%- if tool_call.function -%}{%- set tool_call = tool_call.function -%}{%- endif -%}"
        "{%- if (loop.first and m['content']) or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
        "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' -}}"
        "{%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}"
        "{%- else -%}{{- tool_call.arguments | tojson -}}{%- endif -%}"
        "{{- '}\\n</tool_call>' -}}"
        "{%- endfor -%}"),
}


def _gemma(quote: str, call: tuple[str, str], declare: tuple[str, str],
           response: tuple[str, str]) -> dict:
    """A Gemma-family tool format: key:value objects with `quote`-delimited strings."""
    q = quote.replace("'", "\\'")
    value = (  # a JSON value written the Gemma way: bare keys, strings between quotes
        "{%- macro gv(v) -%}"
        "{%- if v is mapping -%}{{- '{' -}}{%- for k, x in v.items() -%}{{- k + ':' -}}"
        "{{- gv(x) -}}{%- if not loop.last -%}{{- ',' -}}{%- endif -%}{%- endfor -%}{{- '}' -}}"
        f"{{%- elif v is string -%}}{{{{- '{q}' + v + '{q}' -}}}}"
        "{%- elif v is sequence -%}{{- '[' -}}{%- for x in v -%}{{- gv(x) -}}"
        "{%- if not loop.last -%}{{- ',' -}}{%- endif -%}{%- endfor -%}{{- ']' -}}"
        "{%- else -%}{{- v | tojson -}}{%- endif -%}"
        "{%- endmacro -%}")
    return {
        "macro": value,
        "declare": (
            "{%- for tool in tools -%}{%- set f = tool['function'] if tool.get('function') "
            "else tool -%}"
            f"{{{{- '{declare[0]}declaration:' + f['name'] -}}}}"
            "{{- gv({'description': f.get('description') or '', "
            "'parameters': f.get('parameters') or {}}) -}}"
            f"{{{{- '{declare[1]}' -}}}}{{%- endfor -%}}"),
        "tool_turn": (
            "{%- elif m['role'] == 'tool' -%}"
            "{{- '<|im_start|>tool\\n' -}}"
            f"{{{{- '{response[0]}response:' + (m.get('name') or 'tool') -}}}}"
            "{{- gv({'value': m['content']}) -}}"
            f"{{{{- '{response[1]}' -}}}}"
            "{{- '<|im_end|>\\n' -}}"),
        "calls": (
            "{%- for tc in m.get('tool_calls') or [] -%}"
            "{%- set tc = tc['function'] if tc.get('function') else tc -%}"
            f"{{{{- '{call[0]}call:' + tc['name'] -}}}}"
            "{%- if tc['arguments'] is string -%}{{- tc['arguments'] -}}"
            "{%- else -%}{{- gv(tc['arguments']) -}}{%- endif -%}"
            f"{{{{- '{call[1]}' -}}}}"
            "{%- endfor -%}"),
    }


_FORMATS = {
    "json_tools": _QWEN,
    "function_gemma": _gemma("<escape>", ("<start_function_call>", "<end_function_call>"),
                             ("<start_function_declaration>", "<end_function_declaration>"),
                             ("<start_function_response>", "<end_function_response>")),
    "gemma4": _gemma('<|"|>', ("<|tool_call>", "<tool_call|>"), ("<|tool>", "<tool|>"),
                     ("<|tool_response>", "<tool_response|>")),
}
# The tool format of each text demo: its real family's.
TOOL_FORMATS = {"qwen3": "json_tools", "qwen3_5": "json_tools", "gemma3": "function_gemma",
                "gemma4": "gemma4"}


def chat_template(tool_format: str = "json_tools") -> str:
    """The demo chat template that writes tools in `tool_format` (a key of `_FORMATS`)."""
    f = _FORMATS[tool_format]
    return (f.get("macro", "") + _HEAD + _SYSTEM_WITH_TOOLS.replace("@DECLARE@", f["declare"])
            + _LOOP + f["tool_turn"] + "{%- else -%}" + _TURN + f["calls"] + _TAIL)


CHAT_TEMPLATE = chat_template("json_tools")


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


def write_tokenizer(folder: Path, template: str = CHAT_TEMPLATE) -> int:
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
        "chat_template": template,
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
