"""One plan called from 8 threads x 500 calls on every CPU backend: every result correct."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tensorlogic as tl
from conftest import run_in_threads

THREADS = 8
CALLS = 500


def _cpu_backends():
    return [b for b in tl.available_backends() if b != "cupy"]


def _graph() -> tl.EinsumGraph:
    # einsum, elementwise, a row op, a reduction and a view: every kind of pooled buffer
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 8), "float64")
    w = g.constant(np.linspace(-1, 1, 8 * 6).reshape(8, 6), name="w")
    h = g.tanh(g.einsum("bi,ij->bj", x, w) * 0.5 + 0.25)
    g.output(g.softmax(h, axis=-1), "p")
    g.output(g.sum(h.T, axis=1), "s")
    return g


def _expected(x: np.ndarray):
    w = np.linspace(-1, 1, 8 * 6).reshape(8, 6)
    h = np.tanh(x @ w * 0.5 + 0.25)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), h.sum(axis=0)


@pytest.mark.parametrize("backend", _cpu_backends())
@pytest.mark.parametrize("opt_level", [0, 2])
def test_one_plan_many_threads(backend, opt_level):
    plan = tl.compile(_graph(), backend=backend, opt_level=opt_level)
    failures: list[str] = []
    barrier = threading.Barrier(THREADS)

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        barrier.wait()  # start together so calls really overlap
        for i in range(CALLS):
            b = 1 + (k + i) % 4  # several batch sizes: several concrete plans at once
            x = rng.uniform(-1, 1, (b, 8))
            out = plan(x=x)
            p, s = _expected(x)
            if not (
                np.allclose(out["p"], p, rtol=1e-12, atol=1e-12)
                and np.allclose(out["s"], s, rtol=1e-12, atol=1e-12)
            ):
                failures.append(f"thread {k} call {i} (batch {b}) gave a wrong result")
                return

    run_in_threads(worker, THREADS)
    assert not failures, failures[:3]
