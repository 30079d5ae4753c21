"""Chrome Trace Event export (the JSON format Perfetto and chrome://tracing open).

Complete events (``"ph": "X"``) carry ``ts`` and ``dur`` in microseconds; metadata events
(``"M"``) name every process and thread; counter events (``"C"``) carry pool bytes and device
memory. Events on one track are strictly nested: any two either do not overlap or one contains
the other (the exporter clips rounding overlaps so viewers never mis-stack them).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

from ..errors import TensorLogicError
from .events import Track

_NS_PER_US = 1000.0


def _us(ns: int) -> float:
    return round(ns / _NS_PER_US, 3)


def _nest(spans: list[tuple[int, int, dict]]) -> list[tuple[int, int, dict]]:
    """Sort spans (start_ns, dur_ns, event) and clip any that cross a parent's end."""
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[tuple[int, int, dict]] = []
    stack: list[int] = []  # end times of open parents
    for start, dur, ev in spans:
        while stack and stack[-1] <= start:
            stack.pop()
        end = start + dur
        if stack and end > stack[-1]:
            end = stack[-1]
            dur = end - start
        out.append((start, dur, ev))
        stack.append(end)
    return out


def chrome_trace(prof: Any) -> dict[str, Any]:
    """Build the trace document of a ``Profile``."""
    tracks: list[Track] = prof.tracks
    spans: dict[tuple[int, int], list[tuple[int, int, dict]]] = {(t.pid, t.tid): [] for t in tracks}

    def add(track: Track, start: int, dur: int, name: str, cat: str, args: dict) -> None:
        ev = {"name": name, "cat": cat, "ph": "X", "pid": track.pid, "tid": track.tid, "args": args}
        spans[(track.pid, track.tid)].append((start, max(dur, 0), ev))

    for c in prof.calls:
        args = {"call": c.call, "plan": c.plan, "backend": c.backend, "steps": c.steps}
        if c.device_ns is not None:
            args["device_us"] = _us(c.device_ns)
        add(c.track, c.start_ns, c.dur_ns, f"plan {c.plan} call", "call", args)
    for e in prof.steps:
        add(
            e.track,
            e.start_ns,
            e.dur_ns,
            e.name,
            e.kind,
            {
                "op": e.label,
                "node_id": e.node_id,
                "step": e.index,
                "call": e.call,
                "plan": e.plan,
                "backend": e.backend,
                "shape": list(e.shape),
                "dtype": e.dtype,
                "flops": e.flops,
                "bytes": e.bytes,
            },
        )
    for h in prof.host_events:
        add(h.track, h.start_ns, h.dur_ns, h.name, h.category, h.to_dict()["info"])

    events: list[dict[str, Any]] = []
    seen_pids: set[int] = set()
    for t in tracks:
        if t.pid not in seen_pids:
            seen_pids.add(t.pid)
            events.append(
                {
                    "name": "process_name",
                    "ph": "M",
                    "pid": t.pid,
                    "tid": 0,
                    "args": {"name": t.process},
                }
            )
            events.append(
                {
                    "name": "process_sort_index",
                    "ph": "M",
                    "pid": t.pid,
                    "tid": 0,
                    "args": {"sort_index": t.pid},
                }
            )
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": t.pid,
                "tid": t.tid,
                "args": {"name": t.thread},
            }
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": t.pid,
                "tid": t.tid,
                "args": {"sort_index": t.tid},
            }
        )
    for key in sorted(spans):
        for start, dur, ev in _nest(spans[key]):
            ev["ts"] = _us(start)
            ev["dur"] = _us(dur)
            events.append(ev)
    host_pid = tracks[0].pid if tracks else 1
    for c in prof.counters:
        events.append(
            {"name": c.name, "ph": "C", "pid": host_pid, "ts": _us(c.t_ns), "args": dict(c.values)}
        )
    from .. import __version__

    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": f"tensorlogic {__version__}",
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "node": platform.node(),
            "wall_seconds": prof.wall_seconds,
        },
    }


def write_chrome_trace(prof: Any, path: str | os.PathLike) -> None:
    """Write the trace document to ``path`` as JSON."""
    doc = chrome_trace(prof)
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
    except OSError as exc:
        raise TensorLogicError(
            f"cannot write the trace to {os.fspath(path)!r}: {exc}", code="io_error"
        ) from exc
