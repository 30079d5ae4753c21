"""PNG charts of a profile: the timeline (one row per track) and the roofline.

matplotlib is an optional dependency (the ``plot`` extra); without it these functions raise
``MissingDependencyError`` saying how to install it.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import MissingDependencyError, TensorLogicError

_KIND_COLORS = {
    "einsum": "#1f77b4",
    "unary": "#2ca02c",
    "binary": "#98df8a",
    "where": "#bcbd22",
    "reduce": "#ff7f0e",
    "rowop": "#d62728",
    "transpose": "#9467bd",
    "reshape": "#c5b0d5",
    "cast": "#8c564b",
    "fused": "#17becf",
    "call": "#dddddd",
    "optimizer": "#7f7f7f",
    "codegen": "#e377c2",
    "compile": "#aaaaaa",
    "cache": "#555555",
    "transfer": "#ff9896",
}
_BOUND_COLORS = {"compute": "#1f77b4", "memory": "#2ca02c", "overhead": "#d62728"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependencyError(
            "plotting needs matplotlib, which is not installed; install the plot extra: "
            "pip install 'tensorlogic[plot]'",
            code="missing_dependency",
        ) from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | os.PathLike) -> None:
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as exc:
        raise TensorLogicError(
            f"cannot write the chart to {os.fspath(path)!r}: {exc}", code="io_error"
        ) from exc


def plot_timeline(prof: Any, path: str | os.PathLike) -> None:
    """Horizontal bars per track: plan calls behind their steps, host work, colored by kind."""
    plt = _pyplot()
    tracks = prof.tracks
    rows = {(t.pid, t.tid): i for i, t in enumerate(tracks)}
    spans: dict[str, list[tuple[int, float, float, float]]] = {}

    def add(kind: str, track: Any, start_ns: int, dur_ns: int, height: float) -> None:
        spans.setdefault(kind, []).append(
            (rows[(track.pid, track.tid)], start_ns * 1e-6, max(dur_ns * 1e-6, 1e-4), height)
        )

    for c in prof.calls:
        add("call", c.track, c.start_ns, c.dur_ns, 0.9)
    for e in prof.steps:
        add(e.kind, e.track, e.start_ns, e.dur_ns, 0.6)
    for h in prof.host_events:
        add(h.category, h.track, h.start_ns, h.dur_ns, 0.6)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.6 * max(1, len(tracks))))
    try:
        for kind, items in spans.items():
            color = _KIND_COLORS.get(kind, "#bbbbbb")
            for row, x, w, h in items:
                ax.broken_barh([(x, w)], (row - h / 2, h), facecolors=color, edgecolor="none")
            ax.plot([], [], color=color, linewidth=6, label=kind)
        ax.set_yticks(range(len(tracks)))
        ax.set_yticklabels([f"{t.process}: {t.thread}" for t in tracks])
        ax.invert_yaxis()
        ax.set_xlabel("time since profile start (ms)")
        ax.set_title(f"tensorlogic timeline: {len(prof.calls)} plan calls, {len(prof.steps)} steps")
        if spans:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        _save(fig, path)
    finally:
        plt.close(fig)


def plot_roofline(report: Any, path: str | os.PathLike) -> None:
    """Roofline chart per backend: bandwidth slope and FLOP/s roofs, one point per step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 6))
    try:
        pts = [s for s in report.steps if s.flops > 0 and s.bytes > 0 and s.seconds > 0]
        lo_ai = min([s.intensity for s in pts] + [0.01]) / 4
        hi_ai = max([s.intensity for s in pts] + [1000.0]) * 4
        xs = [lo_ai * (hi_ai / lo_ai) ** (k / 100) for k in range(101)]
        for name, pk in report.peaks.items():
            for dtype, pf in pk.flops.items():
                ys = [min(pf, x * pk.bandwidth) / 1e9 for x in xs]
                ax.plot(
                    xs,
                    ys,
                    linewidth=1.5,
                    label=f"{name} roof {dtype} "
                    f"({pf / 1e9:.0f} GFLOP/s, {pk.bandwidth / 1e9:.0f} GB/s)",
                )
        total = sum(s.total_seconds for s in pts) or 1.0
        for bound, color in _BOUND_COLORS.items():
            sel = [s for s in pts if s.bound == bound]
            if not sel:
                continue
            ax.scatter(
                [s.intensity for s in sel],
                [s.gflops for s in sel],
                s=[20 + 400 * s.total_seconds / total for s in sel],
                c=color,
                alpha=0.7,
                edgecolors="black",
                linewidths=0.5,
                label=f"{bound}-bound steps",
            )
        for s in sorted(pts, key=lambda s: -s.total_seconds)[:8]:
            ax.annotate(
                s.name,
                (s.intensity, s.gflops),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_title("roofline (measured peaks); point size = share of step time")
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize="small", loc="lower right")
        if not pts:
            ax.text(
                0.5,
                0.5,
                "no step with FLOPs and bytes was recorded",
                transform=ax.transAxes,
                ha="center",
            )
        _save(fig, path)
    finally:
        plt.close(fig)
