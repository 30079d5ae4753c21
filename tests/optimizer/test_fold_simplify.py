"""Constant folding and simplification rules: structure, numbers against O0, idempotence."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.optimizer import fold, simplify
from optim_helpers import assert_same_as_o0, compute_nodes, count


def test_fold_evaluates_constant_subgraphs_once(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (4, 3), "float64")
    w = g.constant(rng.standard_normal((3, 3)))
    b = g.constant(rng.standard_normal(3))
    wt = g.einsum("ij,jk->ik", g.tanh(w), w.T) * 2.0 + b  # all constant
    g.output(g.einsum("bi,ij->bj", x, wt), name="y")
    g.output(g.exp(b), name="eb")  # an output that folds keeps its id and name
    before = g.fingerprint()
    res = fold(g)
    assert res.changed and g.fingerprint() == before
    gg = res.graph
    assert gg.outputs == g.outputs
    assert gg.node(g.outputs["eb"]).kind == ops.CONSTANT
    assert gg.node(g.outputs["eb"]).name == g.node(g.outputs["eb"]).name
    np.testing.assert_array_equal(gg.constants[g.outputs["eb"]], np.exp(g.constants[b.id]))
    y = gg.node(g.outputs["y"])
    assert all(gg.node(i).kind in (ops.INPUT, ops.CONSTANT) for i in y.inputs)
    assert not fold(gg).changed
    plan = assert_same_as_o0(g, rng, 1)
    assert compute_nodes(plan.optimized_graph) == 1


def _single(build, dtype="float64", shape=(3, 4)):
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    g.output(g.tanh(build(g, x)), name="y")
    return g


CASES = [
    ("mul_one", lambda g, x: x * 1.0),
    ("mul_one", lambda g, x: g.constant(np.ones((3, 4))) * x),
    ("add_zero", lambda g, x: 0.0 + x),
    ("sub_zero", lambda g, x: x - 0.0),
    ("div_one", lambda g, x: x / 1.0),
    ("pow_one", lambda g, x: x**1.0),
    ("neg_neg", lambda g, x: -(-x)),  # noqa: B002 (double negation on purpose)
    ("one_minus_twice", lambda g, x: g.one_minus(g.one_minus(x))),
    ("transpose", lambda g, x: x.T.T),
    ("reshape", lambda g, x: x.reshape(12).reshape(3, 4)),
    ("cast_same", lambda g, x: g.cast(x, "float64")),
    ("einsum_identity", lambda g, x: g.einsum("ij,jk->ik", x, g.constant(np.eye(4)))),
    ("einsum_identity", lambda g, x: g.einsum("ji,jk->ik", g.constant(np.eye(3)), x)),
]


@pytest.mark.parametrize("rule,build", CASES, ids=[f"{c[0]}{k}" for k, c in enumerate(CASES)])
def test_rule_removes_the_identity(rule, build, rng):
    g = _single(build)
    res = simplify(g)
    assert res.changed and res.stats.get(rule) == 1, res.stats
    gg = res.graph
    y = gg.node(gg.outputs["y"])
    assert y.op == "tanh"
    src = gg.node(y.inputs[0])
    assert src.kind == ops.INPUT or (rule == "einsum_identity" and len(src.inputs) == 1)
    assert not simplify(gg).changed
    assert_same_as_o0(g, rng, 1)


def test_composed_transpose_and_reshape_rewrites(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3, 4), "float32")
    t = g.transpose(g.transpose(x, (1, 0, 2)), (2, 0, 1))
    r = x.reshape(6, 4).reshape(4, 6)
    g.output(t, name="t")  # outputs keep their ids: rewritten, not aliased
    g.output(r, name="r")
    res = simplify(g)
    gg = res.graph
    assert gg.outputs == g.outputs
    tn, rn = gg.node(g.outputs["t"]), gg.node(g.outputs["r"])
    assert tn.inputs == (x.id,) and tuple(tn.args["perm"]) == (2, 1, 0)
    assert rn.inputs == (x.id,) and tuple(rn.shape) == (4, 6)
    assert count(gg, ops.TRANSPOSE) == 1 and count(gg, ops.RESHAPE) == 1
    assert not simplify(gg).changed
    assert_same_as_o0(g, rng, 1)


def test_identity_on_an_output_is_kept():
    g = tl.EinsumGraph()
    x = g.input("x", (3,), "float32")
    g.output(x * 1.0, name="y")
    res = simplify(g)
    assert not res.changed and res.graph.outputs == g.outputs


def test_mul_zero_only_with_assume_finite(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (5,), "float32")
    g.output(x * 0.0 + 1.0, name="y")
    assert "mul_zero" not in simplify(g).stats
    # IEEE: inf*0 is nan, and the default keeps that
    out = tl.compile(g, backend="numpy", opt_level=2, cache=False)(
        x=np.array([np.inf, 1, 2, 3, np.nan], np.float32)
    )["y"]
    assert np.isnan(out[0]) and np.isnan(out[4]) and (out[1:4] == 1).all()
    res = simplify(g, {"assume_finite": True})
    assert res.stats.get("mul_zero") == 1
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False, assume_finite=True)
    assert compute_nodes(plan.optimized_graph) == 0
    np.testing.assert_array_equal(plan(x=rng.standard_normal(5).astype(np.float32))["y"], 1.0)


def test_einsum_identity_keeps_a_needed_diagonal(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (4,), "float64")
    g.output(g.einsum("i,ij->ij", x, g.constant(np.eye(4))), name="y")  # diag(x): needs I
    assert not simplify(g).changed
    assert_same_as_o0(g, rng, 2)


def test_fold_takes_an_evaluator_from_the_options(rng):
    from tensorlogic.ir.evaluate import evaluate_node

    seen = []

    def counting(node, arrays):
        seen.append(node.kind)
        return evaluate_node(node, arrays)

    g = tl.EinsumGraph()
    x = g.input("x", (3, 3), "float32")
    w = g.constant(rng.standard_normal((3, 3)).astype(np.float32))
    g.output(x + g.softmax(g.exp(w) * 0.5, axis=1), name="y")
    res = fold(g, {"fold_evaluator": counting})
    assert res.changed and seen == [ops.UNARY, ops.BINARY, ops.ROWOP]
    xv = rng.standard_normal((3, 3)).astype(np.float32)
    e = np.exp(g.constants[w.id]) * 0.5
    want = xv + np.exp(e - e.max(1, keepdims=True)) / np.exp(e - e.max(1, keepdims=True)).sum(
        1, keepdims=True
    )
    plan = tl.compile(g, backend="numpy", opt_level=1, cache=False, fold_evaluator=counting)
    np.testing.assert_allclose(plan(x=xv)["y"], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(tl.GraphError, match="fold_evaluator"):
        tl.compile(g, backend="numpy", fold_evaluator="numpy")
