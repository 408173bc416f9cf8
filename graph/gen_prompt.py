"""The generation prompt as a fixed suffix, where the chat template shows that it is one.

A turn renders its messages twice: with `add_generation_prompt=True` (the prompt) and without
(where the last done node ends). Most templates end with
`{% if add_generation_prompt %}...{% endif %}` and read the flag nowhere else; when that
block's output depends on nothing a chat changes (only constants and the render's own
arguments: no messages, loop or template variables, no filters or calls), the render without
the flag is the render with it less that block's text, for every chat. `generation_suffix`
checks that on the template's syntax tree and measures the text once per tokenizer and
arguments; None where the template does not show it (then both renders run).
"""

from __future__ import annotations

import threading
import weakref
from functools import lru_cache
from typing import Any

__all__ = ["generation_suffix"]

_FLAG = "add_generation_prompt"
_PROBE = [{"role": "user", "content": "Hi"}]
_MAX_ARGS = 32  # suffixes kept per tokenizer (one per set of template arguments)

_suffixes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@lru_cache(maxsize=16)
def _flag_block_is_fixed(source: str) -> bool:
    """Whether `source` ends with an `if add_generation_prompt` block (no elif/else) whose
    output reads only constants and names the template never assigns, and reads the flag
    nowhere else."""
    try:
        from jinja2 import nodes
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        tree = env.parse(source)
    except Exception:  # noqa: BLE001 - tags transformers adds ({% generation %}), bad syntax
        return False
    if not tree.body or not isinstance(tree.body[-1], nodes.If):
        return False
    last = tree.body[-1]
    if (not isinstance(last.test, nodes.Name) or last.test.name != _FLAG or last.elif_
            or last.else_):
        return False
    if sum(1 for n in tree.find_all(nodes.Name) if n.name == _FLAG) != 1:
        return False
    assigned = {n.name for n in tree.find_all(nodes.Name) if n.ctx != "load"}
    assigned |= {n.name for n in tree.find_all(nodes.Macro)}
    allowed = (nodes.Output, nodes.TemplateData, nodes.Const, nodes.If, nodes.Test, nodes.Not,
               nodes.And, nodes.Or, nodes.Compare, nodes.Operand, nodes.Concat, nodes.Add,
               nodes.CondExpr, nodes.Name)
    for body_node in last.body:
        for n in (body_node, *body_node.find_all(nodes.Node)):
            if not isinstance(n, allowed):
                return False
            if isinstance(n, nodes.Name) and (n.name in assigned or n.name in ("messages",
                                                                                 "loop")):
                return False
    return True


def generation_suffix(tokenizer: Any, kw: dict[str, Any]) -> str | None:
    """What `add_generation_prompt=True` appends to every chat's render with template
    arguments `kw`, or None where the template does not show it is only that."""
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str) or not _flag_block_is_fixed(source):
        return None
    key = repr(sorted(kw.items()))
    try:
        with _lock:
            known = _suffixes.setdefault(tokenizer, {})
            if key in known:
                return known[key]
    except TypeError:  # not weak-referenceable
        return None
    try:
        with_flag = tokenizer.apply_chat_template(_PROBE, tokenize=False,
                                                  add_generation_prompt=True, **kw)
        without = tokenizer.apply_chat_template(_PROBE, tokenize=False,
                                                add_generation_prompt=False, **kw)
    except Exception:  # noqa: BLE001 - a template that refuses the probe: render both
        suffix = None
    else:
        ok = isinstance(with_flag, str) and isinstance(without, str)
        suffix = with_flag[len(without):] if ok and with_flag.startswith(without) else None
    with _lock:
        if len(known) >= _MAX_ARGS:
            known.clear()
        known[key] = suffix
    return suffix
