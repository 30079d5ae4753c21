"""Row ops and logsumexp over rows holding NaN of either sign and infinities, on every CPU
backend, lone and fused: a row holding a NaN is NaN throughout (as numpy's NaN maximum makes
it), other rows match the op table's float64 program.

The numba renderer takes a plain (NaN-blind) row max where the program carries a NaN into every
output through a later sum (``ops.nan_carried``); these rows check that it still does for a
NaN the max misses (sign bit set: its key sorts below -inf) and one it sees (sign bit clear).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.ir.evaluate import row_program

_NEG_NAN = np.copysign(np.nan, -1.0)
_INF = np.inf
ROWS = [
    [1.0, 2.0, 3.0, -1.0],
    [np.nan, 0.0, 1.0, 2.0],
    [_NEG_NAN, 0.0, 1.0, 2.0],
    [0.0, 1.0, _NEG_NAN, 2.0],
    [_NEG_NAN, np.nan, 1.0, 0.0],
    [_NEG_NAN, -_INF, -_INF, -_INF],
    [_NEG_NAN, _NEG_NAN, _NEG_NAN, _NEG_NAN],
    [_NEG_NAN, _INF, 0.0, 1.0],
    [np.nan, -_INF, 0.0, 1.0],
    [_INF, 0.0, 1.0, 2.0],
    [-_INF, 0.0, 1.0, 2.0],
    [_INF, -_INF, 0.0, 1.0],
    [-_INF, -_INF, -_INF, -_INF],
    [_INF, _INF, 0.0, 0.0],
    [-0.0, 0.0, -1e18, 3.0],  # its square still fits float32 (layer_norm)
]
NAMES = ["softmax", "log_softmax", "layer_norm", "logsumexp"]
BACKENDS = [("numpy", {}), ("numba", {"fast_math": True}), ("numba", {"fast_math": False})]


def _rows(dtype: str) -> np.ndarray:
    x = np.array(ROWS, dtype)
    assert np.signbit(x[2, 0]) and not np.signbit(x[1, 0])  # both signs reach the kernel
    return x


def _plan(name: str, dtype: str, fused: bool, backend: str, opts: dict):
    g = tl.EinsumGraph()
    x = g.input("x", (len(ROWS), len(ROWS[0])), dtype)
    # x * 1.0 + 0.0 keeps every value (NaN signs included on x86) and makes O2 fuse a computed
    # row into the row op's kernel, whose passes then read the stored row instead of the input
    h = x * 1.0 + 0.0 if fused else x
    if name == "logsumexp":
        y = g.logsumexp(h, axis=1, keepdims=True)
    else:
        y = g.rowop(name, h, axis=1)
    g.output(y, "y")
    return tl.compile(g, backend=backend, opt_level=2 if fused else 0, **opts)


@pytest.mark.parametrize("backend,opts", BACKENDS, ids=["numpy", "numba-fast", "numba-exact"])
@pytest.mark.parametrize("fused", [False, True], ids=["lone", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_rows_with_nan_of_either_sign_and_infinities(name, dtype, fused, backend, opts):
    x = _rows(dtype)
    with np.errstate(all="ignore"):
        got = _plan(name, dtype, fused, backend, opts)(x=x)["y"]
        want = row_program(name, x.astype(np.float64), (1,), ops.LAYER_NORM_EPS)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    has_nan = np.isnan(x).any(axis=1)
    assert np.isnan(got[has_nan]).all(), got[has_nan]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tol = 2e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("fused", [False, True], ids=["lone", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_see_nan_of_either_sign(op, backend, dtype, fused):
    # a lone max or min has no later pass to carry a NaN: the renderer keeps the NaN guard;
    # per row (kept axis), over the whole array (partials per outer row) and over a long
    # 1-d array (partials per block, a NaN in one block only)
    x = _rows(dtype)
    long = np.random.default_rng(0).uniform(-1, 1, 100_003).astype(dtype)
    cases = [(x, 1), (x, None), (x[:1], None), (x[-1:], None)]
    for pos in (0, 70_001):
        for nan in (np.nan, _NEG_NAN):
            v = long.copy()
            v[pos] = nan
            cases.append((v, None))
    cases.append((long, None))
    for a, axis in cases:
        g = tl.EinsumGraph()
        h = g.input("x", a.shape, dtype)
        h = h * 1.0 + 0.0 if fused else h
        g.output(getattr(g, op)(h, axis=axis), "y")
        got = tl.compile(g, backend=backend, opt_level=2 if fused else 0)(x=a)["y"]
        np.testing.assert_array_equal(got, getattr(np, op)(a, axis=axis))


def test_nan_carried_by_the_built_in_programs():
    def first_max(p):
        return next(i for i, st in enumerate(p) if st.kind == "reduce" and st.combine == "max")

    for name in ("softmax", "log_softmax", "logsumexp"):
        prog = ops.ROW_PROGRAMS[name]
        assert ops.nan_carried(prog, first_max(prog)), name
    assert not ops.nan_carried(ops.ROW_PROGRAMS["max"], 0)
    # a write that does not read the sum (or reads it through a NaN-blind op) carries nothing
    m = ops.RowStep("reduce", "m", "x", "max")
    s = ops.RowStep("reduce", "s", ("exp", ("sub", "x", "m")), "sum")
    assert ops.nan_carried((m, s, ops.RowStep("write", "", ("div", "x", "s"))), 0)
    assert not ops.nan_carried((m, s, ops.RowStep("write", "", ("sub", "x", "m"))), 0)
    assert not ops.nan_carried(
        (m, s, ops.RowStep("write", "", ("where", ("eq", "s", 0.0), 0.0, "x"))), 0
    )
    # the later sum must read the max's own expression through NaN-strict ops
    s_relu = ops.RowStep("reduce", "s", ("relu", ("sub", "x", "m")), "sum")
    assert not ops.nan_carried((m, s_relu, ops.RowStep("write", "", ("div", "x", "s"))), 0)
