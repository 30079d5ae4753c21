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


def omp_wait_policy() -> str:
    """OpenMP wait policy for numba's OpenMP thread pool: OMP_WAIT_POLICY if set, else "passive".

    The numba backend exports the result as OMP_WAIT_POLICY before numba loads its OpenMP
    runtime (which reads it once, at load). Passive workers sleep between parallel regions
    instead of spinning: on a 2-core machine the spinning workers of the default policy compete
    with the calling thread, OpenBLAS's threads and any other process, and one descheduled
    worker stalls a whole region for a scheduler tick (measured: 4-8 ms per call under light
    load, vs 10-40 us passive; benchmarks/bench_fused_cpu.py records both). Set
    OMP_WAIT_POLICY=active for the last microseconds of launch latency on a dedicated machine.
    """
    return os.environ.get("OMP_WAIT_POLICY", "passive") or "passive"
