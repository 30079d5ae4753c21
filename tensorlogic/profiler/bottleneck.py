"""Roofline analysis of a profile: per-step bound, achieved rates, share of peak, advice.

For each plan step the measured time is set against the step's roofline on measured peaks:
the compute time ``flops / peak_flops[dtype]`` and the memory time ``bytes / bandwidth``. The
larger of the two is the step's roofline time; a step whose roofline time is below the
backend's per-step overhead is too small to reach either roof and is ``"overhead"``-bound,
otherwise it is ``"compute"``- or ``"memory"``-bound by whichever time dominates. The
bound depends only on the step and the peaks (never on noisy timings), so it is stable.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import TensorLogicError
from .calibration import Peaks, calibrate
from .summary import fmt_seconds

BOUNDS = ("compute", "memory", "overhead")


@dataclass(frozen=True)
class Roofline:
    """Where one step sits on the roofline."""

    intensity: float  # FLOP per byte
    attainable: float  # FLOP/s the roofline allows at this intensity
    compute_seconds: float
    memory_seconds: float
    bound: str

    @property
    def seconds(self) -> float:
        """The roofline's lower bound on the step's time."""
        return max(self.compute_seconds, self.memory_seconds)


def roofline(flops: int, nbytes: int, dtype: str, peaks: Peaks) -> Roofline:
    """Classify a step of ``flops`` and ``nbytes`` against ``peaks``."""
    pf = peaks.flops_for(dtype)
    t_c = flops / pf
    t_m = nbytes / peaks.bandwidth
    intensity = flops / nbytes if nbytes else (math.inf if flops else 0.0)
    attainable = min(pf, intensity * peaks.bandwidth)
    if max(t_c, t_m) < peaks.step_overhead:
        bound = "overhead"
    elif t_c >= t_m:
        bound = "compute"
    else:
        bound = "memory"
    return Roofline(intensity, attainable, t_c, t_m, bound)


@dataclass(frozen=True)
class StepStats:
    """One plan step over all its profiled executions."""

    plan: int
    index: int
    name: str
    node_id: int
    kind: str
    op: str | None
    label: str
    backend: str
    dtype: str
    shape: tuple[int, ...]
    flops: int
    bytes: int
    calls: int
    seconds: float  # mean per execution
    total_seconds: float
    intensity: float
    gflops: float  # achieved
    gbps: float  # achieved
    attainable_gflops: float
    roofline_seconds: float
    share_of_peak: float  # roofline time / measured time (1.0 = on the roof)
    share_of_time: float  # of all step time in the profile
    bound: str

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form (infinite intensity becomes None)."""
        d = asdict(self)
        d["shape"] = list(self.shape)
        if math.isinf(d["intensity"]):
            d["intensity"] = None
        return d


@dataclass(frozen=True)
class Advice:
    """One finding: the rule that fired, what to do, the nodes it names, the time at stake."""

    rule: str
    message: str
    nodes: tuple[str, ...]
    seconds: float
    share: float

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


@dataclass(frozen=True)
class ThreadInfo:
    """Thread pools of this process: BLAS threads, numba threads, usable cores."""

    blas: int
    numba: int
    cores: int

    @staticmethod
    def current() -> "ThreadInfo":
        """Read the pools now (threadpoolctl for BLAS; numba's configured count if loaded)."""
        import os
        import sys

        from threadpoolctl import threadpool_info

        blas = max(
            (
                int(p.get("num_threads", 1))
                for p in threadpool_info()
                if p.get("user_api") == "blas"
            ),
            default=1,
        )
        numba = 0
        nb = sys.modules.get("numba")
        if nb is not None:
            numba = int(nb.config.NUMBA_NUM_THREADS)
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return ThreadInfo(blas, numba, cores)


