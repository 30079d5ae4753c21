"""O3: build candidate plans for the real shapes, time them within a budget, keep the fastest.

Candidates differ in what the optimizer does (every tunable pass on, or one of them skipped:
einsum merging, elementwise fusion, attention fusion where that pass exists), in the CPU thread
mode (``threads="pool"`` or ``"blas"``, see ``backends/numpy/threads.py``) and, for
``backend="auto"`` on a machine without a GPU, in the backend (numba or numpy). The search is
coordinate-wise, one dimension at a time from the O2 plan: first the passes, then the thread
mode on the best structure so far, then the backend, so a plan tries about six candidates
instead of every combination. Each candidate is compiled and timed on random inputs of the
real shapes; the search stops when the budget (``autotune_budget``, default 10 s per plan,
compile time included) runs out, after the O2 plan at least.

The decision is kept on disk under ``TL_CACHE_DIR/autotune``, keyed by the bound graph, the
options, the candidate backends and this machine (CPU model, cores, library versions), so a
second process builds only the winner. ``print(plan)`` lists what was tried and what won.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np

from .. import config
from ..backends import get_backend
from ..errors import BackendError
from ..runtime import json_cache

DEFAULT_BUDGET = 10.0
TUNABLE_PASSES = ("merge", "fusion", "attention")  # passes whose absence is a candidate
THREAD_MODES = ("pool", "blas")
_CPU = ("numba", "numpy")
_OWN_OPTIONS = ("autotune_budget", "autotune_cache", "autotune_timer", "autotune_backends")


@dataclass(frozen=True)
class Candidate:
    """One way to build the plan."""

    backend: str
    skip: tuple[str, ...] = ()
    threads: str | None = None  # None: the backend has no thread modes (or the user chose one)

    @property
    def label(self) -> str:
        parts = [self.backend, "O2" if not self.skip else "O2 without " + "+".join(self.skip)]
        if self.threads:
            parts.append(f"threads={self.threads}")
        return " ".join(parts)

    def to_json(self) -> dict:
        return {"backend": self.backend, "skip": list(self.skip), "threads": self.threads}

    @staticmethod
    def from_json(d: dict) -> Candidate:
        return Candidate(d["backend"], tuple(d["skip"]), d.get("threads"))


@dataclass
class TuneReport:
    """What the autotuner tried (label, median seconds or None if it failed) and what won."""

    winner: str
    tried: list[tuple[str, float | None]] = field(default_factory=list)
    seconds: float = 0.0
    budget: float = DEFAULT_BUDGET
    cached: bool = False
    skipped: int = 0  # candidates left untried when the budget ran out

    def __str__(self) -> str:
        if self.cached:
            head = f"autotune: winner {self.winner} (decision read from the disk cache)"
        else:
            untried = f", {self.skipped} left untried" if self.skipped else ""
            head = (
                f"autotune: tried {len(self.tried)} candidate(s) in {self.seconds:.2f} s "
                f"(budget {self.budget:g} s{untried}), winner {self.winner}"
            )
        lines = [head]
        for label, t in self.tried:
            mark = "  <- won" if label == self.winner else ""
            lines.append(f"  {label}: {'failed' if t is None else f'{t * 1e3:.3f} ms'}{mark}")
        return "\n".join(lines)


def candidate_backends(requested: str, resolved: Any) -> tuple[str, ...]:
    """Backends O3 may choose from: both CPU backends for "auto" on a machine whose "auto"
    resolves to a CPU backend, else the one resolved."""
    if requested == "auto" and config.default_backend() == "auto" and resolved.name in _CPU:
        names = []
        for n in _CPU:
            try:
                get_backend(n)
            except BackendError:
                continue
            names.append(n)
        return tuple(names) or (resolved.name,)
    return (resolved.name,)


def _machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    libs = {}
    for n in ("tensorlogic", "numpy", "numba"):
        try:
            libs[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            libs[n] = "?"
    from ..backends import mkl

    return {
        "cpu": cpu,
        "threads": config.host_threads(),
        "blas": "mkl" if mkl.available() else "numpy",  # the GEMM library (TL_BLAS)
        "python": platform.python_version(),
        **libs,
    }


def _cache_path(plan, binding: dict[str, int], backends: tuple[str, ...]) -> Any:
    opts = {k: repr(v) for k, v in sorted(plan.options.given.items()) if k not in _OWN_OPTIONS}
    graph = plan.graph.bind(binding) if binding else plan.graph
    key = json.dumps(
        {
            "graph": graph.fingerprint(),
            "options": opts,
            "backends": backends,
            "machine": _machine(),
        },
        sort_keys=True,
    )
    return (
        config.cache_dir() / "autotune" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")
    )


def _read(path) -> dict | None:
    doc = json_cache.read(path)
    return doc if isinstance(doc, dict) else None


def _inputs_for(cp) -> dict[str, np.ndarray]:
    """Random inputs of the concrete plan's shapes and dtypes (normal values, never zeros)."""
    rng = np.random.default_rng(0)
    out = {}
    for name, bid in cp.input_ids.items():
        b = cp.buffers[bid]
        # on the plan's own device: a device backend's kernels take only its arrays
        out[name] = cp.backend.to_device(rng.standard_normal(b.shape).astype(b.dtype))
    return out


