"""A chat template rewritten so that a chat's last messages can be rendered without the rest,
where the template's syntax tree shows which earlier text stays the same.

A template is accepted when its top level is a prelude, one loop over `messages` that writes
the turns (the main loop) and a tail (the generation prompt), and the main loop's body reads,
besides its own message: the loop's position from the start (`loop.index0`, `index`, `first`),
`loop.last`, neighbours at a fixed offset (`messages[loop.index0 - 1]`), `messages[0]`, the
render's arguments, pure macros, and values the prelude computed from those. A value that may
differ between two chats where one extends the other (it reads later messages, their number,
`add_generation_prompt` or the clock) may be read there only as `loop.index0 (+ c) <op> value`
(Qwen-style "after the last user turn", found by a prelude scan); a scan may only set
namespace attributes from its own message and position. Anything else: not accepted (None).

The rewritten template (`WindowTemplate.source`) is rendered over `messages[:hw] +
messages[a:]` with the loop positions mapped back to the whole chat's, runs the body only for
the positions asked for, and writes a marker before each turn and after the loop, then the
values the caller needs to compare two renders (`report`). With
`forkv_window=false` over the whole chat it writes exactly the original's text plus markers.
Knows Jinja syntax trees; renders nothing (chat_render.py does).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import lru_cache

from .jinja_source import Unsupported, parse, same_tree, to_source
from .template_reads import Reads, Scope, full_index, jinja_nodes, name_node

__all__ = ["MARK", "WindowTemplate", "window_template"]

# Written between the pieces of a render; random per process, so no message holds it by chance
# (a render with a marker too many is not used).
MARK = f"\ue000forkv-{secrets.token_hex(8)}\ue001"


@dataclass(frozen=True, slots=True)
class WindowTemplate:
    """The rewritten template and what a window over a chat must hold.

    `behind`/`ahead`: the largest offsets the body reads neighbours at (the first `behind`
    turns also read the chat's end, wrapping around: they are always rendered again);
    `uses_last`: the body reads `loop.last`; `head`/`tail`: messages the prelude or tail read
    at the start (`messages[k]`) or end (`messages[-k]`); `report`: how many values each render
    writes after the turns, of which the first `num_scanned` are namespace attributes set by a scan
    (passed back as `forkv_g` to a window render); `atoms`: (report index, c) for each
    `loop.index0 + c <op> value` in the body.
    """

    source: str
    behind: int
    ahead: int
    uses_last: bool
    head: int
    tail: int
    report: int
    num_scanned: int
    atoms: tuple[tuple[int, int], ...]


def _has_output(node) -> bool:
    n = jinja_nodes()
    return isinstance(node, n.Output) or any(True for _ in node.find_all(n.Output))


class _Analysis(Reads):
    """One pass over the template: classifies the prelude's values and rewrites every part."""

    def __init__(self, dynamic: set[str], assigned: set[str], namespaces: set[str]):
        super().__init__(dynamic, assigned, namespaces)
        self.scanned: list[str] = []  # namespace keys set by scans
        self.first_changes: set[str] = set()  # namespace keys whose first value may change
        self.macros: set[str] = set()

    # -- statements (the expressions are template_reads.py's) ---------------------------------
    def body(self, nodes_, cx: Scope) -> tuple[list, bool]:
        out, dyn = [], False
        for node in nodes_:
            node, d = self.st(node, cx)
            out.extend(node if isinstance(node, list) else [node])
            dyn |= d
        return out, dyn

    def st(self, node, cx: Scope):
        n = jinja_nodes()
        if isinstance(node, n.Output):
            if cx.region == "scan":
                raise Unsupported("a scan that writes")
            out, dyn = [], False
            for child in node.nodes:
                if isinstance(child, n.TemplateData):
                    out.append(child)
                    continue
                child, d = self.ex(child, cx)
                out.append(child)
                dyn |= d
            return n.Output(out, lineno=node.lineno), dyn
        if isinstance(node, n.If):
            test, dyn = self.ex(node.test, cx, truth=True)
            inner = cx.inner(control=cx.control or dyn)
            body, d1 = self.body(node.body, inner)
            elif_ = []
            for e in node.elif_:
                e, d = self.st(e, inner)
                elif_.append(e)
                d1 |= d
            else_, d2 = self.body(node.else_, inner)
            return n.If(test, body, elif_, else_, lineno=node.lineno), dyn or d1 or d2
        if isinstance(node, n.For):
            return self._for(node, cx)
        if isinstance(node, n.Assign):
            return self._assign(node, cx)
        if isinstance(node, n.AssignBlock) and node.filter is None \
                and isinstance(node.target, n.Name):
            body, dyn = self.body(node.body, cx)
            self._set_name(node.target.name, dyn or cx.control, cx)
            return n.AssignBlock(node.target, None, body, lineno=node.lineno), dyn
        if isinstance(node, n.FilterBlock) and cx.region != "scan":
            filt, d1 = self._generic(node.filter, cx, False)
            body, d2 = self.body(node.body, cx)
            return n.FilterBlock(body, filt, lineno=node.lineno), d1 or d2
        if isinstance(node, n.With):
            values, dyn = [], False
            for v in node.values:
                v, d = self.ex(v, cx)
                values.append(v)
                dyn |= d
            names = {t.name for t in node.targets if isinstance(t, n.Name)}
            body, d = self.body(node.body, cx.inner(locals=cx.locals | names))
            return n.With(node.targets, values, body, lineno=node.lineno), dyn or d
        if isinstance(node, n.Macro) and cx.region == "top":
            self._macro(node)
            return node, False
        if isinstance(node, n.Continue) and cx.loop is not None:
            return node, False
        if isinstance(node, n.Break) and cx.loop == "other":
            return node, False
        raise Unsupported(f"statement {type(node).__name__} in {cx.region}")

    def _set_name(self, name: str, dyn: bool, cx: Scope) -> None:
        if name.startswith("forkv_") or name in ("loop", "messages"):
            raise Unsupported(f"assignment to {name}")
        if cx.region == "top" and cx.loop is None:
            self.assigned.add(name)
            if dyn:
                self.dynamic.add(name)

    def _assign(self, node, cx: Scope):
        n = jinja_nodes()
        value, dyn = self.ex(node.node, cx)
        dyn |= cx.control
        target = node.target
        if isinstance(target, n.Name):
            if (isinstance(value, n.Call) and isinstance(value.node, n.Name)
                    and value.node.name == "namespace" and cx.region == "top" and cx.loop is None):
                if value.args or value.dyn_args is not None or value.dyn_kwargs is not None:
                    raise Unsupported(f"namespace {target.name} made from a mapping")
                if target.name in self._seen_namespaces:
                    raise Unsupported(f"namespace {target.name} made twice")
                self._seen_namespaces.add(target.name)
                for kw in value.kwargs:  # its attributes' first values
                    _, d = self.ex(kw.value, cx)
                    if d or cx.control:
                        self.dynamic.add(f"{target.name}.{kw.key}")
                        self.first_changes.add(f"{target.name}.{kw.key}")
                self.namespaces.add(target.name)
            self._set_name(target.name, dyn, cx)
        elif isinstance(target, n.NSRef):
            key = f"{target.name}.{target.attr}"
            if target.name in cx.locals:
                pass  # a namespace made in this turn: gone with it
            elif target.name not in self.namespaces:
                raise Unsupported(f"namespace {target.name} not made at the top")
            elif cx.region == "scan":
                if cx.loop != "msgs":
                    raise Unsupported("a scan setting values in an inner loop")
                if key in self.scanned or key in self._top_set:
                    raise Unsupported(f"{key} set in more than one place")
                if key in self.first_changes:  # a window keeps the last render's value
                    raise Unsupported(f"{key} starts from a changing value")
                self.scanned.append(key)
                self.dynamic.add(key)
                i = len(self.scanned) - 1
                mark = n.Assign(n.NSRef("forkv_ns", f"w{i}"), full_index(0))
                return [n.Assign(target, value, lineno=node.lineno), mark], False
            elif cx.region == "top":
                if key in self.scanned:
                    raise Unsupported(f"{key} set in more than one place")
                self._top_set.add(key)
                if dyn or cx.loop is not None:
                    self.dynamic.add(key)
            else:
                raise Unsupported(f"{key} set in the turns")
        elif isinstance(target, n.Tuple):
            for t in target.items:
                if not isinstance(t, n.Name):
                    raise Unsupported("assignment target")
                self._set_name(t.name, dyn, cx)
        else:
            raise Unsupported("assignment target")
        return n.Assign(target, value, lineno=node.lineno), dyn

    def _for(self, node, cx: Scope):
        n = jinja_nodes()
        if node.recursive or not isinstance(node.target, (n.Name, n.Tuple)):
            raise Unsupported("a recursive loop")
        is_msgs = isinstance(node.iter, n.Name) and node.iter.name == "messages" \
            and "messages" not in cx.locals
        if is_msgs:
            raise Unsupported("a loop over messages below the top")
        it, dyn = self.ex(node.iter, cx)
        names = {t.name for t in ([node.target] if isinstance(node.target, n.Name)
                                  else node.target.items) if isinstance(t, n.Name)}
        inner = cx.inner(loop="other", locals=cx.locals | names,
                         control=cx.control or dyn)
        test = None
        if node.test is not None:
            test, d = self.ex(node.test, inner, truth=True)
            dyn |= d
        body, d = self.body(_flat(node.body), inner)
        if node.else_ and any(isinstance(x, n.Name) and x.name == "loop"
                              for e in node.else_ for x in e.find_all(n.Name)):
            raise Unsupported("loop read in a for-else")
        else_, d2 = self.body(node.else_, cx)
        return (n.For(node.target, it, _flat(body), else_, test, False, lineno=node.lineno),
                dyn or d or d2)

    def _macro(self, node) -> None:
        n = jinja_nodes()
        names = {a.name for a in node.args} | {"varargs", "kwargs", "caller", node.name}
        names |= {x.name for x in node.find_all(n.Name) if x.ctx == "store"}
        cx = Scope("macro", locals=frozenset(names))
        for d in node.defaults:
            self.ex(d, cx)
        self.body(node.body, cx)
        self.macros.add(node.name)

    # -- the template ------------------------------------------------------------------------
    def run(self, template):
        n = jinja_nodes()
        self._seen_namespaces: set[str] = set()
        self._top_set: set[str] = set()
        mains = [i for i, s in enumerate(template.body)
                 if isinstance(s, n.For) and isinstance(s.iter, n.Name)
                 and s.iter.name == "messages" and _has_output(s)]
        if len(mains) != 1:
            raise Unsupported("no single loop over messages that writes the turns")
        k = mains[0]
        top = Scope("top")
        prelude = []
        for s in template.body[:k]:
            if isinstance(s, n.For) and isinstance(s.iter, n.Name) and s.iter.name == "messages":
                prelude += self._scan(s)
            else:
                s, _ = self.st(s, top)
                prelude += _flat([s])
        main = self._main(template.body[k])
        tail = []
        for s in template.body[k + 1:]:
            if isinstance(s, n.For) and isinstance(s.iter, n.Name) and s.iter.name == "messages":
                raise Unsupported("a loop over messages after the turns")
            s, _ = self.st(s, top)
            tail += _flat([s])
        return prelude, main, tail

    def _scan(self, node) -> list:
        """A loop over messages that only sets namespace attributes: rewritten to note the
        last position that set each, and followed (in a window) by the value the last render
        had for each one the window did not set (set before the window: still the last)."""
        n = jinja_nodes()
        if node.test is not None or node.recursive or node.else_ \
                or not isinstance(node.target, n.Name):
            raise Unsupported("a filtered or recursive scan")
        first = len(self.scanned)
        cx = Scope("scan", loop="msgs", locals=frozenset({node.target.name}))
        body, _ = self.body(node.body, cx)
        if any(isinstance(x, n.Break) for x in node.find_all(n.Break)):
            raise Unsupported("a scan that stops early")
        out = [n.For(node.target, node.iter, _flat(body), [], None, False, lineno=node.lineno)]
        for i in range(first, len(self.scanned)):
            name, attr = self.scanned[i].split(".", 1)
            test = n.And(name_node("forkv_window"), n.Compare(
                n.Getattr(name_node("forkv_ns"), f"w{i}", "load"),
                [n.Operand("lt", name_node("forkv_a"))]))
            restore = n.Assign(n.NSRef(name, attr),
                               n.Getitem(name_node("forkv_g"), n.Const(i), "load"))
            out.append(n.If(test, [restore], [], []))
        return out

    def _main(self, node):
        n = jinja_nodes()
        if node.test is not None or node.recursive or node.else_ \
                or not isinstance(node.target, n.Name):
            raise Unsupported("a filtered or recursive main loop")
        stored = {x.name for x in node.find_all(n.Name) if x.ctx == "store"}
        for x in node.find_all(n.Assign):
            if isinstance(x.target, n.Name) and x.target.name in self.dynamic:
                raise Unsupported(f"{x.target.name} set in the turns and the prelude")
        if any(isinstance(x, n.Macro) for x in node.find_all(n.Macro)):
            raise Unsupported("a macro defined in the turns")
        cx = Scope("main", loop="msgs", locals=frozenset(stored | {node.target.name}))
        body, _ = self.body(node.body, cx)
        for s in _flat(body):
            if isinstance(s, n.Break):
                raise Unsupported("a main loop that stops early")
        f = full_index(0)
        emit = n.Or(n.Not(name_node("forkv_window")), n.Or(
            n.Compare(f, [n.Operand("lt", name_node("forkv_h"))]),
            n.Compare(full_index(0), [n.Operand("gteq", name_node("forkv_s"))])))
        return n.For(node.target, node.iter,
                     [n.Output([n.Const(MARK)]), n.If(emit, _flat(body), [], [])],
                     [], None, False, lineno=node.lineno)


def _flat(stmts: list) -> list:
    """Statements, with the lists a rewrite put in place of one statement spliced in."""
    out = []
    for s in stmts:
        out.extend(s if isinstance(s, list) else [s])
    return out


def _analyse(template):
    """Passes until the prelude's changing values are known (each pass can only add some)."""
    dynamic: set[str] = set()
    assigned: set[str] = set()
    namespaces: set[str] = set()
    for _ in range(8):
        a = _Analysis(dynamic, assigned, set(namespaces))
        parts = a.run(template)
        if a.dynamic == dynamic and a.assigned == assigned and a.namespaces == namespaces:
            return a, parts
        dynamic, assigned, namespaces = a.dynamic, a.assigned, a.namespaces
    raise Unsupported("the prelude's values do not settle")


@lru_cache(maxsize=16)
def window_template(source: str) -> WindowTemplate | None:
    """The rewritten `source`, or None where it is not accepted (see the module docstring)."""
    template = parse(source)
    if template is None:
        return None
    n = jinja_nodes()
    try:
        a, (prelude, main, tail) = _analyse(template)
        keys = a.scanned + [k for k in a.atom_keys if k not in a.scanned]
        head = []
        if a.scanned:
            head.append(n.Assign(name_node("forkv_ns", "store"), n.Call(
                name_node("namespace"), [],
                [n.Keyword(f"w{i}", n.Neg(n.Const(1))) for i in range(len(a.scanned))],
                None, None)))

        def read(key: str):
            if "." in key:
                ns, attr = key.split(".", 1)
                return n.Getattr(name_node(ns), attr, "load")
            return name_node(key)

        # Each turn starts with a marker (so the first ends the prelude); after the last, the
        # values the turns saw (the tail may set them again), between two more.
        report = [n.Const(MARK)]
        if keys:
            report.append(n.Filter(n.List([read(k) for k in keys]), "tojson", [], [],
                                   None, None))
        report.append(n.Const(MARK))
        body = head + prelude + [main, n.Output(report)] + tail
        rewritten = n.Template(body)
        source_out = to_source(rewritten)
    except Unsupported:
        return None
    again = parse(source_out)
    if again is None or not same_tree(again, rewritten):
        return None
    return WindowTemplate(source_out, a.behind, a.ahead, a.uses_last, a.head, a.tail,
                          len(keys), len(a.scanned),
                          tuple((keys.index(k), c) for k, c in a.atoms))
