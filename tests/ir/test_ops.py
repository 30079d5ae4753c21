"""Every op of the graph API against numpy, on every backend, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops

from conftest import to_numpy
from tensorlogic.testing.reference import BINARY_UFUNCS

SQRT_2_OVER_PI = np.sqrt(2 / np.pi)

UNARY_REF = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "square": np.square,
    "reciprocal": np.reciprocal,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "softplus": lambda x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3))),
    # gelu's derivative by the product rule, with sech^2 for tanh's derivative
    "gelu_grad": lambda x: (
        0.5 * (1 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
        + 0.5
        * x
        * SQRT_2_OVER_PI
        * (1 + 3 * 0.044715 * x**2)
        / np.cosh(SQRT_2_OVER_PI * (x + 0.044715 * x**3)) ** 2
    ),
    "step": lambda x: (x > 0).astype(x.dtype),
    "one_minus": lambda x: 1 - x,
}
POSITIVE_ONLY = {"log", "sqrt", "reciprocal"}

BINARY_REF = BINARY_UFUNCS


def _tol(dtype):
    return {"rtol": 2e-5, "atol": 2e-6} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-13}


def _run(g, backend, **arrays):
    plan = tl.compile(g, backend=backend, opt_level=0)
    return {k: to_numpy(v) for k, v in plan(arrays).items()}


def test_tables_cover_every_op():
    assert set(UNARY_REF) == set(ops.UNARY_OPS)
    assert set(BINARY_REF) == set(ops.BINARY_OPS)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary(op, dtype, backend, rng):
    lo, hi = (0.1, 3.0) if op in POSITIVE_ONLY else (-3.0, 3.0)
    x = rng.uniform(lo, hi, (7, 33)).astype(dtype)
    g = tl.EinsumGraph()
    g.output(g.unary(op, g.input("x", x.shape, dtype)), name="y")
    got = _run(g, backend, x=x)["y"]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, UNARY_REF[op](x.astype("float64")).astype(dtype), **_tol(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary_with_broadcasting(op, dtype, backend, rng):
    a = rng.uniform(0.5, 2.0, (4, 1, 5)).astype(dtype)
    b = rng.uniform(0.5, 2.0, (3, 1)).astype(dtype)
    if op in ("eq", "ne", "ge", "le"):
        b[0, 0] = a[0, 0, 0]  # make equality actually occur
    g = tl.EinsumGraph()
    g.output(g.binary(op, g.input("a", a.shape, dtype), g.input("b", b.shape, dtype)), name="y")
    got = _run(g, backend, a=a, b=b)["y"]
    want = BINARY_REF[op](a, b).astype(dtype)
    assert got.shape == (4, 3, 5)
    np.testing.assert_allclose(got, want, **_tol(dtype))


def test_operators_and_scalars(backend, rng):
    x = rng.uniform(0.5, 2.0, (6, 4)).astype("float32")
    y = rng.uniform(0.5, 2.0, (4,)).astype("float32")
    g = tl.EinsumGraph()
    tx, ty = g.input("x", x.shape), g.input("y", y.shape)
    exprs = {
        "a": tx + ty,
        "b": 2.0 - tx,
        "c": tx * 3,
        "d": 1 / tx,
        "e": tx**2,
        "f": 2**ty,
        "g": -tx,
        "h": abs(tx - 1.2),
        "i": tx > ty,
        "j": tx <= 1.0,
        "k": tx == tx,
        "l": tx != ty,
        "m": tx / ty - ty * tx,
        "n": tx @ g.reshape(ty, (4, 1)),
    }
    for name, t in exprs.items():
        g.output(t, name=name)
    got = _run(g, backend, x=x, y=y)
    want = {
        "a": x + y,
        "b": 2.0 - x,
        "c": x * 3,
        "d": 1 / x,
        "e": x**2,
        "f": 2**y,
        "g": -x,
        "h": abs(x - 1.2),
        "i": x > y,
        "j": x <= 1.0,
        "k": np.ones_like(x, dtype=bool),
        "l": x != y,
        "m": x / y - y * x,
        "n": x @ y.reshape(4, 1),
    }
    for name in exprs:
        # comparisons give numpy's bool; everything else stays float32
        assert got[name].dtype == (bool if name in "ijkl" else np.float32), name
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-6, err_msg=name)


def test_scalar_constants_adopt_the_tensor_dtype():
    g = tl.EinsumGraph()
    x = g.input("x", (3,), "float32")
    assert (x * 2.5).dtype == "float32"
    assert (2.5 + x).dtype == "float32"
    assert (x + g.input("z", (3,), "float64")).dtype == "float64"


def test_where(backend, rng):
    c = (rng.uniform(size=(5, 6)) > 0.5).astype("float64")
    a = rng.standard_normal((5, 6))
    b = rng.standard_normal((6,))
    g = tl.EinsumGraph()
    g.output(
        g.where(
            g.input("c", c.shape, "float64"),
            g.input("a", a.shape, "float64"),
            g.input("b", b.shape, "float64"),
        ),
        name="y",
    )
    np.testing.assert_array_equal(_run(g, backend, c=c, a=a, b=b)["y"], np.where(c != 0, a, b))


def LSE(x, axis, keepdims):
    m = x.max(axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out.reshape(np.sum(x, axis=axis, keepdims=keepdims).shape)


REDUCE_REF = {
    "sum": np.sum,
    "mean": np.mean,
    "max": np.max,
    "min": np.min,
    "prod": np.prod,
    "logsumexp": LSE,
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(REDUCE_REF))
@pytest.mark.parametrize(
    "axis,keepdims", [(None, False), (0, False), (-1, True), ((0, 2), False), ((1, 2), True)]
)
def test_reductions(op, axis, keepdims, dtype, backend, rng):
    x = rng.uniform(0.8, 1.2, (3, 4, 5)).astype(dtype)
    g = tl.EinsumGraph()
    g.output(g.reduce(op, g.input("x", x.shape, dtype), axis, keepdims), name="y")
    got = _run(g, backend, x=x)["y"]
    want = REDUCE_REF[op](x.astype("float64"), axis=axis, keepdims=keepdims)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, **_tol(dtype))


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_and_log_softmax(axis, dtype, backend, rng):
    x = (rng.standard_normal((4, 5, 6)) * 4).astype(dtype)
    g = tl.EinsumGraph()
    tx = g.input("x", x.shape, dtype)
    g.output(g.softmax(tx, axis), name="s")
    g.output(g.log_softmax(tx, axis), name="ls")
    got = _run(g, backend, x=x)
    ref = _softmax(x.astype("float64"), axis)
    np.testing.assert_allclose(got["s"], ref, **_tol(dtype))
    np.testing.assert_allclose(got["ls"], np.log(ref), **_tol(dtype))


def test_softmax_is_stable_for_large_inputs(backend):
    x = np.array([[1000.0, 1001.0, 999.0]], dtype="float32")
    g = tl.EinsumGraph()
    g.output(g.softmax(g.input("x", x.shape), -1), name="s")
    got = _run(g, backend, x=x)["s"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, _softmax(x.astype("float64"), -1), rtol=1e-5)


def test_layout_ops(backend, rng):
    x = rng.standard_normal((2, 3, 4)).astype("float32")
    g = tl.EinsumGraph()
    tx = g.input("x", x.shape)
    t = g.transpose(tx, (2, 0, 1))
    g.output(t, name="t")
    g.output(g.reshape(t, (4, -1)), name="r")
    g.output(g.reshape(tx, (6, 4)) * 2.0, name="r2")
    g.output(g.cast(tx, "float64"), name="c")
    g.output(tx.T + 0.0, name="T")
    got = _run(g, backend, x=x)
    np.testing.assert_array_equal(got["t"], x.transpose(2, 0, 1))
    np.testing.assert_array_equal(got["r"], x.transpose(2, 0, 1).reshape(4, -1))
    np.testing.assert_array_equal(got["r2"], x.reshape(6, 4) * 2)
    assert got["c"].dtype == np.float64
    np.testing.assert_array_equal(got["c"], x.astype("float64"))
    np.testing.assert_array_equal(got["T"], x.T)


def test_symbolic_batch_dimension(backend, rng):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 8))
    w = g.constant(rng.standard_normal((8, 3)).astype("float32"), name="w")
    y = g.softmax(g.einsum("bi,ij->bj", x, w), -1)
    g.output(g.reshape(y, ("B", 3, 1)), name="y")
    g.output(g.sum(x, 0), name="s")
    plan = tl.compile(g, backend=backend)
    wv = g.constants[w.id]
    for batch in (1, 5, 17, 5):
        xv = rng.standard_normal((batch, 8)).astype("float32")
        out = plan(x=xv)
        np.testing.assert_allclose(
            to_numpy(out["y"])[..., 0], _softmax(xv @ wv, -1), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(to_numpy(out["s"]), xv.sum(0), rtol=1e-5, atol=1e-5)
    assert len(plan._specs) == 3


def test_none_dimension_is_a_fresh_symbol(rng):
    g = tl.EinsumGraph()
    a = g.input("a", (None, 3))
    b = g.input("b", (None, 3))
    assert a.shape[0] != b.shape[0]
    with pytest.raises(tl.ShapeError):
        a + b  # two independent unknown sizes cannot be assumed equal
    g.output(g.sum(a, 1), name="y")
    plan = tl.compile(g, backend="numpy")
    np.testing.assert_allclose(
        plan(a=np.ones((4, 3), "float32"), b=np.ones((2, 3), "float32"))["y"], np.full(4, 3.0)
    )


def test_float16_inputs(rng):
    x = rng.uniform(0.5, 1.5, (4, 8)).astype("float16")
    g = tl.EinsumGraph()
    tx = g.input("x", x.shape, "float16")
    g.output(g.einsum("ij,kj->ik", tx, tx) + 1.0, name="y")
    got = tl.compile(g, backend="numpy")(x=x)["y"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, x.astype("float32") @ x.T.astype("float32") + 1, rtol=5e-3)
