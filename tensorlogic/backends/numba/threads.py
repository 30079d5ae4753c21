"""Thread safety and thread-pool coordination for the numba backend.

Threading layer: numba's default pick on machines without TBB is "workqueue" when OpenMP is not
loadable, and workqueue aborts the process when two Python threads launch parallel kernels at the
same time. We ask numba for the "threadsafe" layer (TBB if installed, else GNU OpenMP), both of
which accept concurrent launches; ``config.numba_threading_layer()`` overrides the choice. If the
process ends up on workqueue anyway (neither TBB nor OpenMP loadable, or the user launched numba
first), parallel kernels run under one lock: slower under contention, never an abort.

BLAS vs numba pools: contractions run on numpy's OpenBLAS pool and generated kernels on numba's
OpenMP pool, with no threadpoolctl limit applied. benchmarks/bench_fused_cpu.py measures a
parallel kernel right after a matmul with and without ``threadpool_limits(1, "blas")``; on the
shared (heavily loaded) 2-vCPU machine the difference was within noise (1M-element kernel: 36 ms
after BLAS vs 34 ms with BLAS limited to one thread vs 32 ms alone), while limiting BLAS costs
matmul throughput on a quiet machine, so no limit is the default until a quiet rerun says
otherwise.

OpenMP spinning: ``configure()`` exports ``config.gomp_environment()`` (unless the user set a
policy: the passive one on small machines, a short spin on hosts of many CPUs) while it loads
numba's GNU OpenMP runtime, which reads it once at load, and removes it again so that other
OpenMP runtimes loaded later (torch's) keep their defaults; the reasons and measurements are in
that function's docstring. If OpenMP was loaded before (numba used directly first), the
settings already in effect stay.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

import numba

from ... import config

_lock = threading.Lock()
_configured = False
_needs_lock: bool | None = None
_serial = threading.Lock()


def _loadable(layer: str) -> bool:
    try:
        if layer == "tbb":
            from numba.np.ufunc import tbbpool  # noqa: F401
        elif layer == "omp":
            from numba.np.ufunc import omppool  # noqa: F401
        else:
            return layer == "workqueue"
    except Exception:  # noqa: BLE001 - any import failure means the layer is unusable
        return False
    return True


def configure() -> None:
    """Pick numba's threading layer before its first parallel launch (idempotent)."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        try:
            numba.threading_layer()
            return  # already launched by someone else: keep theirs, checked in launch_lock()
        except ValueError:
            pass
        # libgomp reads its environment once, when it loads: load it (the omppool import) with
        # our settings exported, then take them back so that an OpenMP runtime loaded later
        # (torch ships its own libgomp) keeps its own defaults
        gomp = config.gomp_environment()
        os.environ.update(gomp)
        try:
            _loadable("omp")
        finally:
            for key in gomp:
                os.environ.pop(key, None)
        want = config.numba_threading_layer()
        if want == "threadsafe" and _omp_for_mkl():
            want = "omp"  # MKL's GNU threading layer runs on this libgomp: one pool
        elif want in ("threadsafe", "safe"):
            ok = _loadable("tbb") or (want == "threadsafe" and _loadable("omp"))
            if not ok:
                want = "workqueue"
        numba.config.THREADING_LAYER = want


def _omp_for_mkl() -> bool:
    """Whether MKL runs the GEMMs (``backends.mkl``) and numba's OpenMP layer loads: the mkl
    package brings TBB along, which numba's "threadsafe" choice would otherwise prefer."""
    from .. import mkl

    return mkl.wanted() and _loadable("omp")


def active_layer() -> str | None:
    """The threading layer numba launched, or None before the first parallel kernel."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None


_NO_LOCK = contextlib.nullcontext()


def launch_lock() -> contextlib.AbstractContextManager:
    """Serialize parallel launches only when the active layer is not thread-safe (a context
    manager; once the layer is known to be thread-safe, a shared no-op one: every parallel
    step pays this call)."""
    if _needs_lock is False:
        return _NO_LOCK
    return _checked_lock()


@contextlib.contextmanager
def _checked_lock() -> Iterator[None]:
    global _needs_lock
    if _needs_lock is None:
        layer = active_layer()
        if layer is None:
            # first launch ever: serialize it, then decide from the layer numba picked
            with _serial:
                yield
                layer = active_layer()
                if layer is not None:
                    _needs_lock = layer == "workqueue"
            return
        _needs_lock = layer == "workqueue"
    if _needs_lock:
        with _serial:
            yield
    else:
        yield


def thread_count() -> int:
    """Threads a parallel numba kernel runs on."""
    return int(numba.get_num_threads())
