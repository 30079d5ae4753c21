"""run_batched: split, run, concatenate; batch size from the memory budget."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_models import mlp_graph

import tensorlogic as tl
from tensorlogic.pipeline.sizing import pick_batch_size, planned_bytes


@pytest.fixture(scope="module")
def plan():
    return tl.compile(mlp_graph(), backend="numpy", opt_level=2)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 300),
    batch_size=st.integers(1, 128),
    workers=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_run_batched_equals_big_call(plan, n, batch_size, workers, seed):
    x = np.random.default_rng(seed).standard_normal((n, 32)).astype(np.float32)
    ref = plan(x=x)
    got = tl.run_batched(plan, {"x": x}, batch_size, workers=workers, progress=False)
    assert set(got) == {"y", "s"}
    for name in got:
        assert got[name].shape == ref[name].shape and got[name].dtype == ref[name].dtype
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6)


def test_batch_axis_not_first_and_shared_input(rng):
    """Inputs/outputs whose batch axis is not 0 are sliced and copied into place; an input
    without the batch dimension goes whole to every batch."""
    g = tl.EinsumGraph()
    x = g.input("x", shape=(8, "B"))
    m = g.input("m", shape=(8, 4))
    g.output(g.einsum("ib,ij->jb", x, m), name="y")  # batch axis 1
    g.output(g.relu(g.einsum("ib->b", x)), name="t")  # batch axis 0
    p = tl.compile(g, backend="numpy")
    xs = rng.standard_normal((8, 103)).astype(np.float32)
    ms = rng.standard_normal((8, 4)).astype(np.float32)
    ref = p(x=xs, m=ms)
    got = tl.run_batched(p, {"x": xs, "m": ms}, 10, progress=False)
    for name in ("y", "t"):
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6)


def test_batch_size_none_fits_everything_when_budget_is_large(plan, rng):
    x = rng.standard_normal((50, 32)).astype(np.float32)
    got = tl.run_batched(plan, {"x": x}, progress=False)
    np.testing.assert_allclose(got["y"], plan(x=x)["y"], rtol=1e-5, atol=1e-6)


def test_pick_batch_size_is_the_largest_that_fits(rng):
    g = mlp_graph(width=64)
    per_item = planned_bytes(tl.compile(g, backend="numpy"), "B", 1000, {})
    limit = per_item // 7  # roughly 140 items' worth
    p = tl.compile(g, backend="numpy", memory_limit=limit)
    b = pick_batch_size(p, "B", 1000, {}, limit)
    assert 1 <= b < 1000
    assert planned_bytes(p, "B", b, {}) <= limit
    above = b + max(1, b // 64)
    assert planned_bytes(p, "B", above, {}) is None  # the plan refuses it: over memory_limit
    # run_batched uses it, and a second concurrent worker halves the budget
    x = rng.standard_normal((1000, 64)).astype(np.float32)
    got = tl.run_batched(p, {"x": x}, progress=False)
    ref = tl.compile(g, backend="numpy")(x=x)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)
    b2 = pick_batch_size(p, "B", 1000, {}, limit, concurrent=2)
    assert b2 < b and planned_bytes(p, "B", b2, {}) * 2 <= limit


def test_budget_too_small_for_one_item():
    p = tl.compile(mlp_graph(), backend="numpy", memory_limit=64)
    x = np.ones((100, 32), np.float32)
    with pytest.raises(tl.MemoryBudgetError):
        tl.run_batched(p, {"x": x}, progress=False)


def test_run_batched_errors(plan, rng):
    x = rng.standard_normal((20, 32)).astype(np.float32)
    with pytest.raises(tl.InputError, match="dict of name -> array"):
        tl.run_batched(plan, [x])
    with pytest.raises(tl.InputError, match="missing input 'x'"):
        tl.run_batched(plan, {"z": x})
    with pytest.raises(tl.InputError, match="batch_size must be an int >= 1"):
        tl.run_batched(plan, {"x": x}, 0)
    with pytest.raises(tl.BatchError, match="batch 0: input 'x'"):
        tl.run_batched(plan, {"x": x[:, :5]}, 8, progress=False)
    g = tl.EinsumGraph()
    a = g.input("a", shape=(3, 4))
    g.output(a * 2.0, name="y")
    with pytest.raises(tl.InputError, match="symbolic batch dimension"):
        tl.run_batched(tl.compile(g, backend="numpy"), {"a": np.ones((3, 4), np.float32)})
    g = tl.EinsumGraph()
    a = g.input("a", shape=("B", 4))
    g.output(g.sum(a, axis=0), name="total")
    with pytest.raises(tl.InputError, match=r"output\(s\) \['total'\] have no batch dimension"):
        tl.run_batched(tl.compile(g, backend="numpy"), {"a": np.ones((3, 4), np.float32)})
    g = tl.EinsumGraph()
    a = g.input("a", shape=("B", 4))
    b = g.input("b", shape=("B", 4))
    g.output(a + b, name="y")
    with pytest.raises(tl.InputError, match="disagree on the batch dimension"):
        tl.run_batched(
            tl.compile(g, backend="numpy"),
            {"a": np.ones((3, 4), np.float32), "b": np.ones((5, 4), np.float32)},
        )
