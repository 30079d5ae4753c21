"""The FLOP model of every node kind, in one place: the compiler's steps, the fusion pass and
the profiler's roofline all count with it.

Elementwise ops cost their op-table FLOPs per element, reductions and row ops the FLOPs of their
table rows (``ops.REDUCTION_TABLE``, ``ops.ROW_OP_FLOPS``) per element. Contractions are counted
by their contraction plan along the chosen path, not here.
"""

from __future__ import annotations

import math
from typing import Any

from . import ops
from .fused import FusedBody


def reduction_flops(op: str, n_in: int) -> int:
    """FLOPs of reducing ``n_in`` elements with ``op``."""
    return n_in * ops.REDUCTION_TABLE[op].flops


def row_op_flops(op: str, n: int) -> int:
    """FLOPs of the row op ``op`` over ``n`` elements."""
    return n * ops.ROW_OP_FLOPS[op]


def fused_flops(body: FusedBody) -> int:
    """FLOPs of a fused node, counted like the unfused steps it replaces."""
    n = math.prod(body.space)
    flops = body.flops_per_element() * n  # prologue and epilogue
    if body.tail in ops.ROW_OPS:
        flops += row_op_flops(body.tail, n)
    elif body.tail is not None:
        flops += reduction_flops(body.tail, n)
    return flops


def node_flops(node: Any, in_nodes: list) -> int:
    """FLOPs of one non-contraction node (0 for layout changes and casts)."""
    n = math.prod(node.shape)
    kind = node.kind
    if kind in ops.ELEMENTWISE_KINDS:
        return ops.ELEMENTWISE[node.op].flops * n
    if kind == ops.REDUCE:
        return reduction_flops(node.op, math.prod(in_nodes[0].shape))
    if kind == ops.ROWOP:
        return row_op_flops(node.op, n)
    if kind == ops.ROWGRAD:
        return ops.ROW_GRAD_FLOPS[node.op] * n
    if kind == ops.FUSED:
        return int(node.args.get("flops", 0))
    return 0


__all__ = ["fused_flops", "node_flops", "reduction_flops", "row_op_flops"]
