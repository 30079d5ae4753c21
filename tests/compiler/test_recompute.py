"""The memory plan's recompute choice (``compiler/remat.py``) and the schedule's hoisting of
memory-freeing steps (``compiler/hoist.py``): structure, planned peak and equal results."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops


def _mixed_precision_step():
    # a bfloat16 copy of each weight read in the forward pass and again by the backward pass
    g = tl.EinsumGraph()
    x = g.input("x", (64, 128), "float32")
    h = x
    weights = []
    for k in range(3):
        g.input(f"w{k}", (128, 128), "float32")
        weights.append(f"w{k}")
        h = g.relu(g.einsum("bi,ij->bj", h, g.tensor(f"w{k}")))
    g.output(g.mean(g.square(h)), "loss")
    return tl.grad(g, "loss", weights)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_recompute_lowers_the_peak_and_keeps_results(backend):
    gg = _mixed_precision_step()
    rng = np.random.default_rng()
    feed = {"x": rng.standard_normal((64, 128)).astype(np.float32)}
    feed.update(
        {f"w{k}": rng.standard_normal((128, 128)).astype(np.float32) * 0.1 for k in range(3)}
    )
    kept = tl.compile(gg, backend=backend, precision="bf16", recompute=False, cache=False)
    redo = tl.compile(gg, backend=backend, precision="bf16", cache=False)
    # the weights' bfloat16 casts: computed once each when kept, twice when recomputed
    casts = lambda p: sum(s.kind == ops.CAST and s.dtype == "bfloat16" for s in p.steps)  # noqa: E731
    assert casts(redo) > casts(kept)
    assert redo.memory.peak_bytes < kept.memory.peak_bytes
    a, b = kept(**feed), redo(**feed)
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def test_values_of_computed_operands_are_kept():
    # relu(einsum) is read by the backward too, but recomputing it would repeat a contraction:
    # each einsum runs once (3 forward, 3 weight gradients, 2 input gradients); the last relu,
    # read only by elementwise steps, is recomputed by both from its einsum's kept value
    gg = _mixed_precision_step()
    plan = tl.compile(gg, backend="numpy", cache=False)
    assert sum(s.kind == ops.EINSUM for s in plan.steps) == 8
    assert sum("relu" in f"{s.label} {s.info}" for s in plan.steps) == 4


def test_output_casts_run_as_soon_as_their_operand_exists():
    gg = _mixed_precision_step()
    plan = tl.compile(gg, backend="numpy", precision="bf16", cache=False)
    names = [s.name for s in plan.steps]
    for k in range(3):
        cast = names.index(f"grad_w{k}:float32")
        # the step right before it made the bfloat16 gradient it casts
        (src,) = plan.steps[cast].inputs
        assert plan.steps[cast - 1].output == src


def test_recompute_option_is_checked():
    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", (2,))), "y")
    with pytest.raises(tl.errors.GraphError, match="recompute"):
        tl.compile(g, backend="numpy", recompute="yes")


def _chain(n):
    g = tl.EinsumGraph()
    x, y = g.input("x", (8,)), g.input("y", (8,))
    t = x * y
    for k in range(n):
        t = g.relu(t * 0.5 + y) if k % 2 else g.tanh(t - x)
    g.output(t, "out")
    return g


def test_a_chain_leaves_recompute_and_hoisting_at_their_first_test(monkeypatch):
    """A chain (every step reads the one before, its leaves read right away) has no value to
    recompute and no step to move: both return their input, the graph uncopied, the order
    unchanged, before they look at the users or last uses of every value."""
    from tensorlogic.compiler import hoist, remat
    from tensorlogic.compiler.schedule import needed_nodes
    from tensorlogic.ir.graph import EinsumGraph

    g = _chain(40)
    order = needed_nodes(g)

    def no_copy(self):
        raise AssertionError("rematerialize copied a graph it leaves as it is")

    monkeypatch.setattr(EinsumGraph, "copy", no_copy)
    got, new_order, made = remat.rematerialize(g, order)
    assert got is g and new_order is order and made == 0
    assert hoist.hoist(g, order) is order


def test_opt_level_0_runs_no_optimizer_pass_and_steps_as_written(monkeypatch):
    """O0 compiles the graph as written: no optimizer pass is built or run (one that is
    raises), and the plan has one step per node of the chain, in the graph's order."""
    from tensorlogic.optimizer import base

    g = _chain(30)
    rng = np.random.default_rng()
    x, y = rng.uniform(0.5, 1.5, 8).astype(np.float32), rng.uniform(0.5, 1.5, 8).astype(np.float32)
    want = tl.compile(g, backend="numpy", opt_level=2, cache=False)(x=x, y=y)["out"]

    def refuse(name):
        def make(_options):
            raise AssertionError(f"pass {name} ran at O0")

        return make

    for name in list(base.PASSES):
        monkeypatch.setitem(base.PASSES, name, refuse(name))
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    computed = [n.id for n in g.nodes if n.kind not in (ops.INPUT, ops.CONSTANT)]
    assert [s.node_id for s in plan.steps] == computed
    np.testing.assert_allclose(plan(x=x, y=y)["out"], want, rtol=1e-5, atol=1e-6)