def measure(run: Callable[[], Any], slice_s: float) -> float:
    """Median seconds of ``run()`` over up to 7 calls in about ``slice_s`` (2 at least)."""
    run()  # first call: arenas, kernel loading
    times: list[float] = []
    t_end = time.perf_counter() + slice_s
    while len(times) < 7 and (len(times) < 2 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def autotune(plan, binding: dict[str, int], build: Callable) -> Any:
    """The fastest concrete plan among the candidates (``build(plan, binding, level, options,
    backend)`` makes one); the report goes to its ``autotune`` attribute."""
    from ..options import CompileOptions

    opts = plan.options
    budget = float(opts["autotune_budget"])
    timer = opts["autotune_timer"]
    use_cache = bool(opts["autotune_cache"])
    backends = tuple(opts["autotune_backends"] or (plan.backend.name,))
    # what the caller chose stays fixed; everything else is the candidates' to vary
    base = {k: v for k, v in opts.given.items() if k not in _OWN_OPTIONS}
    user_skip = tuple(base.get("skip_passes") or ())
    from ..optimizer.base import PIPELINES

    tunable = [p for p in TUNABLE_PASSES if p in PIPELINES[3] and p not in user_skip]
    vary_threads = "threads" not in base

    def make(c: Candidate):
        be = plan.backend if c.backend == plan.backend.name else get_backend(c.backend)
        o = dict(base)
        if "fuse_attention" not in base and not be.capabilities.device:
            # the candidates with and without the attention pass decide what "auto" guesses
            # from the scores' size
            o["fuse_attention"] = True
        if c.skip:
            o["skip_passes"] = c.skip
        if c.threads is not None:
            o["threads"] = c.threads
        return build(
            plan, binding, 3, CompileOptions.resolve(o, be.name, be.capabilities.options), be
        )

    def threads_of(backend: str) -> str | None:
        return "pool" if vary_threads and backend in _CPU else None

    path = _cache_path(plan, binding, backends) if use_cache else None
    if path is not None:
        doc = _read(path)
        if doc and "winner" in doc:
            try:
                win = Candidate.from_json(doc["winner"])
                cp = make(win)
            except Exception:  # noqa: BLE001 - a stale or foreign entry: search again
                cp = None
            if cp is not None:
                cp.autotune = TuneReport(
                    win.label,
                    [tuple(t) for t in doc.get("tried", [])],
                    doc.get("seconds", 0.0),
                    budget,
                    cached=True,
                )
                return cp

    t_start = time.perf_counter()
    first = Candidate(backends[0], user_skip, threads_of(backends[0]))
    tried: dict[Candidate, float | None] = {}
    plans: dict[Candidate, Any] = {}
    best: list = [None, float("inf")]  # candidate, seconds
    inputs: dict[str, np.ndarray] | None = None
    n_planned = 1 + len(tunable) + (1 if vary_threads else 0) + (len(backends) - 1)

    def left() -> float:
        return budget - (time.perf_counter() - t_start)

    def attempt(c: Candidate, required: bool = False) -> None:
        nonlocal inputs
        if c in tried or (not required and left() <= 0):
            return
        try:
            cp = make(c)
        except Exception:
            if required:
                raise
            tried[c] = None
            return
        if inputs is None:
            inputs = _inputs_for(cp)
        feed = inputs

        def run():
            return cp.run(feed, None)

        if timer is not None:
            t = float(timer(c.label, run))
        else:
            t = measure(run, max(0.05, min(1.0, left() / max(1, n_planned - len(tried)))))
        tried[c] = t
        if t < best[1]:
            best[0], best[1] = c, t
            plans.clear()
            plans[c] = cp

    attempt(first, required=True)
    # only passes that changed the first plan's graph give a different candidate without them
    report0 = plans[first].optimizer_report if first in plans else None
    if report0 is not None:
        changed = {r.name for r in report0.records if r.changed}
        n_planned -= sum(1 for p in tunable if p not in changed)
        tunable = [p for p in tunable if p in changed]
    # 1. structure: each tunable pass left out in turn
    for p in tunable:
        attempt(Candidate(first.backend, user_skip + (p,), first.threads))
    # 2. thread mode on the best structure so far
    if vary_threads and best[0].backend in _CPU:
        for mode in THREAD_MODES:
            attempt(Candidate(best[0].backend, best[0].skip, mode))
    # 3. the other backends, with the best structure and thread mode
    for b in backends[1:]:
        attempt(Candidate(b, best[0].skip, best[0].threads if b in _CPU else None))
    winner = best[0]
    cp = plans[winner]
    report = TuneReport(
        winner.label,
        [(c.label, t) for c, t in tried.items()],
        time.perf_counter() - t_start,
        budget,
        skipped=max(0, n_planned - len(tried)),
    )
    cp.autotune = report
    if path is not None:
        json_cache.write(
            path,
            {
                "winner": winner.to_json(),
                "tried": report.tried,
                "seconds": report.seconds,
                "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
        )
    return cp
