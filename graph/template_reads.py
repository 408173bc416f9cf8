"""What a chat template's expressions read, rewritten for a window of the chat
(template_window.py).

`Reads` walks one expression at a time: where `loop` is the loop over `messages`, its
position becomes the whole chat's (`full_index`) and `messages[loop.index0 + c]` the window's
item for it (`window_index`); a read of a value the prelude computed is allowed in the turns
only where that value is the same in every render ("static"), or as one side of
`loop.index0 + c <op> value` (an "atom": recorded, so that a render compares the value); a
read a window cannot give the same way (the chat's length, `loop.length`, a message at a
computed position, ...) raises `Unsupported`. Knows Jinja expressions; nothing of rendering.
"""

from __future__ import annotations

from dataclasses import dataclass

from .jinja_source import Unsupported

__all__ = ["Reads", "Scope", "full_index", "jinja_nodes", "name_node"]

_ORDER_OPS = {"eq", "ne", "gt", "gteq", "lt", "lteq"}
_LIST_TESTS = {"defined", "undefined", "sequence", "iterable", "mapping", "string", "none"}
_EXPRESSIONS = {"Const", "Name", "Getattr", "Getitem", "Slice", "Call", "Filter", "Test",
                "Compare", "Operand", "And", "Or", "Not", "Neg", "Pos", "Add", "Sub", "Mul",
                "Div", "FloorDiv", "Mod", "Pow", "Concat", "CondExpr", "List", "Tuple", "Dict",
                "Pair", "Keyword"}


def jinja_nodes():
    from jinja2 import nodes  # (jinja2 comes with transformers; imported when first needed)

    return nodes


def name_node(name: str, ctx: str = "load"):
    return jinja_nodes().Name(name, ctx)


def _loop_attr(attr: str):
    n = jinja_nodes()
    return n.Getattr(n.Name("loop", "load"), attr, "load")


def full_index(c: int = 0):
    """The whole chat's position of the current turn, plus `c`."""
    n = jinja_nodes()
    j = _loop_attr("index0")
    f = n.CondExpr(n.Compare(j, [n.Operand("lt", name_node("forkv_hw"))]), j,
                   n.Add(j, name_node("forkv_d")))
    if c > 0:
        return n.Add(f, n.Const(c))
    return n.Sub(f, n.Const(-c)) if c < 0 else f


def window_index(c: int):
    """Where the whole chat's message at the current position + `c` is in the window."""
    n = jinja_nodes()
    t = full_index(c)
    return n.CondExpr(n.Compare(t, [n.Operand("lt", name_node("forkv_hw"))]), t,
                      n.Sub(t, name_node("forkv_d")))


@dataclass(slots=True)
class Scope:
    """Where an expression is: the part of the template, what `loop` names there, whether a
    branch above may go another way in another render, and the names local to it."""

    region: str  # "top" (prelude, tail), "scan", "main", "macro"
    loop: str | None = None  # what `loop` is: "msgs" (the scan's or main loop), "other", None
    control: bool = False  # inside a branch whose test may differ between renders
    locals: frozenset = frozenset()

    def inner(self, **kw) -> Scope:
        return Scope(**{**{k: getattr(self, k) for k in self.__slots__}, **kw})


