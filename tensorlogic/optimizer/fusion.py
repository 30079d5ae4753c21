"""Elementwise fusion: maximal groups of elementwise ops over one iteration space become one
FUSED node (format: ``ir/fused.py``), optionally ending in a reduction over trailing axes or a
row op (softmax, log_softmax, layer_norm) over the last axis.

Legality is the pure predicate ``is_legal_group``. Groups grow greedily from the last
elementwise node of a chain (its root) towards its producers: a producer joins when it is
elementwise, has the root's shape and dtype, is not a graph output and all its users are already
in the group. Same-dtype members mean no rounding step of the unfused graph is skipped; scalar
constants whose dtype matches everything they meet are inlined as literals.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Mapping

from ..ir import ops
from ..ir.fused import FusedBody, FusedOp
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass

ELEMENTWISE_KINDS = (ops.UNARY, ops.BINARY, ops.WHERE)


def _is_elementwise(node: Node) -> bool:
    return node.kind in ELEMENTWISE_KINDS


def legal_tail(root: Node, tail: Node) -> bool:
    """A reduction over trailing axes, or a row op over the last axis, of the root's value."""
    r = len(root.shape)
    if tail.inputs != (root.id,) or tail.dtype != root.dtype or r == 0:
        return False
    if tail.kind == ops.REDUCE:
        axes = tuple(tail.args["axes"])
        return len(axes) > 0 and axes == tuple(range(r - len(axes), r))
    if tail.kind == ops.ROWOP:
        return tail.args["axis"] == r - 1
    return False


def is_legal_group(g: EinsumGraph, members: frozenset[int], root: int,
                   tail: int | None = None, position: Mapping[int, int] | None = None) -> bool:
    """Whether ``members`` (elementwise, ending in ``root``) plus ``tail`` may become one node.

    Pure: reads the graph, changes nothing. Conditions: at least two nodes; every member
    elementwise with the root's (concrete, non-empty) shape and dtype; no member but the root is
    a graph output or used outside the group; the tail, if any, is the root's only user and a
    legal tail; and no path leaves the group and comes back (no external operand depends on a
    member), so the fused node creates no cycle. ``position`` (node id -> index in a
    topological order of ``g``) only bounds that search; it is computed when not given.
    """
    if root not in members or len(members) + (tail is not None) < 2:
        return False
    rnode = g.node(root)
    space = tuple(rnode.shape)
    if not all(isinstance(d, int) for d in space) or math.prod(space) == 0:
        return False
    outputs = set(g.outputs.values())
    for m in members:
        node = g.node(m)
        if not _is_elementwise(node) or tuple(node.shape) != space or node.dtype != rnode.dtype:
            return False
        if m != root and (m in outputs or any(u not in members for u in g.users(m))):
            return False
    if tail is not None:
        if root in outputs or g.users(root) != [tail] or not legal_tail(rnode, g.node(tail)):
            return False
    if position is None:
        position = {n.id: k for k, n in enumerate(g.nodes)}
    first = min(position[m] for m in members)
    external = {i for m in members for i in g.node(m).inputs if i not in members}
    # a cycle would need an external operand that depends on a member: search its ancestors,
    # which can reach a member only while they come after the first member in the order
    stack, seen = [e for e in external if position[e] > first], set()
    while stack:
        n = stack.pop()
        if n in members:
            return False
        if n in seen:
            continue
        seen.add(n)
        stack.extend(i for i in g.node(n).inputs if position[i] > first)
    return True


def _inline_constant(g: EinsumGraph, nid: int, user: Node, members: set[int]) -> float | None:
    """A scalar constant operand that may be a literal: its dtype equals every other operand's."""
    node = g.node(nid)
    if node.kind != ops.CONSTANT or math.prod(node.shape) != 1 or len(node.shape) > len(user.shape):
        return None
    if node.dtype != user.dtype:
        return None
    for other in user.inputs:
        if other != nid and other not in members and g.node(other).dtype != user.dtype:
            return None  # a Python float is "weak": numpy would compute in the other dtype
    return float(g.constants[nid].reshape(()))


