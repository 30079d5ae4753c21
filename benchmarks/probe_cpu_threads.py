"""How a CPU host runs the GEMMs and row ops of the bench models: a diagnostic, not a benchmark.

Prints and writes (``--json``) what decides the "pool" / "blas" thread modes on this machine:
the BLAS numpy loaded and its threads, the cost of waking our helper threads and numba's
OpenMP threads, GEMM rates of the bench models' shapes under each way of threading them
(OpenBLAS's own threads, the Python-thread split, the numba-loop split of ``gemm_numba``, and
torch in a process of its own), and a GEMM followed by a row op under each mode.

Usage: python benchmarks/probe_cpu_threads.py [--json PATH] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

# (batch, m, n, k) of the bench models' products: MLP layer, block FFN in/out, block projections
# (one head and merged), attention scores and values per (batch, head), mlp.tl, kernel machine
SHAPES = [
    (1, 256, 1024, 1024),
    (1, 1024, 1024, 256),
    (1, 1024, 256, 1024),
    (1, 1024, 256, 256),
    (1, 1024, 768, 256),
    (16, 256, 256, 64),
    (16, 256, 64, 256),
    (1, 2048, 1024, 1024),
    (1, 2048, 512, 1024),
    (1, 2048, 4096, 256),
    (1, 1024, 2048, 512),
]


def _median_time(fn, repeat: int, min_time: float = 0.02) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeat):
        n = 0
        t0 = time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        times.append(dt / n)
    return statistics.median(times)


def info() -> dict:
    import numba
    from threadpoolctl import threadpool_info

    from tensorlogic.backends import gemm_numba
    from tensorlogic.backends.numba import threads as numba_threads
    from tensorlogic.backends.numpy import host_pool

    numba_threads.configure()
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    sib = None
    try:
        sib = open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read().strip()
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "cpu0_siblings": sib,
        "threadpool": threadpool_info(),
        "numba_threads": numba.get_num_threads(),
        "host_threads": host_pool.helper_count() + 1,
        "gemm_numba_available": gemm_numba.available(),
    }


def dispatch(repeat: int) -> dict:
    """Microseconds to run one no-op block per thread: our helper pool, numba's prange."""
    import numba

    from tensorlogic.backends.numba import threads as numba_threads
    from tensorlogic.backends.numpy import host_pool

    numba_threads.configure()
    t = host_pool.helper_count() + 1

    def noop(_i, _w):
        return None

    @numba.njit(parallel=True, nogil=True)
    def pr(a):
        for i in numba.prange(a.shape[0]):
            a[i] += 1.0

    a = np.zeros(numba.get_num_threads())
    pr(a)
    return {
        "host_pool_us": _median_time(lambda: host_pool.run_blocks(noop, t, t - 1), repeat) * 1e6,
        "numba_prange_us": _median_time(lambda: pr(a), repeat) * 1e6,
    }


