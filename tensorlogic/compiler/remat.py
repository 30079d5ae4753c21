"""Recompute instead of keep: the memory plan's choice for cheap values read far apart.

A value computed by one elementwise step (a cast, a scaling, a fused elementwise group) from
graph inputs and constants alone is cheap to compute again, and its operands stay resident for
the whole call anyway. When its users fall into groups separated by other steps (a gradient
graph reads the bfloat16 copy of a weight in the forward pass and again, much later, in the
backward pass), keeping it alive across the gap holds its bytes for nothing: each later group
gets its own copy, computed right before the group's first user, and the original dies after
the first group. The peak can only go down (the copy lives no longer than the kept value
would), at the cost of one more elementwise step per group. Every other forward value the
backward pass reads (activations, softmax results, layer-norm inputs) is kept: recomputing it
would repeat the contractions it came from.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from ..ir import ops
from ..ir.fused import FusedBody
from ..ir.graph import EinsumGraph

# elementwise node kinds cheap enough to compute twice (reading resident operands only)
_CHEAP = (*ops.ELEMENTWISE_KINDS, ops.CAST)
_RESIDENT = (ops.INPUT, ops.CONSTANT)
# users closer than this many steps share one copy
GAP = 2


def _cheap(node) -> bool:
    if node.kind in _CHEAP:
        return True
    return node.kind == ops.FUSED and FusedBody.from_args(node.args["body"]).tail is None


def rematerialize(graph: EinsumGraph, order: list[int]) -> tuple[EinsumGraph, list[int], int]:
    """(graph, schedule, copies made): cheap values of resident operands recomputed for each
    later group of their users. ``graph`` is left unchanged (a copy is edited)."""
    outputs = set(graph.outputs.values())
    # the candidates first (cheap values of resident operands alone): most graphs have few,
    # and then the users of every node are not needed
    candidates = []
    for nid in order:
        node = graph.node(nid)
        if nid in outputs or not node.inputs:
            continue
        if all(graph.node(i).kind in _RESIDENT for i in node.inputs) and _cheap(node):
            candidates.append(nid)
    if not candidates:
        return graph, order, 0
    pos = {nid: k for k, nid in enumerate(order)}
    wanted = set(candidates)
    users: dict[int, set[int]] = defaultdict(set)
    for nid in order:
        for i in graph.node(nid).inputs:
            if i in wanted:
                users[i].add(nid)
    plans: list[tuple[int, list[int]]] = []  # (node, first users of its later groups)
    for nid in candidates:
        us = sorted(users[nid], key=pos.__getitem__)
        groups, cur = [], [us[0]] if us else []
        for a, b in zip(us, us[1:]):
            if pos[b] - pos[a] > GAP:
                groups.append(cur)
                cur = []
            cur.append(b)
        if cur:
            groups.append(cur)
        if len(groups) > 1:
            plans.append((nid, groups[1:]))
    if not plans:
        return graph, order, 0
    g = graph.copy()
    before: dict[int, list[int]] = defaultdict(list)  # user id -> copies scheduled before it
    made = 0
    for nid, later in plans:
        node = g.node(nid)
        for group in later:
            extra = {"shape": node.shape, "dtype": node.dtype} if node.kind == ops.FUSED else {}
            copy = g.add_node(node.kind, node.op, list(node.inputs), dict(node.args), **extra)
            made += 1
            for u in group:
                un = g.node(u)
                g.replace_node(
                    u, replace(un, inputs=tuple(copy if i == nid else i for i in un.inputs))
                )
            before[group[0]].append(copy)
    new_order: list[int] = []
    for nid in order:
        new_order.extend(before.get(nid, ()))
        new_order.append(nid)
    return g, new_order, made
