"""Scheduling: which nodes run, in what order, and the buffer each one produces."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..ir import ops
from ..ir.graph import EinsumGraph

# Nodes whose result can be a view of their input instead of a new buffer.
VIEW_KINDS = (ops.TRANSPOSE, ops.RESHAPE)


@dataclass(frozen=True)
class Buffer:
    """A tensor the plan holds: a graph input, a constant, an intermediate or an output."""

    id: int
    node_id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str  # "input" | "constant" | "intermediate" | "output"
    view_of: int | None = None  # buffer id this one is a view of (views own no memory)

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return int(math.prod(self.shape)) * itemsize(self.dtype)


@functools.cache
def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (``np.dtype`` per call costs more than the product)."""
    return np.dtype(dtype).itemsize


def needed_nodes(g: EinsumGraph) -> list[int]:
    """Ids of the nodes the outputs depend on, in topological (insertion) order."""
    need = g.live_nodes()
    return [n.id for n in g.nodes if n.id in need]


def make_buffers(g: EinsumGraph, order: list[int]) -> dict[int, Buffer]:
    """One buffer per scheduled node, keyed by node id (buffer id = position in ``order``)."""
    outputs = set(g.outputs.values())
    buffers: dict[int, Buffer] = {}
    # whether a buffer's array is C-contiguous: a reshape is a view only of a contiguous array
    # (graph inputs are assumed contiguous; a strided input makes numpy copy, which stays correct)
    contiguous: dict[int, bool] = {}
    for pos, nid in enumerate(order):
        node = g.node(nid)
        if node.kind == ops.INPUT:
            role = "input"
        elif node.kind == ops.CONSTANT:
            role = "constant"
        elif nid in outputs:
            role = "output"
        else:
            role = "intermediate"
        view_of = None
        contiguous[nid] = True
        if node.kind in VIEW_KINDS and role == "intermediate":
            src = node.inputs[0]
            if node.kind == ops.TRANSPOSE:
                view_of = buffers[src].id
                contiguous[nid] = contiguous[src] and _keeps_order(
                    g.node(src).shape, node.args["perm"]
                )
            elif contiguous[src]:
                view_of = buffers[src].id
        buffers[nid] = Buffer(pos, nid, node.name, tuple(node.shape), node.dtype, role, view_of)
    return buffers


def _keeps_order(shape, perm) -> bool:
    """True if transposing by ``perm`` leaves a C-contiguous array contiguous (unit axes aside)."""
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)
