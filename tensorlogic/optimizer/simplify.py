"""Algebraic simplification from a small rule table.

Each rule looks at one node and returns a rewrite or None:
``Alias(nid)`` (the node equals an existing node; never applied to an output, whose id must
survive), ``Rewrite(node)`` (a new record under the same id and name) or ``Fill(value)`` (the node
is a constant of its own shape).

NaN/inf semantics (the ``x*0`` rule): by default ``x*0`` is left alone, because IEEE arithmetic
gives ``inf*0 = nan`` and ``nan*0 = nan``; replacing it by zeros would hide non-finite values the
user may be relying on. With the compile option ``assume_finite=True`` (the user promises finite
inputs, like a fast-math flag) ``x*0`` and ``0*x`` become a zero constant. ``x+0``/``x-0`` drop
the zero even though ``-0.0 + 0.0`` is ``+0.0``: only the sign of a zero can change. ``x*1``,
``x/1``, ``x**1``, ``neg(neg x)``, transposes, reshapes and same-dtype casts are exact.
``one_minus(one_minus x)`` is exact algebraically and removes rounding (``1-(1-x)`` loses the
low bits of a small ``x``), so results can only get closer to the real value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import TensorLogicError
from ..ir import infer, ops
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass
from .util import is_identity_matrix, parse_spec, remove_if_unused, uniform_value


@dataclass(frozen=True)
class Alias:
    """The node computes exactly the value of node ``target``."""

    target: int


@dataclass(frozen=True)
class Rewrite:
    """Replace the node's record (same id and name)."""

    node: Node


@dataclass(frozen=True)
class Fill:
    """The node is a constant filled with ``value``."""

    value: float


Rule = Callable[[EinsumGraph, Node, Mapping[str, Any]], "Alias | Rewrite | Fill | None"]


def _same(g: EinsumGraph, node: Node, nid: int) -> bool:
    """``nid`` already has the node's shape and dtype, so the node may alias it."""
    other = g.node(nid)
    return tuple(other.shape) == tuple(node.shape) and other.dtype == node.dtype


def _binary_identity(g: EinsumGraph, node: Node, op: str, unit: float, sides: tuple[int, ...]):
    if node.kind != ops.BINARY or node.op != op:
        return None
    for k in sides:
        c, x = node.inputs[k], node.inputs[1 - k]
        val = uniform_value(g, c)
        # -0.0 == 0.0, so x + (-0.0) matches too (that one is even exact)
        if val is not None and val == unit and _same(g, node, x):
            return Alias(x)
    return None


def rule_mul_one(g, node, options):
    """x*1 and 1*x -> x."""
    return _binary_identity(g, node, "mul", 1.0, (0, 1))


def rule_add_zero(g, node, options):
    """x+0 and 0+x -> x (only the sign of a zero result can differ)."""
    return _binary_identity(g, node, "add", 0.0, (0, 1))


def rule_sub_zero(g, node, options):
    """x-0 -> x."""
    return _binary_identity(g, node, "sub", 0.0, (1,))


def rule_div_one(g, node, options):
    """x/1 -> x."""
    return _binary_identity(g, node, "div", 1.0, (1,))


def rule_pow_one(g, node, options):
    """x**1 -> x."""
    return _binary_identity(g, node, "pow", 1.0, (1,))


def rule_mul_zero(g, node, options):
    """x*0 -> 0, only with ``assume_finite=True`` (inf*0 and nan*0 are nan in IEEE arithmetic)."""
    if not options.get("assume_finite") or node.kind != ops.BINARY or node.op != "mul":
        return None
    if any(uniform_value(g, i) == 0.0 for i in node.inputs):
        return Fill(0.0)
    return None


def _involution(op: str):
    def rule(g, node, options):
        if node.kind == ops.UNARY and node.op == op:
            inner = g.node(node.inputs[0])
            if inner.kind == ops.UNARY and inner.op == op:
                return Alias(inner.inputs[0])
        return None

    rule.__doc__ = f"{op}({op}(x)) -> x."
    return rule


rule_neg_neg = _involution("neg")
rule_one_minus_twice = _involution("one_minus")


def rule_transpose(g, node, options):
    """transpose(transpose(x)) -> one transpose; an identity transpose -> x."""
    if node.kind != ops.TRANSPOSE:
        return None
    perm = tuple(node.args["perm"])
    src = node.inputs[0]
    inner = g.node(src)
    if inner.kind == ops.TRANSPOSE:
        p1 = tuple(inner.args["perm"])
        perm, src = tuple(p1[p] for p in perm), inner.inputs[0]
    if perm == tuple(range(len(perm))) and node.id not in options["_outputs"]:
        return Alias(src)
    if src != node.inputs[0]:
        return Rewrite(replace(node, inputs=(src,), args=MappingProxyType({"perm": perm})))
    return None


