"""The FLOP model of every node kind, in one place: the compiler's steps, the fusion pass and
the profiler's roofline all count with it.

Elementwise ops cost their op-table FLOPs per element; a reduction one per input element
(logsumexp: max, exp, sum and log, counted as 10); a row op 10 per element (max or mean, an exp
or a square, a sum, a divide). Contractions are counted by their contraction plan along the
chosen path, not here.
"""

from __future__ import annotations

import math
from typing import Any

from . import ops
from .fused import FusedBody

ROW_OP_FLOPS = 10
REDUCTION_FLOPS = {"logsumexp": 10}  # others: 1 per input element


def reduction_flops(op: str, n_in: int) -> int:
    """FLOPs of reducing ``n_in`` elements with ``op``."""
    return n_in * REDUCTION_FLOPS.get(op, 1)


def fused_flops(body: FusedBody) -> int:
    """FLOPs of a fused node, counted like the unfused steps it replaces."""
    n = math.prod(body.space)
    flops = body.flops_per_element() * n  # prologue and epilogue
    if body.tail in ops.ROW_OPS:
        flops += ROW_OP_FLOPS * n
    elif body.tail is not None:
        flops += reduction_flops(body.tail, n)
    return flops


def node_flops(node: Any, in_nodes: list) -> int:
    """FLOPs of one non-contraction node (0 for layout changes and casts)."""
    n = math.prod(node.shape)
    kind = node.kind
    if kind in (ops.UNARY, ops.BINARY):
        return ops.ELEMENTWISE[node.op].flops * n
    if kind == ops.WHERE:
        return n
    if kind == ops.REDUCE:
        return reduction_flops(node.op, math.prod(in_nodes[0].shape))
    if kind == ops.ROWOP:
        return ROW_OP_FLOPS * n
    if kind == ops.FUSED:
        return int(node.args.get("flops", 0))
    return 0


__all__ = ["ROW_OP_FLOPS", "fused_flops", "node_flops", "reduction_flops"]
