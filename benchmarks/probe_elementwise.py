"""Elementwise steps after a GEMM in numba plans: a diagnostic, not a benchmark.

For bench models whose plans follow GEMMs with elementwise steps (bias + ReLU, bias + GELU),
in one process and interleaved: the plan as compiled (elementwise kernels may write over a
dying input, so bias + ReLU overwrites the GEMM result it reads), the same plan with every
numba kernel writing into a buffer of its own, and the plan with serial kernels only
(``parallel_threshold`` above every step). Prints the call time and each step's median time
(profiler), and the bare bias + ReLU kernel alone and right after a split GEMM.

Usage: python benchmarks/probe_elementwise.py [--json PATH] [--models i,j,...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _median_us(fn, n: int) -> float:
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


@contextlib.contextmanager
def _own_buffers():
    """numba kernels declare no alias-safe inputs while plans compile in this block."""
    from tensorlogic.backends.numba import backend as nb

    orig = nb.NumbaBackend.kernel_for

    def kernel_for(self, *args, **kwargs):
        return replace(orig(self, *args, **kwargs), inplace=())

    nb.NumbaBackend.kernel_for = kernel_for
    try:
        yield
    finally:
        nb.NumbaBackend.kernel_for = orig


def models(indices: list[int], rounds: int) -> dict:
    import _models

    import tensorlogic as tl

    out = {}
    for i in indices:
        m = _models.all_models()[i]
        a = m.arrays()
        feed = {k: a[k] for k in m.inputs}
        plans = {"as compiled": tl.compile(m.graph(a), backend="numba", opt_level=2, cache=False)}
        with _own_buffers():
            plans["own buffers"] = tl.compile(m.graph(a), backend="numba", opt_level=2, cache=False)
        plans["serial kernels"] = tl.compile(
            m.graph(a), backend="numba", opt_level=2, cache=False, parallel_threshold=1 << 40
        )
        calls: dict[str, list[float]] = {k: [] for k in plans}
        for _ in range(rounds):
            for k, p in plans.items():
                calls[k].append(_median_us(lambda p=p: p(**feed), 30))
        steps = {}
        for k, p in plans.items():
            with tl.profile() as prof:
                for _ in range(30):
                    p(**feed)
            per: dict[str, list[float]] = {}
            for e in prof.steps:
                per.setdefault(e.name, []).append(e.dur_ns / 1e3)
            steps[k] = {n: round(statistics.median(v), 1) for n, v in per.items()}
        row = {
            "call_us": {k: round(statistics.median(v), 1) for k, v in calls.items()},
            "steps_us": steps,
            "in_place_steps": {
                str(k): v for k, v in plans["as compiled"].concrete.memory.inplace.items()
            },
        }
        print(m.name, json.dumps(row, indent=1), flush=True)
        out[m.name] = row
    return out


def bare_kernel(repeat: int) -> dict:
    """The bias + ReLU kernel alone and right after the split GEMM that wrote its input."""
    import tensorlogic as tl
    from tensorlogic.backends.numpy import threads as cpu_threads

    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 1024)).astype(np.float32)
    w = rng.standard_normal((1024, 1024)).astype(np.float32)
    c = np.empty((256, 1024), np.float32)
    o = np.empty_like(c)
    g = tl.EinsumGraph()
    x = g.input("x", (256, 1024), "float32")
    b = g.constant(rng.standard_normal(1024).astype(np.float32), name="b")
    g.output(g.relu(x + b), name="y")
    kern = tl.compile(g, backend="numba", opt_level=2, cache=False).concrete.kernels[0]
    args = [c, rng.standard_normal((1, 1024)).astype(np.float32)]
    alone, after = [], []
    with cpu_threads.single_threaded_blas():
        cpu_threads.parallel_matmul(a, w, c)
        kern(args, o)
        for _ in range(repeat):
            t = time.perf_counter()
            kern(args, o)
            alone.append(time.perf_counter() - t)
            cpu_threads.parallel_matmul(a, w, c)
            t = time.perf_counter()
            kern(args, o)
            after.append(time.perf_counter() - t)
    res = {
        "alone_us": statistics.median(alone) * 1e6,
        "after_gemm_us": statistics.median(after) * 1e6,
    }
    print("bare bias + ReLU kernel:", res, flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--models", default="3,0,5")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    out = {
        "models": models([int(i) for i in args.models.split(",")], args.rounds),
        "bare_relu": bare_kernel(300),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
