"""Tools and structured output on the wire: `tools`, `tool_choice`, `parallel_tool_calls`,
`response_format` (chat) and `text.format` (responses), tool turns in the history, and tool
calls in answers, whole or streamed.

`plan_tools(body, tokenizer)` reads a request's fields into a `ToolPlan`: the tool specs, the
choice, and the constraint the engine's sampler enforces (a call grammar in the model's format
for `required` or a named tool, else the response format's JSON schema). The plan renders the
prompt with `tools=` through the chat template, turns generated text into an assistant message
with `tool_calls` (parsed by mlx-lm's parser for the model's family, checked against the
schemas), and `CallStream` holds streamed text back once a call starts, so a stream carries
content deltas and then one `tool_calls` delta per call. Knows no routes or engines.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from forkv.engine import SamplingParams
from forkv.graph import GraphError
from forkv.graph.toolformat import ToolFormat, forced_call
from forkv.graph.tools import Constraint, ToolCall, ToolSpec, make_tools
from forkv.tools import parse_tool_calls, tool_format

from .conversations import Turn
from .errors import APIError

__all__ = ["TOOL_ITEMS", "CallStream", "ToolPlan", "history", "name_tool_results", "plan_tools",
           "response_call_items", "tool_turn"]


@dataclass(slots=True)
class ToolPlan:
    """What a request asks about tools and output shape, resolved for one model."""

    specs: list[ToolSpec] = field(default_factory=list)
    choice: str = "auto"
    parallel: bool = True
    constraint: Constraint | None = None
    fmt: ToolFormat | None = None
    format_info: dict = field(default_factory=lambda: {"type": "text"})

    @property
    def parses_calls(self) -> bool:
        return bool(self.specs) and self.choice != "none" and self.fmt is not None

    def apply(self, params: SamplingParams) -> SamplingParams:
        return replace(params, constraint=self.constraint) if self.constraint else params

    def prompt(self, tokenizer: Any, messages: list[dict], template_kwargs: dict,
               images: list | None = None) -> Any:
        """Token ids of `messages` rendered with the tools; the messages as they are when the
        request has none (the engine renders those)."""
        if not self.specs:
            return messages
        if images:  # the vision renderer places image tokens and knows no tools
            raise _bad("tools with images are not supported yet; send them in separate "
                       "requests.", "tools")
        text = tokenizer.apply_chat_template(
            messages, tools=[t.to_openai() for t in self.specs], tokenize=False,
            add_generation_prompt=True, **template_kwargs)
        return list(tokenizer.encode(text, add_special_tokens=False))

    def split(self, text: str, prefix: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of generated `text`; calls that do not parse or fit are dropped."""
        if not self.parses_calls:
            return text, []
        content, calls, _ = parse_tool_calls(text, self.fmt, self.specs, prefix)
        return content, calls if self.parallel else calls[:1]

    def message(self, text: str) -> tuple[dict, str | None]:
        """The chat `message` for generated `text`, and "tool_calls" if it made calls."""
        content, calls = self.split(text, _call_prefix())
        if not calls:
            return {"role": "assistant", "content": text}, None
        return {"role": "assistant", "content": content or None,
                "tool_calls": [c.to_openai() for c in calls]}, "tool_calls"


def _call_prefix() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, "invalid_value", param)


def _choice(raw: Any, specs: list[ToolSpec]) -> str:
    if raw is None:
        return "auto" if specs else "none"
    if isinstance(raw, str) and raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict):  # {"type": "function", "function": {"name": ...}} or flat
        fn = raw.get("function")
        name = (fn.get("name") if isinstance(fn, dict) else None) or raw.get("name")
        if isinstance(name, str) and any(s.name == name for s in specs):
            return name
        raise _bad(f"tool_choice names {name!r}, which is not in tools; name a declared tool.",
                   "tool_choice")
    raise _bad("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', "
               "'function': {'name': ...}}.", "tool_choice")


def _format(raw: Any, param: str) -> tuple[Constraint | None, dict]:
    """A response format (chat's `response_format` or responses' `text.format`)."""
    if raw is None:
        return None, {"type": "text"}
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None, raw
    if kind == "json_object":
        return Constraint.json_object(), raw
    if kind == "json_schema":
        spec = raw.get("json_schema", raw)  # chat nests it; responses does not
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _bad(f"{param} json_schema needs a schema object.", param)
        # strict or not, the sampler holds the output to the schema: that is what it can do
        return Constraint.json_schema(schema), raw
    raise _bad(f"{param}.type must be text, json_object or json_schema.", param)


