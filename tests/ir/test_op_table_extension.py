"""Adding an op is an entry of the op table (``tensorlogic.ir.ops``) and nothing else: an
elementwise op, a row op and a reduction that no code generator has seen are added to the
table here (as an edit of ``ops.py`` would add them, derived name lists included) and built,
optimized, fused and run on every backend, against formulas written out in the test."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops

TOL = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-11, atol=1e-12)}

CUBE = ops.ElementwiseOp(
    "cube", 1, lambda x, out: np.power(x, 3, out=out), "({x}*{x}*{x})", "({x}*{x}*{x})", 2
)
# x / sqrt(mean(x^2) + eps)
RMS_NORM = (
    ops.RowStep("reduce", "q", ("square", "x"), "sum"),
    ops.RowStep("let", "r", ("reciprocal", ("sqrt", ("add", ("mul", "q", "inv_n"), "eps")))),
    ops.RowStep("write", "", ("mul", "x", "r")),
)
# sqrt(sum(x^2)): a reduction only its row program computes
L2NORM = (
    ops.RowStep("reduce", "q", ("square", "x"), "sum"),
    ops.RowStep("result", "", ("sqrt", "q")),
)


@pytest.fixture
def table(monkeypatch):
    """The op table with cube, rms_norm and l2norm added: their rows, and the name lists that
    ops.py derives from the rows."""
    monkeypatch.setitem(ops.ELEMENTWISE, "cube", CUBE)
    monkeypatch.setitem(ops.DTYPE, "cube", ("square", "loop"))
    monkeypatch.setitem(ops.PTX, "cube", ("mul.{T} {t0}, {x}, {x};", "mul.{T} {d}, {t0}, {x};"))
    monkeypatch.setitem(ops.VJP, "cube", ("3 * (x * x)",))
    unary = tuple(n for n, op in ops.ELEMENTWISE.items() if op.arity == 1)
    monkeypatch.setattr(ops, "UNARY_OPS", unary)
    monkeypatch.setitem(ops.OPS_OF_KIND, ops.UNARY, unary)

    monkeypatch.setitem(ops.ROW_PROGRAMS, "rms_norm", RMS_NORM)
    monkeypatch.setitem(ops.ROW_OP_FLOPS, "rms_norm", 6)
    monkeypatch.setattr(ops, "ROW_OPS", tuple(ops.ROW_OP_FLOPS))

    monkeypatch.setitem(ops.ROW_PROGRAMS, "l2norm", L2NORM)
    monkeypatch.setitem(ops.REDUCTION_TABLE, "l2norm", ops.Reduction("l2norm", None, 0.0, None, 3))
    monkeypatch.setattr(ops, "REDUCTIONS", tuple(ops.REDUCTION_TABLE))
    return ops


def _run(g, backend, level, **inputs):
    plan = tl.compile(g, backend=backend, opt_level=level)
    out = plan(**inputs)
    return {k: np.asarray(tl.backends.get_backend(backend).to_host(v)) for k, v in out.items()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("level", [0, 2])
def test_a_new_elementwise_op(table, backend, level, dtype, rng):
    x = rng.uniform(-2, 2, (37, 19)).astype(dtype)
    y = rng.uniform(-2, 2, (37, 19)).astype(dtype)
    g = tl.EinsumGraph()
    a, b = g.input("x", x.shape, dtype), g.input("y", y.shape, dtype)
    c = g.elementwise("cube", a)
    g.output(c, "c")
    g.output(g.elementwise("cube", a * b + 1.0) - b, "chain")  # a fused group at O2
    got = _run(g, backend, level, x=x, y=y)
    np.testing.assert_allclose(got["c"], x**3, **TOL[dtype])
    np.testing.assert_allclose(got["chain"], (x * y + 1.0) ** 3 - y, **TOL[dtype])


def test_a_new_elementwise_op_differentiates(table, rng):
    from tensorlogic.autodiff import grad

    x = rng.uniform(-2, 2, (5, 3))
    g = tl.EinsumGraph()
    a = g.input("x", x.shape, "float64")
    g.output(g.sum(g.elementwise("cube", a)), "s")
    dg = grad(g, "s", ["x"])
    got = tl.compile(dg, backend="numpy")(x=x)
    np.testing.assert_allclose(got["grad_x"], 3 * x * x, rtol=1e-12)


def _rms(x, axis, eps):
    return x / np.sqrt((x * x).mean(axis=axis, keepdims=True) + eps)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("level", [0, 2])
@pytest.mark.parametrize("axis", [-1, 0])
def test_a_new_row_op(table, backend, level, axis, dtype, rng):
    x = rng.standard_normal((23, 41)).astype(dtype)
    g = tl.EinsumGraph()
    a = g.input("x", x.shape, dtype)
    g.output(g.rowop("rms_norm", a, axis=axis, eps=1e-6), "r")
    # a prologue and an epilogue the fusion pass puts around the row op at O2
    g.output(g.rowop("rms_norm", g.unary("tanh", a * 2.0), axis=axis, eps=1e-6) * 3.0, "f")
    got = _run(g, backend, level, x=x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got["r"], _rms(x64, axis, 1e-6), **TOL[dtype])
    np.testing.assert_allclose(got["f"], 3.0 * _rms(np.tanh(2 * x64), axis, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("level", [0, 2])
def test_a_new_reduction(table, backend, level, dtype, rng):
    x = rng.standard_normal((13, 300)).astype(dtype)
    g = tl.EinsumGraph()
    a = g.input("x", x.shape, dtype)
    g.output(g.reduce("l2norm", a, axis=1), "rows")
    g.output(g.reduce("l2norm", a, axis=0, keepdims=True), "cols")
    g.output(g.reduce("l2norm", g.unary("exp", a * 0.5)), "all")  # fused at O2
    got = _run(g, backend, level, x=x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got["rows"], np.sqrt((x64**2).sum(1)), **TOL[dtype])
    np.testing.assert_allclose(got["cols"], np.sqrt((x64**2).sum(0, keepdims=True)), **TOL[dtype])
    np.testing.assert_allclose(got["all"], np.sqrt(np.exp(x64).sum()), **TOL[dtype])


def test_a_new_reduction_over_an_empty_axis(table, backend):
    g = tl.EinsumGraph()
    a = g.input("x", (4, 0), "float64")
    g.output(g.reduce("l2norm", a, axis=1), "r")
    got = _run(g, backend, 0, x=np.zeros((4, 0)))
    np.testing.assert_array_equal(got["r"], np.zeros(4))  # sqrt of the sum's identity


def test_unknown_names_stay_refused():
    g = tl.EinsumGraph()
    a = g.input("x", (3, 4))
    with pytest.raises(tl.errors.GraphError, match="rms_norm"):
        g.rowop("rms_norm", a)
    with pytest.raises(tl.errors.GraphError, match="eps"):
        g.rowop("softmax", a, eps=1e-5)
