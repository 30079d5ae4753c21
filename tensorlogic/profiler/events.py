"""The event records a profile is made of: plan steps, plan calls, host spans, counter samples.

Times are integer nanoseconds on ``time.perf_counter_ns``'s clock, relative to the start of the
profile. Every timed event lives on a ``Track``: one per host thread, one per (device, issuing
thread) for device work timed with events.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Track:
    """A timeline row: a process (host, or a device) and a thread or stream in it."""

    pid: int
    tid: int
    process: str
    thread: str


class StepEvent(NamedTuple):
    """One executed plan step (a named tuple: profiles hold many, built fast)."""

    call: int  # index of the plan call in the profile
    plan: int  # index of the plan in ``Profile.plans``
    index: int  # step index in the plan
    name: str
    node_id: int
    kind: str
    op: str | None
    label: str
    backend: str
    shape: tuple[int, ...]
    dtype: str
    flops: int
    bytes: int
    start_ns: int
    dur_ns: int
    track: Track

    @property
    def seconds(self) -> float:
        """Duration in seconds."""
        return self.dur_ns * 1e-9

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form."""
        d = self._asdict()
        d["shape"] = list(self.shape)
        d["track"] = asdict(self.track)
        return d


@dataclass(frozen=True)
class CallEvent:
    """One call of a plan: the span that holds its steps on the calling thread's track."""

    call: int
    plan: int
    backend: str
    steps: int
    start_ns: int
    dur_ns: int
    track: Track
    device_ns: int | None = None  # sum of device step times, for event-timed backends

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form."""
        d = asdict(self)
        d["track"] = asdict(self.track)
        return d


@dataclass(frozen=True)
class HostEvent:
    """Host-side work outside the steps: an optimizer pass, code generation, a cache hit or
    miss, a host-device transfer (category ``"transfer"``)."""

    category: str
    name: str
    start_ns: int
    dur_ns: int
    track: Track
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form."""
        return {
            "category": self.category,
            "name": self.name,
            "start_ns": self.start_ns,
            "dur_ns": self.dur_ns,
            "track": asdict(self.track),
            "info": _jsonable(self.info),
        }


@dataclass(frozen=True)
class CounterSample:
    """A sample of a counter (``values`` holds one series per key, e.g. one per plan)."""

    name: str
    t_ns: int
    values: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form."""
        return {"name": self.name, "t_ns": self.t_ns, "values": dict(self.values)}


def _jsonable(value: Any) -> Any:
    """Info values as JSON types (tuples to lists, unknown objects to their repr)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
