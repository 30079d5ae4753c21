"""Recognize layer normalization written out by hand and replace it with the ``layer_norm`` row op.

The pattern, over one axis ``a`` of ``x`` (every node of ``x``'s dtype):

    m = mean(x, axis=a, keepdims=True)
    d = x - m
    q = square(d) | d * d | d ** 2
    v = mean(q, axis=a, keepdims=True)
    s = sqrt(v + eps) | sqrt(eps + v)            (eps: a scalar constant, finite, >= 0)
    y = d / s | d * reciprocal(s) | d * (1 / s)  (either operand order for the product)

``y`` becomes ``layer_norm(x, axis=a, eps=eps)``: the same function (biased variance, the same
epsilon in the same dtype), computed in one kernel. The rewrite applies only when every
intermediate (m, d, q, v, the sum, s and the reciprocal) is used by the pattern alone and is not a
graph output, so no value that something else reads disappears.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Mapping

from ..ir import ops
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass
from .util import output_ids, uniform_value


def _only_users(g: EinsumGraph, nid: int, users: set[int], outputs: set[int]) -> bool:
    """``nid`` is no output and is read by exactly the nodes ``users``."""
    return nid not in outputs and set(g.users(nid)) == users


def _mean_keepdims(g: EinsumGraph, nid: int) -> tuple[int, int] | None:
    """(input id, axis) of a keepdims mean over one axis, or None."""
    n = g.node(nid)
    if n.kind != ops.REDUCE or n.op != "mean" or not n.args.get("keepdims"):
        return None
    axes = tuple(n.args["axes"])
    if len(axes) != 1:
        return None
    return n.inputs[0], int(axes[0])


def _is_op(n: Node, kind: str, op: str) -> bool:
    return n.kind == kind and n.op == op


def _eps_value(g: EinsumGraph, nid: int, like: Node) -> float | None:
    """The value of a scalar constant of ``like``'s dtype that broadcasts into ``like``'s shape."""
    c = g.node(nid)
    if c.kind != ops.CONSTANT or c.dtype != like.dtype or math.prod(c.shape) != 1:
        return None
    if len(c.shape) > len(like.shape):
        return None
    v = uniform_value(g, nid)
    if v is None or not math.isfinite(v) or v < 0:
        return None
    return v


def _squared(g: EinsumGraph, q: Node, d: int) -> bool:
    """``q`` is d*d, square(d) or d**2 (a constant exponent of exactly 2)."""
    if _is_op(q, ops.UNARY, "square"):
        return q.inputs == (d,)
    if _is_op(q, ops.BINARY, "mul"):
        return q.inputs == (d, d)
    if _is_op(q, ops.BINARY, "pow") and q.inputs[0] == d:
        e = g.node(q.inputs[1])
        return (
            e.kind == ops.CONSTANT
            and math.prod(e.shape) == 1
            and e.dtype == q.dtype
            and len(e.shape) <= len(q.shape)
            and uniform_value(g, q.inputs[1]) == 2.0
        )
    return False


def _inverse_sqrt(g: EinsumGraph, nid: int) -> tuple[int, list[int]] | None:
    """(s, [nodes]) when ``nid`` is reciprocal(s) or 1 / s for a sqrt node s."""
    r = g.node(nid)
    if _is_op(r, ops.UNARY, "reciprocal"):
        s = r.inputs[0]
    elif _is_op(r, ops.BINARY, "div") and uniform_value(g, r.inputs[0]) == 1.0:
        one = g.node(r.inputs[0])
        if (
            one.kind != ops.CONSTANT
            or one.dtype != r.dtype
            or math.prod(one.shape) != 1
            or len(one.shape) > len(r.shape)
        ):
            return None
        s = r.inputs[1]
    else:
        return None
    return s, [nid]


def match(g: EinsumGraph, y: Node, outputs: set[int]) -> tuple[int, int, float, list[int]] | None:
    """(x, axis, eps, intermediates) when ``y`` ends a hand-written layer normalization."""
    if y.kind != ops.BINARY or y.op not in ("div", "mul"):
        return None
    extra: list[int] = []
    if y.op == "div":
        d, s = y.inputs
    else:
        d = s = None
        for a, b in (y.inputs, y.inputs[::-1]):
            inv = _inverse_sqrt(g, b)
            if inv is not None and _only_users(g, b, {y.id}, outputs):
                d, (s, extra) = a, inv
                break
        if d is None:
            return None
    sn, dn = g.node(s), g.node(d)
    if not _is_op(sn, ops.UNARY, "sqrt") or not _is_op(dn, ops.BINARY, "sub"):
        return None
    x, m = dn.inputs
    xn = g.node(x)
    mm = _mean_keepdims(g, m)
    if mm is None or mm[0] != x:
        return None
    axis = mm[1]
    # the sum v + eps under the sqrt
    an = g.node(sn.inputs[0])
    if not _is_op(an, ops.BINARY, "add"):
        return None
    for v, c in (an.inputs, an.inputs[::-1]):
        eps = _eps_value(g, c, g.node(v))
        mv = _mean_keepdims(g, v) if eps is not None else None
        if mv is not None:
            break
    else:
        return None
    q, v_axis = mv
    if v_axis != axis or not _squared(g, g.node(q), d):
        return None
    chain = [m, d, q, v, an.id, s, *extra]
    if any(g.node(n).dtype != xn.dtype for n in chain + [y.id]):
        return None
    if tuple(y.shape) != tuple(xn.shape) or tuple(g.node(an.id).shape) != tuple(g.node(v).shape):
        return None
    last = {m: {d}, d: {q, y.id}, q: {v}, v: {an.id}, an.id: {s}, s: {extra[0] if extra else y.id}}
    for nid, users in last.items():
        if not _only_users(g, nid, users, outputs):
            return None
    return x, axis, eps, chain


def _layernorm(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Replace every hand-written layer normalization by one ``layer_norm`` row op."""
    g: EinsumGraph | None = None
    found = 0
    outs = output_ids(graph)  # a rewrite keeps every id that an output names
    for node in graph.nodes:
        cur = g if g is not None else graph
        if node.id not in cur:
            continue
        hit = match(cur, cur.node(node.id), outs)
        if hit is None:
            continue
        x, axis, eps, chain = hit
        if g is None:
            g = graph.copy()
        y = g.node(node.id)
        new = Node(
            y.id,
            ops.ROWOP,
            "layer_norm",
            (x,),
            tuple(y.shape),
            y.dtype,
            y.name,
            MappingProxyType({"axis": axis, "eps": eps}),
        )
        g.replace_node(y.id, new)
        # users before producers, so each node is unused when it goes
        for nid in reversed(chain):
            if nid in g and not g.users(nid):
                g.remove_node(nid)
        found += 1
    if g is None:
        return PassResult(graph, False, {})
    return PassResult(g, True, {"layer_norms": found})


layernorm = function_pass("layernorm", _layernorm)
