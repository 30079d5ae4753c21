"""Threads in plans that call BLAS: a large row op right after a GEMM, per backend and thread mode.

The plan is ``softmax(x @ w)`` with a result of ``--mb`` MB (default 256). For each backend
(numpy, numba) and thread mode ("pool": GEMMs split over our threads with single-threaded BLAS;
"blas": BLAS's own threads) it profiles the plan and reports the softmax step's bandwidth
against ``tl.calibrate()``'s all-thread bandwidth (target: at least 60%) and the GEMM step's
GFLOP/s (target: a GEMM in a numba plan as fast as in a numpy plan). Each configuration runs in
its own process, so no pool's idle threads slow another.

Usage: python benchmarks/bench_threads.py [--mb 256] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import machine, table, write_results  # noqa: E402

CONFIGS = [("numpy", "pool"), ("numba", "pool"), ("numpy", "blas"), ("numba", "blas")]


def worker(backend: str, mode: str, mb: int, repeat: int) -> dict:
    import tensorlogic as tl
    from tensorlogic.backends.numpy import host_pool

    k = 256
    n = int((mb * 2**20 / 4) ** 0.5) // 64 * 64  # an n x n float32 result of about mb MB
    rng = np.random.default_rng(0)
    g = tl.EinsumGraph()
    x = g.input("x", (n, k), "float32")
    w = g.constant((rng.standard_normal((k, n)) / 16).astype(np.float32), name="w")
    g.output(g.softmax(g.einsum("ik,kj->ij", x, w), axis=-1), name="p")
    plan = tl.compile(g, backend=backend, opt_level=2, threads=mode, cache=False)
    xv = rng.standard_normal((n, k)).astype(np.float32)
    plan(x=xv)
    with tl.profile() as prof:
        for _ in range(repeat):
            plan(x=xv)
    peaks = tl.calibrate(backend)
    per = {}
    for e in prof.steps:
        per.setdefault(e.index, []).append(e.dur_ns * 1e-9)
    gemm, row = plan.steps[0], plan.steps[1]
    t_gemm = statistics.median(per[0])
    t_row = statistics.median(per[1])
    return {
        "backend": backend,
        "threads": mode,
        "n": n,
        "result_mb": n * n * 4 / 2**20,
        "threads_used": host_pool.helper_count() + 1,
        "gemm_ms": t_gemm * 1e3,
        "gemm_gflops": gemm.flops / t_gemm / 1e9,
        "row_ms": t_row * 1e3,
        "row_gbps": row.bytes / t_row / 1e9,
        "calibrated_gbps": peaks.bandwidth / 1e9,
        "row_share_of_bw": row.bytes / t_row / peaks.bandwidth,
        "row_step": row.info or row.label,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a 32 MB result, 3 calls")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.mb, args.repeat = 32, 3
    if args.worker:
        backend, mode = args.worker.split(":")
        print(json.dumps(worker(backend, mode, args.mb, args.repeat)))
        return 0
    m0 = machine()
    rows = []
    for backend, mode in CONFIGS:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            f"{backend}:{mode}",
            "--mb",
            str(args.mb),
            "--repeat",
            str(args.repeat),
        ]
        res = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True)
        if res.returncode:
            rows.append(
                {
                    "backend": backend,
                    "threads": mode,
                    "error": (res.stderr.strip().splitlines() or ["?"])[-1][:200],
                }
            )
        else:
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"  {backend} {mode}: done", flush=True)
    print(
        table(
            rows,
            [
                "backend",
                "threads",
                "result_mb",
                "threads_used",
                "gemm_ms",
                "gemm_gflops",
                "row_ms",
                "row_gbps",
                "calibrated_gbps",
                "row_share_of_bw",
                "error",
            ],
        )
    )
    m1 = machine()
    path = write_results(
        "bench_threads",
        rows,
        {
            "load_before": m0["loadavg_1min"],
            "load_after": m1["loadavg_1min"],
            "result_mb": args.mb,
            "repeat": args.repeat,
        },
    )
    print(f"load {m0['loadavg_1min']:.2f} -> {m1['loadavg_1min']:.2f}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
