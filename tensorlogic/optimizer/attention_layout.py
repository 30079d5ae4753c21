"""Choose the memory layout of each attention node's q, k, v and result (``layout`` argument).

A multi-head projection ``bsd,dhe->bhse`` is one GEMM ``(B*S, D) x (D, H*E)`` whose product lies
in ``(b, s, h, e)`` order; writing it as ``(b, h, s, e)`` costs a regrouping copy of the whole
result, and so does reading a ``(b, h, q, e)`` attention result in the output projection
``bhqe,hed->bqd``. An attention kernel that reads its operands with a row stride and a batch
decomposition (``ir/attention.py``) can take the projections' natural layout instead.

For each attention node this pass tries every position of the sequence axis, per operand:

* q, k or v produced by an einsum that nothing else reads: the einsum's output term is
  re-ordered, and the position kept is the one whose contraction plan copies least (ties keep
  the canonical layout);
* q, k or v that is a transpose moving only the sequence axis: the attention reads the
  transpose's input directly;
* the result, when every user is an einsum: the users' terms for it are re-ordered, the
  position chosen by the same copy count over all users.

The shapes change with the layout, so the memory plan and every consumer see the real tensor.
Runs only where the compile option ``attention_layout`` allows (the backend's default:
``Capabilities.attention_layouts``, the dtypes whose attention kernel reads strided layouts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ..errors import GraphError, TensorLogicError
from ..ir import attention as attn_ir
from ..ir import ops, pairwise
from ..ir import spec as einspec
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass
from .util import output_ids, parse_spec, remove_if_unused

# symbolic sizes count as this when layouts are compared (only sizes of 1 change the plan)
_SYMBOLIC_SIZE = 7


def _concrete(shape) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else _SYMBOLIC_SIZE for d in shape)


def _copy_cost(terms: list[str], output: str, in_shapes: list[tuple], dts: list[str], path) -> int:
    """Elements an einsum's contraction plan copies (operand regroupings and a result that is
    not written in place), or a large number when it can't be planned."""
    spec = ",".join(terms) + "->" + output
    shapes = [_concrete(s) for s in in_shapes]
    try:
        es = einspec.parse(spec, [len(s) for s in shapes])
        sizes = einspec.letter_sizes(es, shapes)
        plan = pairwise.plan_einsum(es, shapes, sizes, path, dts)
    except (TensorLogicError, ValueError, KeyError):
        return 1 << 62
    if len(terms) == 1:  # a one-operand einsum copies its whole result
        return math.prod(sizes[c] for c in es.output)
    return plan.copied + sum(math.prod(s) for s, _dt in plan.scratch)


def _einsum_parts(g: EinsumGraph, node: Node):
    es = parse_spec(node.args["spec"], tuple(len(g.node(i).shape) for i in node.inputs))
    return list(es.inputs), es.output


def _laid_out(letters: str, j: int) -> str:
    return "".join(attn_ir.laid_out_shape(tuple(letters), j))


def _with_spec(node: Node, terms: list[str], output: str, shape: tuple) -> Node:
    args = dict(node.args)
    args["spec"] = ",".join(terms) + "->" + output
    return replace(node, args=MappingProxyType(args), shape=tuple(shape))


def _operand_choice(g: EinsumGraph, att: Node, pos: int, outputs: set[int]):
    """(layout position, rewrite) for operand ``pos`` of ``att``; rewrite is None to keep it."""
    rank = len(att.shape)
    canon = rank - 2
    nid = att.inputs[pos]
    src = g.node(nid)
    if src.kind == ops.TRANSPOSE:
        perm = [int(a) for a in src.args["perm"]]
        for j in range(rank - 1):
            if j != canon and perm == attn_ir.to_canonical_perm(rank, j):
                return j, ("read", src.inputs[0])
    private = nid not in outputs and g.users(nid) == [att.id] and att.inputs.count(nid) == 1
    if src.kind != ops.EINSUM or not private:
        return canon, None
    terms, out = _einsum_parts(g, src)
    in_nodes = [g.node(i) for i in src.inputs]
    shapes = [tuple(n.shape) for n in in_nodes]
    dts = [n.dtype for n in in_nodes]
    path = src.args.get("path_strategy")
    costs = {j: _copy_cost(terms, _laid_out(out, j), shapes, dts, path) for j in range(rank - 1)}
    best = min(costs, key=lambda j: (costs[j], j != canon))
    if best == canon:
        return canon, None
    new = _with_spec(src, terms, _laid_out(out, best), attn_ir.laid_out_shape(src.shape, best))
    return best, ("einsum", new)