def build_body(g: EinsumGraph, members: frozenset[int], root: int,
               tail: int | None) -> tuple[FusedBody, list[int]]:
    """The fused program of a legal group and its external operands in order."""
    order = _topological(g, members)
    tmp = {nid: j for j, nid in enumerate(order)}
    external: list[int] = []
    instrs = []
    for nid in order:
        node = g.node(nid)
        refs = []
        for i in node.inputs:
            if i in tmp:
                refs.append(("tmp", tmp[i]))
                continue
            value = _inline_constant(g, i, node, members)
            if value is not None:
                refs.append(("const", value))
                continue
            if i not in external:
                external.append(i)
            refs.append(("in", external.index(i)))
        instrs.append(FusedOp("where" if node.kind == ops.WHERE else node.op, tuple(refs)))
    space = tuple(g.node(root).shape)
    if tail is None:
        return FusedBody(tuple(instrs), space), external
    t = g.node(tail)
    if t.kind == ops.REDUCE:
        body = FusedBody(tuple(instrs), space, t.op, tuple(t.args["axes"]),
                         bool(t.args.get("keepdims")))
    else:
        body = FusedBody(tuple(instrs), space, t.op, (int(t.args["axis"]),),
                         eps=float(t.args.get("eps", ops.LAYER_NORM_EPS)))
    return body, external


def _topological(g: EinsumGraph, members: frozenset[int]) -> list[int]:
    """Members ordered so every member comes after the members it uses."""
    order: list[int] = []
    done: set[int] = set()

    def visit(n: int) -> None:
        if n in done:
            return
        done.add(n)
        for i in g.node(n).inputs:
            if i in members:
                visit(i)
        order.append(n)

    for m in sorted(members):
        visit(m)
    return order


def fused_flops(body: FusedBody) -> int:
    """FLOPs of a fused node, counted like the unfused steps it replaces."""
    n = math.prod(body.space)
    flops = body.flops_per_element() * n
    if body.tail in ops.ROW_OPS:
        flops += 10 * n
    elif body.tail is not None:
        flops += n * (10 if body.tail == "logsumexp" else 1)
    return flops


def _grow(g: EinsumGraph, root: int, taken: set[int]) -> frozenset[int]:
    """The largest group around ``root`` that the greedy rule admits (a worklist walk)."""
    rnode = g.node(root)
    outputs = set(g.outputs.values())
    members = {root}
    work = [root]
    while work:
        for p in g.node(work.pop()).inputs:
            if p in members or p in taken or p in outputs:
                continue
            pn = g.node(p)
            if (_is_elementwise(pn) and tuple(pn.shape) == tuple(rnode.shape)
                    and pn.dtype == rnode.dtype and all(u in members for u in g.users(p))):
                members.add(p)
                work.append(p)
    return frozenset(members)


def _fusion(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Fuse every legal elementwise group (with its tail) into one FUSED node."""
    g: EinsumGraph | None = None
    taken: set[int] = set()
    groups = fused_nodes = 0
    position = {n.id: k for k, n in enumerate(graph.nodes)}  # fused nodes keep their root's
    for node in reversed(graph.nodes):
        cur = g if g is not None else graph
        if node.id in taken or node.id not in cur or not _is_elementwise(cur.node(node.id)):
            continue
        members = _grow(cur, node.id, taken)
        users = cur.users(node.id)
        tail = users[0] if len(users) == 1 and node.id not in cur.outputs.values() else None
        if tail is not None and not legal_tail(cur.node(node.id), cur.node(tail)):
            tail = None
        if not is_legal_group(cur, members, node.id, tail, position):
            continue
        body, external = build_body(cur, members, node.id, tail)
        visible = cur.node(tail if tail is not None else node.id)
        if g is None:
            g = graph.copy()
        fused = Node(visible.id, ops.FUSED, None, tuple(external), tuple(visible.shape),
                     visible.dtype, visible.name,
                     MappingProxyType({"body": body.to_args(), "flops": fused_flops(body)}))
        g.replace_node(visible.id, fused)
        # users before producers: insertion order is topological, so remove from the back
        for m in sorted(set(members) - {visible.id}, key=position.__getitem__, reverse=True):
            g.remove_node(m)
        taken |= members
        groups += 1
        fused_nodes += len(members) + (tail is not None)
    if g is None:
        return PassResult(graph, False, {})
    return PassResult(g, True, {"groups": groups, "nodes_fused": fused_nodes})


fusion = function_pass("fusion", _fusion, (2, 3))
