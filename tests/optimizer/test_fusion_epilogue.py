"""Row-op epilogues: the fusion pass absorbs elementwise consumers of softmax / log_softmax /
layer_norm into the row op's node; every backend matches the unfused O0 plan on fresh data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.errors import GraphError
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody, FusedOp
from tensorlogic.optimizer import fusion, is_legal_group
from optim_helpers import count, random_inputs

TOL = {"float32": 3e-5, "float64": 1e-10}


def _affine(
    shape=(64, 96), dtype="float32", op="layer_norm", prologue=False, residual=False, act=False
):
    """``op(x) * gamma + beta`` (gamma, beta of shape (D,)), optionally after ``x * 1.5 - s``,
    followed by a residual add and a relu."""
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    gamma = g.input("gamma", shape[-1:], dtype)
    beta = g.input("beta", shape[-1:], dtype)
    if prologue:
        x = x * 1.5 - g.input("s", shape[:-1] + (1,), dtype)
    y = getattr(g, op)(x, -1) * gamma + beta
    if residual:
        y = y + g.input("r", shape, dtype)
    if act:
        y = g.relu(y) * 0.5
    g.output(y, "y")
    return g


def _compare(g, backend, rng, opt_level=2, **opts):
    inputs = random_inputs(g, rng, 0.25, 1.5)
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**inputs)
    plan = tl.compile(g, backend=backend, opt_level=opt_level, cache=False, **opts)
    got = plan(**inputs)
    for name, want in ref.items():
        have = got[name].get() if hasattr(got[name], "get") else np.asarray(got[name])
        tol = TOL[str(want.dtype)]
        np.testing.assert_allclose(have, want, rtol=tol, atol=tol, err_msg=f"{backend} {name}")
    return plan


def _fused_body(g) -> FusedBody:
    (node,) = [n for n in g if n.kind == ops.FUSED]
    return FusedBody.from_args(node.args["body"])


def test_layer_norm_affine_is_one_fused_node_with_an_epilogue():
    g = _affine()
    res = fusion(g)
    assert res.changed and res.stats == {"groups": 1, "nodes_fused": 3}
    gg = res.graph
    assert count(gg, ops.FUSED) == 1 and count(gg, ops.ROWOP) == 0 and count(gg, ops.BINARY) == 0
    body = _fused_body(gg)
    assert body.instrs == () and body.tail == "layer_norm"  # the row op reads input 0 itself
    assert [i.op for i in body.epilogue] == ["mul", "add"]
    assert body.epilogue[0].args == (("tail", 0), ("in", 1))
    assert body.epilogue[1].args == (("tmp", 0), ("in", 2))
    y = gg.node(gg.outputs["y"])
    assert y.id == g.outputs["y"] and tuple(y.shape) == (64, 96)
    assert not fusion(gg).changed
    assert FusedBody.from_args(body.to_args()) == body


@pytest.mark.parametrize("how", ["op", "hand"])
def test_one_kernel_at_o2(how):
    """The layer_norm op, or layer norm written out by hand, with an affine: one plan step."""
    g = tl.EinsumGraph()
    x = g.input("x", (32, 64))
    if how == "op":
        y = g.layer_norm(x, -1)
    else:
        d = x - g.mean(x, 1, keepdims=True)
        y = d / g.sqrt(g.mean(g.square(d), 1, keepdims=True) + 1e-5)
    w = np.random.default_rng(0).uniform(0.5, 1.5, 64).astype(np.float32)
    g.output(y * g.constant(w) + g.constant(w[::-1].copy()), "y")
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    assert len(plan.steps) == 1
    assert "layer_norm -> mul,add" in str(plan)


def test_prologue_row_op_and_epilogue_share_one_node():
    g = _affine(prologue=True, residual=True, act=True)
    gg = fusion(g).graph
    assert count(gg, ops.FUSED) == 1
    body = _fused_body(gg)
    assert [i.op for i in body.instrs] == ["mul", "sub"]
    assert [i.op for i in body.epilogue] == ["mul", "add", "add", "relu", "mul"]
    assert body.epilogue[-1].args[1] == ("const", 0.5)


def test_epilogue_stops_where_a_value_leaves_the_group():
    g = tl.EinsumGraph()
    x = g.input("x", (8, 16))
    gamma = g.input("gamma", (16,))
    scaled = g.softmax(x, -1) * gamma
    g.output(scaled, "scaled")  # an output: the epilogue ends here
    g.output(g.exp(scaled + 1.0), "z")
    gg = fusion(g).graph
    body = FusedBody.from_args(gg.node(gg.outputs["scaled"]).args["body"])
    assert body.tail == "softmax" and [i.op for i in body.epilogue] == ["mul"]
    # the add and exp after it are an elementwise group of their own
    z = gg.node(gg.outputs["z"])
    assert z.kind == ops.FUSED and [i.op for i in FusedBody.from_args(z.args["body"]).instrs] == [
        "add",
        "exp",
    ]


def test_no_epilogue_across_a_broadcast_or_a_second_user():
    g = tl.EinsumGraph()
    x = g.input("x", (8, 16))
    big = g.input("big", (3, 8, 16))
    s = g.softmax(x, -1)
    g.output(s + big, "wider")  # the consumer has a larger shape: not an epilogue
    g.output(s * 2.0, "twice")
    gg = fusion(g).graph
    assert count(gg, ops.ROWOP) == 1 and count(gg, ops.FUSED) == 0


def test_legality_is_a_pure_predicate_that_refuses_cycles():
    g = tl.EinsumGraph()
    x = g.input("x", (8, 16))
    s = g.softmax(x, -1)
    e = g.exp(s)  # the add's other operand depends on the row op
    y = s + e
    g.output(y, "y")
    before = [(n.id, n.kind, n.inputs) for n in g]
    pos = {n.id: k for k, n in enumerate(g.nodes)}
    assert not is_legal_group(g, frozenset(), None, s.id, pos, [y.id])
    assert is_legal_group(g, frozenset(), None, s.id, pos, [e.id, y.id])
    assert not is_legal_group(g, frozenset(), None, s.id, pos, [y.id, e.id])  # out of order
    assert not is_legal_group(g, frozenset(), None, None, pos, [e.id])  # no row op
    assert [(n.id, n.kind, n.inputs) for n in g] == before
    body = _fused_body(fusion(g).graph)
    assert [i.op for i in body.epilogue] == ["exp", "add"]
    assert body.epilogue[1].args == (("tail", 0), ("tmp", 0))


def test_bad_epilogues_are_graph_errors():
    mul = FusedOp("mul", (("tail", 0), ("in", 0)))
    with pytest.raises(GraphError, match="epilogue needs a row-op tail"):
        FusedBody((FusedOp("exp", (("in", 0),)),), (4, 5), "sum", (1,), epilogue=(mul,)).validate(1)
    with pytest.raises(GraphError, match="bad ref"):
        FusedBody((FusedOp("add", (("tail", 0), ("in", 0))),), (4, 5), "softmax", (1,)).validate(
            1
        )  # ("tail", 0) outside an epilogue
    with pytest.raises(GraphError, match="empty program"):
        FusedBody((), (4, 5), "sum", (1,)).validate(1)
    with pytest.raises(GraphError, match="epilogue instruction 0"):
        FusedBody(
            (), (4, 5), "softmax", (1,), epilogue=(FusedOp("mul", (("tail", 0), ("in", 3))),)
        ).validate(1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ops.ROW_OPS)
def test_every_backend_matches_o0(op, dtype, backend, rng):
    g = _affine((50, 130), dtype, op, prologue=op != "layer_norm", residual=True, act=True)
    plan = _compare(g, backend, rng)
    assert len(plan.steps) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_affine_on_every_backend(dtype, backend, rng):
    g = _affine((37, 256), dtype)
    _compare(g, backend, rng)


def test_numpy_blocks_and_aliasing(rng, monkeypatch):
    """Small blocks (many per row set) and an epilogue input of the output's shape."""
    from tensorlogic.backends.numpy import fused as fused_numpy

    monkeypatch.setattr(fused_numpy, "BLOCK_BYTES", 512)
    g = tl.EinsumGraph()
    x = g.input("x", (6, 5, 40), "float64")
    r = g.input("r", (6, 5, 40), "float64")
    c = g.input("c", (5, 1), "float64")
    y = g.where(r > 0.7, g.log_softmax(x * c, -1), r)  # where last: not alias-safe over the tail
    g.output(g.gelu(y) + r, "y")
    _compare(g, "numpy", rng)


