"""Tests of tensorlogic.testing itself: it must catch a wrong backend, derive sensible
tolerances and input ranges, and its strategies must cover every op."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tensorlogic as tl
from tensorlogic.backends import base as backend_base
from tensorlogic.backends.numpy.backend import NumpyBackend
from tensorlogic.ir import ops
from tensorlogic.testing import (
    assert_backends_agree,
    bounds,
    choose_ranges,
    derive_tolerances,
    graph_cases,
    random_inputs,
    reference_evaluate,
)


class _SlightlyWrongExp(NumpyBackend):
    """numpy, except that exp is off by a relative 1e-4."""

    name = "wrong_exp"

    def prepare(self, step, node, in_nodes, graph):
        kernel = super().prepare(step, node, in_nodes, graph)
        if node.kind == ops.UNARY and node.op == "exp":

            def wrong(args, out):
                r = kernel(args, out)
                r *= 1 + 1e-4
                return r

            return wrong
        return kernel


@pytest.fixture
def wrong_backend(monkeypatch):
    monkeypatch.setitem(backend_base._factories, "wrong_exp", _SlightlyWrongExp)
    yield "wrong_exp"
    backend_base._instances.pop("wrong_exp", None)


def _exp_graph(dtype="float32"):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 4), dtype)
    g.output(g.sum(g.exp(x), axis=1), "y")
    return g


def test_a_wrong_backend_is_caught(wrong_backend):
    with pytest.raises(AssertionError) as info:
        assert_backends_agree(_exp_graph(), backends=[wrong_backend], opt_levels=[0, 1], seed=5)
    msg = str(info.value)
    for phrase in ("'wrong_exp' at O0", "output 'y'", "seed=5", "exp"):
        assert phrase in msg


def test_a_correct_graph_passes_and_reports():
    rep = assert_backends_agree(_exp_graph("float64"), backends=["numpy"], sizes={"B": 5}, seed=1)
    assert rep.sizes == {"B": 5} and rep.seed == 1
    assert all(err <= rep.tolerances["y"].atol for err in rep.errors.values())
    assert rep.reference_errors["y"] <= rep.tolerances["y"].atol


def test_tolerances_follow_dtype_and_sum_length():
    def tol(dtype, n):
        g = tl.EinsumGraph()
        x = g.input("x", (3, n), dtype)
        g.output(g.sum(x, axis=1), "y")
        return derive_tolerances(g, {}, {"x": (-1.0, 1.0)})["y"]

    assert tol("float32", 8).atol > 1e6 * tol("float64", 8).atol
    assert tol("float32", 64).atol > 4 * tol("float32", 8).atol
    assert tol("float32", 8).source == "error bound"


def test_ranges_are_positive_where_needed():
    g = tl.EinsumGraph()
    a, b, c = g.input("a", (3,)), g.input("b", (3,)), g.input("c", (3,))
    g.output(g.log(a) + g.tanh(b) / g.sqrt(c), "y")
    r = choose_ranges(g, {})
    assert r["a"][0] > 0 and r["c"][0] > 0
    assert r["b"][0] < 0  # b may be negative: nothing needs it positive


def test_random_inputs_are_fresh_nonzero_and_bound():
    g = _exp_graph()
    rng = np.random.default_rng(0)
    one = random_inputs(g, {"B": 3}, {"x": (-2.0, 2.0)}, rng)["x"]
    two = random_inputs(g, {"B": 3}, {"x": (-2.0, 2.0)}, rng)["x"]
    assert one.shape == (3, 4) and one.dtype == np.float32
    assert np.all(one != 0) and not np.array_equal(one, two)


def test_reference_interpreter_matches_numpy():
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3), "float64")
    y = g.input("y", (3,), "float64")
    g.output(g.log_softmax(g.einsum("ij,j->ij", x, y), axis=0), "z")
    xv, yv = np.arange(6.0).reshape(2, 3) / 7, np.array([1.0, -2.0, 0.5])
    z = xv * yv
    want = z - np.log(np.exp(z).sum(axis=0, keepdims=True))
    np.testing.assert_allclose(reference_evaluate(g, {"x": xv, "y": yv})["z"], want, rtol=1e-12)


def test_bounds_rules():
    x = bounds.Bound(-1.0, 2.0, 0.0, True)
    e = bounds.unary("exp", x, "float64")
    assert e.lo == pytest.approx(np.exp(-1)) and e.hi == pytest.approx(np.exp(2))
    assert bounds.unary("log", x, "float64").domain  # log of a range through zero
    noisy = bounds.unary("tanh", x, "float32")
    assert bounds.binary("gt", noisy, x, "float32").problem  # rounding decides a comparison
    assert not bounds.binary("gt", x, x, "float32").problem


def test_strategies_cover_every_op():
    seen: collections.Counter = collections.Counter()

    # derandomized: this checks the generator's reach, so it must not depend on the run's luck
    @settings(
        max_examples=500,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(graph_cases())
    def collect(case):
        case.graph.validate()
        assert case.graph.outputs
        for n in case.graph.nodes:
            seen[n.kind] += 1
            if n.op:
                seen[n.op] += 1
            seen[n.dtype] += 1
            if n.kind == ops.EINSUM:
                spec = n.args["spec"]
                seen["ellipsis"] += "..." in spec
                seen["implicit"] += "->" not in spec
                terms = spec.split("->")[0].replace("...", "").split(",")
                seen["repeated-index"] += any(len(set(t)) < len(t) for t in terms)
        seen["symbolic"] += bool(case.graph.symbols)

    collect()
    wanted = (
        set(ops.UNARY_OPS)
        | set(ops.BINARY_OPS)
        | set(ops.REDUCTIONS)
        | set(ops.ROW_OPS)
        | {ops.EINSUM, ops.WHERE, ops.TRANSPOSE, ops.RESHAPE, ops.CAST, ops.CONSTANT}
        | {"float32", "float64", "ellipsis", "implicit", "repeated-index", "symbolic"}
    )
    missing = sorted(k for k in wanted if not seen[k])
    assert not missing, f"strategies never produced {missing}"
