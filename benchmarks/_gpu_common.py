"""Shared by the GPU benchmark and probes: timing (CuPy events, synchronized walls) and the
30-node small graph."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import cupy as cp


def gpu_time(fn: Callable[[], object], inner: int, batches: int = 7, warmup: int = 3) -> float:
    """Median device seconds per call: events around ``inner`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(batches):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3 / inner)
    return statistics.median(times)


def gpu_times(
    fns: dict[str, Callable[[], object]], inner: int, rounds: int = 5
) -> dict[str, float]:
    """``gpu_time`` of several contenders sampled round-robin, median over the rounds.

    Host-bound calls (~10 us) swing by half between moments on a device host; taking turns keeps
    a slow moment from landing on one contender only.
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(gpu_time(fn, inner, batches=3))
    return {name: statistics.median(v) for name, v in samples.items()}


def wall_time(fn: Callable[[], object], inner: int, batches: int = 7, warmup: int = 3) -> float:
    """Median host seconds per call, synchronized per batch (for launch-bound work)."""
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        cp.cuda.Device().synchronize()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def small_graph(n_nodes: int = 30, size: int = 64):
    """A chain of ``n_nodes`` dependent tiny elementwise ops (tanh, scale, shift) on one input."""
    import tensorlogic as tl

    g = tl.EinsumGraph()
    h = g.input("x", (size, size))
    for k in range(n_nodes):
        h = g.tanh(h) if k % 3 == 0 else (h * 0.99 if k % 3 == 1 else h + 0.01)
    g.output(h, "y")
    return g
