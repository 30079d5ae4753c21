"""Pairs of constants on a contraction path are contracted once, at compile time."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.optimizer import optimize
from optim_helpers import assert_same_as_o0, random_inputs


def _scaled_scores(rng, dtype="float32", weight="constant", scale=0.125):
    """Attention's scaled scores with the scale on a product: merge pulls it in as an operand
    beside the key weight, and the planned path multiplies those two first."""
    g = tl.EinsumGraph()
    x = g.input("x", (2, 24, 16), dtype)
    wq = g.constant(rng.standard_normal((2, 8, 16)).astype(dtype), name="wq")
    wk_value = rng.standard_normal((2, 8, 16)).astype(dtype)
    wk = g.parameter("wk", wk_value) if weight == "parameter" else g.constant(wk_value, name="wk")
    q = g.einsum("bsd,hkd->bhsk", x, wq)
    k = g.einsum("bsd,hkd->bhsk", x, wk)
    g.output(g.einsum("bhqk,bhsk->bhqs", q, k) * scale, name="y")
    return g


def _planned_einsum(plan) -> tuple:
    """(operand count, constant_pairs stat) of the plan's one multi-operand einsum."""
    g = plan.optimized_graph
    big = [n for n in g if n.kind == ops.EINSUM and len(n.inputs) >= 3]
    stats = {}
    for r in plan.optimizer_report.records:
        if r.name == "contraction":
            stats.update(r.stats)
    return (len(big[0].inputs) if big else None), stats.get("constant_pairs", 0)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_scale_pair_is_contracted_at_compile_time(backend, rng):
    g = _scaled_scores(rng)
    plan = tl.compile(g, backend=backend, opt_level=2, cache=False)
    operands, hoisted = _planned_einsum(plan)
    assert hoisted == 1 and operands == 4  # x, wq, x and the scaled key weight
    # the key weight and the scale are gone from the plan: wq and the scaled key weight remain
    consts = [n for n in plan.optimized_graph if n.kind == ops.CONSTANT]
    assert len(consts) == 2 and {n.shape for n in consts} == {(2, 8, 16)}
    assert "wq" in {n.name for n in consts} and "wk" not in {n.name for n in consts}
    inputs = random_inputs(g, rng)
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**inputs)["y"]
    np.testing.assert_allclose(plan(**inputs)["y"], ref, rtol=2e-5, atol=2e-5)


def test_per_channel_constants_fold_and_match(rng):
    """A constant vector scaling a constant matrix inside a network: one operand at run time."""
    g = tl.EinsumGraph()
    x = g.input("x", (32, 12), "float64")
    s = g.constant(rng.uniform(0.5, 2.0, 12), name="s")
    w = g.constant(rng.standard_normal((12, 20)), name="w")
    v = g.constant(rng.standard_normal((20, 6)), name="v")
    g.output(g.einsum("bi,i,ij,jk->bk", x, s, w, v), name="y")
    plan = assert_same_as_o0(g, rng, 2)
    operands, hoisted = _planned_einsum(plan)
    assert hoisted >= 1 and (operands is None or operands < 4)


@pytest.mark.parametrize(
    "why,kwargs,options",
    [
        ("a learned parameter changes between calls", {"weight": "parameter"}, {}),
        ("16-bit floats compute the product in float32", {"dtype": "float16"}, {}),
        ("fold skipped", {}, {"skip_passes": ["fold"]}),
    ],
)
def test_pairs_that_stay_on_the_run_time_path(why, kwargs, options, rng):
    g = _scaled_scores(rng, **kwargs)
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False, **options)
    operands, hoisted = _planned_einsum(plan)
    assert hoisted == 0 and operands == 5, why
    assert_same_as_o0(g, rng, 2, rtol=2e-2 if "dtype" in kwargs else None, **options)


def test_pair_whose_product_would_grow_the_plan_stays(rng):
    """An outer product of two constant vectors is larger than either: not stored."""
    g = tl.EinsumGraph()
    x = g.input("x", (64, 64), "float64")
    a = g.constant(rng.standard_normal(64), name="a")
    b = g.constant(rng.standard_normal(64), name="b")
    g.output(g.einsum("ij,i,j->ij", x, a, b), name="y")
    plan = assert_same_as_o0(g, rng, 2)
    assert _planned_einsum(plan) == (3, 0)


def test_optimizing_the_result_again_changes_nothing(rng):
    graph, _ = optimize(_scaled_scores(rng), opt_level=2)
    again, report = optimize(graph, opt_level=2)
    assert again.fingerprint() == graph.fingerprint()
    assert not any(r.changed for r in report.records)
