"""How a model family writes tool calls: the tags around a call, splitting generated text into
content and call texts, and the grammar that forces a call (tool_choice required or named).

Formats are named after mlx-lm's tool parsers (`mlx_lm.tool_parsers.<name>`), which parse the
call texts; `detect_format` reads the chat template the way mlx-lm does for the families here:
Qwen's `<tool_call>` JSON (`json_tools`), FunctionGemma's `call:name{k:<escape>v<escape>}`
(`function_gemma`) and Gemma 4's `<|tool_call>call:name{k:<|"|>v<|"|>}<tool_call|>`
(`gemma4`). Grammars are Lark in llguidance's dialect; JSON parts embed the tool's schema with
`%json`, written compactly as chat templates write JSON (`tojson`), so a forced call re-renders
to the tokens that were generated. Pure text work: no tokenizer, no model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import GraphError
from .tools import Constraint, ToolSpec

__all__ = ["FORMATS", "ToolFormat", "call_grammar", "detect_format", "forced_call"]

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """A family's call syntax: `start`/`end` tags around each call; `quote` delimits strings in
    the Gemma key:value syntax (None for JSON calls); `nested` says whether the parser takes
    objects and lists inside arguments."""

    name: str
    start: str
    end: str
    quote: str | None = None
    nested: bool = True
    separator: str = ""  # between consecutive calls

    def split(self, text: str) -> tuple[str, list[str]]:
        """Generated text as (content before the first call, the text inside each call). A call
        cut off by max_tokens is kept as it stands (its parse will fail and say so)."""
        first = text.find(self.start)
        if first < 0:
            return text, []
        content = text[:first]
        if self.separator and content.endswith(self.separator):
            content = content[: -len(self.separator)]
        calls, pos = [], first
        while pos >= 0:
            body_start = pos + len(self.start)
            end = text.find(self.end, body_start)
            calls.append(text[body_start: end if end >= 0 else len(text)])
            pos = text.find(self.start, end + len(self.end)) if end >= 0 else -1
        return content, calls


FORMATS: dict[str, ToolFormat] = {
    "json_tools": ToolFormat("json_tools", "<tool_call>", "</tool_call>", separator="\n"),
    "function_gemma": ToolFormat("function_gemma", "<start_function_call>",
                                 "<end_function_call>", quote="<escape>", nested=False),
    "gemma4": ToolFormat("gemma4", "<|tool_call>", "<tool_call|>", quote='<|"|>'),
}


def detect_format(chat_template: Any) -> ToolFormat | None:
    """The call format a chat template writes (mlx-lm's inference for these families)."""
    if not isinstance(chat_template, str):
        return None
    if "<|tool_call>" in chat_template and "<tool_call|>" in chat_template:
        return FORMATS["gemma4"]
    if "<start_function_call>" in chat_template:
        return FORMATS["function_gemma"]
    if "<tool_call>" in chat_template and "tool_call.name" in chat_template:
        return FORMATS["json_tools"]
    return None


def call_grammar(fmt: ToolFormat, tools: Sequence[ToolSpec], choice: str = "required",
                 parallel: bool = True) -> str:
    """A Lark grammar whose matches are calls in `fmt` and nothing else: to any of `tools`
    (`choice="required"`) or to the tool named `choice`; one call, or several if `parallel`."""
    if choice != "required":
        tools = [t for t in tools if t.name == choice]
        if not tools:
            raise GraphError(f"tool_choice names {choice!r}, which is not a declared tool; "
                             "declare it or choose 'auto' or 'required'.")
    if not tools:
        raise GraphError("tool_choice 'required' needs at least one declared tool; declare "
                         "tools (tools=[...]) or use tool_choice 'auto'.")
    rules: list[str] = []
    calls = [_call_rule(fmt, t, rules) for t in tools]
    rules.insert(0, "call: " + " | ".join(calls))
    sep = _lit(fmt.separator) + " " if fmt.separator else ""
    head = f"start: call ({sep}call)*" if parallel else "start: call"
    return "\n".join([head, *rules]) + "\n"


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: the same escapes as JSON


def _closed(schema: Any) -> Any:
    """`schema` with objects that do not say otherwise closed to undeclared properties: a
    forced call names only the arguments its tool declares."""
    if not isinstance(schema, dict):
        return schema
    out = {k: ({p: _closed(v) for p, v in v.items()} if k == "properties"
               and isinstance(v, dict) else _closed(v) if k == "items" else v)
           for k, v in schema.items()}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _call_rule(fmt: ToolFormat, tool: ToolSpec, rules: list[str]) -> str:
    params = _closed(tool.parameters or {"type": "object", "properties": {}})
    if fmt.quote is None:
        name = f"args_{len(rules)}"
        rules.append(f"{name}: %json " + json.dumps({**params, "x-guidance": _JSON_STYLE}))
        return (_lit(f'{fmt.start}\n{{"name": "{tool.name}", "arguments": ') + f" {name} "
                + _lit(f"}}\n{fmt.end}"))
    body = _gemma_value(fmt, tool, params, rules, top=True)
    return _lit(f"{fmt.start}call:{tool.name}") + f" {body} " + _lit(fmt.end)


def _gemma_value(fmt: ToolFormat, tool: ToolSpec, schema: dict, rules: list[str],
                 top: bool = False) -> str:
    """A Lark expression for one value of `schema` in the Gemma key:value syntax."""
    q = fmt.quote or ""

    def render(v: Any) -> str:
        return _lit(q + v + q) if isinstance(v, str) else _lit(json.dumps(v))

    if "const" in schema:
        return render(schema["const"])
    if "enum" in schema:
        return "(" + " | ".join(render(v) for v in schema["enum"]) + ")"
    kind = schema.get("type")
    if kind == "string":
        n = schema.get("maxLength")
        # strings may not hold '<': every tag and the quote itself start with it
        body = f"/[^<]{{{schema.get('minLength', 0)},{n}}}/" if n is not None else "/[^<]*/"
        return f"{_lit(q)} {body} {_lit(q)}"
    if kind in ("integer", "number", "boolean", "null"):
        name = f"v_{len(rules)}"
        rules.append(f"{name}: %json " + json.dumps({**schema, "x-guidance": _JSON_STYLE}))
        return name
    if kind == "object" and (top or fmt.nested):
        props = schema.get("properties") or {}
        parts = [_lit(f"{k}:") + " " + _gemma_value(fmt, tool, v, rules)
                 for k, v in props.items()]  # every property, in declared order
        inner = f" {_lit(',')} ".join(parts)
        return f'"{{" {inner} "}}"' if parts else '"{}"'
    if kind == "array" and fmt.nested:
        item = _gemma_value(fmt, tool, schema.get("items") or {"type": "string"}, rules)
        return f'"[" ({item} ("," {item})*)? "]"'
    raise GraphError(f"tool {tool.name!r} has an argument schema ({json.dumps(schema)[:60]}) "
                     f"that the {fmt.name} call format cannot force; simplify the schema or "
                     "use tool_choice 'auto'.")


def forced_call(tools: Sequence[ToolSpec], tool_choice: str, parallel: bool,
                chat_template: Any) -> Constraint:
    """The constraint that makes a node call a tool (`tool_choice` required or a name), in the
    call format of `chat_template`."""
    fmt = detect_format(chat_template)
    if fmt is None:
        raise GraphError(f"tool_choice {tool_choice!r} forces a call, but this model's chat "
                         "template writes no tool-call format forkv knows (Qwen <tool_call> "
                         "JSON, FunctionGemma, Gemma 4); use tool_choice 'auto'.")
    return Constraint.grammar(call_grammar(fmt, tools, tool_choice, parallel))
