"""Measured peaks of this machine: memory bandwidth, FLOP/s per dtype, per-step overhead.

``tl.calibrate(backend)`` measures, through the backend's own array module (numpy with BLAS on
CPU backends; CuPy with cuBLAS on a device backend), the streaming bandwidth (an ``add`` over
arrays far larger than the caches, on all cores), the matmul FLOP/s per dtype, and the
per-step and per-call overhead of the backend's plans. Results are cached on disk under
``config.cache_dir()`` keyed by a fingerprint of the machine and the backend, so the analyzer
uses measured peaks, never datasheet numbers, and pays the measurement once.
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from .. import config
from ..errors import TensorLogicError
from ..runtime import json_cache
from ..runtime.steps import run_program

CACHE_FILE = "calibration.json"
_FORMAT = 1
_mem_lock = threading.Lock()
_memo: dict[str, "Peaks"] = {}


@dataclass(frozen=True)
class Peaks:
    """The roofline of one backend on this machine.

    Attributes:
        bandwidth: bytes per second the memory streams (read + write).
        flops: FLOP/s of a large matmul, per dtype name.
        step_overhead: seconds a tiny step costs (kernel launch / ufunc dispatch).
        call_overhead: seconds a plan call costs besides its steps.
        backend: the backend measured.
        device: "cpu", or the device's name.
        measured: when (ISO 8601), or "given" for peaks passed in by hand.
    """

    bandwidth: float
    flops: Mapping[str, float]
    step_overhead: float
    call_overhead: float = 0.0
    backend: str = "numpy"
    device: str = "cpu"
    measured: str = "given"
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and self.step_overhead >= 0 and self.call_overhead >= 0):
            raise TensorLogicError(
                f"peaks need bandwidth > 0 and overheads >= 0, got bandwidth={self.bandwidth}, "
                f"step_overhead={self.step_overhead}, call_overhead={self.call_overhead}",
                code="bad_peaks",
            )
        if not self.flops or any(not v > 0 for v in self.flops.values()):
            raise TensorLogicError(
                f"peaks need a positive FLOP/s per dtype, got {dict(self.flops)}", code="bad_peaks"
            )

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype`` (a dtype never measured takes the nearest wider one)."""
        if dtype in self.flops:
            return float(self.flops[dtype])
        for wider in ("float32", "float64"):
            if wider in self.flops:
                return float(self.flops[wider])
        return float(max(self.flops.values()))

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form."""
        d = asdict(self)
        d["flops"] = dict(self.flops)
        d["details"] = dict(self.details)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Peaks":
        """Inverse of ``to_dict``."""
        return Peaks(
            float(d["bandwidth"]),
            {str(k): float(v) for k, v in d["flops"].items()},
            float(d["step_overhead"]),
            float(d.get("call_overhead", 0.0)),
            str(d.get("backend", "numpy")),
            str(d.get("device", "cpu")),
            str(d.get("measured", "")),
            dict(d.get("details", {})),
        )

    def __str__(self) -> str:
        fl = ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in self.flops.items())
        return (
            f"peaks of {self.backend} on {self.device}: {self.bandwidth / 1e9:.1f} GB/s, {fl}, "
            f"step overhead {self.step_overhead * 1e6:.2f} us, call overhead "
            f"{self.call_overhead * 1e6:.2f} us"
        )


def _fingerprint(backend: Any) -> str:
    """What the peaks depend on: host, CPU count, numpy, the backend and its device."""
    dev = backend.device_name
    return "|".join(
        str(x)
        for x in (
            platform.node(),
            platform.machine(),
            platform.processor(),
            os.cpu_count(),
            np.__version__,
            backend.name,
            dev or "cpu",
        )
    )


def _cache_path() -> Any:
    return config.cache_dir() / CACHE_FILE


def _load_cache() -> dict[str, Any]:
    data = json_cache.read(_cache_path())
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        return {}
    return data


def _save_cache(key: str, peaks: Peaks) -> None:
    data = _load_cache() or {"format": _FORMAT, "entries": {}}
    data.setdefault("entries", {})[key] = peaks.to_dict()
    json_cache.write(_cache_path(), data)  # unwritable: a re-measurement next time


class _Timer:
    """Best-of-N timing of a callable on a backend (synchronizing device backends)."""

    def __init__(self, backend: Any) -> None:
        self.sync: Callable[[], Any] = backend.synchronize

    def best(self, fn: Callable[[], Any], reps: int, budget: float = 0.5) -> float:
        fn()
        self.sync()
        best = float("inf")
        t_stop = time.perf_counter() + budget
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            self.sync()
            best = min(best, time.perf_counter() - t0)
            if time.perf_counter() > t_stop:
                break
        return best


def _is_host(xp: Any) -> bool:
    # host backends compute with numpy itself; device ones with a numpy-like module (CuPy)
    return xp is np


def _bandwidth(xp: Any, timer: _Timer) -> tuple[float, dict]:
    """Streaming bandwidth of ``c = a + b`` (3 streams) and ``b[:] = a`` (2), all cores on host."""
    n = (1 << 23) if _is_host(xp) else (1 << 26)  # 32 MiB per float32 array on host, 256 on device
    a = xp.ones(n, np.float32)
    b = xp.full(n, 2.0, np.float32)
    c = xp.empty(n, np.float32)
    details: dict[str, float] = {}
    if _is_host(xp):
        # numpy ufuncs run on one core; stream all cores on disjoint chunks (they drop the GIL)
        workers = max(1, os.cpu_count() or 1)
        chunks = [slice(k * n // workers, (k + 1) * n // workers) for k in range(workers)]
        pool = ThreadPoolExecutor(workers)

        def par(f: Callable[[slice], Any]) -> Callable[[], None]:
            return lambda: list(pool.map(f, chunks))

        try:
            t_add = timer.best(par(lambda s: np.add(a[s], b[s], out=c[s])), 5)
            t_copy = timer.best(par(lambda s: np.copyto(c[s], a[s])), 5)
        finally:
            pool.shutdown()
        details["threads"] = workers
    else:
        t_add = timer.best(lambda: xp.add(a, b, out=c), 5)
        t_copy = timer.best(lambda: xp.copyto(c, a), 5)
    bw_add = 3 * 4 * n / t_add
    bw_copy = 2 * 4 * n / t_copy
    details.update(add_GBps=bw_add / 1e9, copy_GBps=bw_copy / 1e9)
    return max(bw_add, bw_copy), details


def _matmul_flops(xp: Any, timer: _Timer, dtypes: tuple[str, ...]) -> dict[str, float]:
    """FLOP/s of a square matmul per dtype through the module's BLAS (cuBLAS on CuPy)."""
    n = 1024 if _is_host(xp) else 4096
    out: dict[str, float] = {}
    rng = np.random.default_rng(0)
    for dt in dtypes:
        a = xp.asarray(rng.standard_normal((n, n)).astype(dt))
        b = xp.asarray(rng.standard_normal((n, n)).astype(dt))
        c = xp.empty((n, n), dt)
        t = timer.best(lambda: xp.matmul(a, b, out=c), 5, budget=0.4)
        out[dt] = 2.0 * n**3 / t
    return out


