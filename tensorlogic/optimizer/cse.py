"""Common subexpression elimination over a canonical key per node.

Keys: einsum specs alpha-renamed (``ab,bc->ac`` equals ``xy,yz->xz``) with their operands put in
a canonical order (the letters follow the operands), commutative operands sorted, constants keyed
by dtype, shape and bytes (equal values merge). Graph inputs never merge. An output node is never
dropped in favour of another node: when a duplicate is an output, it becomes the survivor.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from typing import Any, Mapping

from ..ir import ops, spec as einspec
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass
from .util import hashable, parse_spec

# args that only carry planning metadata: two einsums differing only there compute the same thing
_PLANNING_ARGS = ("path_strategy", "path_info", "path_slices")
_MAX_ORDERINGS = 24


def einsum_key(spec: str, inputs: tuple[int, ...], ranks: list[int]) -> tuple:
    """Canonical form of an einsum over the given input ids.

    Operands are sorted by input id; among operands with the same input the smallest
    alpha-canonical spec wins, so consistent permutations and renamings give one key.
    """
    es = parse_spec(spec, tuple(ranks))
    order = sorted(range(len(inputs)), key=lambda k: inputs[k])
    groups = [list(g) for _, g in itertools.groupby(order, key=lambda k: inputs[k])]
    n_orders = math.prod(math.factorial(len(g)) for g in groups)
    if n_orders > _MAX_ORDERINGS:
        candidates = [order]
    else:
        candidates = [
            [k for grp in perm for k in grp]
            for perm in itertools.product(*(itertools.permutations(g) for g in groups))
        ]
    best = min(
        str(einspec.canonical(einspec.EinsumSpec(tuple(es.inputs[k] for k in cand), es.output)))
        for cand in candidates
    )
    return (ops.EINSUM, tuple(sorted(inputs)), best)


def node_key(
    g: EinsumGraph, node: Node, inputs: tuple[int, ...], lone: frozenset = frozenset()
) -> tuple | None:
    """The CSE key of ``node`` whose inputs are (already deduplicated) ``inputs``; None: unique.

    ``lone`` holds constants whose dtype and shape no other constant shares: they cannot have a
    twin, so their contents are not hashed (weights of MBs would cost milliseconds per pass).
    """
    if node.kind == ops.INPUT:
        return None
    if node.kind == ops.CONSTANT:
        if node.id in lone:
            return None
        arr = g.constants[node.id]
        digest = hashlib.blake2b(arr.tobytes(), digest_size=16).hexdigest()
        return (ops.CONSTANT, node.dtype, tuple(arr.shape), digest)
    if node.kind == ops.EINSUM:
        ranks = [len(g.node(i).shape) for i in inputs]
        extra = {k: v for k, v in node.args.items() if k != "spec" and k not in _PLANNING_ARGS}
        return (*einsum_key(node.args["spec"], inputs, ranks), hashable(extra), node.dtype)
    if node.kind == ops.BINARY and ops.ELEMENTWISE[node.op].commutative:
        inputs = tuple(sorted(inputs))
    return (node.kind, node.op, inputs, hashable(node.args), node.dtype, tuple(node.shape))


def _cse(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Merge nodes with equal canonical keys."""
    outputs = set(graph.outputs.values())
    alias: dict[int, int] = {}  # removed node -> survivor
    table: dict[tuple, int] = {}
    merges: list[tuple[int, int]] = []  # (node to drop, survivor), in discovery order
    swapped = False  # an output survived over an earlier twin: its users now point forward
    kinds = Counter((n.dtype, tuple(n.shape)) for n in graph if n.kind == ops.CONSTANT)
    lone = frozenset(
        n.id for n in graph if n.kind == ops.CONSTANT and kinds[(n.dtype, tuple(n.shape))] == 1
    )
    for node in graph:
        ins = tuple(alias.get(i, i) for i in node.inputs)
        key = node_key(graph, node, ins, lone)
        if key is None:
            continue
        rep = table.get(key)
        if rep is None:
            table[key] = node.id
            continue
        if node.id in outputs and rep in outputs:
            continue  # two outputs keep their own buffers
        if node.id in outputs:  # keep the output node; the earlier twin goes
            table[key] = node.id
            alias[rep] = node.id
            for k, v in alias.items():
                if v == rep:
                    alias[k] = node.id
            merges.append((rep, node.id))
            swapped = True
        else:
            alias[node.id] = rep
            merges.append((node.id, rep))
    if not merges:
        return PassResult(graph, False, {})
    g = graph.copy()
    for drop, keep in merges:
        g.redirect(drop, keep)
        g.remove_node(drop)
    if swapped:
        g.reorder()
    return PassResult(g, True, {"merged": len(merges)})


cse = function_pass("cse", _cse)
