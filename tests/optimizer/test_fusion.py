"""Elementwise fusion: legality predicate, structure, the numpy fused kernel against O0."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends.numpy import fused as fused_numpy, host_pool
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody
from tensorlogic.optimizer import fusion, is_legal_group
from optim_helpers import assert_same_as_o0, count


def _chain(shape=(64, 48), dtype="float32"):
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    b = g.input("b", shape[-1:], dtype)
    y = g.relu(g.tanh(x * 1.5 + b) - 0.25) * x
    g.output(y, name="y")
    return g


def test_chain_becomes_one_fused_node(rng):
    g = _chain()
    res = fusion(g)
    assert res.changed and res.stats == {"groups": 1, "nodes_fused": 6}
    gg = res.graph
    assert count(gg, ops.FUSED) == 1 and count(gg, ops.BINARY) == 0 and count(gg, ops.UNARY) == 0
    y = gg.node(gg.outputs["y"])
    assert y.id == g.outputs["y"] and y.name == g.node(g.outputs["y"]).name
    body = FusedBody.from_args(y.args["body"])
    assert [i.op for i in body.instrs] == ["mul", "add", "tanh", "sub", "relu", "mul"]
    assert body.instrs[0].args[1] == ("const", 1.5)  # a same-dtype scalar becomes a literal
    assert y.args["flops"] == body.flops_per_element() * 64 * 48
    assert not fusion(gg).changed
    plan = assert_same_as_o0(g, rng, 2)
    assert len(plan.steps) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_comparison_masks_fuse_as_one_zero(dtype, rng):
    """A comparison (bool) whose users are all in the group joins it as 1/0 in the group's
    dtype: ``exp(w * (x > y)) + where(x >= 0.5, w, y)`` is one kernel, with numpy's results."""
    g = tl.EinsumGraph()
    x, y, w = (g.input(n, (40, 33), dtype) for n in "xyw")
    g.output(g.exp(w * (x > y)) * 2.0 + g.where(x >= 0.5, w, y), "o")
    g.output(w * (x == 0.0), "z")  # a comparison with an inlined literal
    res = fusion(g)
    gg = res.graph
    assert count(gg, ops.FUSED) == 2 and count(gg, ops.BINARY) == 0
    ops_in = [
        i.op for n in gg if n.kind == ops.FUSED for i in FusedBody.from_args(n.args["body"]).instrs
    ]
    assert {"gt", "ge", "eq"} <= set(ops_in)
    plan = assert_same_as_o0(g, rng, 2)
    assert len(plan.steps) == 2
    # a comparison that is an output (its bool leaves the group) is not a member
    h = tl.EinsumGraph()
    a, b = h.input("a", (8, 5), dtype), h.input("b", (8, 5), dtype)
    m = a < b
    h.output(m, "m")
    h.output(g_exp := h.exp(a * m), "e")
    hh = fusion(h).graph
    assert hh.node(hh.outputs["m"]).dtype == "bool" and count(hh, ops.BINARY, "lt") == 1
    assert g_exp.dtype == dtype
    assert_same_as_o0(h, rng, 2)


@pytest.mark.parametrize("helpers", [0, 3])
@pytest.mark.parametrize("block_bytes", [64, 1000, 1 << 20])
@pytest.mark.parametrize(
    "tail",
    [
        None,
        "sum",
        "mean",
        "max",
        "min",
        "prod",
        "logsumexp",
        "softmax",
        "log_softmax",
        "layer_norm",
        "sum2",
        "all",
    ],
)
def test_fused_kernel_matches_o0_for_every_tail_and_block_size(
    tail, block_bytes, helpers, rng, monkeypatch
):
    """Every tail and block size, with the blocks on the calling thread alone or spread over
    helper threads (more helpers than this machine has cores: they queue, results are the same)."""
    monkeypatch.setattr(fused_numpy, "BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(fused_numpy, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(host_pool, "helper_count", lambda: helpers)
    g = tl.EinsumGraph()
    x = g.input("x", (5, 7, 9), "float64")
    s = g.input("s", (7, 1), "float64")
    c = g.input("c", (5, 7, 9), "float64")
    v = g.where(c > 0.2, g.sigmoid(x) * s, g.square(x) - s)
    if tail in ("softmax", "log_softmax", "layer_norm"):
        v = getattr(g, tail)(v, axis=-1)
    elif tail == "sum2":
        v = g.sum(v, axis=(1, 2), keepdims=True)
    elif tail == "all":
        v = g.sum(v)
    elif tail is not None:
        v = g.reduce(tail, v, axis=-1)
    g.output(v, name="y")
    plan = assert_same_as_o0(g, rng, 2)
    assert [s.kind for s in plan.steps] == ["fused"]


def test_mixed_dtypes_stay_exact(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (33, 17), "float32")
    h = g.input("h", (17,), "float16")
    y = g.exp(x * 0.5) + h  # float16 operand promoted like numpy does
    h2 = g.tanh(h) * 2.0  # a float16 chain of another shape is a group of its own
    g.output(y - g.constant(np.float32(0.25)), name="y")
    g.output(h2, name="h2")
    plan = assert_same_as_o0(g, rng, 2)
    assert sum(s.kind == "fused" for s in plan.steps) == 2


def _graph_for_predicate():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 4), "float32")
    a = g.exp(x)
    b = g.tanh(a)
    c = a + b  # needs a and b
    d = c * 2.0
    g.output(d, name="d")
    return g, x, a, b, c, d


