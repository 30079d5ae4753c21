"""Choose the memory layout of each attention node's q, k, v and result (``layout`` argument).

A multi-head projection ``bsd,dhe->bhse`` is one GEMM ``(B*S, D) x (D, H*E)`` whose product lies
in ``(b, s, h, e)`` order; writing it as ``(b, h, s, e)`` costs a regrouping copy of the whole
result, and so does reading a ``(b, h, q, e)`` attention result in the output projection
``bhqe,hed->bqd``. An attention kernel that reads its operands with a row stride and a batch
decomposition (``ir/attention.py``) can take the projections' natural layout instead.

For each attention node this pass tries every order of the batch axes (up to three of them:
attention is the same function of every batch index, so any order serves) and, per operand,
every position of the sequence axis, and keeps the combination whose contraction plans copy
the fewest elements (ties keep the given order and the canonical layout):

* q, k or v produced by an einsum that nothing else reads: the einsum's output term is
  re-ordered;
* q, k or v that is a transpose of a tensor already in a wanted layout: the attention reads
  that tensor directly; any other operand keeps its layout, or gets a transpose (counted as a
  copy) where the batch order changes;
* the result, when every user is an einsum: the users' terms for it are re-ordered (another
  batch order is tried only then); the mask gets a transpose when the batch order changes.

The shapes change with the layout, so the memory plan and every consumer see the real tensor.
Runs only where the compile option ``attention_layout`` allows (the backend's default:
``Capabilities.attention_layouts``, the dtypes whose attention kernel reads strided layouts).
"""

from __future__ import annotations

import itertools
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
# batch orders are tried for attentions of up to this many batch axes (3! = 6 orders)
_MAX_PERMUTED = 3


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


def _size(shape) -> int:
    return math.prod(_concrete(shape))


def _batch_order(letters, pi: tuple[int, ...]) -> list:
    """Canonical ``letters`` (batch..., S, D) with the batch axes taken in the order ``pi``."""
    nb = len(pi)
    return [letters[i] for i in pi] + list(letters[nb:])


def _operand_option(g: EinsumGraph, att: Node, pos: int, pi, outputs: set[int]):
    """(copied elements, sequence position, rewrite) of the cheapest way to give operand
    ``pos`` of ``att`` to the attention with its batch axes in the order ``pi``. Rewrites:
    None (as it is), ("einsum", node) (the producer writes that layout), ("read", node) (read
    the input of a transpose directly), ("transpose", perm) (a transpose node, one copy)."""
    rank = len(att.shape)
    nb = rank - 2
    identity = tuple(pi) == tuple(range(nb))
    nid = att.inputs[pos]
    src = g.node(nid)
    size = _size(src.shape)
    if src.kind == ops.TRANSPOSE:
        # src = X.transpose(perm): a layout of src's axes that is X's own order reads X
        perm = [int(a) for a in src.args["perm"]]
        for j in range(rank - 1):
            axes = _laid_out_axes(_batch_order(list(range(rank)), pi), j)
            if [perm[a] for a in axes] == list(range(rank)):
                return 0, j, ("read", src.inputs[0])
    private = nid not in outputs and g.users(nid) == [att.id] and att.inputs.count(nid) == 1
    if src.kind == ops.EINSUM and private:
        terms, out = _einsum_parts(g, src)
        in_nodes = [g.node(i) for i in src.inputs]
        shapes = [tuple(n.shape) for n in in_nodes]
        dts = [n.dtype for n in in_nodes]
        path = src.args.get("path_strategy")
        order = _batch_order(out, pi)
        costs = {
            j: _copy_cost(terms, "".join(_laid_out_axes(order, j)), shapes, dts, path)
            for j in range(rank - 1)
        }
        best = min(costs, key=lambda j: (costs[j], j != nb))
        if best == nb and identity:
            return costs[best], best, None
        new_out = "".join(_laid_out_axes(order, best))
        shape = _laid_out_axes(_batch_order(tuple(src.shape), pi), best)
        return costs[best], best, ("einsum", _with_spec(src, terms, new_out, shape))
    # a strided view (a transpose) is copied by the kernel; another batch order costs a copy
    cost = size if src.kind == ops.TRANSPOSE or not identity else 0
    return cost, nb, (None if identity else ("transpose", list(pi) + [nb, nb + 1]))


def _laid_out_axes(order, j: int) -> list:
    """``order`` (batch..., S, D) with S moved to position ``j``."""
    return list(attn_ir.laid_out_shape(tuple(order), j))


