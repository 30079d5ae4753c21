"""Pairwise contractions whose output order puts the second operand's letters first."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl


@pytest.mark.parametrize(
    "spec,shapes",
    [
        ("x,c->cx", [(2,), (1,)]),
        ("x,c->cx", [(2,), (3,)]),
        ("ab,c->cab", [(2, 3), (4,)]),
        ("ab,bc->ca", [(2, 3), (3, 4)]),
        ("bab,cb->bca", [(2, 3, 2), (4, 2)]),
    ],
)
def test_swapped_operand_order(spec, shapes, rng):
    g = tl.EinsumGraph()
    ins = [g.input(f"i{k}", s) for k, s in enumerate(shapes)]
    g.output(g.einsum(spec, *ins), name="o")
    arrs = {f"i{k}": rng.random(s, dtype=np.float32) + 0.5 for k, s in enumerate(shapes)}
    out = tl.compile(g, backend="numpy")(**arrs)["o"]
    np.testing.assert_allclose(out, np.einsum(spec, *arrs.values()), rtol=1e-5)
