"""The numba backend's elementwise kernels write over a dying input of their own shape."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _both(g: tl.EinsumGraph, feed: dict, **opts) -> tuple[dict, dict, object]:
    plan = tl.compile(g, backend="numba", opt_level=2, cache=False, **opts)
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**feed)
    return plan(**feed), ref, plan


def _mlp(rng, batch: int, width: int, layers: int, dtype: str = "float32"):
    g = tl.EinsumGraph()
    h = g.input("x", (batch, width), dtype)
    for i in range(layers):
        w = g.constant((rng.standard_normal((width, width)) / width**0.5).astype(dtype), f"w{i}")
        b = g.constant(rng.standard_normal(width).astype(dtype), f"b{i}")
        h = g.relu(g.einsum("bi,ij->bj", h, w) + b)
    g.output(h, "y")
    return g


@pytest.mark.parametrize("threshold", [0, 1 << 30])  # parallel and serial kernels
def test_bias_relu_runs_in_place_over_the_gemm_result(threshold, monkeypatch):
    # the bias + ReLU as a step of its own (not inside its GEMM's blocks, the default)
    from tensorlogic.backends.numpy import backend as numpy_backend  # the CPU backends' pairs

    monkeypatch.setattr(numpy_backend, "FUSE_EPILOGUES", False)
    rng = _rng(1)
    g = _mlp(rng, 64, 96, 3)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    got, want, plan = _both(g, {"x": x}, parallel_threshold=threshold)
    mem = plan.concrete.memory
    steps = plan.concrete.steps
    fused = [s.index for s in steps if s.kind == "fused"]
    assert len(fused) == 3
    if threshold == 0:
        # every bias + ReLU but the last (the plan's output) overwrites its GEMM's result
        assert set(mem.inplace) == set(fused[:-1])
        for k in mem.inplace:
            assert steps[k - 1].kind == "einsum" and mem.inplace[k] == steps[k - 1].output
    else:
        # serial kernels keep their own output: aliased, LLVM would run their scalar loop
        assert not mem.inplace
        assert all(not k.inplace for k in plan.concrete.kernels)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
    # a second call over the same arena gives the same result
    np.testing.assert_array_equal(plan(x=x)["y"], got["y"])


def test_broadcast_and_other_dtype_inputs_are_not_overwritten():
    rng = _rng(2)
    g = tl.EinsumGraph()
    x = g.input("x", (32, 48), "float32")
    w = g.constant(rng.standard_normal((48, 48)).astype(np.float32), "w")
    row = g.input("row", (48,), "float32")
    h = g.einsum("ij,jk->ik", x, w)  # dies at the next step: may be overwritten
    wide = g.cast(g.einsum("ij,jk->ik", x, w) * 0.5, "float64")  # another dtype: may not
    y = g.tanh(h * row + h) + g.cast(wide, "float32")
    g.output(y * 2.0, "y")
    feed = {
        "x": rng.standard_normal((32, 48)).astype(np.float32),
        "row": rng.standard_normal(48).astype(np.float32),
    }
    got, want, plan = _both(g, feed, parallel_threshold=0)
    np.testing.assert_allclose(got["y"], want["y"], rtol=2e-5, atol=2e-5)
    bufs = plan.concrete.buffers
    for k, b in plan.concrete.memory.inplace.items():
        step = plan.concrete.steps[k]
        assert bufs[b].shape == bufs[step.output].shape
        assert bufs[b].dtype == bufs[step.output].dtype


def test_row_op_steps_keep_their_own_output():
    rng = _rng(3)
    g = tl.EinsumGraph()
    x = g.input("x", (16, 40), "float32")
    w = g.constant(rng.standard_normal((40, 40)).astype(np.float32), "w")
    s = g.softmax(g.einsum("ij,jk->ik", x, w) * 0.1, axis=-1)
    g.output(g.layer_norm(s + 1.0), "y")
    feed = {"x": rng.standard_normal((16, 40)).astype(np.float32)}
    got, want, plan = _both(g, feed, parallel_threshold=0)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
    cp = plan.concrete
    tails = [
        s.index
        for s in cp.steps
        if s.kind == "rowop"
        or (s.kind == "fused" and cp.graph.node(s.node_id).args["body"]["tail"] is not None)
    ]
    assert len(tails) == 2  # the softmax (with its scale and "+ 1") and the layer norm
    assert not set(tails) & set(cp.memory.inplace)


def test_half_precision_elementwise_in_place():
    rng = _rng(4)
    g = _mlp(rng, 24, 40, 2, "float16")
    x = rng.standard_normal((24, 40)).astype(np.float16)
    got, want, _ = _both(g, {"x": x}, parallel_threshold=0)
    np.testing.assert_allclose(
        got["y"].astype(np.float32), want["y"].astype(np.float32), rtol=2e-2, atol=2e-2
    )


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 70),
    twice=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_elementwise_chains_in_place_match_numpy(rows, cols, twice, seed):
    """A dying value read twice by one step (x * x + x) and chains of such steps."""
    rng = _rng(seed)
    g = tl.EinsumGraph()
    a = g.input("a", (rows, cols), "float32")
    b = g.input("b", (rows, cols), "float32")
    w = g.constant(rng.standard_normal((cols, cols)).astype(np.float32), "w")
    h = g.einsum("ij,jk->ik", a, w)
    t = g.sigmoid(h * h + h) if twice else g.relu(h - b)
    u = g.einsum("ij,jk->ik", t, w)
    g.output(g.exp(-(u * u)) + b, "y")
    feed = {
        "a": rng.standard_normal((rows, cols)).astype(np.float32),
        "b": rng.standard_normal((rows, cols)).astype(np.float32),
    }
    got, want, _ = _both(g, feed, parallel_threshold=0)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
