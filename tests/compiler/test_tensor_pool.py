"""TensorPool: arenas reused across calls and threads; steady-state calls allocate only outputs."""

from __future__ import annotations

import gc
import threading
import tracemalloc

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.runtime.pool import Arena, TensorPool
from conftest import run_in_threads


def mlp_graph(rng, layers=4, batch=128, width=512):
    """An MLP alternating gelu and relu, with a softmax head."""
    g = tl.EinsumGraph()
    x = g.input("x", (batch, width))
    h = x
    for i in range(layers):
        w = g.constant((rng.standard_normal((width, width)) * width**-0.5).astype(np.float32))
        b = g.constant((rng.standard_normal(width) * 0.1).astype(np.float32))
        h = g.einsum("bi,ij->bj", h, w) + b
        h = g.gelu(h) if i % 2 == 0 else g.relu(h)
    g.output(g.softmax(h, axis=-1), name="y")
    return g


def attention_graph(rng, batch=4, seq=64, width=128, heads=4):
    """Two attention blocks with residuals, a logsumexp and a where."""
    d = width // heads
    g = tl.EinsumGraph()
    h = g.input("x", (batch, seq, width))
    for _ in range(2):
        wq, wk, wv = (
            g.constant((rng.standard_normal((width, heads, d)) * width**-0.5).astype(np.float32))
            for _ in range(3)
        )
        wo = g.constant((rng.standard_normal((heads, d, width)) * width**-0.5).astype(np.float32))
        q = g.einsum("bsi,ihd->bhsd", h, wq)
        k = g.einsum("bsi,ihd->bhsd", h, wk)
        v = g.einsum("bsi,ihd->bhsd", h, wv)
        att = g.softmax(g.einsum("bhqd,bhkd->bhqk", q, k) * d**-0.5, axis=-1)
        ctx = g.einsum("bhqk,bhkd->bqhd", att, v)
        h = g.einsum("bqhd,hdo->bqo", ctx, wo) + h
        h = g.where(h > 0, h, h * 0.1)
    g.output(h, name="y")
    g.output(g.logsumexp(h, axis=-1), name="lse")
    return g


def _extra_bytes_per_call(plan, inputs, out=None):
    """Bytes a steady-state call allocates (traced peak above the start) and the output bytes."""
    for _ in range(3):
        plan(inputs, out=out)
    gc.collect()
    tracemalloc.start()
    try:
        worst = 0
        for _ in range(3):
            tracemalloc.reset_peak()
            start, _ = tracemalloc.get_traced_memory()
            res = plan(inputs, out=out)
            _, peak = tracemalloc.get_traced_memory()
            outs = 0 if out else sum(a.nbytes for a in res.values())
            worst = max(worst, peak - start - outs)
            del res
    finally:
        tracemalloc.stop()
    return worst


# numpy keeps an iterator buffer of ~32 KiB for broadcasting ufuncs and Python bookkeeping costs
# a few KiB; every intermediate of these graphs is at least 128 KiB, so any intermediate or
# temporary allocated per call would exceed this bound
SLACK = 96 * 1024


@pytest.mark.parametrize("make", [mlp_graph, attention_graph], ids=["mlp", "attention"])
def test_steady_state_allocates_only_outputs(make, rng):
    g = make(rng)
    plan = tl.compile(g, backend="numpy", cache=False)
    node = g.node(g.inputs["x"])
    inputs = {"x": rng.standard_normal(node.shape).astype(np.float32)}
    smallest = min(
        b.nbytes
        for b in plan.concrete.buffers
        if b.role == "intermediate" and b.view_of is None and b.nbytes > 4096
    )
    assert smallest > SLACK
    assert _extra_bytes_per_call(plan, inputs) < SLACK
    # with caller-provided outputs nothing of size is allocated at all
    out = {k: np.empty_like(v) for k, v in plan(inputs).items()}
    assert _extra_bytes_per_call(plan, inputs, out=out) < SLACK
    assert plan.concrete.pool.arenas_created == 1


def test_unpooled_plan_allocates_every_call(rng):
    g = mlp_graph(rng, layers=2)
    pooled = tl.compile(g, backend="numpy", cache=False)
    fresh = tl.compile(g, backend="numpy", pool=False, cache=False)
    x = {"x": rng.standard_normal((128, 512)).astype(np.float32)}
    np.testing.assert_allclose(fresh(x)["y"], pooled(x)["y"], rtol=1e-6, atol=1e-7)
    for _ in range(3):
        fresh(x)
    assert fresh.concrete.pool.arenas_created == 4
    assert fresh.concrete.pool.idle == 0
    assert _extra_bytes_per_call(fresh, x) > fresh.memory.peak_bytes


