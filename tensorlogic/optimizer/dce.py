"""Dead code elimination: keep only what the outputs reach (graph inputs always stay)."""

from __future__ import annotations

from typing import Any, Mapping

from ..ir import ops
from ..ir.graph import EinsumGraph
from .base import PassResult, function_pass


def _dce(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Remove every node no output depends on; inputs and outputs are never removed."""
    live = graph.live_nodes()
    dead = [n.id for n in graph if n.id not in live and n.kind != ops.INPUT]
    if not dead:
        return PassResult(graph, False, {})
    g = graph.copy()
    for nid in reversed(dead):  # users before producers: each node is unused when removed
        g.remove_node(nid)
    return PassResult(g, True, {"removed": len(dead)})


dce = function_pass("dce", _dce)