@st.composite
def _epilogue_graphs(draw):
    dtype = draw(st.sampled_from(["float32", "float64"]))
    rows = draw(st.sampled_from([(1,), (7,), (3, 5)]))
    d = draw(st.sampled_from([1, 9, 64, 130]))
    shape = rows + (d,)
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    v = getattr(g, draw(st.sampled_from(ops.ROW_OPS)))(x, -1)
    for k in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["col", "full", "scalar", "rows", "unary"]))
        if kind == "unary":
            v = g.unary(draw(st.sampled_from(["tanh", "relu", "neg", "sigmoid"])), v)
            continue
        operand = (
            g.input(f"p{k}", {"col": (d,), "full": shape, "rows": rows + (1,)}[kind], dtype)
            if kind != "scalar"
            else draw(st.sampled_from([0.5, -2.0, 3.0]))
        )
        op = draw(st.sampled_from(["add", "mul", "sub", "maximum"]))
        v = g.binary(op, v, operand) if draw(st.booleans()) else g.binary(op, operand, v)
    g.output(v, "y")
    return g


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_epilogue_graphs(), st.randoms(use_true_random=False))
def test_random_epilogues_match_o0_on_numpy(g, rnd):
    plan = _compare(g, "numpy", np.random.default_rng(rnd.getrandbits(32)))
    assert len(plan.steps) == 1


