"""TimelineProfiler: records every plan step, compile-time work and counters while active.

``with tl.profile() as prof:`` installs a ``Profile`` as the executor's observer
(``runtime.hooks``). While recording, a plan call stores only raw timestamps, one per step
(``perf_counter_ns``), or one device event per step on backends with ``capabilities.events``
(``backend.event()`` / ``backend.event_seconds(start, end)``: GPU steps are then timed without a
synchronization after every step). Event records are built from the raw data on first access.
Calls from several threads are recorded on their own tracks.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..runtime import hooks
from ..errors import TensorLogicError
from .events import CallEvent, CounterSample, HostEvent, StepEvent, Track

HOST_PID = 1


class _RawCall:
    """What one profiled plan call leaves behind (turned into events later)."""

    __slots__ = (
        "plan",
        "ident",
        "thread",
        "stamps",
        "events",
        "offsets",
        "host_end",
        "pool",
        "device_mem",
    )

    def __init__(self, plan: Any, ident: int, thread: str, stamps: list[int]) -> None:
        self.plan = plan
        self.ident = ident
        self.thread = thread
        self.stamps = stamps  # host: start of step 0, then the end of each step
        self.events: list | None = None  # device: one event before step 0, then one per step
        self.offsets: list[int] | None = None  # device: event times from the first, in ns
        self.host_end = 0
        self.pool = 0
        self.device_mem: tuple[str, float] | None = None


class _CallHook:
    """One profiled call: a timestamp (or a device event) after every step, then the record."""

    __slots__ = ("after_step", "profile", "rec")

    def __init__(self, profile: Profile, rec: _RawCall) -> None:
        self.profile, self.rec = profile, rec
        backend = rec.plan.backend
        if backend.capabilities.events:
            # device steps are timed by events on the stream: no synchronization per step
            make_event, events = backend.event, [backend.event()]
            rec.events = events
            mark = events.append
            self.after_step = lambda k: mark(make_event())
        else:
            clock, tick = time.perf_counter_ns, rec.stamps.append
            self.after_step = lambda k: tick(clock())

    def done(self) -> None:
        rec = self.rec
        rec.host_end = time.perf_counter_ns()
        if self.profile.record_counters:
            plan, backend = rec.plan, rec.plan.backend
            rec.pool = plan.pool.bytes_held
            used = backend.memory_in_use()
            free = backend.free_memory() if used is None and rec.events is not None else None
            if used is not None:
                rec.device_mem = ("in use", float(used))
            elif free is not None:
                # a device backend that only knows its free memory (one driver query)
                rec.device_mem = ("free", float(free))
        self.profile._raw.append(rec)  # list.append is atomic: calls from many threads are safe


class Profile:
    """A recording of plan calls; use as ``with tl.profile() as prof:``.

    After (or during) recording: ``steps``, ``calls``, ``host_events``, ``counters`` hold the
    events; ``table()``, ``export_chrome_trace(path)``, ``to_dict()``, ``bottlenecks()``,
    ``plot_timeline(path)`` and ``plot_roofline(path)`` present them.
    """

    def __init__(self, *, counters: bool = True) -> None:
        self.record_counters = counters
        self._raw: list[_RawCall] = []
        self._host: list[tuple] = []
        self._counter_raw: list[tuple[str, int, float]] = []
        self._active = False
        self._t0 = 0
        self._t1: int | None = None
        self._built: tuple[int, int, int] | None = None
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ recording
    def __enter__(self) -> "Profile":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "Profile":
        """Begin recording (``with`` does this)."""
        if self._active:
            raise TensorLogicError("this profile is already recording", code="profile_active")
        if not self._t0:
            self._t0 = time.perf_counter_ns()
        self._active = True
        hooks.push(self)
        return self

    def stop(self) -> None:
        """Stop recording and resolve device timings (one synchronization per device)."""
        if not self._active:
            return
        hooks.pop(self)
        self._active = False
        self._t1 = time.perf_counter_ns()
        self._resolve_device_times()

    def _resolve_device_times(self) -> None:
        """Turn device events into offsets (ns from each call's first event) and drop them,
        so their resources go back now; one synchronization per device backend."""
        synced: set[int] = set()
        for rec in self._raw:
            if rec.events is None or rec.offsets is not None:
                continue
            be = rec.plan.backend
            if id(be) not in synced:
                be.synchronize()
                synced.add(id(be))
            seconds = be.event_seconds
            e0 = rec.events[0]
            rec.offsets = [0] + [int(round(seconds(e0, e) * 1e9)) for e in rec.events[1:]]
            rec.events = None

    @property
    def active(self) -> bool:
        """True while recording."""
        return self._active

    def step_hook(self, plan: Any, env: list) -> _CallHook:
        """Observer hook: time-stamp every step of one call of ``plan``."""
        clock = time.perf_counter_ns
        rec = _RawCall(plan, threading.get_ident(), threading.current_thread().name, [clock()])
        return _CallHook(self, rec)

    def compile_event(
        self, category: str, name: str, start: float, seconds: float, info: dict
    ) -> None:
        """Observer hook: record host work (optimizer pass, codegen, cache, transfer)."""
        self._host.append(
            (
                category,
                name,
                int(round(start * 1e9)),
                int(round(seconds * 1e9)),
                threading.get_ident(),
                threading.current_thread().name,
                dict(info),
            )
        )

    def counter(self, name: str, value: float) -> None:
        """Observer hook: record a counter sample."""
        self._counter_raw.append((name, time.perf_counter_ns(), float(value)))

    # ------------------------------------------------------------------ events
    @property
    def plans(self) -> list[Any]:
        """The concrete plans seen, in order of first call (``StepEvent.plan`` indexes this)."""
        return self._build()["plans"]

    @property
    def steps(self) -> list[StepEvent]:
        """Every executed step, in call order."""
        return self._build()["steps"]

    @property
    def calls(self) -> list[CallEvent]:
        """Every plan call."""
        return self._build()["calls"]

    @property
    def host_events(self) -> list[HostEvent]:
        """Compile-time work and host-device transfers."""
        return self._build()["host"]

    @property
    def counters(self) -> list[CounterSample]:
        """Counter samples (pool bytes per plan, device memory, user counters)."""
        return self._build()["counters"]

    @property
    def tracks(self) -> list[Track]:
        """Every track that holds an event."""
        return self._build()["tracks"]

    @property
    def start_ns(self) -> int:
        """The profile's time origin (``perf_counter_ns``)."""
        return self._t0

    @property
    def wall_seconds(self) -> float:
        """Time from start to stop (or to now while recording)."""
        end = self._t1 if self._t1 is not None else time.perf_counter_ns()
        return (end - self._t0) * 1e-9 if self._t0 else 0.0

    def _build(self) -> dict[str, Any]:
        key = (len(self._raw), len(self._host), len(self._counter_raw))
        with self._lock:
            if self._built == key:
                return self._cache
            self._resolve_device_times()
            self._cache = _Builder(self._t0).build(
                self._raw[: key[0]], self._host[: key[1]], self._counter_raw[: key[2]]
            )
            self._built = key
            return self._cache

    # ------------------------------------------------------------------ presentation
    def table(
        self, sort_by: str = "total", row_limit: int | None = 20, group_by: str = "node"
    ) -> str:
        """Text table of step times grouped by node (or ``group_by="op"``), like PyTorch's
        ``key_averages().table()``: calls, total, mean, % of total, GFLOP/s, GB/s."""
        from .summary import key_averages, render_table

        rows = key_averages(self.steps, group_by)
        return render_table(rows, sort_by=sort_by, row_limit=row_limit, group_by=group_by)

    def key_averages(self, group_by: str = "node") -> list:
        """Per-node (or per-op) aggregates: list of ``KeyAverage``."""
        from .summary import key_averages

        return key_averages(self.steps, group_by)

    def export_chrome_trace(self, path: str | os.PathLike) -> None:
        """Write a Chrome Trace Event JSON file (opens in Perfetto and chrome://tracing)."""
        from .trace import write_chrome_trace

        write_chrome_trace(self, path)

    def chrome_trace(self) -> dict[str, Any]:
        """The Chrome Trace Event document as a dict."""
        from .trace import chrome_trace

        return chrome_trace(self)

    def to_dict(self) -> dict[str, Any]:
        """Every event as plain JSON-able data."""
        b = self._build()
        return {
            "wall_seconds": self.wall_seconds,
            "plans": [
                {"index": i, "backend": p.backend.name, "steps": len(p.steps)}
                for i, p in enumerate(b["plans"])
            ],
            "tracks": [t.__dict__.copy() for t in b["tracks"]],
            "steps": [e.to_dict() for e in b["steps"]],
            "calls": [e.to_dict() for e in b["calls"]],
            "host_events": [e.to_dict() for e in b["host"]],
            "counters": [c.to_dict() for c in b["counters"]],
        }

    def bottlenecks(self, peaks: Any = None, **options: Any) -> Any:
        """Roofline analysis and advice (a ``BottleneckReport``).

        Args:
            peaks: a ``Peaks`` for every backend, or a dict backend name -> ``Peaks``; by
                default each backend's measured peaks from ``tl.calibrate`` (cached on disk).
            options: passed to ``analyze`` (thresholds, ``threads`` info).
        """
        from .bottleneck import analyze

        return analyze(self, peaks, **options)

    def plot_timeline(self, path: str | os.PathLike) -> None:
        """Write the timeline as a PNG (needs matplotlib: the ``plot`` extra)."""
        from .plots import plot_timeline

        plot_timeline(self, path)

    def plot_roofline(self, path: str | os.PathLike, peaks: Any = None) -> None:
        """Write the roofline chart of the profiled steps as a PNG (needs matplotlib)."""
        from .plots import plot_roofline

        plot_roofline(self.bottlenecks(peaks), path)

    def __repr__(self) -> str:
        state = "recording" if self._active else "stopped"
        return f"<Profile {state}: {len(self._raw)} plan calls, {len(self._host)} host events>"


def profile(*, counters: bool = True) -> Profile:
    """A new profiler: ``with tl.profile() as prof: plan(...)`` records every plan call.

    Args:
        counters: sample pool bytes and device memory after every call.
    """
    return Profile(counters=counters)


class _Builder:
    """Turns raw records into events and tracks."""

    def __init__(self, t0: int) -> None:
        self.t0 = t0
        self.tracks: dict[tuple, Track] = {}
        self.tids: dict[int, int] = {}
        self.device_pids: dict[str, int] = {}

    def host_track(self, ident: int, thread: str) -> Track:
        tid = self.tids.setdefault(ident, len(self.tids) + 1)
        key = (HOST_PID, tid)
        tr = self.tracks.get(key)
        if tr is None:
            tr = self.tracks[key] = Track(HOST_PID, tid, f"host (pid {os.getpid()})", thread)
        return tr

    def device_track(self, backend: str, ident: int, thread: str) -> Track:
        pid = self.device_pids.setdefault(backend, HOST_PID + 1 + len(self.device_pids))
        tid = self.tids.setdefault(ident, len(self.tids) + 1)
        key = (pid, tid)
        tr = self.tracks.get(key)
        if tr is None:
            tr = self.tracks[key] = Track(pid, tid, f"{backend} device", f"stream of {thread}")
        return tr

    def build(
        self, raw: list[_RawCall], host: list[tuple], counter_raw: list[tuple[str, int, float]]
    ) -> dict[str, Any]:
        t0 = self.t0
        plans: list[Any] = []
        plan_ix: dict[int, int] = {}
        steps: list[StepEvent] = []
        calls: list[CallEvent] = []
        counters: list[CounterSample] = []
        pools: dict[str, float] = {}
        for c, rec in enumerate(raw):
            plan = rec.plan
            p = plan_ix.get(id(plan))
            if p is None:
                p = plan_ix[id(plan)] = len(plans)
                plans.append(plan)
            bname = plan.backend.name
            host_tr = self.host_track(rec.ident, rec.thread)
            start = rec.stamps[0] - t0
            device_ns = None
            if rec.offsets is None:
                bounds = [s - t0 for s in rec.stamps]
                tr = host_tr
            else:
                bounds = [start + off for off in rec.offsets]
                device_ns = bounds[-1] - bounds[0]
                tr = self.device_track(bname, rec.ident, rec.thread)
            n = len(bounds) - 1
            calls.append(
                CallEvent(c, p, bname, n, start, rec.host_end - rec.stamps[0], host_tr, device_ns)
            )
            plan_steps = plan.steps
            for k in range(n):
                s = plan_steps[k]
                b = bounds[k]
                steps.append(
                    StepEvent(
                        c,
                        p,
                        k,
                        s.name,
                        s.node_id,
                        s.kind,
                        s.op,
                        s.label,
                        bname,
                        s.shape,
                        s.dtype,
                        s.flops,
                        s.bytes,
                        b,
                        bounds[k + 1] - b,
                        tr,
                    )
                )
            t_end = rec.host_end - t0
            pools[f"plan {p}"] = float(rec.pool)
            counters.append(CounterSample("pool bytes", t_end, dict(pools)))
            if rec.device_mem is not None:
                what, value = rec.device_mem
                counters.append(CounterSample("device memory", t_end, {f"{bname} {what}": value}))
        host_events = [
            HostEvent(cat, name, s - t0, d, self.host_track(ident, thread), info)
            for cat, name, s, d, ident, thread, info in host
        ]
        for name, t, v in counter_raw:
            counters.append(CounterSample(name, t - t0, {name: v}))
        counters.sort(key=lambda c: c.t_ns)
        tracks = sorted(self.tracks.values(), key=lambda t: (t.pid, t.tid))
        return {
            "plans": plans,
            "steps": steps,
            "calls": calls,
            "host": host_events,
            "counters": counters,
            "tracks": tracks,
        }
