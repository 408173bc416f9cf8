"""Small checks shared by nodes, specs and trees: one-line messages for pydantic validation
errors (the field, what it should be, where, the fix) and whether a recorded model id names a
given model. Knows pydantic's error format; nothing about trees or models beyond their ids.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["matches_model", "spec_message", "validation_message"]


def validation_message(e: ValidationError, what: str, where: str = "",
                       fields: Any = ()) -> str:
    """One sentence from pydantic's first error: the field, what it should be, the fix.

    `what` names the thing validated ("generation setting", "workflow spec field"); `where`
    (e.g. "of node 'r1'", "in spec.yaml") says where it was; `fields` lists the known names.
    """
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    where = f" {where}" if where else ""
    if err["type"] == "extra_forbidden":
        known = f"; use one of {', '.join(fields)}" if fields else "; remove or rename it"
        return f"{what} {loc!r}{where} is not a known field{known}."
    msg = err["msg"].removeprefix("Input ").removeprefix("Value error, ")
    got = err.get("input")
    got = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    return f"{what} {loc!r}{where}: {msg}{got}; fix that value."


def matches_model(recorded: str | None, model_id: str) -> bool:
    """Whether a tree or spec made for `recorded` may run on `model_id` ("name@fingerprint").

    A recorded id without a fingerprint ("demo:qwen3:tiny", as a hand-written spec gives it)
    matches that model name; with one, the fingerprint decides (a moved folder is the same
    model). `demo:<arch>` and `demo:<arch>:tiny` are one model.
    """
    if recorded is None:
        return True
    name, _, fp = model_id.partition("@")
    rec_name, has_fp, rec_fp = recorded.partition("@")
    if has_fp and fp:
        return rec_fp == fp
    return _canonical(rec_name) == _canonical(name)


def _canonical(name: str) -> str:
    parts = name.split(":")
    return f"{name}:tiny" if parts[0] == "demo" and len(parts) == 2 else name


def spec_message(e: ValidationError, data: str | bytes, source: str, root: type[BaseModel]) -> str:
    """One sentence for a spec that fails to parse or validate: where, what, the fix."""
    err = e.errors()[0]
    if err["type"] == "json_invalid":
        why = err.get("ctx", {}).get("error", err["msg"])  # says the line and column
        return f"{source} is not valid JSON ({why}); fix the JSON there."
    loc = err["loc"]
    node = ""
    if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
        node_id = _node_id(data, loc[1])
        node = f"(node {node_id!r})" if node_id else f"(node #{loc[1] + 1})"
    return validation_message(e, f"{source}: field", node, fields=_fields_at(root, loc))


def _fields_at(root: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed where an unknown one sits (for the error's hint)."""
    model = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        ann = model.model_fields[part].annotation if part in model.model_fields else None
        nested = [a for a in getattr(ann, "__args__", (ann,)) + _list_args(ann)
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)


def _list_args(ann) -> tuple:
    return tuple(x for a in getattr(ann, "__args__", ()) for x in getattr(a, "__args__", ()))


def _node_id(data: str | bytes, index: int) -> str | None:
    try:
        node = json.loads(data)["nodes"][index]
        return node.get("id") if isinstance(node, dict) else None
    except (ValueError, KeyError, IndexError, TypeError):
        return None