def _has_epilogue(case) -> bool:
    from tensorlogic.optimizer import optimize

    g, _report = optimize(case.graph, 2)
    return any(n.kind == ops.FUSED and FusedBody.from_args(n.args["body"]).epilogue for n in g)


def test_fuzzer_graphs_reach_epilogues():
    """The differential fuzzer's graph strategy produces row ops that get an epilogue."""
    from hypothesis import find
    from tensorlogic.testing import graph_cases

    case = find(
        graph_cases(max_ops=3, symbolic=False, kinds=("rowop", "unary")),
        _has_epilogue,
        settings=settings(max_examples=300, database=None),
    )
    assert _has_epilogue(case)


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzzed_row_op_graphs_agree_on_cpu_backends(data):
    from tensorlogic.testing import assert_backends_agree, graph_cases

    case = data.draw(graph_cases(max_ops=3, symbolic=False, kinds=("rowop", "binary", "unary")))
    assert_backends_agree(
        case.graph,
        backends=("numpy", "numba"),
        opt_levels=(0, 2),
        ranges=case.ranges,
        sizes=case.sizes,
        seed=data.draw(st.integers(0, 2**32 - 1)),
    )


@pytest.mark.parametrize("block_bytes", [96, 1 << 20])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("tail", ops.ROW_OPS)
@pytest.mark.parametrize("prologue", [True, False])
def test_numpy_fused_row_ops_over_any_axis(tail, axis, prologue, block_bytes, rng, monkeypatch):
    """A hand-made fused node whose row op runs over a leading axis (the numpy kernel keeps
    that axis and the ones after it whole in a block) against plain numpy."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))
    from cupy_cases import EPILOGUE, epilogue_reference, epilogue_shapes
    from tensorlogic.backends.numpy import fused as fused_numpy

    monkeypatch.setattr(fused_numpy, "BLOCK_BYTES", block_bytes)
    space = (6, 5, 7)
    g = tl.EinsumGraph()
    shapes = epilogue_shapes(space, axis)
    ins = [g.input(n, s, "float64") for n, s in zip(("x", "gamma", "r"), shapes)]
    instrs = (FusedOp("tanh", (("in", 0),)),) if prologue else ()
    body = FusedBody(instrs, space, tail, (axis,), epilogue=EPILOGUE)
    nid = g.add_node(
        ops.FUSED, None, [t.id for t in ins], {"body": body.to_args()}, shape=space, dtype="float64"
    )
    g.output(g.tensor(nid), "y")
    data = {n: rng.standard_normal(s) for n, s in zip(("x", "gamma", "r"), shapes)}
    got = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**data)["y"]
    want = epilogue_reference(tail, *data.values(), axis, prologue)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
