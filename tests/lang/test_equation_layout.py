"""Intermediates of a tensor equation are laid out along its left side's indices."""

from __future__ import annotations

import numpy as np

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.lang.equations import build_equations


def _graph(text: str, arrays: dict) -> tl.EinsumGraph:
    g = tl.EinsumGraph()
    env = {k: g.input(k, v.shape, "float32") for k, v in arrays.items()}
    for name, t in build_equations(g, tl.parse(text).equations, env).items():
        g.output(t, name=name)
    return g


def test_weights_first_products_are_built_in_the_left_sides_order():
    rng = np.random.default_rng(0)
    a = {
        "X": rng.standard_normal((6, 5)).astype(np.float32),
        "W": rng.standard_normal((4, 5)).astype(np.float32),
        "B": rng.standard_normal(4).astype(np.float32),
    }
    g = _graph("Y[b, o.] = softmax(W[o, i] X[b, i] + B[o])", a)
    # the product lands as [b, o] directly: no transpose, and the softmax runs along rows
    specs = [n.args["spec"] for n in g if n.kind == ops.EINSUM]
    assert all(s.split("->")[1] == "ca" for s in specs), specs
    (sm,) = [n for n in g if n.kind == ops.ROWOP]
    assert sm.args["axis"] in (-1, 1)
    out = tl.compile(g, backend="numpy")(**a)["Y"]
    z = a["X"] @ a["W"].T + a["B"]
    z = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(out, z / z.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_indices_absent_from_the_left_side_follow_it():
    rng = np.random.default_rng(1)
    a = {
        "A": rng.standard_normal((3, 4)).astype(np.float32),
        "C": rng.standard_normal((4, 2)).astype(np.float32),
    }
    g = _graph("Z[j, i] = A[i, k] C[k, j]", a)
    out = tl.compile(g, backend="numpy", opt_level=0)(**a)["Z"]
    np.testing.assert_allclose(out, (a["A"] @ a["C"]).T, rtol=1e-5, atol=1e-6)
