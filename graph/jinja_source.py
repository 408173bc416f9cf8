"""Jinja syntax trees of chat templates: parsing them as Hugging Face does, and writing a tree
back as template source.

`to_source` writes every piece of text as a string literal inside `{{ }}` and nothing between
tags, so whitespace control (`trim_blocks`, `lstrip_blocks`, `-`) has nothing to act on; its
output is trusted only where parsing it again gives the same tree (`same_tree`: text data and
the literal that writes it count as one, as do adjacent outputs). Knows Jinja's syntax, not
what any template means; a construct it does not write raises `Unsupported`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Unsupported", "parse", "same_tree", "to_source"]


class Unsupported(ValueError):  # noqa: N818 - internal: "this template is not handled"
    """A template construct the source writer (or a caller's analysis) does not handle."""


def _environment():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers' settings (its `{% generation %}` tag is not known here: such templates
    # fail to parse, and callers fall back)
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                         extensions=[loopcontrols])


def parse(source: str):
    """The template's syntax tree, or None where Jinja (as set up here) cannot parse it."""
    try:
        return _environment().parse(source)
    except Exception:  # noqa: BLE001 - unknown tags, bad syntax: the caller falls back
        return None


_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "FloorDiv": "//", "Mod": "%",
           "Pow": "**"}
_COMPARE = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=",
            "in": "in", "notin": "not in"}


def _literal(value: str) -> str:
    """A Jinja string literal for `value`: the lexer decodes it with 'unicode-escape'."""
    out = []
    for ch in value:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif 32 <= o < 127:
            out.append(ch)
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "'" + "".join(out) + "'"


def _ident(name: str) -> str:
    if not name.isidentifier():
        raise Unsupported(f"name {name!r}")
    return name


def _args(node) -> str:
    parts = [_ex(a) for a in node.args]
    parts += [f"{_ident(k.key)}={_ex(k.value)}" for k in node.kwargs]
    if node.dyn_args is not None:
        parts.append("*" + _ex(node.dyn_args))
    if node.dyn_kwargs is not None:
        parts.append("**" + _ex(node.dyn_kwargs))
    return ", ".join(parts)


def _ex(node) -> str:
    """An expression, every compound part in parentheses."""
    kind = type(node).__name__
    if kind == "Const":
        v = node.value
        if v is None or isinstance(v, bool):
            return {None: "none", True: "true", False: "false"}[v]
        if isinstance(v, int) and v >= 0:
            return str(v)
        if isinstance(v, float) and v >= 0 and v == v and v != float("inf"):
            return repr(v)
        if isinstance(v, str):
            return _literal(v)
        raise Unsupported(f"constant {v!r}")
    if kind == "Name":
        return _ident(node.name)
    if kind == "Getattr":
        return f"({_ex(node.node)}).{_ident(node.attr)}"
    if kind == "Getitem":
        arg = node.arg
        if type(arg).__name__ == "Slice":
            parts = ["" if p is None else _ex(p) for p in (arg.start, arg.stop, arg.step)]
            return f"({_ex(node.node)})[{parts[0]}:{parts[1]}:{parts[2]}]"
        return f"({_ex(node.node)})[{_ex(arg)}]"
    if kind == "Call":
        return f"({_ex(node.node)})({_args(node)})"
    if kind in ("Filter", "Test"):
        args = _args(node)
        call = _ident(node.name) + (f"({args})" if args else "")
        if kind == "Filter":
            return call if node.node is None else f"(({_ex(node.node)})|{call})"
        return f"(({_ex(node.node)}) is {call})"
    if kind == "Compare":
        ops = " ".join(f"{_COMPARE[o.op]} ({_ex(o.expr)})" for o in node.ops)
        return f"(({_ex(node.expr)}) {ops})"
    if kind in ("And", "Or"):
        return f"(({_ex(node.left)}) {kind.lower()} ({_ex(node.right)}))"
    if kind == "Not":
        return f"(not ({_ex(node.node)}))"
    if kind in ("Neg", "Pos"):
        return f"({'-' if kind == 'Neg' else '+'}({_ex(node.node)}))"
    if kind in _BINARY:
        return f"(({_ex(node.left)}) {_BINARY[kind]} ({_ex(node.right)}))"
    if kind == "Concat":
        return "(" + " ~ ".join(f"({_ex(n)})" for n in node.nodes) + ")"
    if kind == "CondExpr":
        tail = "" if node.expr2 is None else f" else ({_ex(node.expr2)})"
        return f"(({_ex(node.expr1)}) if ({_ex(node.test)}){tail})"
    if kind == "List":
        return "[" + ", ".join(_ex(n) for n in node.items) + "]"
    if kind == "Tuple":
        items = [_ex(n) for n in node.items]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if kind == "Dict":
        return "{" + ", ".join(f"{_ex(p.key)}: {_ex(p.value)}" for p in node.items) + "}"
    raise Unsupported(f"expression {kind}")