def test_legality_predicate_is_pure_and_checks_each_condition():
    g, x, a, b, c, d = _graph_for_predicate()
    before = g.fingerprint()
    assert is_legal_group(g, frozenset({a.id, b.id, c.id, d.id}), d.id)
    assert is_legal_group(g, frozenset({c.id, d.id}), d.id)
    # a is used by b outside the group
    assert not is_legal_group(g, frozenset({a.id, c.id, d.id}), d.id)
    # an external operand (b) that depends on a member (a): a cycle
    g2 = g.copy()
    assert not is_legal_group(g2, frozenset({a.id, c.id}), c.id)
    assert not is_legal_group(g, frozenset({d.id}), d.id)  # a single op is not a group
    assert not is_legal_group(g, frozenset({x.id, a.id}), a.id)  # inputs are not elementwise
    g.output(c, name="c")
    assert not is_legal_group(g, frozenset({c.id, d.id}), d.id)  # c is now an output
    g3, *_ = _graph_for_predicate()
    assert g3.fingerprint() == before


def test_fusion_respects_outputs_and_shapes(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (8, 6), "float64")
    r = g.input("r", (6,), "float64")
    small = g.exp(r) * 2.0  # shape (6,): its own group, computed once, not per row
    mid = g.tanh(x + small)
    g.output(mid, name="mid")  # an output inside a chain ends a group
    g.output(g.abs(mid) * 3.0 + 1.0, name="y")
    res = fusion(g)
    gg = res.graph
    assert count(gg, ops.FUSED) == 3
    assert gg.outputs == g.outputs
    assert_same_as_o0(g, rng, 2)


def test_reduction_over_leading_axes_is_not_a_tail(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (8, 6), "float64")
    g.output(g.sum(g.exp(x) * 2.0, axis=0), name="y")
    res = fusion(g)
    assert count(res.graph, ops.REDUCE) == 1 and count(res.graph, ops.FUSED) == 1
    assert_same_as_o0(g, rng, 2)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_bias_add_is_recomputed_by_each_elementwise_user(backend, rng):
    """``h = x @ w + b`` read by an activation and by its derivative (a training graph) is not
    written: both fused groups add the bias themselves, and the add node is gone."""
    g = tl.EinsumGraph()
    x = g.input("x", (6, 8), "float32")
    w = g.input("w", (8, 5), "float32")
    b = g.input("b", (5,), "float32")
    d = g.input("d", (6, 5), "float32")
    h = g.einsum("ij,jk->ik", x, w) + b
    g.output(g.gelu(h) * 2.0, name="y")
    g.output(g.tanh(h) * d, name="z")
    gg = fusion(g).graph
    assert count(gg, ops.BINARY) == 0 and count(gg, ops.FUSED) == 2
    assert_same_as_o0(g, rng, 2)
    plan = tl.compile(g, backend=backend, opt_level=2, cache=False)
    shapes = {"x": (6, 8), "w": (8, 5), "b": (5,), "d": (6, 5)}
    inputs = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**inputs)
    got = plan(**inputs)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=2e-5, atol=2e-5)


def test_recomputation_needs_one_full_operand_and_elementwise_users(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (6, 5), "float32")
    y = g.input("y", (6, 5), "float32")
    b = g.input("b", (5,), "float32")
    two_full = x + y  # two full-size operands: recomputing it would read both
    g.output(g.relu(two_full) * 2.0, name="a")
    g.output(g.exp(two_full) + 1.0, name="c")
    h = x + b  # also read by an einsum: stays, and its elementwise users read it
    g.output(g.relu(h) * 3.0, name="e")
    g.output(g.einsum("ij,ij->i", h, y), name="f")
    gg = fusion(g).graph
    assert count(gg, ops.BINARY) == 2
    assert_same_as_o0(g, rng, 2)


def test_a_producer_read_by_a_recomputed_member_stays(rng):
    """``p = abs(x)`` read by a bias add ``q = p + b`` and by ``q * p``: the group of ``q * p``
    recomputes ``q``, whose node stays for its other user (``exp(q)``) and still reads ``p``,
    so ``p`` is not a member that leaves the graph (removing it raised "still used")."""
    g = tl.EinsumGraph()
    x = g.input("x", (6, 5), "float64")
    b = g.input("b", (5,), "float64")
    p = g.abs(x)
    q = p + b
    g.output(g.exp(q), name="o")
    r = q * p  # the walk from here meets q (a recomputed copy) before p
    g.output(r, name="r")
    members = frozenset({r.id, q.id, p.id})
    assert not is_legal_group(g, members, r.id, recomputed=frozenset({q.id}))
    assert is_legal_group(g, frozenset({r.id, q.id}), r.id, recomputed=frozenset({q.id}))
    gg = fusion(g).graph
    gg.validate()
    assert count(gg, ops.FUSED) == 2 and count(gg, ops.BINARY) == 0
    assert_same_as_o0(g, rng, 2)
