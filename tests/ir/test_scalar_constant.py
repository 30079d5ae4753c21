"""A scalar constant keeps shape (), so scalar arithmetic stays scalar."""

from __future__ import annotations

import numpy as np

import tensorlogic as tl


def test_scalar_constant_is_0d():
    g = tl.EinsumGraph()
    c = g.constant(np.float32(0.5))
    assert c.shape == ()
    x = g.input("x", ())
    y = x * 2.0 + c
    assert y.shape == ()
    g.output(y, name="y")
    out = tl.compile(g, backend="numpy")(x=np.array(3.0, np.float32))["y"]
    assert out.shape == () and float(out) == 6.5
