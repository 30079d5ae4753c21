"""The backward row ops (``ops.ROW_GRAD_PROGRAMS``): one node per softmax / log_softmax /
layer_norm gradient, checked against the reference interpreter's explicit Jacobians and
finite differences on every CPU backend, second-order gradients through them, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.errors import GraphError, ShapeError
from tensorlogic.ir import ops
from tensorlogic.testing import assert_grads_agree, reference_evaluate

CPU = ("numpy", "numba")


def _row_grad_graph(op, shape, axis, dtype):
    g = tl.EinsumGraph()
    a = g.input("a", shape, dtype)
    ct = g.input("g", shape, dtype)
    g.output(g.row_grad(op, [a, ct], axis), "dx")
    return g


def _operands(op, shape, axis, rng):
    x = rng.standard_normal(shape)
    if op == "softmax":  # the operand is the softmax result: positive rows summing to 1
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        x = e / e.sum(axis=axis, keepdims=True)
    elif op == "log_softmax":
        x = x - np.log(np.exp(x).sum(axis=axis, keepdims=True))
    return x, rng.standard_normal(shape)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("op", sorted(ops.ROW_GRAD_PROGRAMS))
@pytest.mark.parametrize("shape,axis", [((5, 7), -1), ((4, 6), 0), ((2, 3, 33), 1), ((3, 130), 1)])
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 2e-5), ("bfloat16", 3e-2)])
def test_row_grad_matches_the_reference_jacobian(backend, op, shape, axis, dtype, tol):
    rng = np.random.default_rng()
    x, ct = _operands(op, shape, axis, rng)
    g = _row_grad_graph(op, shape, axis, dtype)
    feed = {"a": x.astype(g.node("a").dtype), "g": ct.astype(g.node("g").dtype)}
    want = reference_evaluate(g, feed)["dx"]
    for level in (0, 2):
        got = tl.compile(g, backend=backend, opt_level=level, cache=False)(**feed)["dx"]
        assert got.dtype == np.dtype(g.node("a").dtype)
        scale = max(np.abs(want).max(), 1.0)
        np.testing.assert_allclose(got.astype(np.float64), want, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("op", ops.ROW_OPS)
def test_grad_of_a_row_op_is_one_backward_node(op):
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float32")
    w = g.input("w", (4, 8), "float32")
    g.output(g.sum(g._rowop(op, x, -1, None) * w), "loss")
    gg = tl.grad(g, "loss", ["x"])
    back = [n for n in gg.nodes if n.kind == ops.ROWGRAD]
    assert [n.op for n in back] == [op]
    # nothing else over the row: no reductions besides the loss's sum
    assert sum(n.kind == ops.REDUCE for n in gg.nodes) == 1
    plan = tl.compile(gg, backend="numpy", opt_level=2, cache=False)
    assert sum(s.kind == ops.ROWGRAD for s in plan.steps) == 1


@pytest.mark.parametrize("op", ops.ROW_OPS)
def test_second_order_gradient_through_a_backward_row_op(op):
    # d/dx of sum(grad_x(sum(rowop(x) * w)) * v): the backward node itself is differentiated
    g = tl.EinsumGraph()
    x = g.input("x", (3, 5), "float64")
    w = g.input("w", (3, 5), "float64")
    g.output(g.sum(g._rowop(op, x, -1, None) * w), "loss")
    gg = tl.grad(g, "loss", ["x"])
    v = gg.input("v", (3, 5), "float64")
    gg.output(gg.sum(gg.tensor(gg.outputs.pop("grad_x")) * v), "second")
    del gg.outputs["loss"]
    assert_grads_agree(gg, "second", ["x", "w"], backends=CPU)


def test_row_grad_refuses_bad_operands():
    g = tl.EinsumGraph()
    a = g.input("a", (3, 4), "float32")
    b = g.input("b", (3, 5), "float32")
    c = g.input("c", (3, 4), "float64")
    with pytest.raises(GraphError, match="unknown row op 'gelu'"):
        g.row_grad("gelu", [a, a], -1)
    with pytest.raises(ShapeError, match="one shape and dtype"):
        g.row_grad("softmax", [a, b], -1)
    with pytest.raises(ShapeError, match="one shape and dtype"):
        g.row_grad("softmax", [a, c], -1)
    with pytest.raises(GraphError, match="takes 2 inputs"):
        g.row_grad("layer_norm", [a], -1)
    with pytest.raises(ShapeError):
        g.row_grad("softmax", [a, a], 2)
    n = len(g)
    i = g.input("i", (3, 4), "int32")
    with pytest.raises(GraphError, match="float dtype"):
        g.row_grad("softmax", [i, i], -1)
    assert len(g) == n + 1  # nothing half-added


def test_row_grad_round_trips_through_save(tmp_path):
    g = _row_grad_graph("layer_norm", (3, 6), -1, "float32")
    path = tmp_path / "g.json"
    g.save(path)
    h = tl.EinsumGraph.load(path)
    rng = np.random.default_rng()
    feed = {k: rng.standard_normal((3, 6)).astype(np.float32) for k in ("a", "g")}
    want = tl.compile(g, backend="numpy", cache=False)(**feed)["dx"]
    np.testing.assert_array_equal(tl.compile(h, backend="numpy", cache=False)(**feed)["dx"], want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threshold", [1 << 30, 1])  # serial, and parallel over rows
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("op", sorted(ops.ROW_GRAD_PROGRAMS))
def test_numba_renders_the_row_backward_as_one_kernel(op, dtype, threshold, fast):
    shape, axis = (6, 3, 40), 1  # the row axis in the middle: moved last for the kernel
    g = _row_grad_graph(op, shape, axis, dtype)
    plan = tl.compile(g, backend="numba", cache=False, parallel_threshold=threshold, fast_math=fast)
    (step,) = plan.steps
    assert "row backward" in step.info
    rng = np.random.default_rng()
    x, ct = _operands(op, shape, axis, rng)
    feed = {"a": x.astype(dtype), "g": ct.astype(dtype)}
    want = reference_evaluate(g, feed)["dx"]
    tol = 1e-12 if dtype == "float64" else 2e-5
    got = plan(**feed)["dx"]
    np.testing.assert_allclose(got, want, atol=tol * max(np.abs(want).max(), 1.0), rtol=tol)
