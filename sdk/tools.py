"""Tool calls and structured output for agent code: parse a generated node's calls, run them,
and append the results.

`attach_tool_calls` reads a final node's text with mlx-lm's tool parser for the model's family
(`mlx_lm.tool_parsers`, chosen from the chat template as mlx-lm does), checks each call against
the tools visible at the node, and stores them in `node.tool_calls` (problems go to
`node.meta["tool_call_error"]`). `run_tools` runs the calls of a node with the tools' Python
functions and adds `tool` result nodes under it. `run` is `session.run` plus
`attach_tool_calls` on what it computed. The agent loop lives in `forkv.agent`. Knows the
Session only through its public surface (`run`, `tree`, `engine.lm.tokenizer`).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from functools import partial
from typing import Any

from forkv.graph import GraphError, Node, Tree
from forkv.graph.toolformat import ToolFormat, detect_format
from forkv.graph.tools import (
    Constraint,
    ToolCall,
    ToolSpec,
    check_arguments,
    make_tool,
    visible_tools,
)

__all__ = ["Constraint", "ToolCall", "ToolSpec", "attach_tool_calls", "call_content", "make_tool",
           "parse_tool_calls", "run", "run_tools", "tool_format"]


def tool_format(tokenizer: Any) -> ToolFormat | None:
    """The model's call format, from its chat template (None: it has none forkv knows)."""
    return detect_format(getattr(tokenizer, "chat_template", None))


def _parser(fmt: ToolFormat) -> Callable[[str, Any], Any]:
    module = importlib.import_module(f"mlx_lm.tool_parsers.{fmt.name}")
    # the tags forkv splits on must be the ones mlx-lm's parser was written for
    assert (module.tool_call_start, module.tool_call_end) == (fmt.start, fmt.end), fmt.name
    if fmt.name == "function_gemma":
        return partial(_braces_in_strings, module.parse_tool_call, fmt.quote)
    return module.parse_tool_call


_BRACE = "\ue000"  # a private-use character: stands in for "}" while mlx-lm parses


def _braces_in_strings(parse: Callable, quote: str, body: str, tools: Any = None):
    """mlx-lm's function_gemma parser ends a call's arguments at the first "}", even one inside
    a quoted string (`topic:<escape>a}b<escape>`): hide those from it, then put them back."""
    parts = body.split(quote)
    if _BRACE in body or len(parts) < 3:
        return parse(body, tools)
    # odd parts lie between a pair of quotes
    masked = quote.join(p.replace("}", _BRACE) if i % 2 else p for i, p in enumerate(parts))
    parsed = parse(masked, tools)
    for item in parsed if isinstance(parsed, list) else [parsed]:
        args = item.get("arguments")
        if isinstance(args, dict):
            item["arguments"] = {k: v.replace(_BRACE, "}") if isinstance(v, str) else v
                                 for k, v in args.items()}
    return parsed


def parse_tool_calls(text: str, fmt: ToolFormat, tools: list[ToolSpec],
                     id_prefix: str = "call") -> tuple[str, list[ToolCall], list[str]]:
    """(content, calls, problems) of generated `text`: each call parsed by mlx-lm's parser and
    checked against `tools`; a call that does not parse or fit its schema is left out and
    described in `problems`."""
    content, bodies = fmt.split(text)
    by_name = {t.name: t for t in tools}
    parse = _parser(fmt) if bodies else None
    calls: list[ToolCall] = []
    problems: list[str] = []
    for body in bodies:
        try:
            parsed = parse(body, [t.to_openai() for t in tools])
        except Exception as e:  # noqa: BLE001 - a parser's error is a problem of this call
            problems.append(f"a call did not parse ({type(e).__name__}: {e}): {body[:80]!r}")
            continue
        for item in parsed if isinstance(parsed, list) else [parsed]:
            name, args = item.get("name"), item.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            spec = by_name.get(name)
            why = (f"{name!r} is not a declared tool" if spec is None
                   else check_arguments(spec, args))
            if why:
                problems.append(why)
                continue
            calls.append(ToolCall(id=f"{id_prefix}_{len(calls)}", name=name, arguments=args))
    return content, calls, problems


def attach_tool_calls(tokenizer: Any, tree: Tree, node: Node | str,
                      id_prefix: str | None = None) -> list[ToolCall]:
    """Parse the calls in a done final node's text into `node.tool_calls` (idempotent): the
    tools visible at the node, its `tool_choice` ("none": no calls) and `parallel_tool_calls`
    (False: the first call only). Call ids are `id_prefix` (default `call_<node id>`) + index.
    The one parser of generated calls: the node runner calls it for Session and the server."""
    node = tree[node] if isinstance(node, str) else node
    if node.kind != "final" or node.is_pending or node.tool_calls or not node.is_generated:
        return list(node.tool_calls)
    if node.gen.tool_choice == "none":
        return []
    fmt = tool_format(tokenizer)
    if fmt is None or fmt.start not in (node.text or ""):  # no call: the path is not walked
        return []
    tools = visible_tools(tree.path(node))
    if not tools:
        return []
    _, calls, problems = parse_tool_calls(node.text or "", fmt, tools,
                                          id_prefix or f"call_{node.id}")
    node.tool_calls = calls if node.gen.parallel_tool_calls else calls[:1]
    if problems:
        node.meta["tool_call_error"] = "; ".join(problems)
    return list(node.tool_calls)


def call_content(tokenizer: Any, node: Node) -> str:
    """A final node's text without the calls it made (as its rendered message's content)."""
    fmt = tool_format(tokenizer)
    text = node.text or ""
    return fmt.split(text)[0] if node.tool_calls and fmt is not None else text


def run(session: Any, targets: Any = None) -> list[Node]:
    """`session.run(targets)`, then the tool calls of every final node it computed parsed."""
    done = session.run(targets)
    for node in done:
        attach_tool_calls(session.engine.lm.tokenizer, session.tree, node)
    return done


def run_tools(node: Node, handlers: dict[str, Callable[..., Any]] | None = None) -> list[Node]:
    """Run each call of final `node` and add its result as a `tool` node (a chain, in call
    order); return the tool nodes. A tool runs through `handlers[name]` if given, else the
    Python function it was declared from; an exception becomes the result text, so the model
    sees what went wrong."""
    by_name = {t.name: t for t in visible_tools(node.path())}
    parent, out = node, []
    for call in node.tool_calls:
        spec = by_name.get(call.name)
        try:
            if handlers and call.name in handlers:
                value = handlers[call.name](**call.arguments)
            elif spec is not None:
                value = spec.invoke(call.arguments)
            else:
                raise GraphError(f"no handler for tool {call.name!r}")
            text = value if isinstance(value, str) else json.dumps(value, default=str)
        except Exception as e:  # noqa: BLE001 - reported to the model as the tool's result
            text = f"error: {type(e).__name__}: {e}"
        parent = parent.tool(text, call=call)
        out.append(parent)
    return out
