"""Gradients on the cupy backend (generated kernels, cuBLAS): the same finite-difference checks
as on the CPU, float64 for the rules and float32/float16 against the float64 gradient."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.testing import assert_grads_agree, graph_cases

pytestmark = pytest.mark.gpu
GPU = ("numpy", "cupy")


def _mlp_block(dtype):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 8), dtype)
    w = g.input("w", (8, 8), dtype)
    q, k, v = (g.input(n, (2, 4, 8), dtype) for n in "qkv")
    h = g.gelu(g.einsum("bi,ij->bj", x, w))
    h = g.layer_norm(h) + g.softmax(h) + g.log_softmax(h)
    att = g.attention(q, k, v, causal=True)
    g.output(g.mean(g.square(h)) + g.sum(g.max(att, axis=-1)), "loss")
    return g


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_block_gradients_on_the_gpu(dtype):
    assert_grads_agree(
        _mlp_block(dtype),
        "loss",
        backends=GPU,
        sizes={"B": 3},
        ranges={n: (-1.0, 1.0) for n in ("x", "w", "q", "k", "v")},
    )


@pytest.mark.parametrize("op", ops.UNARY_OPS + ops.BINARY_OPS)
def test_elementwise_gradients_on_the_gpu(op):
    g = tl.EinsumGraph()
    a = g.input("a", (3, 4), "float32")
    y = g.unary(op, a) if op in ops.UNARY_OPS else g.binary(op, a, g.input("b", (4,), "float32"))
    if op in ops.COMPARISONS:  # bool, with no gradient of its own: a mask of a float tensor
        y = y * a
    g.output(y, "y")
    positive = op in ("log", "sqrt", "reciprocal", "pow", "div")
    assert_grads_agree(
        g, "y", backends=GPU, ranges={"a": (0.5, 2.0), "b": (0.5, 2.0)} if positive else None
    )


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=graph_cases(max_ops=6))
def test_random_graph_gradients_on_the_gpu(case):
    assert_grads_agree(case.graph, "out0", backends=GPU, ranges=case.ranges, sizes=case.sizes)