@dataclass
class BottleneckReport:
    """The analysis of a profile: ``steps`` (one ``StepStats`` per plan step), ``advice``,
    the peaks used per backend; ``str(report)`` is the text report."""

    steps: list[StepStats]
    advice: list[Advice]
    peaks: dict[str, Peaks]
    total_seconds: float
    transfer_seconds: float
    wall_seconds: float
    threads: ThreadInfo | None = None
    by_bound: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form."""
        return {
            "total_seconds": self.total_seconds,
            "transfer_seconds": self.transfer_seconds,
            "wall_seconds": self.wall_seconds,
            "by_bound": dict(self.by_bound),
            "peaks": {k: v.to_dict() for k, v in self.peaks.items()},
            "threads": asdict(self.threads) if self.threads else None,
            "steps": [s.to_dict() for s in self.steps],
            "advice": [asdict(a) for a in self.advice],
        }

    def __str__(self) -> str:
        lines = ["Bottleneck report"]
        for p in self.peaks.values():
            lines.append(f"  {p}")
        lines.append(
            f"  step time {fmt_seconds(self.total_seconds)}"
            + (
                f", host-device transfers {fmt_seconds(self.transfer_seconds)}"
                if self.transfer_seconds
                else ""
            )
            + f", wall {fmt_seconds(self.wall_seconds)}"
        )
        if self.by_bound:
            parts = [f"{b} {100 * s:.1f}%" for b, s in self.by_bound.items()]
            lines.append("  time by bound: " + ", ".join(parts))
        rows = [
            ("step", "op", "bound", "time/call", "% time", "GFLOP/s", "GB/s", "FLOP/B", "% of roof")
        ]
        for s in sorted(self.steps, key=lambda s: -s.total_seconds)[:15]:
            ai = "inf" if math.isinf(s.intensity) else f"{s.intensity:.2f}"
            rows.append(
                (
                    s.name,
                    s.label,
                    s.bound,
                    fmt_seconds(s.seconds),
                    f"{100 * s.share_of_time:.1f}",
                    f"{s.gflops:.2f}",
                    f"{s.gbps:.2f}",
                    ai,
                    f"{100 * s.share_of_peak:.1f}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines.append("")
        for k, r in enumerate(rows):
            lines.append(
                "  "
                + "  ".join(
                    c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
                ).rstrip()
            )
            if k == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        if len(self.steps) > 15:
            lines.append(f"  ... {len(self.steps) - 15} more steps (report.steps has them all)")
        lines.append("")
        if self.advice:
            lines.append("Advice:")
            for a in self.advice:
                lines.append(f"  - {a}")
        else:
            lines.append("Advice: none; every step is near its roofline or too small to matter.")
        return "\n".join(lines)


def _peaks_for(backends: list[str], peaks: Any) -> dict[str, Peaks]:
    if peaks is None:
        return {b: calibrate(b) for b in backends}
    if isinstance(peaks, Peaks):
        return {b: peaks for b in backends}
    if isinstance(peaks, Mapping):
        missing = [b for b in backends if b not in peaks]
        if missing:
            raise TensorLogicError(
                f"peaks given for {sorted(peaks)} but the profile also ran on "
                f"{missing}; pass peaks for every backend",
                code="bad_peaks",
            )
        for b in backends:
            if not isinstance(peaks[b], Peaks):
                raise TensorLogicError(
                    f"peaks[{b!r}] must be a Peaks, got {type(peaks[b]).__name__}", code="bad_peaks"
                )
        return {b: peaks[b] for b in backends}
    raise TensorLogicError(
        f"peaks must be a Peaks, a dict of backend -> Peaks, or None; got {type(peaks).__name__}",
        code="bad_peaks",
    )


def step_stats(prof: Any, peaks: dict[str, Peaks]) -> list[StepStats]:
    """Aggregate step events per (plan, step) and place each on its roofline."""
    agg: dict[tuple[int, int], list] = {}
    for e in prof.steps:
        a = agg.get((e.plan, e.index))
        if a is None:
            agg[(e.plan, e.index)] = [e, 1, e.dur_ns]
        else:
            a[1] += 1
            a[2] += e.dur_ns
    total_ns = sum(a[2] for a in agg.values())
    out = []
    for (p, k), (e, n, ns) in sorted(agg.items()):
        pk = peaks[e.backend]
        rl = roofline(e.flops, e.bytes, e.dtype, pk)
        mean = ns * 1e-9 / n
        out.append(
            StepStats(
                p,
                k,
                e.name,
                e.node_id,
                e.kind,
                e.op,
                e.label,
                e.backend,
                e.dtype,
                e.shape,
                e.flops,
                e.bytes,
                n,
                mean,
                ns * 1e-9,
                rl.intensity,
                e.flops / mean / 1e9 if mean > 0 else 0.0,
                e.bytes / mean / 1e9 if mean > 0 else 0.0,
                rl.attainable / 1e9,
                rl.seconds,
                rl.seconds / mean if mean > 0 else 0.0,
                ns / total_ns if total_ns else 0.0,
                rl.bound,
            )
        )
    return out


def analyze(
    prof: Any,
    peaks: Any = None,
    *,
    threads: ThreadInfo | None = None,
    rules: tuple[str, ...] | None = None,
    **thresholds: float,
) -> BottleneckReport:
    """Analyze a ``Profile``: roofline per step and advice from the rules in ``advice``.

    Args:
        peaks: ``Peaks`` for all backends, a dict backend -> ``Peaks``, or None to use
            ``tl.calibrate`` (measured once per machine and cached).
        threads: thread pool sizes (default: read from this process).
        rules: names of the advice rules to run (default: all).
        thresholds: overrides of ``advice.THRESHOLDS``.
    """
    from .advice import run_rules

    backends = sorted({e.backend for e in prof.steps})
    pk = _peaks_for(backends, peaks)
    stats = step_stats(prof, pk)
    total = sum(s.total_seconds for s in stats)
    transfers = [h for h in prof.host_events if h.category == "transfer"]
    transfer_s = sum(h.dur_ns for h in transfers) * 1e-9
    by_bound: dict[str, float] = {}
    for s in stats:
        by_bound[s.bound] = by_bound.get(s.bound, 0.0) + s.share_of_time
    threads = threads if threads is not None else ThreadInfo.current()
    report = BottleneckReport(
        stats,
        [],
        pk,
        total,
        transfer_s,
        prof.wall_seconds,
        threads,
        {b: by_bound[b] for b in BOUNDS if b in by_bound},
    )
    report.advice = run_rules(
        report,
        prof.plans,
        transfers,
        rules,
        thresholds,
        device_backends={c.backend for c in prof.calls if c.device_ns is not None},
    )
    return report


__all__ = [
    "Advice",
    "BottleneckReport",
    "Roofline",
    "StepStats",
    "ThreadInfo",
    "analyze",
    "roofline",
    "step_stats",
]
