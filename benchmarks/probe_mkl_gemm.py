"""MKL or OpenBLAS, whole or split: a diagnostic for ``backends.mkl``, not a benchmark.

For the bench models' products (``probe_cpu_threads.SHAPES``, float32), GFLOP/s of the ways the
CPU backends can run one product: MKL whole on its own threads (numba's OpenMP pool; the
"pool" mode's default where MKL is installed), MKL cut into single-threaded blocks over numba's
loop (TL_MKL_SPLIT=1), numpy's OpenBLAS cut the same way (TL_BLAS=numpy, the pool mode without
MKL) and OpenBLAS whole on its own pthreads (the "blas" mode without MKL). One process: every
way runs through ``threads.parallel_matmul`` / ``np.matmul`` with the settings switched between
them, a shape's ways one after another with a pause between (OpenBLAS's idle workers spin).

Usage: python benchmarks/probe_mkl_gemm.py [--json PATH] [--repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import machine  # noqa: E402
from probe_cpu_threads import SHAPES, _median_time  # noqa: E402

WAYS = {
    "mkl whole": {"TL_BLAS": "mkl", "TL_MKL_SPLIT": "0"},
    "mkl split": {"TL_BLAS": "mkl", "TL_MKL_SPLIT": "1"},
    "openblas split": {"TL_BLAS": "numpy"},
    "openblas own": None,  # np.matmul, OpenBLAS's threads
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    from tensorlogic.backends import mkl
    from tensorlogic.backends.numba import threads as numba_threads
    from tensorlogic.backends.numpy import threads as cpu_threads

    has_mkl = mkl.library_path() is not None
    rng = np.random.default_rng(0)
    rows = []
    for nb, m, n, k in SHAPES:
        shape_a = (nb, m, k) if nb > 1 else (m, k)
        shape_b = (nb, k, n) if nb > 1 else (k, n)
        a = rng.standard_normal(shape_a, dtype=np.float32)
        b = rng.standard_normal(shape_b, dtype=np.float32)
        out = np.empty(shape_a[:-1] + (n,), np.float32)
        want = a.astype(np.float64) @ b
        row = {"shape": f"{nb}x{m}x{n}x{k}"}
        for way, env in WAYS.items():
            if env is not None and env.get("TL_BLAS") == "mkl" and not has_mkl:
                continue
            # OpenBLAS's workers spin for a while after its threaded calls ("openblas own"):
            # let them sleep before the next way
            time.sleep(0.3)
            if env is None:
                fn = lambda: np.matmul(a, b, out=out)  # noqa: E731
            else:
                os.environ.update(env)
                fn = lambda: cpu_threads.parallel_matmul(a, b, out)  # noqa: E731
            with cpu_threads.single_threaded_blas() if env else contextlib.nullcontext():
                t = _median_time(fn, args.repeat)
                fn()
            err = float(np.abs(out - want).max() / np.abs(want).max())
            assert err < 1e-5, (way, row["shape"], err)
            row[way] = round(2 * nb * m * n * k / t / 1e9, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {
        "machine": machine(),
        "numba_layer": numba_threads.active_layer(),
        "mkl": mkl.loaded_path() is not None,
        "mkl_threads": mkl._load().get_threads() if has_mkl else 0,
        "numba_threads": numba_threads.thread_count(),
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