def rule_reshape(g, node, options):
    """reshape(reshape(x)) -> one reshape; a reshape to the same shape -> x."""
    if node.kind != ops.RESHAPE:
        return None
    src = node.inputs[0]
    inner = g.node(src)
    if inner.kind == ops.RESHAPE:
        src = inner.inputs[0]
    if tuple(g.node(src).shape) == tuple(node.shape) and node.id not in options["_outputs"]:
        return Alias(src)
    if src != node.inputs[0]:
        return Rewrite(
            replace(node, inputs=(src,), args=MappingProxyType({"shape": tuple(node.shape)}))
        )
    return None


def rule_cast_same(g, node, options):
    """A cast to the dtype the tensor already has -> x."""
    if node.kind == ops.CAST and g.node(node.inputs[0]).dtype == node.dtype:
        return Alias(node.inputs[0])
    return None


def rule_einsum_identity(g, node, options):
    """An identity-matrix operand ``ij`` of an einsum: rename one letter to the other, drop it."""
    if node.kind != ops.EINSUM or len(node.inputs) < 2:
        return None
    in_nodes = [g.node(i) for i in node.inputs]
    if not any(n.kind == ops.CONSTANT and len(n.shape) == 2 for n in in_nodes):
        return None
    es = parse_spec(node.args["spec"], tuple(len(n.shape) for n in in_nodes))
    for k, nid in enumerate(node.inputs):
        term = es.inputs[k]
        if len(term) != 2 or term[0] == term[1] or in_nodes[k].dtype != node.dtype:
            continue
        if not is_identity_matrix(g, nid):
            continue
        i, j = term
        if i in es.output and j in es.output:
            continue  # the result keeps the diagonal structure: the identity is needed
        old, new = (j, i) if j not in es.output else (i, j)
        terms = [t.replace(old, new) for m, t in enumerate(es.inputs) if m != k]
        spec = ",".join(terms) + "->" + es.output.replace(old, new)
        inputs = tuple(n for m, n in enumerate(node.inputs) if m != k)
        try:
            shape, dtype = infer.infer(
                ops.EINSUM, None, [g.node(n) for n in inputs], {"spec": spec}, node.name
            )
        except TensorLogicError:
            continue
        if tuple(shape) != tuple(node.shape) or dtype != node.dtype:
            continue  # e.g. the identity set a size that a broadcast dimension lacks
        return Rewrite(replace(node, inputs=inputs, args=MappingProxyType({"spec": spec})))
    return None


# which node kinds each rule can match: the pass only tries the rules of a node's kind
RULE_KINDS = {
    "mul_one": ops.BINARY,
    "add_zero": ops.BINARY,
    "sub_zero": ops.BINARY,
    "div_one": ops.BINARY,
    "pow_one": ops.BINARY,
    "mul_zero": ops.BINARY,
    "neg_neg": ops.UNARY,
    "one_minus_twice": ops.UNARY,
    "transpose": ops.TRANSPOSE,
    "reshape": ops.RESHAPE,
    "cast_same": ops.CAST,
    "einsum_identity": ops.EINSUM,
}

RULES: tuple[tuple[str, Rule], ...] = (
    ("mul_one", rule_mul_one),
    ("add_zero", rule_add_zero),
    ("sub_zero", rule_sub_zero),
    ("div_one", rule_div_one),
    ("pow_one", rule_pow_one),
    ("mul_zero", rule_mul_zero),
    ("neg_neg", rule_neg_neg),
    ("one_minus_twice", rule_one_minus_twice),
    ("transpose", rule_transpose),
    ("reshape", rule_reshape),
    ("cast_same", rule_cast_same),
    ("einsum_identity", rule_einsum_identity),
)


_BY_KIND: dict[str, list[tuple[str, Rule]]] = {}
for _name, _rule in RULES:
    _BY_KIND.setdefault(RULE_KINDS[_name], []).append((_name, _rule))


def _simplify(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Apply the rule table once over the graph in topological order."""
    g: EinsumGraph | None = None
    counts: dict[str, int] = {}
    outputs = set(graph.outputs.values())
    ctx = {**options, "_outputs": outputs}
    for node in graph:
        cur = g if g is not None else graph
        rules = _BY_KIND.get(node.kind)
        if not rules or node.id not in cur:
            continue
        node = cur.node(node.id)
        for name, rule in rules:
            action = rule(cur, node, ctx)
            if action is None or (isinstance(action, Alias) and node.id in outputs):
                continue
            if g is None:
                g = graph.copy()
                cur = g
            if isinstance(action, Alias):
                g.redirect(node.id, action.target)
                remove_if_unused(g, node.id)
            elif isinstance(action, Rewrite):
                g.replace_node(node.id, action.node)
                for i in node.inputs:
                    if i not in action.node.inputs:
                        remove_if_unused(g, i)
            else:
                arr = np.full(tuple(node.shape), action.value, dtype=node.dtype)
                arr.setflags(write=False)
                g.replace_node(
                    node.id,
                    replace(node, kind=ops.CONSTANT, op=None, inputs=(), args=MappingProxyType({})),
                )
                g.constants[node.id] = arr
                for i in node.inputs:
                    remove_if_unused(g, i)
            counts[name] = counts.get(name, 0) + 1
            break
    if g is None:
        return PassResult(graph, False, {})
    return PassResult(g, True, counts)


simplify = function_pass("simplify", _simplify)
