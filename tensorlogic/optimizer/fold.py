"""Constant folding: nodes whose inputs are all constants are evaluated once, at compile time.

Folding runs the numpy backend's own kernels, so a folded value is bit-for-bit what the plan
would have computed at run time. A folded node keeps its id and name (it becomes a constant).
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..ir import ops
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass

# Results larger than this (elements) are folded only if they are no larger than their inputs:
# folding must not turn a cheap broadcast into a huge stored constant.
MAX_FOLD_ELEMENTS = 1 << 22


def evaluate(node: Node, in_nodes: list[Node], arrays: list[np.ndarray]) -> np.ndarray:
    """Compute one node on numpy arrays with the numpy backend's kernel for it."""
    from ..backends import kernels
    from ..backends.fused_numpy import fused_kernel

    if node.kind == ops.EINSUM:
        kernel = kernels.einsum_kernel(np, node, in_nodes)
    elif node.kind == ops.FUSED:
        kernel = fused_kernel(node, in_nodes)
    else:
        kernel = kernels.make_kernel(np, node, in_nodes, True)
    out = np.empty(tuple(node.shape), node.dtype)
    with np.errstate(all="ignore"):
        res = kernel(arrays, out)
    if res is not out:  # a view of an input: the constant must own its memory
        res = np.array(res, dtype=node.dtype, copy=True).reshape(tuple(node.shape))
    res.setflags(write=False)
    return res


def _foldable(g: EinsumGraph, node: Node) -> bool:
    if node.kind in (ops.INPUT, ops.CONSTANT) or not node.inputs:
        return False
    if any(g.node(i).kind != ops.CONSTANT for i in node.inputs):
        return False
    size = math.prod(node.shape)
    return size <= MAX_FOLD_ELEMENTS or size <= sum(g.constants[i].size for i in node.inputs)


def _fold(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Replace every node whose inputs are all constants by its value."""
    g: EinsumGraph | None = None
    folded = 0
    for node in graph:
        cur = g if g is not None else graph
        if not _foldable(cur, node):
            continue
        in_nodes = [cur.node(i) for i in node.inputs]
        value = evaluate(node, in_nodes, [cur.constants[i] for i in node.inputs])
        if g is None:
            g = graph.copy()
        g.replace_node(node.id, replace(node, kind=ops.CONSTANT, op=None, inputs=(),
                                             args=MappingProxyType({})))
        g.constants[node.id] = value
        folded += 1
    if g is None:
        return PassResult(graph, False, {})
    return PassResult(g, True, {"folded": folded})


fold = function_pass("fold", _fold, (1, 2, 3))
