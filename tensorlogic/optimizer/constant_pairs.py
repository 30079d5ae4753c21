"""Constant pairs of a contraction path, contracted once at compile time.

Merging puts a network's constants (weights, a scalar such as attention's ``1/sqrt(dk)``) into
one einsum with its inputs, and the planned path may contract two of them together: the scaled
key projection ``x . (s * Wk)`` multiplies the scale into the weight first. That pair's value is
the same on every call, so it is evaluated here, once, like the fold pass evaluates constant
nodes, and the einsum takes the result as one operand in place of the two (its path is then
planned again). A pair is taken only where it does not grow what the plan stores (its result no
larger than its larger operand), in float32/float64 (16-bit floats compute such products in
float32 at run time, so a stored rounded product would change the result), and not for learned
parameters, which change between calls.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import TensorLogicError
from ..ir import infer, ops
from ..ir.graph import EinsumGraph, Node
from .fold import fold_node
from .util import parse_spec

_DTYPES = ("float32", "float64")


def _constant_pair(g: EinsumGraph, node: Node) -> tuple[int, int] | None:
    """Positions (i, j) in the node's operands of the first pair its planned path contracts
    whose two sides are constants (original operands, not intermediates), or None."""
    path = node.args.get("path_strategy")
    if not isinstance(path, list):
        return None
    # positions of the current operand list: an original operand's index, or None (a result)
    current: list[int | None] = list(range(len(node.inputs)))
    for pair in path:
        if len(pair) != 2:
            return None
        i, j = sorted(pair)
        a, b = current[i], current[j]
        if a is not None and b is not None:
            if all(_is_constant(g, node, k) for k in (a, b)):
                return a, b
        current = [c for k, c in enumerate(current) if k not in (i, j)] + [None]
    return None


def _is_constant(g: EinsumGraph, node: Node, k: int) -> bool:
    src = g.node(node.inputs[k])
    return src.kind == ops.CONSTANT and src.dtype == node.dtype


def hoist(g: EinsumGraph, node: Node, options: Mapping[str, Any]) -> Node | None:
    """The einsum record with its first constant pair (``_constant_pair``) replaced by one
    constant operand holding their contraction, added to ``g``; None where there is none or
    it would not pay. The returned record has no planned path."""
    if node.dtype not in _DTYPES or "fold" in set(options.get("skip_passes") or ()):
        return None
    found = _constant_pair(g, node)
    if found is None:
        return None
    i, j = found
    es = parse_spec(node.args["spec"], tuple(len(g.node(k).shape) for k in node.inputs))
    ti, tj = es.inputs[i], es.inputs[j]
    if len(set(ti)) != len(ti) or len(set(tj)) != len(tj):
        return None  # a diagonal: left to the run-time path
    rest = [t for k, t in enumerate(es.inputs) if k not in (i, j)]
    kept = set("".join(rest)) | set(es.output)
    term = "".join(dict.fromkeys(c for c in ti + tj if c in kept))
    a, b = node.inputs[i], node.inputs[j]
    pair_spec = f"{ti},{tj}->{term}"
    try:
        shape, dtype = infer.infer(
            ops.EINSUM, None, [g.node(a), g.node(b)], {"spec": pair_spec}, node.name
        )
    except TensorLogicError:
        return None
    larger = max(math.prod(g.node(a).shape), math.prod(g.node(b).shape))
    if dtype != node.dtype or math.prod(shape) > larger:
        return None
    inputs = [x for k, x in enumerate(node.inputs) if k not in (i, j)]
    spec = ",".join([*rest, term]) + "->" + es.output
    pair_id = g.add_node(ops.EINSUM, None, [a, b], {"spec": pair_spec})
    try:
        infer.infer(ops.EINSUM, None, [g.node(x) for x in [*inputs, pair_id]], {"spec": spec}, "")
    except TensorLogicError:
        g.remove_node(pair_id)
        return None
    fold_node(g, g.node(pair_id), options.get("fold_evaluator"))
    args = {k: v for k, v in node.args.items() if k not in ("path_strategy", "path_info")}
    args["spec"] = spec
    return replace(node, inputs=(*inputs, pair_id), args=MappingProxyType(args))