def test_eight_threads_share_one_plan(backend, rng):
    g = tl.EinsumGraph()
    x = g.input("x", (16, 32))
    w1 = g.constant(rng.standard_normal((32, 32)).astype(np.float32) * 0.2)
    w2 = g.constant(rng.standard_normal((32, 8)).astype(np.float32) * 0.2)
    h = g.tanh(g.einsum("ij,jk->ik", x, w1) + 1.0)
    h = g.sigmoid(h * h)
    y = g.log_softmax(g.einsum("ij,jk->ik", h, w2), axis=-1)
    g.output(y, name="y")
    g.output(g.sum(h, axis=1), name="s")
    plan = tl.compile(g, backend=backend, cache=False)
    ref_plan = tl.compile(g, backend="numpy", reuse_memory=False, pool=False, cache=False)
    cases = [{"x": rng.standard_normal((16, 32)).astype(np.float32)} for _ in range(32)]
    expected = [ref_plan(c) for c in cases]
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(tid: int) -> None:
        barrier.wait()
        for i in range(200):
            k = (tid * 7 + i * 3) % len(cases)
            got = plan(cases[k], to_host=True)
            for name, want in expected[k].items():
                if not np.allclose(got[name], want, rtol=1e-5, atol=1e-5):
                    errors.append(f"thread {tid} call {i} output {name}")
                    return

    run_in_threads(worker, 8)
    assert not errors, errors[:5]
    pool = plan.concrete.pool
    assert 1 <= pool.arenas_created <= 8  # one per concurrent call at most, then reused
    # every arena came back, but the one a captured CUDA graph keeps (its fixed addresses)
    captured = int(getattr(plan.concrete.runner, "graph", None) is not None)
    assert pool.idle == pool.arenas_created - captured
    assert pool.bytes_held == pool.arenas_created * plan.memory.peak_bytes
    plan.release_memory()  # drops a captured CUDA graph too, and the arena it kept
    assert pool.idle == 0 and pool.bytes_held == 0
    assert getattr(plan.concrete.runner, "graph", None) is None
    np.testing.assert_allclose(
        plan(cases[0], to_host=True)["y"], expected[0]["y"], rtol=1e-5, atol=1e-5
    )


def test_arena_reset_drops_call_references():
    env = Arena([None, "slot", None])
    env.seal()
    env[0], env[2] = "input", "view of input"
    env.reset()
    assert list(env) == [None, "slot", None]


def test_pool_survives_failing_arena_factory():
    calls = {"n": 0}

    def make():
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError("no memory")
        return Arena([1])

    pool = TensorPool(make, arena_bytes=100)
    with pytest.raises(MemoryError):
        pool.acquire()
    assert pool.bytes_held == 0
    a = pool.acquire()
    pool.release(a)
    assert pool.acquire() is a


def test_call_that_raises_returns_its_arena(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (4, 4))
    g.output(g.exp(x) + 1.0, name="y")
    plan = tl.compile(g, backend="numpy", cache=False)
    with pytest.raises(tl.InputError):
        plan(x=np.ones((4, 4), np.float32), out={"y": np.empty((3, 3), np.float32)})
    plan(x=np.ones((4, 4), np.float32))
    pool = plan.concrete.pool
    assert pool.idle == pool.arenas_created == 1


@pytest.mark.gpu
def test_threads_share_a_cuda_graph_plan(rng):
    # the captured graph owns fixed buffers: concurrent calls must not race for them
    g = tl.EinsumGraph()
    x = g.input("x", (64, 128))
    w = g.constant(rng.standard_normal((128, 128)).astype(np.float32) * 0.1)
    h = x
    for _ in range(6):
        h = g.tanh(g.einsum("ij,jk->ik", h, w) + 0.5)
    g.output(h, name="y")
    plan = tl.compile(g, backend="cupy", cuda_graph=True, cache=False)
    ref = tl.compile(g, backend="numpy", cache=False)
    cases = [{"x": rng.standard_normal((64, 128)).astype(np.float32)} for _ in range(16)]
    expected = [ref(c)["y"] for c in cases]
    errors: list[str] = []

    def worker(tid: int) -> None:
        for i in range(100):
            k = (tid * 5 + i) % len(cases)
            got = plan(cases[k], to_host=True)["y"]
            if not np.allclose(got, expected[k], rtol=1e-4, atol=1e-5):
                errors.append(f"thread {tid} call {i}")
                return

    run_in_threads(worker, 8)
    assert not errors, errors[:5]
