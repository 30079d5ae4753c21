"""Small models with a symbolic batch dimension for the pipeline tests."""

from __future__ import annotations

import numpy as np

import tensorlogic as tl


def mlp_graph(width: int = 32, depth: int = 2, seed: int = 0) -> tl.EinsumGraph:
    """x[B, width] -> depth tanh layers -> y[B, width], plus a per-item score s[B]."""
    rng = np.random.default_rng(seed)
    g = tl.EinsumGraph()
    h = g.input("x", shape=("B", width), dtype="float32")
    for k in range(depth):
        w = g.constant(
            (rng.standard_normal((width, width)) * width**-0.5).astype(np.float32), name=f"w{k}"
        )
        h = g.tanh(g.einsum("bi,ij->bj", h, w))
    g.output(h, name="y")
    g.output(g.sum(h * h, axis=1), name="s")
    return g


def reference(plan: tl.CompiledPlan, inputs: dict) -> dict:
    """One big call."""
    return plan(inputs)
