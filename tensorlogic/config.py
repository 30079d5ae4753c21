"""The one module that reads environment variables.

Everything else in the library takes explicit arguments; defaults come from here.
"""

from __future__ import annotations

import os
from pathlib import Path


def debug_level() -> int:
    """TL_DEBUG: 0 (off), 1 (validate the final graph), 2 (validate after every pass)."""
    try:
        return int(os.environ.get("TL_DEBUG", "0") or 0)
    except ValueError:
        return 0


def default_backend() -> str:
    """TL_BACKEND: the backend that ``backend="auto"`` resolves to, if set."""
    return os.environ.get("TL_BACKEND", "auto") or "auto"


def cache_dir() -> Path:
    """TL_CACHE_DIR: where generated kernels and calibration data are cached."""
    base = os.environ.get("TL_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "tensorlogic"


def numba_cache_dir() -> Path:
    """Where the numba backend writes generated kernel modules and their compiled objects.

    Under ``cache_dir()``; numba's own ``NUMBA_CACHE_DIR`` does not move them (the backend uses
    its own cache locator, so this function is the only place that decides).
    """
    return cache_dir() / "numba"


def numba_threading_layer() -> str:
    """TL_NUMBA_THREADING_LAYER: numba threading layer for the numba backend.

    Default "threadsafe" (TBB if installed, else OpenMP): both allow several Python threads to
    run parallel kernels at once; numba's "workqueue" layer aborts the process when that happens.
    """
    return os.environ.get("TL_NUMBA_THREADING_LAYER", "threadsafe") or "threadsafe"


BLAS_CHOICES = ("auto", "mkl", "numpy")


def cpu_blas() -> str:
    """TL_BLAS: the GEMM library of the CPU backends.

    "auto" (default): Intel MKL where the ``mkl`` package is installed (``backends.mkl``), else
    numpy's own BLAS (OpenBLAS); "mkl": MKL, an error where it is missing; "numpy": numpy's BLAS
    even where MKL is installed.
    """
    value = (os.environ.get("TL_BLAS", "auto") or "auto").lower()
    if value not in BLAS_CHOICES:
        from .errors import BackendError

        raise BackendError(f"TL_BLAS={value!r}: expected one of {BLAS_CHOICES}")
    return value


def mkl_split() -> bool | None:
    """TL_MKL_SPLIT: in the "pool" thread mode with MKL, split each GEMM into single-threaded
    MKL blocks over numba's threads ("1") or hand it whole to MKL's own threads ("0"); unset:
    the rule in ``backends.numpy.threads.mkl_splits`` (split)."""
    value = os.environ.get("TL_MKL_SPLIT", "")
    return None if value == "" else value not in ("0", "false", "no")


def host_threads() -> int:
    """TL_NUM_THREADS: threads the numpy backend's fused kernels may use (caller included).

    Default: the CPUs this process may run on. 1 keeps every numpy kernel on the calling thread.
    """
    try:
        n = int(os.environ.get("TL_NUM_THREADS", "0") or 0)
    except ValueError:
        n = 0
    if n > 0:
        return n
    return process_cpus()


# From this many CPUs on (the process's affinity), idle OpenMP workers spin for a while before
# sleeping (``gomp_environment``); below, they sleep at once.
SPIN_MIN_CPUS = 8
# libgomp's spin iterations before a worker sleeps: a third of libgomp's own default (torch's)
SPIN_COUNT = 100_000


def process_cpus() -> int:
    """CPUs this process may run on (its affinity; all the machine's where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def gomp_environment(cpus: int | None = None) -> dict[str, str]:
    """Settings the numba backend exports for GNU OpenMP before numba loads it (read once there).

    Empty when the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT (theirs apply). Otherwise it
    depends on the CPUs the process may use (``cpus``, default ``process_cpus()``):

    - fewer than ``SPIN_MIN_CPUS``: ``{"OMP_WAIT_POLICY": "passive"}``, idle workers sleep at
      once. On the 2-core test machine spinning workers compete with the caller, OpenBLAS's
      threads and other processes, and lose whole scheduler ticks: a plan of two 512x512
      matmuls with fused kernels took 16 ms with libgomp's default or "active" vs 3 ms passive;
      a 1M-element kernel right after a matmul took 2.8-6.5 ms even with GOMP_SPINCOUNT=1000
      (in 4 of 7 runs) vs 0.15-0.4 ms passive in every run. The price is a sleeping worker's
      wake-up on each parallel kernel (50-80 us there, a VM), which
      ``backends.numba.backend.PARALLEL_THRESHOLD`` accounts for.
    - ``SPIN_MIN_CPUS`` or more: ``{"GOMP_SPINCOUNT": SPIN_COUNT}``, workers spin briefly
      between the parallel steps of a plan (as torch's do, with three times the count), then
      sleep. On a 16-core host a no-op parallel region 0.2 ms after the last one took 47 us
      with passive workers and 8 us with this count (22 us with 10000: the pause between steps
      outlasts that spin); a plan launches one region per GEMM and per parallel kernel (about
      14 per transformer block). libgomp itself cuts the spin when threads outnumber CPUs.
    """
    if os.environ.get("OMP_WAIT_POLICY") or os.environ.get("GOMP_SPINCOUNT"):
        return {}
    if (process_cpus() if cpus is None else cpus) >= SPIN_MIN_CPUS:
        return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
    return {"OMP_WAIT_POLICY": "passive"}