def _result_choice(g: EinsumGraph, att: Node, outputs: set[int]):
    """(layout position, rewritten users) for the result of ``att``."""
    rank = len(att.shape)
    canon = rank - 2
    users = g.users(att.id)
    if att.id in outputs or not users or any(g.node(u).kind != ops.EINSUM for u in users):
        return canon, []
    parts = []
    for u in users:
        un = g.node(u)
        terms, out = _einsum_parts(g, un)
        in_nodes = [g.node(i) for i in un.inputs]
        parts.append((un, terms, out, in_nodes))

    def rewritten(j: int):
        res = []
        for un, terms, out, in_nodes in parts:
            new_terms = [_laid_out(t, j) if i == att.id else t for t, i in zip(terms, un.inputs)]
            shapes = [
                attn_ir.laid_out_shape(n.shape, j) if n.id == att.id else tuple(n.shape)
                for n in in_nodes
            ]
            res.append((un, new_terms, out, shapes, [n.dtype for n in in_nodes]))
        return res

    costs = {}
    for j in range(rank - 1):
        costs[j] = sum(
            _copy_cost(t, o, s, d, un.args.get("path_strategy")) for un, t, o, s, d in rewritten(j)
        )
    best = min(costs, key=lambda j: (costs[j], j != canon))
    if best == canon:
        return canon, []
    news = [_with_spec(un, t, o, un.shape) for un, t, o, _s, _d in rewritten(best)]
    return best, news


def _enabled(options: Mapping[str, Any]):
    enabled = options.get("attention_layout", False)
    if not isinstance(enabled, (bool, tuple)):
        raise GraphError(
            f"attention_layout must be True, False or a tuple of dtype names, got {enabled!r}"
        )
    return enabled


def _attention_layout(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Give every attention node (in an allowed dtype, canonical so far) the layout of its
    operands and result that saves the most regrouping copies."""
    enabled = _enabled(options)
    if enabled is False or enabled == ():
        return PassResult(graph, False, {})
    only = frozenset(enabled) if isinstance(enabled, tuple) else None
    g: EinsumGraph | None = None
    changed = 0
    for node in graph.nodes:
        cur = g if g is not None else graph
        if node.id not in cur or node.kind != ops.ATTENTION:
            continue
        att = cur.node(node.id)
        if att.args.get("layout") is not None or (only is not None and att.dtype not in only):
            continue
        outputs = output_ids(cur)
        choices = [_operand_choice(cur, att, p, outputs) for p in range(3)]
        jo, users = _result_choice(cur, att, outputs)
        canon = len(att.shape) - 2
        if all(c[1] is None for c in choices) and not users:
            continue
        if g is None:
            g = cur = graph.copy()
            att = cur.node(node.id)
        inputs = list(att.inputs)
        dropped = []
        for p, (_j, rw) in enumerate(choices):
            if rw is None:
                continue
            if rw[0] == "read":
                dropped.append(inputs[p])
                inputs[p] = rw[1]
            else:
                cur.replace_node(rw[1].id, rw[1])
        layout = tuple(c[0] for c in choices) + (jo,)
        args = {**att.args, "layout": layout}
        shape = attn_ir.laid_out_shape(att.shape, jo) if jo != canon else tuple(att.shape)
        cur.replace_node(
            att.id,
            replace(att, inputs=tuple(inputs), args=MappingProxyType(args), shape=tuple(shape)),
        )
        for un in users:
            cur.replace_node(un.id, un)
        for d in dropped:
            remove_if_unused(cur, d)
        changed += 1
    if g is None:
        return PassResult(graph, False, {})
    g.reorder()
    return PassResult(g, True, {"attention_layouts": changed})


attention_layout = function_pass("attention_layout", _attention_layout)
