"""Why a split GEMM wins or loses against BLAS's own threads: one product timed each way.

Prints, per dtype and shape, the median microseconds of ``np.matmul`` on BLAS's threads
(``blasN``, N threads), on one BLAS thread, and split by ``gemm_numba`` into 2, 4 and 8
blocks of one-thread BLAS calls, plus the launch of an empty numba ``prange`` region. A probe
behind the "pool" thread mode's per-plan rule (RESULTS.md, ab_trees); run it pinned, e.g.
``NUMBA_NUM_THREADS=8 OMP_NUM_THREADS=8 OPENBLAS_NUM_THREADS=8 taskset -c 0-7 python3
benchmarks/gemm_split_probe.py``.
"""

from __future__ import annotations

import time

import numba
import numpy as np

from tensorlogic.backends import gemm_numba
from tensorlogic.backends.numpy import threads as cpu_threads

SHAPES = ((256, 256, 256), (48, 2304, 48), (1000, 1000, 1000))  # (m, k, n)


def median_us(fn, n: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * float(np.median(times))


@numba.njit(parallel=True)
def _touch(x):
    for i in numba.prange(x.shape[0]):
        x[i] += 1.0


def main() -> None:
    x = np.zeros(8)
    _touch(x)
    print("numba layer", numba.threading_layer(), numba.get_num_threads())
    print(f"empty prange region: {median_us(lambda: _touch(x), 200):.1f} us")
    rng = np.random.default_rng(0)
    for dt in ("float32", "float64"):
        for m, k, n in SHAPES:
            a = rng.standard_normal((m, k)).astype(dt)
            b = rng.standard_normal((k, n)).astype(dt)
            out = np.empty((m, n), dt)
            reps = 200 if m * n * k < 10**8 else 20
            t = median_us(lambda: np.matmul(a, b, out=out), reps)
            row = [f"{dt} {m}x{k}x{n}: blas{cpu_threads.blas_threads()} {t:.1f} us"]
            with cpu_threads.single_threaded_blas():
                row.append(f"blas1 {median_us(lambda: np.matmul(a, b, out=out), reps):.1f}")
                for parts in (2, 4, 8):
                    g = gemm_numba.grid(1, m, n, parts)
                    t = median_us(lambda g=g: gemm_numba.matmul(a, b, out, g), reps)
                    row.append(f"split{len(g)} {t:.1f}")
            print(", ".join(row))


if __name__ == "__main__":
    main()
