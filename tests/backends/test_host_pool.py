"""The host block pool: every block once, one block at a time per participant, errors raised."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends.numpy import fused as fused_numpy, host_pool
from conftest import run_in_threads


@pytest.mark.parametrize("n_blocks,helpers", [(1, 3), (2, 1), (7, 0), (50, 1), (50, 4)])
def test_every_block_runs_once_and_participants_never_overlap(n_blocks, helpers):
    seen: list[tuple[int, int]] = []
    busy: set[int] = set()
    lock = threading.Lock()

    def work(block: int, who: int) -> None:
        with lock:
            assert who not in busy, f"participant {who} runs two blocks at once"
            busy.add(who)
        time.sleep(0.0005)
        with lock:
            busy.discard(who)
            seen.append((block, who))

    host_pool.run_blocks(work, n_blocks, helpers)
    assert sorted(b for b, _ in seen) == list(range(n_blocks))
    assert all(0 <= who <= min(helpers, n_blocks - 1) for _, who in seen)


def test_a_failing_block_raises_in_the_caller_after_all_blocks_settle():
    done = []

    def work(block: int, who: int) -> None:
        if block == 3:
            raise ValueError("block 3 failed")
        done.append(block)

    with pytest.raises(ValueError, match="block 3 failed"):
        host_pool.run_blocks(work, 20, 2)
    assert 3 not in done and len(done) <= 19


def test_parallel_fused_plans_called_from_threads_match_serial(monkeypatch):
    """Several threads call plans whose fused kernels spread blocks over the shared pool."""
    monkeypatch.setattr(fused_numpy, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(fused_numpy, "PARALLEL_MIN_ELEMENTS", 1)
    g = tl.EinsumGraph()
    x = g.input("x", (300, 50), "float32")
    b = g.input("b", (50,), "float32")
    g.output(g.softmax(g.tanh(x * 0.5 + b) - x, axis=-1), "y")
    g.output(g.sum(g.exp(x * 0.1) * b, axis=-1), "s")
    rng = np.random.default_rng(11)
    data = [
        {
            "x": rng.standard_normal((300, 50)).astype(np.float32),
            "b": rng.standard_normal(50).astype(np.float32),
        }
        for _ in range(4)
    ]
    serial = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    want = [serial(**d) for d in data]
    monkeypatch.setattr(host_pool, "helper_count", lambda: 2)
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    assert any(len(s.scratch) > 0 for s in plan.steps)

    def call(k: int) -> None:
        for _ in range(30):
            got = plan(**data[k])
            for name in ("y", "s"):
                np.testing.assert_allclose(got[name], want[k][name], rtol=2e-5, atol=2e-6)

    run_in_threads(call, 4)


def test_a_forked_child_runs_blocks_with_its_own_pool():
    """After fork the parent's helper threads are gone; the child still runs every block."""
    import multiprocessing as mp

    host_pool.run_blocks(lambda b, w: None, 8, 1)  # the parent's pool exists before the fork
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_child_blocks, args=(q,))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and q.get(timeout=5) == list(range(40))


def _child_blocks(q) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def work(block: int, who: int) -> None:
        with lock:
            seen.append(block)

    host_pool.run_blocks(work, 40, 1)
    q.put(sorted(seen))


@pytest.mark.parametrize("mode", ["pool", "blas"])
def test_fused_kernels_in_plans_that_call_blas_follow_the_thread_mode(monkeypatch, mode):
    """threads="blas": OpenBLAS's spinning workers hold the other core after a matmul, so fused
    kernels get no helper threads; threads="pool" (default): BLAS runs single-threaded blocks on
    the same helpers, so fused kernels use them too."""
    monkeypatch.setattr(fused_numpy, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(fused_numpy, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(host_pool, "helper_count", lambda: 1)

    def fused_scratch_sets(with_matmul: bool) -> int:
        g = tl.EinsumGraph()
        x = g.input("x", (256, 64), "float32")
        w = g.input("w", (64, 64), "float32")
        h = g.einsum("ij,jk->ik", x, w) if with_matmul else x
        g.output(g.tanh(h * 0.5 + 1.0) - h, "y")
        plan = tl.compile(g, backend="numpy", opt_level=2, cache=False, threads=mode)
        (fused,) = [s for s in plan.steps if s.kind == "fused"]
        rng = np.random.default_rng(3)
        xv = rng.standard_normal((256, 64)).astype(np.float32)
        wv = rng.standard_normal((64, 64)).astype(np.float32)
        hv = xv @ wv if with_matmul else xv
        np.testing.assert_allclose(
            plan(x=xv, w=wv)["y"], np.tanh(hv * 0.5 + 1.0) - hv, rtol=1e-5, atol=1e-5
        )
        return len(fused.scratch)

    factor = 2 if mode == "blas" else 1
    assert fused_scratch_sets(True) * factor == fused_scratch_sets(False)
