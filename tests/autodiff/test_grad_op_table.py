"""Every op of the op table has a VJP rule, and each rule agrees with finite differences on
the numpy and numba backends at O0 and O2 (iterating the tables, so a new op without a rule
fails here)."""

from __future__ import annotations

import pytest

import tensorlogic as tl
from tensorlogic.autodiff import DIFFERENTIABLE_LEAVES, RULES
from tensorlogic.ir import ops
from tensorlogic.testing import assert_grads_agree

CPU = ("numpy", "numba")
SHAPE = (3, 4)


def test_every_node_kind_has_a_rule():
    missing = [k for k in ops.NODE_KINDS if k not in RULES and k not in DIFFERENTIABLE_LEAVES]
    assert not missing, f"node kinds without a VJP rule: {missing}"


def test_every_elementwise_op_has_a_vjp_entry():
    for name, op in ops.ELEMENTWISE.items():
        assert name in ops.VJP, f"elementwise op {name!r} has no entry in ops.VJP"
        assert len(ops.VJP[name]) == op.arity, name


def _positive(op: str) -> bool:
    return op in ("log", "sqrt", "reciprocal", "pow", "div")


@pytest.mark.parametrize("op", ops.UNARY_OPS)
def test_unary_op_grad(op):
    g = tl.EinsumGraph()
    x = g.input("x", SHAPE, "float32")
    g.output(g.sum(g.unary(op, x) * g.input("w", SHAPE, "float32")), "loss")
    ranges = {"x": (0.5, 2.0)} if _positive(op) else {"x": (-2.0, 2.0)}
    report = assert_grads_agree(g, "loss", ["x"], backends=CPU, ranges=ranges)
    assert report.checked > 0


@pytest.mark.parametrize("op", ops.BINARY_OPS)
def test_binary_op_grad(op):
    g = tl.EinsumGraph()
    a = g.input("a", SHAPE, "float64")
    b = g.input("b", (1, SHAPE[1]), "float64")  # broadcast: the gradient sums over rows
    g.output(g.sum(g.binary(op, a, b) * g.input("w", SHAPE, "float64")), "loss")
    ranges = {"a": (0.5, 2.0), "b": (0.5, 2.0)} if _positive(op) else None
    report = assert_grads_agree(g, "loss", ["a", "b"], backends=CPU, ranges=ranges)
    assert report.checked > 0


@pytest.mark.parametrize("op", ops.REDUCTIONS)
@pytest.mark.parametrize("axis,keepdims", [((1,), False), ((0, 1), True), (None, False)])
def test_reduction_grad(op, axis, keepdims):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 4), "float64")
    r = g.reduce(op, x, axis, keepdims)
    g.output(g.sum(r * r), "loss")
    ranges = {"x": (-1.0, 1.0)} if op == "prod" else None
    assert_grads_agree(g, "loss", ["x"], backends=CPU, ranges=ranges, sizes={"B": 3})


@pytest.mark.parametrize("op", ops.ROW_OPS)
@pytest.mark.parametrize("axis", [0, -1])
def test_row_op_grad(op, axis):
    g = tl.EinsumGraph()
    x = g.input("x", SHAPE, "float32")
    y = g._rowop(op, x, axis, None)
    g.output(g.sum(y * g.input("w", SHAPE, "float32")), "loss")
    assert_grads_agree(g, "loss", ["x"], backends=CPU)


def test_where_transpose_reshape_cast_grad():
    g = tl.EinsumGraph()
    c = g.input("c", (3, 1), "float64")
    a = g.input("a", (3, 4), "float32")
    b = g.input("b", (4,), "float64")
    w = g.where(c > 0.0, a, b)  # cond gets no gradient
    t = g.transpose(g.reshape(w, (2, 6)), (1, 0))
    y = g.cast(t, "float32") * g.cast(a, "float64").reshape(6, 2)
    g.output(g.sum(y), "loss")
    assert_grads_agree(g, "loss", ["a", "b"], backends=CPU)


def test_attention_grad():
    g = tl.EinsumGraph()
    q = g.input("q", (2, 3, 4), "float32")
    k = g.input("k", (2, 5, 4), "float32")
    v = g.input("v", (2, 5, 3), "float32")
    m = g.input("m", (1, 3, 5), "float32")
    y = g.attention(q, k, v, mask=m)
    g.output(y, "y")
    assert_grads_agree(g, "y", ["q", "k", "v", "m"], backends=CPU)
