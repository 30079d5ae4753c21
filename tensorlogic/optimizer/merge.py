"""Einsum merging: grow tensor networks so the contraction planner sees them whole.

Rewrites (each keeps the surviving node's id and name):

* an einsum operand produced by another einsum that nothing else uses is replaced by that
  einsum's operands (its letters renamed: output letters take the consumer's letters, summed
  letters get fresh ones, so no letter clashes);
* an operand ``x * s`` with a scalar ``s`` (shape ``()``) becomes two operands ``x`` and ``s``
  (also when several einsums use the product and nothing else does: each takes both);
* ``einsum(...) * s`` becomes one einsum with ``s`` as an extra scalar operand.

Scalars thereby move through contractions to wherever the planner finds them cheapest. A merge
needs every operand to have the result's dtype (so no intermediate rounding is skipped), and is
checked by re-inferring the merged spec: it must give the same shape (repeated indices and size-1
broadcasts that would not survive the merge are left alone).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import TensorLogicError
from ..ir import infer, ops, spec as einspec
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass
from .util import parse_spec, remove_if_unused, single_user


def _spec_text(terms: list[str] | tuple[str, ...], output: str) -> str:
    return ",".join(terms) + "->" + output


def _parsed(g: EinsumGraph, node: Node) -> einspec.EinsumSpec:
    return parse_spec(node.args["spec"], tuple(len(g.node(i).shape) for i in node.inputs))


def _checked(
    g: EinsumGraph, node: Node, terms: list[str], output: str, inputs: list[int]
) -> Node | None:
    """The einsum record with the new operands if it infers to the node's shape and dtype."""
    spec = _spec_text(terms, output)
    in_nodes = [g.node(i) for i in inputs]
    if any(n.dtype != node.dtype for n in in_nodes):
        return None
    try:
        shape, dtype = infer.infer(ops.EINSUM, None, in_nodes, {"spec": spec}, node.name)
    except TensorLogicError:
        return None
    if tuple(shape) != tuple(node.shape) or dtype != node.dtype:
        return None
    return replace(
        node, kind=ops.EINSUM, op=None, inputs=tuple(inputs), args=MappingProxyType({"spec": spec})
    )


def _scalar_split(g: EinsumGraph, nid: int) -> tuple[int, int] | None:
    """(x, s) if node ``nid`` is ``x * s`` with ``s`` a scalar and ``x`` of the product's shape."""
    node = g.node(nid)
    if node.kind != ops.BINARY or node.op != "mul":
        return None
    a, b = node.inputs
    for x, s in ((a, b), (b, a)):
        if g.node(s).shape == () and tuple(g.node(x).shape) == tuple(node.shape) and x != s:
            return x, s
    return None


def _shared_scalar_product(g: EinsumGraph, nid: int) -> bool:
    """Whether node ``nid`` is ``x * s`` (``s`` a scalar) used only by einsums, several times:
    each of them takes ``x`` and ``s`` as operands (its path scales whichever operand is
    cheapest), so the full-size product is never written (a gradient scaled by a constant and
    contracted twice, as attention's scores gradient is)."""
    users = g.users(nid)
    return (
        len(users) > 1
        and _scalar_split(g, nid) is not None
        and all(g.node(u).kind == ops.EINSUM for u in users)
    )


def absorb_operand(g: EinsumGraph, node: Node, outputs: set[int]) -> tuple[Node, int] | None:
    """Merge one producer of an einsum operand into the einsum; (new record, producer id)."""
    es = _parsed(g, node)
    for k, p in enumerate(node.inputs):
        if p in outputs:
            continue
        prod = g.node(p)
        if single_user(g, p) != node.id and not _shared_scalar_product(g, p):
            continue
        terms, inputs = list(es.inputs), list(node.inputs)
        if prod.kind == ops.EINSUM and single_user(g, p) == node.id:
            pes = _parsed(g, prod)
            mapping = dict(zip(pes.output, es.inputs[k]))
            used = set(es.letters)
            fresh = einspec.symbols(used)
            for c in pes.letters:
                if c not in mapping:
                    mapping[c] = next(fresh)
            new_terms = ["".join(mapping[c] for c in t) for t in pes.inputs]
            terms[k : k + 1] = new_terms
            inputs[k : k + 1] = list(prod.inputs)
        else:
            split = _scalar_split(g, p)
            if split is None:
                continue
            inputs[k] = split[0]
            terms.append("")
            inputs.append(split[1])
        new = _checked(g, node, terms, es.output, inputs)
        if new is not None:
            return new, p
    return None


def pull_scalar(g: EinsumGraph, node: Node, outputs: set[int]) -> tuple[Node, int] | None:
    """``einsum(...) * s`` -> one einsum with the scalar as an extra operand."""
    split = _scalar_split(g, node.id)
    if split is None:
        return None
    e, s = split
    prod = g.node(e)
    if prod.kind != ops.EINSUM or e in outputs or single_user(g, e) != node.id:
        return None
    pes = _parsed(g, prod)
    new = _checked(g, node, [*pes.inputs, ""], pes.output, [*prod.inputs, s])
    return (new, e) if new is not None else None


def _merge(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Merge einsum chains and pull scalar factors into them, in topological order."""
    g: EinsumGraph | None = None
    outputs = set(graph.outputs.values())
    stats = {"merged": 0, "scalars": 0}
    for node in graph:
        cur = g if g is not None else graph
        if node.id not in cur:
            continue
        node = cur.node(node.id)
        while True:
            if node.kind == ops.EINSUM:
                found = absorb_operand(cur, node, outputs)
            elif node.kind == ops.BINARY:
                found = pull_scalar(cur, node, outputs)
            else:
                found = None
            if found is None:
                break
            new, gone = found
            if g is None:
                g = cur = graph.copy()
            is_scalar = cur.node(gone).kind != ops.EINSUM or node.kind == ops.BINARY
            g.replace_node(node.id, new)
            remove_if_unused(g, gone)
            stats["scalars" if is_scalar else "merged"] += 1
            node = new
    if g is None:
        return PassResult(graph, False, {})
    return PassResult(g, True, {k: v for k, v in stats.items() if v})


merge = function_pass("merge", _merge)
