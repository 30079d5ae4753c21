"""Schedule a step as soon as its operands exist when that frees memory.

The schedule is the graph's insertion order, which leaves steps that only end other values'
lives far from those values: the casts a mixed-precision plan adds at the end, turning each
bfloat16 gradient into its float32 output, would otherwise keep every bfloat16 gradient alive
until the last step. A step moves up to right after its latest operand when every operand it
reads from the arena dies there and its own result is no larger than what it frees (or is an
output, which lives outside the arena): the live bytes can only go down.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..ir import ops
from ..ir.graph import EinsumGraph

_LEAVES = (ops.INPUT, ops.CONSTANT)
# steps light enough to move: no contraction or reduction scratch lands at the new place
_CHEAP = (*ops.ELEMENTWISE_KINDS, ops.CAST)


def _nbytes(node) -> int:
    if any(isinstance(d, str) for d in node.shape):
        return 0
    return math.prod(node.shape) * np.dtype(node.dtype).itemsize


def hoist(graph: EinsumGraph, order: list[int]) -> list[int]:
    """``order`` with memory-freeing steps moved up (a topological order still)."""
    pos = {nid: k for k, nid in enumerate(order)}
    # candidates first (cheap steps that could move up at all): a chain has none, and then the
    # last uses of every value are not needed
    candidates = []
    for nid in order:
        node = graph.node(nid)
        if node.kind not in _CHEAP or not node.inputs:
            continue
        ins = [i for i in node.inputs if graph.node(i).kind not in _LEAVES]
        if not ins:
            continue
        anchor = max(node.inputs, key=pos.__getitem__)
        if pos[anchor] + 1 < pos[nid]:
            candidates.append((nid, node, ins, anchor))
    if not candidates:
        return order
    last_use: dict[int, int] = {}
    for nid in order:
        for i in graph.node(nid).inputs:
            last_use[i] = max(last_use.get(i, -1), pos[nid])
    outputs = set(graph.outputs.values())
    after: dict[int, list[int]] = defaultdict(list)  # node -> steps moved right after it
    moved: set[int] = set()
    for nid, node, ins, anchor in candidates:
        if anchor in moved:
            continue
        if any(last_use[i] != pos[nid] or i in outputs for i in ins):
            continue  # an operand lives on: moving frees nothing
        freed = sum(_nbytes(graph.node(i)) for i in set(ins))
        if nid not in outputs and _nbytes(node) >= freed:
            continue
        after[anchor].append(nid)
        moved.add(nid)
    if not moved:
        return order
    new: list[int] = []

    def place(nid: int) -> None:
        new.append(nid)
        for m in after.get(nid, ()):
            place(m)

    for nid in order:
        if nid not in moved:
            place(nid)
    return new
