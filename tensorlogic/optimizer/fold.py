"""Constant folding: nodes whose inputs are all constants are evaluated once, at compile time.

Values come from the IR's evaluator (``ir.evaluate.evaluate_node``: textbook numpy in the node's
dtype), not from any backend, so the optimizer depends on the IR alone; the compile option
``fold_evaluator`` may pass another ``evaluate(node, arrays) -> array``. A folded node keeps its
id and name (it becomes a constant).
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from ..ir import ops
from ..ir.evaluate import evaluate_node
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass

# Results larger than this (elements) are folded only if they are no larger than their inputs:
# folding must not turn a cheap broadcast into a huge stored constant.
MAX_FOLD_ELEMENTS = 1 << 22

Evaluator = Callable[[Node, list[np.ndarray]], np.ndarray]


def evaluate(
    node: Node, arrays: list[np.ndarray], evaluator: Evaluator | None = None
) -> np.ndarray:
    """One node's value on constant operands, as a read-only array that owns its memory."""
    with np.errstate(all="ignore"):
        res = (evaluator or evaluate_node)(node, arrays)
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


def fold_node(g: EinsumGraph, node: Node, evaluator: Evaluator | None = None) -> None:
    """Make ``node`` (whose inputs are constants of ``g``) a constant holding its value, in
    place: it keeps its id and name."""
    value = evaluate(node, [g.constants[i] for i in node.inputs], evaluator)
    g.replace_node(
        node.id, replace(node, kind=ops.CONSTANT, op=None, inputs=(), args=MappingProxyType({}))
    )
    g.constants[node.id] = value


def _fold(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Replace every node whose inputs are all constants by its value."""
    evaluator = options.get("fold_evaluator")
    g: EinsumGraph | None = None
    folded = 0
    for node in graph:
        cur = g if g is not None else graph
        if not _foldable(cur, node):
            continue
        if g is None:
            g = graph.copy()
        fold_node(g, node, evaluator)
        folded += 1
    if g is None:
        return PassResult(graph, False, {})
    return PassResult(g, True, {"folded": folded})


fold = function_pass("fold", _fold)
