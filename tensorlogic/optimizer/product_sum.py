"""Einsums without data reuse become an elementwise product and a sum, which fusion joins.

An einsum in which one operand holds every index (``a,a,ba,ba->b``: a kernel machine's weighted
sum of squared kernel values; ``ij,ij->i``) does one multiply-add per element of that operand:
there is no reuse for a GEMM to exploit, so BLAS gains nothing, and the pairwise plan writes a
full-size intermediate per pair and reads it back. Written as ``sum(x * y * ..., trailing
axes)``, the fusion pass makes it one kernel that reads each operand once, together with the
elementwise ops that produced them (the ``+ 1`` of a polynomial kernel): one pass over memory
instead of three to five.

Rewritten only where fusion gains a producer: an operand that holds every index is made by an
elementwise node that nothing else uses (so it is never written). Alone, BLAS's dot loops or
numpy's einsum read the operands as fast as a generated kernel (measured on ``i,i->``,
``ij,ij->i`` and ``ij,ij->``, which stay einsums). Each
operand must have the einsum's float dtype, no index may repeat within an operand, every index
must have one size in all operands, the full operand's index order must start with the output's
(the summed indices trailing, as the fused reduction needs), and every other operand's indices
must appear in that order (they broadcast through a reshape that only adds size-1 axes).
"""

from __future__ import annotations

from typing import Any, Mapping

from .. import dtypes
from ..ir import ops
from ..ir.graph import EinsumGraph, Node
from ..ir.node import freeze
from .base import PassResult, function_pass
from .util import output_ids, parse_spec


def _plan(g: EinsumGraph, node: Node) -> tuple[str, list[str]] | None:
    """(full term, operand terms) if ``node`` is an einsum to rewrite, else None."""
    if node.kind != ops.EINSUM or len(node.inputs) < 2 or node.dtype not in dtypes.FLOATS:
        return None
    ins = [g.node(i) for i in node.inputs]
    if any(n.dtype != node.dtype for n in ins):
        return None  # mixed dtypes: the einsum's own promotion and accumulation apply
    es = parse_spec(node.args["spec"], tuple(len(n.shape) for n in ins))
    terms, out = list(es.inputs), es.output
    if any(len(set(t)) != len(t) for t in terms):
        return None
    sizes: dict[str, Any] = {}
    for t, n in zip(terms, ins):
        for c, d in zip(t, n.shape):
            if sizes.setdefault(c, d) != d:
                return None  # a size-1 broadcast of an index: left to the einsum
    letters = set(sizes)
    full = [k for k, t in enumerate(terms) if set(t) == letters]
    if not full:
        return None
    order = terms[full[0]]
    if order[: len(out)] != out or any(terms[k] != order for k in full):
        return None
    for t in terms:
        pos = [order.index(c) for c in t]
        if pos != sorted(pos):
            return None
    outs = output_ids(g)
    fusable = any(
        ins[k].kind in ops.ELEMENTWISE_KINDS
        and ins[k].id not in outs
        and g.users(ins[k].id) == [node.id]
        for k in full
    )
    return (order, terms) if fusable else None


def _broadcast(g: EinsumGraph, nid: int, term: str, order: str) -> int:
    """The operand with size-1 axes for the indices of ``order`` it lacks (numpy broadcasting
    aligns trailing axes, so a term that ends ``order`` needs none)."""
    if not term or order.endswith(term):
        return nid
    shape = g.node(nid).shape
    target = [1] * (len(order) - order.index(term[0]))
    for c, d in zip(term, shape):
        target[order.index(c) - order.index(term[0])] = d
    return g.add_node(ops.RESHAPE, None, [nid], {"shape": target})


def _rewrite(g: EinsumGraph, node: Node, order: str, terms: list[str]) -> None:
    """Replace ``node`` (keeping its id and name) by products of its operands and a sum."""
    operands = [(len(t), _broadcast(g, nid, t, order)) for nid, t in zip(node.inputs, terms)]
    # small operands first: their products stay small; the full-size ones join last
    ids = [nid for _, nid in sorted(operands, key=lambda p: p[0])]
    summed = list(range(len(node.shape), len(order)))
    acc = ids[0]
    for nid in ids[1:] if summed else ids[1:-1]:
        acc = g.add_node(ops.BINARY, "mul", [acc, nid])
    if summed:
        kind, op, inputs, args = ops.REDUCE, "sum", (acc,), {"axes": summed, "keepdims": False}
    else:
        kind, op, inputs, args = ops.BINARY, "mul", (acc, ids[-1]), {}
    new = Node(node.id, kind, op, inputs, node.shape, node.dtype, node.name, freeze(args))
    g.replace_node(node.id, new)


def _product_sum(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Rewrite every einsum without data reuse as an elementwise product and a sum."""
    del options
    g: EinsumGraph | None = None
    found = 0
    for node in graph.nodes:
        cur = g if g is not None else graph
        if node.id not in cur:
            continue
        hit = _plan(cur, cur.node(node.id))
        if hit is None:
            continue
        if g is None:
            g = graph.copy()
        _rewrite(g, g.node(node.id), *hit)
        found += 1
    if g is None:
        return PassResult(graph, False, {})
    g.reorder()
    return PassResult(g, True, {"rewritten": found})


product_sum = function_pass("product_sum", _product_sum)
