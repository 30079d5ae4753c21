"""FUSED nodes (broadcasting, reduction tails, row ops) against the unfused numpy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.ir import ops

from numba_cases import fused_graph, random_inputs, reference, tol

# relu(a*b+c)*d-e : the benchmark chain
CHAIN = [
    ("mul", [("in", 0), ("in", 1)]),
    ("add", [("tmp", 0), ("in", 2)]),
    ("relu", [("tmp", 1)]),
    ("mul", [("tmp", 2), ("in", 3)]),
    ("sub", [("tmp", 3), ("in", 4)]),
]
# exp/log/where/constants in one program
MIXED = [
    ("exp", [("in", 0)]),
    ("mul", [("tmp", 0), ("const", 0.25)]),
    ("gt", [("in", 1), ("const", 0.0)]),
    ("where", [("tmp", 2), ("tmp", 1), ("in", 1)]),
    ("abs", [("tmp", 3)]),
    ("add", [("tmp", 4), ("const", 1.0)]),
    ("log", [("tmp", 5)]),
]


def _check(rng, shapes, dtype, instrs, space, tail=None, axes=(), keepdims=False, **opts):
    g = fused_graph(shapes, dtype, instrs, space, tail, axes, keepdims)
    xs = random_inputs(rng, shapes, dtype)
    plan = tl.compile(g, backend="numba", opt_level=0, **opts)
    got = plan(**xs)["y"]
    want = reference(shapes, dtype, instrs, tail, axes, keepdims, xs)
    n = int(np.prod([space[a] for a in axes])) if axes else 1
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **tol(dtype, n))
    return plan


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shapes",
    [
        [(37,)] * 5,  # flat
        [(6, 7), (7,), (6, 1), (1, 7), ()],  # bias, row scale, scalar-like
        [(3, 1, 5), (4, 1), (3, 4, 5), (5,), (3, 4, 1)],  # rank 3 mixed broadcasting
    ],
)
def test_chain_broadcasting(rng, dtype, shapes):
    space = np.broadcast_shapes(*shapes)
    _check(rng, shapes, dtype, CHAIN, space)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mixed_program_with_constants_and_where(rng, dtype):
    _check(rng, [(5, 8), (8,)], dtype, MIXED, (5, 8))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tail", ["sum", "mean", "max", "min", "prod", "logsumexp"])
@pytest.mark.parametrize("axes,keepdims", [((1,), False), ((0, 2), True), ((0, 1, 2), False)])
def test_reduction_tails(rng, dtype, tail, axes, keepdims):
    instrs = [("mul", [("in", 0), ("in", 1)]), ("add", [("tmp", 0), ("const", 0.5)])]
    _check(rng, [(3, 4, 5), (4, 1)], dtype, instrs, (3, 4, 5), tail, axes, keepdims)


LEADING = pytest.mark.parametrize(
    "shapes,axes",
    [
        ([(7, 3, 600), (600,)], (0,)),  # leading axes reduced, a kept last dim over 2 tasks
        ([(7, 3, 600), (600,)], (0, 1)),
        ([(5, 6, 300), (6, 300)], (1,)),  # kept dims on both sides of the reduced one
        ([(4, 9, 5, 70), (70,)], (0, 2)),
        ([(7, 3, 40), (3, 1)], (0,)),  # an input broadcast along the last dim
    ],
)


@LEADING
@pytest.mark.parametrize("tail", ["sum", "mean", "max", "min", "prod", "logsumexp"])
def test_reductions_over_leading_axes(rng, tail, shapes, axes):
    """Reductions over the axes before a kept last one (bias gradients) walk rows with the kept
    elements innermost."""
    # values near 1: a product over 180 of them stays far from float32's overflow and underflow
    instrs = [
        ("mul", [("in", 0), ("in", 1)]),
        ("mul", [("tmp", 0), ("const", 0.05)]),
        ("add", [("tmp", 1), ("const", 1.0)]),
    ]
    space = np.broadcast_shapes(*shapes)
    plan = _check(rng, shapes, "float32", instrs, space, tail, axes, parallel_threshold=0)
    by_columns = tail != "logsumexp" and all(s[-1] == space[-1] for s in shapes)
    assert ("nch =" in plan.concrete.kernels[0].source) == by_columns


@LEADING
@pytest.mark.parametrize("dtype,threshold", [("float64", 0), ("float32", None)])
def test_sums_over_leading_axes_serial_and_float64(rng, dtype, threshold, shapes, axes):
    instrs = [("mul", [("in", 0), ("in", 1)]), ("add", [("tmp", 0), ("const", 0.5)])]
    space = np.broadcast_shapes(*shapes)
    _check(rng, shapes, dtype, instrs, space, "sum", axes, parallel_threshold=threshold)


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "complex64"])
@pytest.mark.parametrize("tail", ["sum", "max", "prod"])
def test_lone_reductions_over_leading_axes(rng, dtype, tail):
    if dtype.startswith("complex") and tail == "max":
        pytest.skip("complex max is not a numba reduction")
    g = tl.EinsumGraph()
    x = g.input("x", (6, 5, 300), dtype)
    g.output(g.reduce(tail, x, (0, 1)), "y")
    raw = rng.integers(-3, 4, (6, 5, 300))
    xs = {"x": (raw + (1j * raw if dtype.startswith("complex") else 0)).astype(dtype)}
    got = tl.compile(g, backend="numba", opt_level=0, parallel_threshold=0)(**xs)["y"]
    want = tl.compile(g, backend="numpy", opt_level=0)(**xs)["y"]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tail", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [2, 1])
def test_row_op_tails(rng, dtype, tail, axis):
    instrs = [("mul", [("in", 0), ("const", 3.0)]), ("add", [("tmp", 0), ("in", 1)])]
    _check(rng, [(3, 4, 6), (6,)], dtype, instrs, (3, 4, 6), tail, (axis,))


@pytest.mark.parametrize(
    "case",
    [
        ("flat", [(70000,)] * 5, CHAIN, None, ()),
        ("rows", [(300, 257), (257,), (300, 1), (300, 257), (300, 257)], CHAIN, None, ()),
        ("sum-all", [(70001,)], [("square", [("in", 0)])], "sum", (0,)),
        ("lse-all", [(300, 257), (257,)], [("add", [("in", 0), ("in", 1)])], "logsumexp", (0, 1)),
        ("max-rows", [(300, 257)], [("neg", [("in", 0)])], "max", (1,)),
        ("softmax", [(300, 257)], [("mul", [("in", 0), ("const", 2.0)])], "softmax", (1,)),
        # two outer dims: the flat parallel index is split into both (once failed to compile)
        ("rank3", [(3, 1, 5), (4, 1), (3, 4, 5), (5,), (3, 4, 1)], CHAIN, None, ()),
        ("rank3-max", [(3, 4, 5), (4, 1)], [("mul", [("in", 0), ("in", 1)])], "max", (2,)),
        # row ops over the last dim walk row views; (4, 1) is a per-row scalar, (9,) a shared row
        (
            "rank3-softmax",
            [(3, 4, 9), (4, 1), (9,)],
            [("add", [("in", 0), ("in", 1)]), ("mul", [("tmp", 0), ("in", 2)])],
            "softmax",
            (2,),
        ),
        (
            "rank3-log-softmax",
            [(3, 4, 9), (4, 1)],
            [("sub", [("in", 0), ("in", 1)])],
            "log_softmax",
            (2,),
        ),
        (
            "rank3-layer-norm",
            [(3, 4, 9), (4, 1)],
            [("sub", [("in", 0), ("in", 1)])],
            "layer_norm",
            (2,),
        ),
        ("axis0-softmax", [(33, 5), (5,)], [("add", [("in", 0), ("in", 1)])], "softmax", (0,)),
    ],
)
def test_parallel_kernels(rng, case):
    _, shapes, instrs, tail, axes = case
    space = np.broadcast_shapes(*shapes)
    plan = _check(rng, shapes, "float32", instrs, space, tail, axes, parallel_threshold=0)
    assert "parallel" in plan.steps[0].info


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tail", ["softmax", "log_softmax", "layer_norm"])
@pytest.mark.parametrize(
    "shape,axis",
    [((7,), 0), ((5, 33), 1), ((33, 5), 0), ((2, 3, 17), 2), ((2, 17, 3), 1), ((4, 1), 1)],
)
@pytest.mark.parametrize("threshold", [0, None])
def test_row_ops_on_a_lone_input(rng, dtype, tail, shape, axis, threshold):
    """A row op of a plain input re-reads the input in each pass instead of storing it first."""
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    g.output(g._rowop(tail, x, axis, None), "y")
    xs = {"x": (rng.standard_normal(shape) * 3).astype(dtype)}
    plan = tl.compile(g, backend="numba", opt_level=0, parallel_threshold=threshold)
    assert ("parallel" in plan.steps[0].info) == (threshold == 0)
    want = tl.compile(g, backend="numpy", opt_level=0)(**xs)["y"]
    np.testing.assert_allclose(plan(**xs)["y"], want, **tol(dtype, shape[axis]))


@settings(max_examples=12, deadline=None)
@given(m=st.integers(2, 40), n=st.integers(2, 40), seed=st.integers(0, 2**32 - 1))
def test_sizes_property(m, n, seed):
    """One compiled kernel per pattern serves every size (sizes are run-time arguments)."""
    rng = np.random.default_rng(seed)
    shapes = [(m, n), (n,)]
    instrs = [("sub", [("in", 0), ("in", 1)]), ("tanh", [("tmp", 0)])]
    _check(rng, shapes, "float64", instrs, (m, n))
    _check(rng, shapes, "float64", instrs, (m, n), "logsumexp", (1,))
    _check(rng, shapes, "float64", instrs, (m, n), "softmax", (0,))


def test_bad_fused_program_raises_graph_error():
    # the body is checked when the node is added, before any backend sees it
    with pytest.raises(tl.GraphError, match="unknown op 'nope'"):
        fused_graph([(4,)], "float32", [("nope", [("in", 0)])], (4,))


def test_long_chain_is_split_into_bounded_kernels():
    # a 200-op elementwise chain: one fused kernel per MAX_GROUP_OPS ops at most, so each
    # numba compile stays bounded and the whole compile linear in the chain's length
    from tensorlogic.optimizer.fusion import MAX_GROUP_OPS

    g = tl.EinsumGraph()
    x = g.input("x", (16, 8))
    h = x
    for k in range(200):
        h = g.tanh(h) if k % 3 == 0 else h * (0.5 + 0.05 * (k % 5)) if k % 3 == 1 else h + x
    g.output(h, "y")
    plan = tl.compile(g, backend="numba", opt_level=2)
    fused = [n for n in plan.optimized_graph.nodes if n.kind == ops.FUSED]
    sizes = [len(n.args["body"]["instrs"]) for n in fused]
    assert max(sizes) <= MAX_GROUP_OPS and len(fused) == math.ceil(200 / MAX_GROUP_OPS)
    v = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    ref = tl.compile(g, backend="numpy", opt_level=0)(x=v)["y"]
    np.testing.assert_allclose(plan(x=v)["y"], ref, rtol=1e-4, atol=1e-5)


def test_kernel_that_cannot_compile_for_memory_falls_back_to_numpy(monkeypatch):
    from tensorlogic.backends.numba import cache as numba_cache

    def out_of_memory(*a, **k):
        raise MemoryError

    monkeypatch.setattr(numba_cache, "load", out_of_memory)
    g = tl.EinsumGraph()
    x = g.input("x", (8, 4))
    g.output(g.sum(g.tanh(x) * 2.0 + x, axis=1), "y")
    plan = tl.compile(g, backend="numba", opt_level=2, cache=False)
    v = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)
    np.testing.assert_allclose(plan(x=v)["y"], (np.tanh(v) * 2 + v).sum(axis=1), rtol=1e-5)
    assert "numba parallel" not in str(plan) and "numba serial" not in str(plan)