def _target(node) -> str:
    kind = type(node).__name__
    if kind == "Name":
        return _ident(node.name)
    if kind == "NSRef":
        return f"{_ident(node.name)}.{_ident(node.attr)}"
    if kind == "Tuple" and node.items:
        return ", ".join(_target(n) for n in node.items)
    raise Unsupported(f"assignment target {kind}")


def _body(nodes) -> str:
    return "".join(_st(n) for n in nodes)


def _signature(node) -> str:
    """Macro / call-block parameters with their defaults (which belong to the last ones)."""
    names = [_ident(a.name) for a in node.args]
    first = len(names) - len(node.defaults)
    return ", ".join(n if i < first else f"{n}={_ex(node.defaults[i - first])}"
                     for i, n in enumerate(names))


def _st(node) -> str:
    kind = type(node).__name__
    if kind == "Output":
        return "".join("{{ " + (_literal(n.data) if type(n).__name__ == "TemplateData"
                                else _ex(n)) + " }}" for n in node.nodes)
    if kind == "If":
        out = "{% if " + _ex(node.test) + " %}" + _body(node.body)
        for e in node.elif_:
            out += "{% elif " + _ex(e.test) + " %}" + _body(e.body)
        if node.else_:
            out += "{% else %}" + _body(node.else_)
        return out + "{% endif %}"
    if kind == "For":
        head = f"{_target(node.target)} in {_ex(node.iter)}"
        if node.test is not None:
            head += f" if {_ex(node.test)}"
        if node.recursive:
            head += " recursive"
        out = "{% for " + head + " %}" + _body(node.body)
        if node.else_:
            out += "{% else %}" + _body(node.else_)
        return out + "{% endfor %}"
    if kind == "Assign":
        return "{% set " + _target(node.target) + " = " + _ex(node.node) + " %}"
    if kind == "AssignBlock" and node.filter is None:
        return "{% set " + _target(node.target) + " %}" + _body(node.body) + "{% endset %}"
    if kind == "Macro":
        return ("{% macro " + _ident(node.name) + "(" + _signature(node) + ") %}"
                + _body(node.body) + "{% endmacro %}")
    if kind == "CallBlock":
        return ("{% call(" + _signature(node) + ") " + _ex(node.call) + " %}"
                + _body(node.body) + "{% endcall %}")
    if kind == "FilterBlock":
        return "{% filter " + _ex(node.filter) + " %}" + _body(node.body) + "{% endfilter %}"
    if kind == "With":
        pairs = ", ".join(f"{_target(t)}={_ex(v)}" for t, v in zip(node.targets, node.values))
        return "{% with " + pairs + " %}" + _body(node.body) + "{% endwith %}"
    if kind in ("Continue", "Break"):
        return "{% " + kind.lower() + " %}"
    raise Unsupported(f"statement {kind}")


def to_source(template) -> str:
    """Source text for a syntax tree (a `jinja2.nodes.Template` or a list of statements)."""
    body = template.body if type(template).__name__ == "Template" else template
    return _body(body)


def _norm(value: Any) -> Any:
    """A comparable form: text data as the constant that writes it, adjacent outputs merged."""
    from jinja2 import nodes

    if isinstance(value, list):
        out: list = []
        for item in (_norm(v) for v in value):
            if (isinstance(item, tuple) and item and item[0] == "Output" and out
                    and isinstance(out[-1], tuple) and out[-1][0] == "Output"):
                out[-1] = ("Output", out[-1][1] + item[1])
            else:
                out.append(item)
        return out
    if isinstance(value, nodes.TemplateData):
        return ("Const", value.data)
    if isinstance(value, nodes.Output):
        return ("Output", tuple(_norm(n) for n in value.nodes))
    if isinstance(value, nodes.Node):
        return (type(value).__name__,) + tuple(_norm(v) for _, v in value.iter_fields())
    if isinstance(value, tuple):
        return tuple(_norm(v) for v in value)
    return value


def same_tree(a, b) -> bool:
    """Whether two syntax trees render alike for the reasons above (and only those)."""
    return _norm(a) == _norm(b)
