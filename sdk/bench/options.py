"""`--set NAME=VALUE`: a benchmark's own keyword arguments (sizes, modes, baseline reps) from
the command line, typed by the function's signature."""

from __future__ import annotations

import inspect

# Set through their own flags, never through --set.
_OWN_FLAGS = {"model": "--model", "quick": "--quick", "reps": "--reps"}


def parse_settings(fn, pairs: list[str]) -> dict:
    """Keyword arguments for `fn` from NAME=VALUE strings; a clear error names what is wrong."""
    params = inspect.signature(fn).parameters
    takes_more = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if n not in _OWN_FLAGS
             and p.kind is p.POSITIONAL_OR_KEYWORD and _settable(p)]
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise ValueError(f"--set takes NAME=VALUE, got {pair!r}.")
        if name in _OWN_FLAGS:
            raise ValueError(f"Set {name} with {_OWN_FLAGS[name]}, not --set.")
        if name in named:
            out[name] = _coerce(name, text, params[name])
        elif name in params:
            raise ValueError(f"{name!r} cannot be set from the command line"
                             + (f"; this benchmark takes {', '.join(named)}." if named else "."))
        elif takes_more:  # e.g. the agent's size fields, checked by the benchmark itself
            out[name] = _number(name, text, int)
        else:
            raise ValueError(f"Unknown setting {name!r}; this benchmark takes "
                             f"{', '.join(named) or 'no settings'}.")
    return out


def _settable(param: inspect.Parameter) -> bool:
    """Plain values only (numbers, strings, flags, lists of them), not objects like Sizes."""
    if isinstance(param.default, (bool, int, float, str, tuple)):
        return True
    hint = str(param.annotation).split("|")[0].strip()
    return hint in ("bool", "int", "float", "str") or hint.startswith("tuple[")


def _coerce(name: str, text: str, param: inspect.Parameter):
    default, hint = param.default, str(param.annotation)
    if isinstance(default, bool) or hint.startswith("bool"):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} is true or false, got {text!r}.")
    if isinstance(default, tuple) or "tuple" in hint:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise ValueError(f"{name} is a comma-separated list, got {text!r}.")
        return tuple(_number(name, t, int) for t in items) if "int" in hint else tuple(items)
    if isinstance(default, int) or hint.startswith("int"):
        return _number(name, text, int)
    if isinstance(default, float) or hint.startswith("float"):
        return _number(name, text, float)
    return text


def _number(name: str, text: str, kind):
    try:
        return kind(text.replace("_", ""))
    except ValueError:
        raise ValueError(f"{name} takes a number, got {text!r}.") from None