class Reads:
    """The expression half of one pass over a template: what it has learnt of the prelude's
    values (`dynamic`: may differ between renders; `assigned`, `namespaces`) and what the
    turns read (neighbour offsets, `loop.last`, atoms, the messages the prelude reads)."""

    def __init__(self, dynamic: set[str], assigned: set[str], namespaces: set[str]):
        self.dynamic, self.assigned, self.namespaces = set(dynamic), set(assigned), namespaces
        self.atom_keys: list[str] = []
        self.atoms: list[tuple[str, int]] = []
        self.behind = self.ahead = self.head = self.tail = 0
        self.uses_last = False

    def _offset(self, node, cx: Scope) -> int | None:
        """c where `node` is the messages loop's `index0 + c` (`index` is index0 + 1)."""
        n = jinja_nodes()
        if cx.loop != "msgs" or "loop" in cx.locals:
            return None
        if (isinstance(node, n.Getattr) and isinstance(node.node, n.Name)
                and node.node.name == "loop" and node.attr in ("index0", "index")):
            return 0 if node.attr == "index0" else 1
        if isinstance(node, n.Add):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                base = self._offset(a, cx)
                if base is not None and isinstance(b, n.Const) and type(b.value) is int:
                    return base + b.value
        if isinstance(node, n.Sub) and isinstance(node.right, n.Const) \
                and type(node.right.value) is int:
            base = self._offset(node.left, cx)
            if base is not None:
                return base - node.right.value
        return None

    def _key(self, node, cx: Scope) -> str | None:
        """The prelude value `node` reads ("name" or "ns.attr"), if it is one."""
        n = jinja_nodes()
        if isinstance(node, n.Name) and node.name in self.assigned and node.name not in cx.locals:
            return node.name
        if (isinstance(node, n.Getattr) and isinstance(node.node, n.Name)
                and node.node.name in self.namespaces and node.node.name not in cx.locals):
            return f"{node.node.name}.{node.attr}"
        return None

    def ex(self, node, cx: Scope, truth: bool = False):
        """(rewritten expression, whether its value may differ between two renders)."""
        n = jinja_nodes()
        kind = type(node).__name__
        if kind not in _EXPRESSIONS:
            raise Unsupported(f"expression {kind}")
        if isinstance(node, n.Name):
            return node, self._name(node, cx, truth)
        if isinstance(node, n.Getattr) and isinstance(node.node, n.Name):
            if node.node.name == "loop" and cx.loop == "msgs" and "loop" not in cx.locals:
                return self._loop(node, cx), False
            key = self._key(node, cx)
            if key is not None:
                dyn = key in self.dynamic
                if dyn and cx.region != "top":
                    raise Unsupported(f"{key} read in the turns")
                return node, dyn
        if isinstance(node, n.Getitem) and isinstance(node.node, n.Name) \
                and node.node.name == "messages" and "messages" not in cx.locals:
            return self._message(node, cx)
        if (isinstance(node, n.Filter) and isinstance(node.node, n.Name)
                and node.node.name == "messages" and node.name in ("length", "count")
                and not node.args and not node.kwargs and cx.region == "top"):
            return name_node("forkv_num"), True
        if (isinstance(node, n.Test) and isinstance(node.node, n.Name)
                and node.node.name == "messages" and node.name in _LIST_TESTS
                and not node.args and not node.kwargs):
            return node, False
        if isinstance(node, n.Call) and isinstance(node.node, n.Name) \
                and node.node.name == "strftime_now":
            if cx.region != "top":
                raise Unsupported("the clock read in the turns")
            return self._generic(node, cx, False)[0], True
        if isinstance(node, n.Compare):
            atom = self._atom(node, cx)
            if atom is not None:
                return atom, False
        child_truth = truth if isinstance(node, (n.And, n.Or)) else isinstance(node, n.Not)
        return self._generic(node, cx, child_truth)

    def _generic(self, node, cx: Scope, child_truth: bool):
        n = jinja_nodes()
        dyn = False
        values = []
        for field, value in node.iter_fields():
            truth = child_truth or (isinstance(node, n.CondExpr) and field == "test")
            if isinstance(value, n.Node):
                value, d = self.ex(value, cx, truth)
                dyn |= d
            elif isinstance(value, list):
                out = []
                for item in value:
                    if isinstance(item, n.Node):
                        item, d = self.ex(item, cx, truth)
                        dyn |= d
                    out.append(item)
                value = out
            values.append(value)
        return type(node)(*values, lineno=node.lineno), dyn

    def _name(self, node, cx: Scope, truth: bool) -> bool:
        name = node.name
        if name.startswith("forkv_"):
            raise Unsupported(f"name {name}")
        if name in cx.locals:
            return False
        if name == "loop":
            if cx.loop == "msgs":
                raise Unsupported("the loop object itself")
            return False
        if name == "messages":
            if not truth:
                raise Unsupported("messages used as a whole")
            return False
        if name == "add_generation_prompt":
            if cx.region != "top":
                raise Unsupported("add_generation_prompt read in the turns")
            return True
        if name in self.assigned:
            dyn = name in self.dynamic
            if dyn and cx.region != "top":
                raise Unsupported(f"{name} read in the turns")
            return dyn
        return False  # a render argument, a global or a macro

    def _loop(self, node, cx: Scope):
        n = jinja_nodes()
        if node.attr == "index0":
            return full_index(0)
        if node.attr == "index":
            return full_index(1)
        if node.attr == "first":
            return n.Compare(full_index(0), [n.Operand("eq", n.Const(0))])
        if node.attr == "last" and cx.region == "main":
            self.uses_last = True  # the window runs to the chat's end: its own loop.last
            return node
        raise Unsupported(f"loop.{node.attr}")

    def _message(self, node, cx: Scope):
        n = jinja_nodes()
        arg = node.arg
        if isinstance(arg, n.Const) and arg.value == 0 and type(arg.value) is int:
            return node, False  # every window starts with the chat's first message
        if cx.region == "main":
            c = self._offset(arg, cx)
            if c is None:
                raise Unsupported("messages read at a computed position")
            self.behind, self.ahead = max(self.behind, -c), max(self.ahead, c)
            return n.Getitem(node.node, window_index(c), node.ctx, lineno=node.lineno), False
        if cx.region == "top":
            if isinstance(arg, n.Const) and type(arg.value) is int:
                self.head = max(self.head, arg.value + 1)
                return node, True
            if (isinstance(arg, n.Neg) and isinstance(arg.node, n.Const)
                    and type(arg.node.value) is int):
                self.tail = max(self.tail, arg.node.value)
                return node, True
        raise Unsupported("messages read at a computed position")

    def _atom(self, node, cx: Scope):
        """`loop.index0 + c <op> value` (either way round) with a changing value: rewritten,
        and recorded so that a render checks which turns the value's change reaches."""
        n = jinja_nodes()
        if cx.region != "main" or len(node.ops) != 1 or node.ops[0].op not in _ORDER_OPS:
            return None
        left, right = node.expr, node.ops[0].expr
        for idx, val, swap in ((left, right, False), (right, left, True)):
            c = self._offset(idx, cx)
            key = self._key(val, cx)
            if c is None or key is None or key not in self.dynamic:
                continue
            if key not in self.atom_keys:
                self.atom_keys.append(key)
            self.atoms.append((key, c))
            full = full_index(c)
            lhs, rhs = (val, full) if swap else (full, val)
            return n.Compare(lhs, [n.Operand(node.ops[0].op, rhs)], lineno=node.lineno)
        return None