def _result_option(g: EinsumGraph, att: Node, pi, outputs: set[int]):
    """(copied elements, sequence position, rewritten users) of the result in batch order
    ``pi``; None when the result can't take another layout (a graph output, or a user that is
    no einsum)."""
    rank = len(att.shape)
    nb = rank - 2
    users = g.users(att.id)
    if att.id in outputs or not users or any(g.node(u).kind != ops.EINSUM for u in users):
        return None
    parts = []
    for u in users:
        un = g.node(u)
        terms, out = _einsum_parts(g, un)
        parts.append((un, terms, out, [g.node(i) for i in un.inputs]))
    shape = _batch_order(tuple(att.shape), pi)

    def rewritten(j: int):
        res = []
        for un, terms, out, in_nodes in parts:
            new_terms = [
                "".join(_laid_out_axes(_batch_order(t, pi), j)) if i == att.id else t
                for t, i in zip(terms, un.inputs)
            ]
            shapes = [
                _laid_out_axes(shape, j) if n.id == att.id else tuple(n.shape) for n in in_nodes
            ]
            res.append((un, new_terms, out, shapes, [n.dtype for n in in_nodes]))
        return res

    costs = {
        j: sum(
            _copy_cost(t, o, s, d, un.args.get("path_strategy")) for un, t, o, s, d in rewritten(j)
        )
        for j in range(rank - 1)
    }
    best = min(costs, key=lambda j: (costs[j], j != nb))
    news = [_with_spec(un, t, o, un.shape) for un, t, o, _s, _d in rewritten(best)]
    return costs[best], best, news


def _mask_cost(g: EinsumGraph, att: Node, pi) -> int:
    """Elements copied to permute the mask's batch axes (0 where only size-1 axes move)."""
    if len(att.inputs) < 4:
        return 0
    rank = len(att.shape)
    mshape = (1,) * (rank - len(g.node(att.inputs[3]).shape)) + tuple(g.node(att.inputs[3]).shape)
    moved = [a for i, a in enumerate(pi) if a != i]
    if all(mshape[a] == 1 for a in moved):
        return 0
    return _size(mshape)


def _choose(g: EinsumGraph, att: Node, outputs: set[int]):
    """(batch order, operand options, result option) copying least; ties keep the given batch
    order and the canonical positions."""
    nb = len(att.shape) - 2
    identity = tuple(range(nb))
    perms = list(itertools.permutations(range(nb))) if nb <= _MAX_PERMUTED else [identity]
    best = None
    for pi in perms:
        res = _result_option(g, att, pi, outputs)
        if res is None and pi != identity:
            continue  # the result would need a transposing copy back: never cheaper
        opers = [_operand_option(g, att, p, pi, outputs) for p in range(3)]
        total = sum(o[0] for o in opers) + (res[0] if res else 0) + _mask_cost(g, att, pi)
        key = (total, pi != identity)
        if best is None or key < best[0]:
            best = (key, pi, opers, res)
    return best[1], best[2], best[3]


def _transposed(g: EinsumGraph, nid: int, perm: list[int], rank: int) -> int:
    """A transpose of node ``nid`` (first aligned to ``rank`` with leading size-1 axes)."""
    shape = tuple(g.node(nid).shape)
    if len(shape) < rank:
        nid = g.add_node(
            ops.RESHAPE, None, [nid], {"shape": [1] * (rank - len(shape)) + list(shape)}
        )
    return g.add_node(ops.TRANSPOSE, None, [nid], {"perm": perm})


def _enabled(options: Mapping[str, Any]):
    enabled = options.get("attention_layout", False)
    if not isinstance(enabled, (bool, tuple)):
        raise GraphError(
            f"attention_layout must be True, False or a tuple of dtype names, got {enabled!r}"
        )
    return enabled


def _attention_layout(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Give every attention node (in an allowed dtype, canonical so far) the batch order and
    layout of its operands and result that copy least."""
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
        rank = len(att.shape)
        nb = rank - 2
        pi, opers, res = _choose(cur, att, output_ids(cur))
        identity = tuple(pi) == tuple(range(nb))
        if identity and all(o[2] is None for o in opers) and (res is None or res[1] == nb):
            continue
        if g is None:
            g = cur = graph.copy()
            att = cur.node(node.id)
        inputs = list(att.inputs)
        dropped = []
        for p, (_c, _j, rw) in enumerate(opers):
            if rw is None:
                continue
            if rw[0] == "read":
                dropped.append(inputs[p])
                inputs[p] = rw[1]
            elif rw[0] == "einsum":
                cur.replace_node(rw[1].id, rw[1])
            else:
                inputs[p] = _transposed(cur, inputs[p], rw[1], rank)
        if len(inputs) == 4 and not identity:
            inputs[3] = _transposed(cur, inputs[3], list(pi) + [nb, nb + 1], rank)
        jo = res[1] if res is not None else nb
        layout = tuple(o[1] for o in opers) + (jo,)
        shape = attn_ir.laid_out_shape(_batch_order(tuple(att.shape), pi), jo)
        args = {**att.args, "layout": layout}
        cur.replace_node(
            att.id,
            replace(att, inputs=tuple(inputs), args=MappingProxyType(args), shape=tuple(shape)),
        )
        for un in res[2] if res is not None else []:
            cur.replace_node(un.id, un)
        for d in dropped:
            remove_if_unused(cur, d)
        changed += 1
    if g is None:
        return PassResult(graph, False, {})
    g.reorder()
    return PassResult(g, True, {"attention_layouts": changed})


attention_layout = function_pass("attention_layout", _attention_layout)
