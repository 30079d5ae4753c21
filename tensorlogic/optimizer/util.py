"""Small helpers the passes share: constant values, hashable args, output sets."""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..ir import ops, spec as einspec
from ..ir.graph import EinsumGraph, Node

# Constants larger than this are never scanned for a uniform value (keeps passes linear and cheap).
_SCAN_LIMIT = 1 << 20


_SCALARS = (str, int, float, bool, type(None))


@functools.lru_cache(maxsize=4096)
def parse_spec(spec: str, ranks: tuple[int, ...]) -> einspec.EinsumSpec:
    """``ir.spec.parse`` memoized: passes parse the same specs again and again."""
    return einspec.parse(spec, list(ranks))


def hashable(value: Any) -> Any:
    """A hashable form of node args (mappings become sorted item tuples)."""
    t = type(value)
    if t in _SCALARS:
        return value
    if t is MappingProxyType or t is dict:
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    if t is tuple or t is list:
        return tuple(hashable(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    return value


def output_ids(g: EinsumGraph) -> set[int]:
    """Ids of the nodes the graph's outputs name."""
    return set(g.outputs.values())


def constant_array(g: EinsumGraph, nid: int) -> np.ndarray | None:
    """The value of a constant node, or None if the node is not a constant."""
    node = g.node(nid)
    if node.kind != ops.CONSTANT:
        return None
    return g.constants[nid]


def uniform_value(g: EinsumGraph, nid: int) -> float | None:
    """The single (real) value every element of a constant node has, or None.

    Returns None for non-constants, empty or large constants, and constants with differing
    values. NaN is never uniform (NaN != NaN), which keeps NaN-sensitive rules conservative.
    """
    arr = constant_array(g, nid)
    if arr is None or arr.size == 0 or arr.size > _SCAN_LIMIT:
        return None
    first = arr.flat[0]
    if not np.all(arr == first) or np.iscomplexobj(arr) and first.imag != 0:
        return None
    return float(first.real)


def is_identity_matrix(g: EinsumGraph, nid: int) -> bool:
    """True for a constant square 2-D identity matrix."""
    arr = constant_array(g, nid)
    if arr is None or arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.size > _SCAN_LIMIT:
        return False
    return bool(np.array_equal(arr, np.eye(arr.shape[0], dtype=arr.dtype)))


def single_user(g: EinsumGraph, nid: int) -> int | None:
    """The one node that consumes ``nid`` (using it once), or None."""
    users = g.users(nid)
    if len(users) != 1:
        return None
    if g.node(users[0]).inputs.count(nid) != 1:
        return None
    return users[0]


def remove_if_unused(g: EinsumGraph, nid: int) -> None:
    """Remove a non-input node that nothing uses any more, and its producers that end up unused.

    Passes call this on what a rewrite left behind, so a second run finds nothing to do.
    """
    stack = [nid]
    while stack:
        n = stack.pop()
        if n not in g:
            continue
        node: Node = g.node(n)
        if node.kind == ops.INPUT or g.users(n) or n in g.outputs.values():
            continue
        g.remove_node(n)
        stack.extend(node.inputs)