def plan_tools(body: dict, tokenizer: Any) -> ToolPlan:
    """The `ToolPlan` of a chat or responses request body (400 on bad fields)."""
    if not isinstance(body.get("tools") or [], list):
        raise _bad("tools must be a list of {'type': 'function', 'function': {...}} objects.",
                   "tools")
    try:
        specs = make_tools(body.get("tools") or [])
    except (GraphError, ValueError) as e:
        raise _bad(f"tools: {e}", "tools") from None
    if "response_format" in body:
        constraint, info = _format(body["response_format"], "response_format")
    else:
        text = body.get("text")
        if text is not None and not isinstance(text, dict):
            raise _bad("text must be an object, such as {'format': {'type': 'json_object'}}.",
                       "text")
        constraint, info = _format((text or {}).get("format"), "text.format")
    choice = _choice(body.get("tool_choice"), specs)
    if choice == "required" and not specs:
        raise _bad("tool_choice 'required' needs tools; send tools or choose 'auto'.",
                   "tool_choice")
    parallel = body.get("parallel_tool_calls")
    plan = ToolPlan(specs, choice, True if parallel is None else bool(parallel), constraint,
                    tool_format(tokenizer), info)
    if choice not in ("auto", "none"):
        try:
            plan.constraint = forced_call(specs, choice, plan.parallel,
                                          getattr(tokenizer, "chat_template", None))
        except GraphError as e:
            raise _bad(str(e), "tool_choice") from None
    return plan


def history(raw: list[dict], messages: list[dict]) -> list[dict]:
    """Carry the tool parts of the request's messages onto the engine's: an assistant turn's
    `tool_calls` (arguments as objects, as templates write them) and a tool turn's
    `tool_call_id` and tool name (found from the call it answers)."""
    names: dict[str, str] = {}
    for i, (m, out) in enumerate(zip(raw, messages)):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls and out["role"] == "assistant":
            out["tool_calls"] = [_history_call(c, f"messages[{i}].tool_calls[{j}]")
                                 for j, c in enumerate(calls)]
            names.update({c["id"]: c["function"]["name"] for c in out["tool_calls"]})
        if out["role"] == "tool":
            call_id, name = m.get("tool_call_id"), m.get("name")
            for field, value in (("tool_call_id", call_id), ("name", name)):
                if value is not None and not isinstance(value, str):
                    raise _bad(f"messages[{i}].{field} must be a string.", f"messages[{i}].{field}")
            out["tool_call_id"] = call_id
            out["name"] = name or names.get(call_id) or "tool"
    return messages


def _history_call(call: Any, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad(f"{where} needs function.name.", where)
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise _bad(f"{where}.function.arguments is not JSON.", where) from None
    if not isinstance(call.get("id"), (str, type(None))):
        raise _bad(f"{where}.id must be a string.", f"{where}.id")
    return {"id": call.get("id") or _call_prefix(), "type": "function",
            "function": {"name": fn["name"], "arguments": args}}


class CallStream:
    """Splits streamed text: content passes through until a call starts; the rest is held
    and parsed at the end. Text that might be the start of a call tag is held back."""

    def __init__(self, plan: ToolPlan):
        self.plan, self.held, self.in_call = plan, "", False

    def feed(self, text: str) -> str:
        if not self.plan.parses_calls:
            return text
        self.held += text
        if self.in_call:
            return ""
        start = self.plan.fmt.start
        i = self.held.find(start)
        if i >= 0:
            self.in_call = True
            out, self.held = self.held[:i], self.held[i:]
            return out
        keep = next((k for k in range(min(len(start) - 1, len(self.held)), 0, -1)
                     if self.held.endswith(start[:k])), 0)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content still held, OpenAI tool-call deltas with their index)."""
        held, self.held = self.held, ""
        if not self.in_call:
            return held, []
        _, calls = self.plan.split(held, _call_prefix())
        if not calls:
            return held, []
        return "", [{"index": k, **c.to_openai()} for k, c in enumerate(calls)]


def response_call_items(calls: list[ToolCall]) -> list[dict]:
    """Responses API `function_call` output items."""
    return [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": c.id,
             "name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False),
             "status": "completed"} for c in calls]


TOOL_ITEMS = ("function_call", "function_call_output")


def tool_turn(item: dict, where: str) -> Turn:
    """The turn of a Responses API `function_call` or `function_call_output` input item."""
    if item["type"] == "function_call":
        call = _history_call({"id": item.get("call_id"), "function": item}, where)
        return Turn("final", "", tool_calls=[ToolCall(id=call["id"], name=call["function"]["name"],
                                                      arguments=call["function"]["arguments"])])
    output = item.get("output")
    if not isinstance(output, str):
        output = json.dumps(output)
    return Turn("tool", output, tool_call_id=item.get("call_id"))


def name_tool_results(tree: Any, node_ids: list[str]) -> None:
    """Give tool nodes the name of the call they answer (templates like Gemma's write it)."""
    for node_id in node_ids:
        node = tree[node_id]
        if node.kind != "tool" or node.name or not node.tool_call_id:
            continue
        for above in reversed(tree.path(node)):
            match = [c.name for c in above.tool_calls if c.id == node.tool_call_id]
            if match:
                node.name = match[0]
                break