def _overheads(backend: Any) -> tuple[float, float]:
    """Per-step and per-call overhead of the backend's plans, from chains of 16-element adds."""
    from ..compiler.compile import compile as compile_graph
    from ..ir.graph import EinsumGraph

    def chain(length: int) -> Any:
        g = EinsumGraph()
        x = g.input("x", shape=(16,), dtype="float32")
        y = x
        for _ in range(length):
            y = y + x
        g.output(y, name="y")
        # opt level 0: nothing may fuse the chain away, each add stays one step
        return compile_graph(g, backend=backend.name, opt_level=0, cache=False)

    x = np.ones(16, np.float32)
    long_plan, short_plan = chain(33), chain(1)
    cp = long_plan.concrete
    timer = _Timer(backend)
    env = cp.pool.acquire()
    xd = backend.to_device(x)
    env[cp.input_ids["x"]] = xd
    for bid in cp.output_ids.values():
        if env[bid] is None:
            env[bid] = backend.empty(cp.buffers[bid].shape, cp.buffers[bid].dtype)
    program = cp.program

    def run_long() -> None:
        run_program(program, env)

    samples = [timer.best(run_long, 20, budget=0.05) for _ in range(5)]
    step = statistics.median(samples) / len(program)
    calls = []
    for _ in range(5):
        calls.append(timer.best(lambda: short_plan(x=xd), 50, budget=0.05))
    call = max(0.0, statistics.median(calls) - step)
    return step, call


def measure(backend_name: str = "auto") -> Peaks:
    """Measure the peaks of ``backend_name`` now (about a second on a CPU), without the cache."""
    from ..backends import get_backend

    backend = get_backend(backend_name)
    xp = backend.xp
    timer = _Timer(backend)
    t0 = time.perf_counter()
    bw, bw_details = _bandwidth(xp, timer)
    dtypes = ("float32", "float64") if _is_host(xp) else ("float16", "float32", "float64")
    flops = _matmul_flops(xp, timer, dtypes)
    step, call = _overheads(backend)
    dev = backend.device_name
    details = dict(
        bw_details,
        seconds=round(time.perf_counter() - t0, 3),
        numpy=np.__version__,
        cpu_count=os.cpu_count(),
    )
    return Peaks(
        bw,
        flops,
        step,
        call,
        backend.name,
        dev or "cpu",
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        details,
    )


def calibrate(backend: str = "auto", *, force: bool = False, cache: bool = True) -> Peaks:
    """This machine's measured peaks for ``backend``, cached on disk after the first time.

    Args:
        backend: backend name ("auto" picks the best available one).
        force: measure again even if the cache holds peaks for this machine.
        cache: read and write the on-disk cache (``config.cache_dir()/calibration.json``).
    """
    from ..backends import get_backend

    be = get_backend(backend)
    key = _fingerprint(be)
    with _mem_lock:
        if not force and key in _memo:
            return _memo[key]
        if cache and not force:
            entry = _load_cache().get("entries", {}).get(key)
            if entry is not None:
                try:
                    _memo[key] = peaks = Peaks.from_dict(entry)
                    return peaks
                except (KeyError, TypeError, ValueError, TensorLogicError):
                    pass  # a damaged entry is measured again
        peaks = measure(be.name)
        _memo[key] = peaks
        if cache:
            _save_cache(key, peaks)
        return peaks