def gemms(repeat: int) -> list[dict]:
    from threadpoolctl import threadpool_limits

    from tensorlogic.backends.numpy import threads as cpu_threads

    rows = []
    t = os.cpu_count() or 1
    rng = np.random.default_rng(0)
    for nb, m, n, k in SHAPES:
        a = rng.standard_normal((nb, m, k) if nb > 1 else (m, k)).astype(np.float32)
        b = rng.standard_normal((nb, k, n) if nb > 1 else (k, n)).astype(np.float32)
        c = np.empty((nb, m, n) if nb > 1 else (m, n), np.float32)
        flops = 2 * nb * m * n * k
        row = {"shape": f"{nb}x{m}x{n}x{k}", "mflop": flops / 1e6}
        for threads in sorted({t, max(1, t // 2), 1}, reverse=True):
            with threadpool_limits(threads, user_api="blas"):
                row[f"openblas{threads}"] = (
                    flops / _median_time(lambda: np.matmul(a, b, out=c), repeat) / 1e9
                )
        for split in ("python", "numba"):
            cpu_threads.SPLIT = split
            with cpu_threads.single_threaded_blas():
                row[f"pool_{split}"] = (
                    flops / _median_time(lambda: cpu_threads.parallel_matmul(a, b, c), repeat) / 1e9
                )
        cpu_threads.SPLIT = "numba"
        rows.append(row)
        print(row, flush=True)
    return rows


def torch_gemms(repeat: int) -> dict:
    """torch's GEMM rates on the same shapes, in a process of its own."""
    code = f"""
import json, sys, time, statistics, torch
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from probe_cpu_threads import SHAPES, _median_time
torch.set_grad_enabled(False)
out = {{"threads": torch.get_num_threads(), "config": torch.__config__.parallel_info()}}
for nb, m, n, k in SHAPES:
    a = torch.randn(nb, m, k) if nb > 1 else torch.randn(m, k)
    b = torch.randn(nb, k, n) if nb > 1 else torch.randn(k, n)
    c = torch.empty(nb, m, n) if nb > 1 else torch.empty(m, n)
    out[f"{{nb}}x{{m}}x{{n}}x{{k}}"] = 2 * nb * m * n * k / _median_time(
        lambda: torch.matmul(a, b, out=c), {repeat}) / 1e9
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode:
        return {"error": res.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def handover(repeat: int) -> list[dict]:
    """softmax(x @ w) plans, 1024 x 1024 and 4096 x 4096 results, per backend and mode."""
    import tensorlogic as tl

    rows = []
    rng = np.random.default_rng(1)
    for n, k in ((1024, 256), (4096, 256)):
        g = tl.EinsumGraph()
        x = g.input("x", (n, k), "float32")
        w = g.constant((rng.standard_normal((k, n)) / 16).astype(np.float32), name="w")
        g.output(g.layer_norm(g.einsum("ik,kj->ij", x, w), axis=-1), name="p")
        xv = rng.standard_normal((n, k)).astype(np.float32)
        for backend in ("numpy", "numba"):
            for mode in ("pool", "blas"):
                plan = tl.compile(g, backend=backend, opt_level=2, threads=mode, cache=False)
                plan(x=xv)
                with tl.profile() as prof:
                    for _ in range(repeat):
                        plan(x=xv)
                per: dict[int, list[float]] = {}
                for e in prof.steps:
                    per.setdefault(e.index, []).append(e.dur_ns * 1e-6)
                total = _median_time(lambda: plan(x=xv), repeat) * 1e3
                row = {
                    "n": n,
                    "k": k,
                    "backend": backend,
                    "mode": mode,
                    "total_ms": total,
                    "steps_ms": [statistics.median(v) for _, v in sorted(per.items())],
                }
                rows.append(row)
                print(row, flush=True)
    return rows


def profiles(indices: list[int], repeat: int) -> dict:
    """Per-step profiler tables of bench models (numpy and numba O2, default thread mode)."""
    import tensorlogic as tl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _models

    models = _models.all_models()
    out = {}
    for i in indices:
        m = models[i]
        a = m.arrays()
        feed = {k: a[k] for k in m.inputs}
        for backend in ("numpy", "numba"):
            plan = tl.compile(m.graph(a), backend=backend, opt_level=2)
            plan(**feed)
            total = _median_time(lambda: plan(**feed), repeat) * 1e3
            with tl.profile() as prof:
                for _ in range(10):
                    plan(**feed)
            text = f"{m.name} {backend} O2: {total:.3f} ms per call\n{prof.table(row_limit=40)}"
            out[f"{m.name} / {backend}"] = text
            print(text, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--models", default="", help="bench model indices to profile per step")
    args = ap.parse_args(argv)
    out = {"info": info()}
    print({k: v for k, v in out["info"].items() if k != "threadpool"}, flush=True)
    print(out["info"]["threadpool"], flush=True)
    out["dispatch"] = dispatch(args.repeat)
    print(out["dispatch"], flush=True)
    out["torch"] = torch_gemms(args.repeat)
    print({k: v for k, v in out["torch"].items() if k != "config"}, flush=True)
    out["gemm_gflops"] = gemms(args.repeat)
    out["handover"] = handover(args.repeat)
    if args.models:
        out["profiles"] = profiles([int(i) for i in args.models.split(",")], args.repeat)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
