"""How to cut a GEMM over numba's threads: a diagnostic for ``gemm_numba.grid``, not a benchmark.

For the bench models' products, GFLOP/s of the pool mode's split GEMM (one numba parallel loop
of single-threaded BLAS calls) under several grids: the default (``grid``), row panels only,
column panels only, half and twice as many blocks; beside them OpenBLAS's own threads and one
BLAS thread on the whole product. Also the cost of one parallel region (a no-op ``prange`` over
the threads, right after a short sleep, as between steps of a plan) and per-step profiles of the
bench models. The OpenMP wait policy is read when numba loads libgomp, so compare policies by
running this script once per environment (``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``).

Usage: python benchmarks/probe_gemm_grid.py [--json PATH] [--repeat N] [--models i,j]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from probe_cpu_threads import SHAPES, _median_time  # noqa: E402


def _grids(nb: int, m: int, n: int, t: int) -> dict[str, np.ndarray]:
    from tensorlogic.backends import gemm_numba

    def panels(rows: int, cols: int) -> np.ndarray:
        r = gemm_numba._cuts(m, rows, 8)
        c = gemm_numba._cuts(n, cols, 32)
        out = [
            (b, r[i], r[i + 1], c[j], c[j + 1])
            for b in range(nb)
            for i in range(len(r) - 1)
            for j in range(len(c) - 1)
        ]
        return np.array(out, np.int64).reshape(-1, 5)

    per = max(1, t // nb)
    return {
        "grid": gemm_numba.grid(nb, m, n, t),
        "rows": panels(per, 1),
        "cols": panels(1, per),
        "grid_half": gemm_numba.grid(nb, m, n, max(1, t // 2)),
        "grid_2x": gemm_numba.grid(nb, m, n, 2 * t),
    }


def region_cost(repeat: int) -> dict:
    """Microseconds of one no-op parallel region, back to back and after a 0.2 ms pause."""
    import numba

    from tensorlogic.backends.numba import threads as numba_threads

    numba_threads.configure()

    @numba.njit(parallel=True, nogil=True)
    def pr(a):
        for i in numba.prange(a.shape[0]):
            a[i] += 1.0

    a = np.zeros(numba.get_num_threads())
    pr(a)
    back = _median_time(lambda: pr(a), repeat) * 1e6
    gaps = []
    for _ in range(200):
        t_end = time.perf_counter() + 2e-4
        while time.perf_counter() < t_end:
            pass
        t0 = time.perf_counter()
        pr(a)
        gaps.append(time.perf_counter() - t0)
    return {"back_to_back_us": back, "after_pause_us": statistics.median(gaps) * 1e6}


def gemms(repeat: int) -> list[dict]:
    import numba
    from threadpoolctl import threadpool_limits

    from tensorlogic.backends import gemm_numba
    from tensorlogic.backends.numpy import threads as cpu_threads

    t = numba.get_num_threads()
    rng = np.random.default_rng(0)
    rows = []
    for nb, m, n, k in SHAPES:
        a = rng.standard_normal((nb, m, k)).astype(np.float32)
        b = rng.standard_normal((nb, k, n)).astype(np.float32)
        c = np.empty((nb, m, n), np.float32)
        flops = 2 * nb * m * n * k
        row: dict = {"shape": f"{nb}x{m}x{n}x{k}", "mflop": flops / 1e6}
        with threadpool_limits(t, user_api="blas"):
            row["openblas_all"] = flops / _median_time(lambda: np.matmul(a, b, out=c), repeat) / 1e9
        with cpu_threads.single_threaded_blas():
            row["openblas_1"] = flops / _median_time(lambda: np.matmul(a, b, out=c), repeat) / 1e9
            for name, blocks in _grids(nb, m, n, t).items():
                row[name] = (
                    flops / _median_time(lambda: gemm_numba.matmul(a, b, c, blocks), repeat) / 1e9
                )
                row[name + "_blocks"] = int(blocks.shape[0])
        rows.append(row)
        print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}))
    return rows


def profiles(indices: list[int], repeat: int) -> dict:
    import tensorlogic as tl
    import _models

    models = _models.all_models()
    out = {}
    for i in indices:
        m = models[i]
        a = m.arrays()
        feed = {k: a[k] for k in m.inputs}
        plan = tl.compile(m.graph(a), backend="numba", opt_level=2)
        plan(**feed)
        total = _median_time(lambda: plan(**feed), repeat, 0.1) * 1e3
        with tl.profile() as prof:
            for _ in range(20):
                plan(**feed)
        text = f"{m.name} numba O2: {total:.3f} ms per call\n{prof.table(row_limit=40)}"
        out[m.name] = text
        print(text, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--models", default="0,3")
    args = ap.parse_args(argv)
    env = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}
    out: dict = {"env": env}
    out["region"] = region_cost(args.repeat)
    print(env, out["region"], flush=True)
    out["gemm_gflops"] = gemms(args.repeat)
    if args.models:
        out["profiles"] = profiles([int(i) for i in args.models.split(",")], args.repeat)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
