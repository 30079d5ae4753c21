"""Where the time of a multi-device run goes: a timeline of every lane's batches.

``with trace_lanes() as tr: run_batched(..., devices=...)`` records, per batch, the host times of
its phases on the lane's thread (taken from the queue, inputs staged and sent, kernels and
copies queued, results landed in the caller's arrays) and, where the backend's transfers
record device events (CuPy), when its upload, kernels and download ran on the device, on the
same clock. ``tr.lanes()`` sums that up per lane (time to the first kernel, per-batch phase
times, device idle gaps, when the last result landed); ``tr.report()`` prints it.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

_active: LaneTrace | None = None
_active_lock = threading.Lock()


@dataclass
class BatchTimes:
    """One batch on one lane; times are seconds since the trace began."""

    device: int
    index: int
    n_items: int
    host: dict[str, float] = field(default_factory=dict)  # take, staged, queued, landing, landed
    device_times: dict[str, float] = field(default_factory=dict)  # h2d_*, compute_*, d2h_end

    def span(self, a: str, b: str) -> float | None:
        """Seconds from mark ``a`` to mark ``b`` (host or device), None if one is missing."""
        marks = {**self.host, **self.device_times}
        return marks[b] - marks[a] if a in marks and b in marks else None


class LaneTrace:
    """Batch timelines of the runs started while it is active (see the module docstring)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.batches: list[BatchTimes] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        """Seconds since the trace began."""
        return time.perf_counter() - self.t0

    def add(self, record: BatchTimes) -> None:
        with self._lock:
            self.batches.append(record)

    def lanes(self) -> dict[int, dict[str, float]]:
        """Per device: batches, seconds to the first kernel and to the last result landed,
        median per-batch phases (stage = host copy in and send, h2d, compute, d2h, land =
        waiting for the download and copying out), and the device's idle time between its
        batches' kernels."""
        out: dict[int, dict[str, float]] = {}
        for dev in sorted({b.device for b in self.batches}):
            mine = sorted(
                (b for b in self.batches if b.device == dev),
                key=lambda b: b.device_times.get("compute_start", b.host.get("take", 0.0)),
            )
            row: dict[str, float] = {"batches": len(mine), "items": sum(b.n_items for b in mine)}
            row["first_take_s"] = min(b.host.get("take", float("inf")) for b in mine)
            row["last_landed_s"] = max(b.host.get("landed", 0.0) for b in mine)
            for name, (a, b) in {
                "stage_s": ("take", "staged"),
                "h2d_s": ("h2d_start", "h2d_end"),
                "compute_s": ("compute_start", "compute_end"),
                "d2h_s": ("compute_end", "d2h_end"),
                "land_s": ("landing", "landed"),
                "land_after_d2h_s": ("d2h_end", "landed"),
            }.items():
                spans = [s for x in mine if (s := x.span(a, b)) is not None]
                if spans:
                    row[name] = statistics.median(spans)
                    row[name.replace("_s", "_total_s", 1)] = sum(spans)
            starts = [b.device_times.get("compute_start") for b in mine]
            ends = [b.device_times.get("compute_end") for b in mine]
            if all(t is not None for t in starts + ends) and mine:
                row["first_compute_s"] = starts[0]
                row["last_compute_end_s"] = ends[-1]
                row["idle_between_s"] = sum(max(0.0, s - e) for s, e in zip(starts[1:], ends[:-1]))
            out[dev] = row
        return out

    def report(self) -> str:
        """The per-lane summary as lines of text (milliseconds)."""
        lines = []
        for dev, row in self.lanes().items():
            parts = [f"device {dev}: {row['batches']:.0f} batches"]
            for key, value in row.items():
                if key in ("batches", "items"):
                    continue
                parts.append(f"{key[:-2]} {value * 1e3:.1f}")
            lines.append(", ".join(parts) + " (ms)")
        return "\n".join(lines)


def active() -> LaneTrace | None:
    """The trace runs started now record into, if any."""
    return _active


@contextlib.contextmanager
def trace_lanes() -> Iterator[LaneTrace]:
    """Record the batch timelines of the multi-device runs started inside the block."""
    global _active
    trace = LaneTrace()
    with _active_lock:
        before, _active = _active, trace
    try:
        yield trace
    finally:
        with _active_lock:
            _active = before


__all__ = ["BatchTimes", "LaneTrace", "active", "trace_lanes"]
