"""Per-node and per-op aggregates of step events, and their text table."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TensorLogicError
from .events import StepEvent

GROUPS = ("node", "op")
SORT_KEYS = ("total", "mean", "calls", "name", "flops", "gflops", "gbps")


@dataclass
class KeyAverage:
    """Aggregate of the steps of one node (or one op)."""

    key: str
    op: str
    backend: str
    calls: int = 0
    total_ns: int = 0
    flops: int = 0
    bytes: int = 0

    @property
    def total_seconds(self) -> float:
        """Summed duration."""
        return self.total_ns * 1e-9

    @property
    def mean_seconds(self) -> float:
        """Mean duration of one execution."""
        return self.total_seconds / self.calls if self.calls else 0.0

    @property
    def gflops(self) -> float:
        """Achieved GFLOP/s over all executions."""
        return self.flops / self.total_ns if self.total_ns else 0.0

    @property
    def gbps(self) -> float:
        """Achieved GB/s (bytes read and written) over all executions."""
        return self.bytes / self.total_ns if self.total_ns else 0.0


def key_averages(steps: list[StepEvent], group_by: str = "node") -> list[KeyAverage]:
    """Aggregate step events by node name (per plan and backend) or by op label."""
    if group_by not in GROUPS:
        raise TensorLogicError(
            f"group_by must be one of {GROUPS}, got {group_by!r}", code="bad_argument"
        )
    plans = {e.plan for e in steps}
    rows: dict[tuple, KeyAverage] = {}
    for e in steps:
        if group_by == "node":
            name = e.name if len(plans) == 1 else f"{e.name} (plan {e.plan})"
            key = (name, e.backend)
            label = e.label
        else:
            key = (e.label, e.backend)
            name = label = e.label
        row = rows.get(key)
        if row is None:
            row = rows[key] = KeyAverage(name, label, e.backend)
        row.calls += 1
        row.total_ns += e.dur_ns
        row.flops += e.flops
        row.bytes += e.bytes
    return list(rows.values())


def fmt_seconds(s: float) -> str:
    """A duration with a fitting unit."""
    if s >= 1.0:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.3f} us"


def _sort(rows: list[KeyAverage], sort_by: str) -> list[KeyAverage]:
    if sort_by not in SORT_KEYS:
        raise TensorLogicError(
            f"sort_by must be one of {SORT_KEYS}, got {sort_by!r}", code="bad_argument"
        )
    keys = {
        "total": lambda r: -r.total_ns,
        "mean": lambda r: -r.mean_seconds,
        "calls": lambda r: -r.calls,
        "name": lambda r: r.key,
        "flops": lambda r: -r.flops,
        "gflops": lambda r: -r.gflops,
        "gbps": lambda r: -r.gbps,
    }
    return sorted(rows, key=keys[sort_by])


def render_table(
    rows: list[KeyAverage],
    sort_by: str = "total",
    row_limit: int | None = 20,
    group_by: str = "node",
) -> str:
    """The aggregates as an aligned text table with a total line."""
    if row_limit is not None and (not isinstance(row_limit, int) or row_limit < 1):
        raise TensorLogicError(
            f"row_limit must be a positive int or None, got {row_limit!r}", code="bad_argument"
        )
    rows = _sort(rows, sort_by)
    total_ns = sum(r.total_ns for r in rows)
    shown = rows if row_limit is None else rows[:row_limit]
    head = (
        "Name" if group_by == "node" else "Op",
        "Op" if group_by == "node" else "Backend",
        "Calls",
        "Total",
        "Mean",
        "% total",
        "GFLOP/s",
        "GB/s",
    )
    table = [head]
    for r in shown:
        share = 100.0 * r.total_ns / total_ns if total_ns else 0.0
        table.append(
            (
                r.key,
                r.op if group_by == "node" else r.backend,
                str(r.calls),
                fmt_seconds(r.total_seconds),
                fmt_seconds(r.mean_seconds),
                f"{share:.1f}%",
                f"{r.gflops:.2f}",
                f"{r.gbps:.2f}",
            )
        )
    if not rows:
        return "no steps were recorded (call a plan inside `with tl.profile()`)"
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    right = {2, 3, 4, 5, 6, 7}

    def line(row: tuple) -> str:
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))
        ]
        return "  ".join(cells).rstrip()

    sep = "  ".join("-" * w for w in widths)
    out = [sep, line(table[0]), sep] + [line(r) for r in table[1:]] + [sep]
    more = len(rows) - len(shown)
    n_steps = sum(r.calls for r in rows)
    tail = f"Self time total: {fmt_seconds(total_ns * 1e-9)} over {n_steps} steps"
    if more:
        tail += f" ({more} more rows not shown; row_limit={row_limit})"
    out.append(tail)
    return "\n".join(out)
