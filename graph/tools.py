"""Tools and structured output as data: what a tool is (name, description, JSON schema of its
arguments), a call of one, checking a call's arguments against the schema, and a `Constraint`
on a generated node's text.

`make_tool` turns a Python function (its signature and docstring), a pydantic model, an
OpenAI-style `{"type": "function", "function": {...}}` dict or a `ToolSpec` into a `ToolSpec`;
a spec made from a function keeps the function, so `ToolSpec.invoke` can run a call. Tools are
declared on nodes and seen by every node below (`visible_tools`). Knows nothing about chat
templates or call syntax (`toolformat` does) and never runs a model.
"""

from __future__ import annotations

import inspect
import json
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model

from .errors import GraphError

if TYPE_CHECKING:
    from .nodes import Node

__all__ = ["Constraint", "ToolCall", "ToolSpec", "check_arguments", "make_tool", "make_tools",
           "visible_tools"]

_NAME = r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$"


class ToolSpec(BaseModel):
    """A tool the model may call: `parameters` is the JSON schema of its arguments object."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                "properties": {}})
    _fn: Callable[..., Any] | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:  # by content: the function is not compared
        return isinstance(other, ToolSpec) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        return self.name, self.description, json.dumps(self.parameters, sort_keys=True)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tools` entry (what chat templates take as `tools=`)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    @property
    def function(self) -> Callable[..., Any] | None:
        """The Python function this tool was made from, if any."""
        return self._fn

    def invoke(self, arguments: dict[str, Any]) -> Any:
        """Run the tool's function with `arguments` (validated by its signature's types)."""
        if self._fn is None:
            raise GraphError(f"tool {self.name!r} has no Python function to run; make it "
                             "with make_tool(function) or run the call yourself.")
        model = _arguments_model(self._fn)
        values = model.model_validate(arguments)
        return self._fn(**{name: getattr(values, name) for name in model.model_fields})


class ToolCall(BaseModel):
    """One call the model made: which tool, with which (schema-checked) arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    arguments: dict[str, Any] = {}

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry (arguments as a JSON string)."""
        return {"id": self.id, "type": "function", "function": {
            "name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}

    def to_message(self) -> dict[str, Any]:
        """The entry chat templates render (arguments as an object)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def _arguments_model(fn: Callable[..., Any]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = Any if p.annotation is p.empty else p.annotation
        default = ... if p.default is p.empty else p.default
        fields[name] = (annotation, Field(default, description=_param_docs(fn).get(name)))
    return create_model(f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"),
                        **fields)


def _param_docs(fn: Callable[..., Any]) -> dict[str, str]:
    """`name: text` lines of a Google-style `Args:` section."""
    doc = inspect.getdoc(fn) or ""
    section = re.split(r"^\s*(?:Args|Arguments|Parameters):\s*$", doc, maxsplit=1,
                       flags=re.MULTILINE)
    if len(section) < 2:
        return {}
    out = {}
    for line in section[1].splitlines():
        m = re.match(r"^\s+(\w+)(?:\s*\(.*?\))?:\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
        elif line.strip() and not line.startswith((" ", "\t")):
            break  # the next section
    return out


def _clean(schema: Any) -> Any:
    """Drop pydantic's `title` keys: noise in every prompt that renders the schema."""
    if isinstance(schema, dict):
        return {k: _clean(v) for k, v in schema.items()
                if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_clean(v) for v in schema]
    return schema


def make_tool(obj: Any, name: str | None = None, description: str | None = None) -> ToolSpec:
    """A `ToolSpec` from a function, a pydantic model class, an OpenAI tool dict or a spec."""
    if isinstance(obj, ToolSpec):
        return obj
    if isinstance(obj, dict):
        fn = obj.get("function", obj) if obj.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or "name" not in fn:
            raise GraphError(f"tool {obj!r} is not a function tool; pass {{'type': "
                             "'function', 'function': {'name': ..., 'parameters': {...}}}.")
        return ToolSpec(name=fn["name"], description=fn.get("description") or "",
                        parameters=fn.get("parameters") or {"type": "object", "properties": {}})
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        return ToolSpec(name=name or obj.__name__,
                        description=description or inspect.getdoc(obj) or "",
                        parameters=_clean(obj.model_json_schema()))
    if callable(obj):
        name = name or getattr(obj, "__name__", "")
        if not re.match(_NAME, name):
            raise GraphError(f"tool name {name!r} is not valid; name the function (or pass "
                             "name=) with 1-64 letters, digits, '_' or '-'.")
        doc = (inspect.getdoc(obj) or "").split("\n\n")[0].strip()
        schema = _clean(_arguments_model(obj).model_json_schema())
        spec = ToolSpec(name=name, description=description or doc,
                        parameters=schema)
        spec._fn = obj
        return spec
    raise GraphError(f"cannot make a tool from {type(obj).__name__}; pass a function, a "
                     "pydantic model class or an OpenAI tool dict.")


def make_tools(tools: Iterable[Any] | None) -> list[ToolSpec]:
    """`make_tool` over a list; names must be unique."""
    specs = [make_tool(t) for t in tools or ()]
    names = [s.name for s in specs]
    for n in names:
        if names.count(n) > 1:
            raise GraphError(f"two tools are named {n!r}; give each tool its own name.")
    return specs


_tools = operator.attrgetter("tools")


def visible_tools(path: Sequence[Node]) -> list[ToolSpec]:
    """The tools declared on `path` (root first); a later declaration of a name replaces an
    earlier one."""
    if not any(map(_tools, path)):  # (checked in C: most paths declare none)
        return []
    out: dict[str, ToolSpec] = {}
    for node in path:
        for spec in node.tools:
            out.pop(spec.name, None)
            out[spec.name] = spec
    return list(out.values())


def check_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """Why `arguments` do not fit `spec.parameters` (one sentence), or None if they do."""
    if not isinstance(arguments, dict):
        return f"arguments of {spec.name!r} are not a JSON object"
    import jsonschema

    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(spec.parameters).iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(map(str, error.absolute_path)) or "(top level)"
    return f"arguments of {spec.name!r} at {where}: {error.message}"


class Constraint(BaseModel):
    """What a generated node's text must match (structured output): `kind` is json_schema,
    json_object, regex or grammar (Lark, llguidance's dialect); `spec` the schema as JSON text,
    the regex or the grammar. The engine's sampler enforces it token by token."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["json_schema", "json_object", "regex", "grammar"]
    spec: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str | type[BaseModel]) -> Constraint:
        """JSON valid under `schema` (a dict, JSON text or a pydantic model class)."""
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            schema = _clean(schema.model_json_schema())
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        return cls(kind="json_schema", spec=text)

    @classmethod
    def json_object(cls) -> Constraint:
        return cls(kind="json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls(kind="regex", spec=pattern)

    @classmethod
    def grammar(cls, lark: str) -> Constraint:
        return cls(kind="grammar", spec=lark)
