"""Every op of the table, and single-node kernels, against the numpy backend."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops

from numba_cases import EVERY_KIND_OPTIONS, every_kind_graph, every_kind_inputs, libm_graph, tol

# inputs in a range where every op is defined (log, sqrt, pow need positive bases)
_POSITIVE = {"log", "sqrt", "pow", "reciprocal"}


def _run_both(g, inputs, **opts):
    got = tl.compile(g, backend="numba", opt_level=0, **opts)(**inputs)
    want = tl.compile(g, backend="numpy", opt_level=0)(**inputs)
    return got, want


@pytest.mark.parametrize("op", ops.UNARY_OPS)
def test_unary_op_float64(op, rng):
    g = tl.EinsumGraph()
    x = g.input("x", (7, 13), "float64")
    g.output(g.unary(op, x), "y")
    lo = 0.1 if op in _POSITIVE else -3.0
    xs = {"x": rng.uniform(lo, 3.0, (7, 13))}
    got, want = _run_both(g, xs)
    np.testing.assert_allclose(got["y"], want["y"], **tol("float64"))


@pytest.mark.parametrize("op", ops.BINARY_OPS)
def test_binary_op_broadcast_float64(op, rng):
    g = tl.EinsumGraph()
    a = g.input("a", (5, 1, 9), "float64")
    b = g.input("b", (4, 9), "float64")
    g.output(g.binary(op, a, b), "y")
    lo = 0.5 if op in _POSITIVE else -2.0
    xs = {"a": rng.uniform(lo, 2.0, (5, 1, 9)), "b": rng.uniform(lo, 2.0, (4, 9))}
    if op in ("eq", "ne", "ge", "le"):  # make some elements equal
        xs["b"][:, ::2] = xs["a"][0, 0, ::2]
    got, want = _run_both(g, xs)
    np.testing.assert_allclose(got["y"], want["y"], **tol("float64"))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_single_nodes_float32_float64(dtype, rng):
    """O0 plans: each UNARY/BINARY/WHERE/REDUCE/ROWOP node is its own generated kernel."""
    g = every_kind_graph(dtype)
    xs = every_kind_inputs(rng, dtype)
    opts = EVERY_KIND_OPTIONS[dtype]
    plan = tl.compile(g, backend="numba", opt_level=0, **opts)
    assert all("numba" in s.info for s in plan.steps)
    assert all(("parallel" in s.info) == bool(opts) for s in plan.steps)
    got = plan(**xs)
    want = tl.compile(g, backend="numpy", opt_level=0)(**xs)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
        np.testing.assert_allclose(got[k], want[k], err_msg=k, **tol(dtype, 10))


def test_einsum_and_layout_steps_use_blas_and_numpy(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (8, 5), "float32")
    w = g.input("w", (5, 3), "float32")
    h = g.einsum("ij,jk->ik", x, w)
    g.output(g.relu(h.T) + 1.0, "y")
    g.output(g.cast(h, "float64"), "c")
    xs = {
        "x": rng.standard_normal((8, 5)).astype(np.float32),
        "w": rng.standard_normal((5, 3)).astype(np.float32),
    }
    got, want = _run_both(g, xs)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_non_contiguous_input_and_float16_fallback(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (6, 4), "float64")
    h = g.input("h", (6, 4), "float16")
    g.output(g.exp(x) * 2.0, "y")
    g.output(h * h, "hh")
    base = rng.standard_normal((4, 6))
    xs = {"x": base.T, "h": rng.standard_normal((6, 4)).astype(np.float16)}
    assert not xs["x"].flags.c_contiguous
    got, want = _run_both(g, xs)
    np.testing.assert_allclose(got["y"], want["y"], **tol("float64"))
    np.testing.assert_array_equal(got["hh"], want["hh"])


def test_fast_math_off_matches_libm(rng):
    xs = {"x": rng.uniform(-5, 5, (9, 11))}
    plan = tl.compile(libm_graph(), backend="numba", opt_level=0, fast_math=False)
    assert all("fast" not in s.info for s in plan.steps)
    got = plan(**xs)
    want = tl.compile(libm_graph(), backend="numpy", opt_level=0)(**xs)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(got["sm"], want["sm"], **tol("float64", 11))


def test_strided_out_and_read_only_inputs(rng):
    """Kernels are compiled for aligned arrays: other buffers are handled around them."""
    g = tl.EinsumGraph()
    a = g.input("a", (6, 8), "float32")
    b = g.input("b", (8,), "float32")
    g.output(g.exp(a) * b, "y")
    plan = tl.compile(g, backend="numba", opt_level=0)
    xa = rng.uniform(-1, 1, (6, 8)).astype(np.float32)
    xb = rng.uniform(-1, 1, 8).astype(np.float32)
    xa.flags.writeable = False
    xb_ro = np.broadcast_to(xb, (8,))  # read-only view
    want = np.exp(xa) * xb
    np.testing.assert_allclose(plan(a=xa, b=xb_ro)["y"], want, **tol("float32"))
    # unaligned buffers (a float32 view at an odd byte offset), as input and as out=
    raw = bytearray(4 * 48 + 1)
    out = np.frombuffer(raw, np.float32, count=48, offset=1).reshape(6, 8)
    ua = np.frombuffer(bytearray(4 * 48 + 1), np.float32, count=48, offset=1).reshape(6, 8)
    ua[...] = xa
    assert not out.flags.aligned and not ua.flags.aligned and out.flags.writeable
    res = plan(a=ua, b=xb, out={"y": out})["y"]
    assert res is out
    np.testing.assert_allclose(out, want, **tol("float32"))
