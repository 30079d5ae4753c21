"""Shared benchmark helpers: timing with medians, machine facts, result files."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).parent / "results"


def median_time(
    fn: Callable[[], object],
    repeat: int = 20,
    warmup: int = 3,
    min_time: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs.

    With ``min_time``, each sample loops fn until that many seconds pass (for microsecond calls).
    ``clock``: ``time.thread_time`` counts only the calling thread's CPU time, which a crowded
    machine's other processes do not inflate (for work that runs on the calling thread alone).
    """
    for _ in range(warmup):
        fn()
    return statistics.median(_sample(fn, min_time, clock) for _ in range(repeat))


def _sample(
    fn: Callable[[], object], min_time: float, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds per call of ``fn``, looping it until ``min_time`` seconds pass (at least once)."""
    n, t0 = 0, clock()
    while True:
        fn()
        n += 1
        dt = clock() - t0
        if dt >= min_time:
            return dt / n


def interleaved_times(
    fns: dict[str, Callable[[], object]], repeat: int = 20, warmup: int = 3, min_time: float = 0.0
) -> dict[str, float]:
    """Median seconds per call of each function, sampled round-robin.

    Every round takes one sample of each function (looping it for ``min_time`` seconds), so a
    slow minute on a shared machine slows every contender alike instead of whichever ran then.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            samples[name].append(_sample(fn, min_time))
    return {name: statistics.median(v) for name, v in samples.items()}


def versions(*names: str) -> dict[str, str]:
    """Installed versions of the named distributions (absent ones omitted)."""
    out = {"python": platform.python_version()}
    for n in ("tensorlogic", "numpy", "opt_einsum", "numba", *names):
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict:
    """CPU model, usable cores and load, so readers can judge the numbers."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores_usable": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
    }


def cores_look_free(threshold: float = 0.5) -> bool:
    """True when the 1-minute load average leaves the usable cores mostly idle."""
    m = machine()
    return (
        m["loadavg_1min"] is not None
        and m["loadavg_1min"] < threshold * (m["cores_usable"] or 1) + 0.5
    )


def write_results(
    name: str, rows: list[dict], extra: dict | None = None, peers: tuple[str, ...] = ()
) -> Path:
    """Write benchmarks/results/<name>.json with machine, versions and date."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(*peers),
        "argv": sys.argv[1:],
        "rows": rows,
        **(extra or {}),
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain text table of the given columns."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [columns] + [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
