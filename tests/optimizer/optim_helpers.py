"""Helpers for the optimizer tests: compile at two levels and compare on fresh random inputs."""

from __future__ import annotations

import numpy as np

import tensorlogic as tl
from tensorlogic.ir import ops


def random_inputs(g: tl.EinsumGraph, rng, low: float = -1.0, high: float = 1.0) -> dict:
    """Fresh random values for every input of a concrete graph (never zeros)."""
    out = {}
    for name, nid in g.inputs.items():
        node = g.node(nid)
        out[name] = rng.uniform(low, high, size=node.shape).astype(node.dtype)
    return out


def assert_same_as_o0(g: tl.EinsumGraph, rng, opt_level: int, rtol=None, atol=None, **options):
    """Compile at O0 and ``opt_level``, run both on the same random inputs, compare outputs."""
    inputs = random_inputs(g, rng)
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**inputs)
    plan = tl.compile(g, backend="numpy", opt_level=opt_level, cache=False, **options)
    got = plan(**inputs)
    for name in ref:
        dt = ref[name].dtype
        tol = 1e-9 if dt == np.float64 else 2e-5 if dt == np.float32 else 3e-3
        np.testing.assert_allclose(
            got[name],
            ref[name],
            rtol=rtol or tol,
            atol=atol or tol,
            equal_nan=True,
            err_msg=f"output {name!r} at O{opt_level}",
        )
    return plan


def count(g: tl.EinsumGraph, kind: str | None = None, op: str | None = None) -> int:
    """Number of nodes of a kind (and op) in a graph."""
    return sum(1 for n in g if (kind is None or n.kind == kind) and (op is None or n.op == op))


def compute_nodes(g: tl.EinsumGraph) -> int:
    """Nodes that are neither inputs nor constants."""
    return sum(1 for n in g if n.kind not in (ops.INPUT, ops.CONSTANT))
