"""Advice rules: each reads the analyzed steps (and the plans) and names the nodes to fix.

A rule is a function ``rule(ctx) -> list[Advice]``; ``RULES`` maps rule names to them.
Thresholds live in ``THRESHOLDS`` and can be overridden per call of ``prof.bottlenecks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import TensorLogicError
from ..ir import ops
from ..ir import spec as einspec
from .bottleneck import Advice, BottleneckReport, StepStats
from .summary import fmt_seconds

ELEMENTWISE_KINDS = ops.ELEMENTWISE_KINDS
# backends whose kernels run on numba's thread pool (their steps can stall behind BLAS threads)
NUMBA_BACKENDS = {"numba"}

THRESHOLDS: dict[str, float] = {
    "chain_min_steps": 2,  # elementwise steps in a row that make an unfused chain
    "chain_min_share": 0.01,  # of step time, for a chain to be worth naming
    "overhead_min_share": 0.2,  # of step time spent in overhead-bound steps
    "overhead_min_steps": 2,
    "transfer_min_share": 0.3,  # of step + transfer time spent copying host <-> device
    "below_roof_share": 0.1,  # a step under this fraction of its roofline is "far below"
    "below_roof_min_share": 0.05,  # ... when it takes at least this share of step time
    "einsum_share": 0.25,  # a batched contraction under this fraction of its roofline
    "einsum_min_share": 0.02,
    "threads_min_share": 0.1,  # of step time lost by steps stalled behind BLAS threads
    "one_thread_roof_share": 0.5,  # a memory-bound step on one thread under this share of roof
    "one_thread_min_share": 0.05,  # ... when it takes at least this share of step time
}
MAX_NAMES = 6


@dataclass
class Context:
    """What rules read."""

    report: BottleneckReport
    plans: list[Any]
    transfers: list[Any]
    t: dict[str, float]
    device_backends: set[str]

    def by_plan(self) -> dict[int, dict[int, StepStats]]:
        """Step stats per plan, by step index."""
        out: dict[int, dict[int, StepStats]] = {}
        for s in self.report.steps:
            out.setdefault(s.plan, {})[s.index] = s
        return out


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" (+{len(names) - MAX_NAMES} more)" if len(names) > MAX_NAMES else "")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _chains(steps) -> list[list[int]]:
    """Runs of elementwise steps connected by data flow (each feeding another of the run),
    whatever their order in the schedule: the groups the fusion pass would merge."""
    producer = {s.output: k for k, s in enumerate(steps) if s.kind in ELEMENTWISE_KINDS}
    parent = list(range(len(steps)))

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for k, s in enumerate(steps):
        if s.kind not in ELEMENTWISE_KINDS:
            continue
        for b in s.inputs:
            j = producer.get(b)
            if j is not None:
                parent[find(j)] = find(k)
    groups: dict[int, list[int]] = {}
    for k, s in enumerate(steps):
        if s.kind in ELEMENTWISE_KINDS:
            groups.setdefault(find(k), []).append(k)
    return [g for g in groups.values() if len(g) >= 2]


def unfused_chain(ctx: Context) -> list[Advice]:
    """Elementwise steps feeding each other that run as separate kernels.

    Below O2 every such run is named (the fusion pass would merge it for free; small steps
    there cost their fixed overhead each), whatever its share of the time, so the advice does
    not depend on noisy timings; at O2 only runs worth ``chain_min_share`` of the time are.
    """
    out = []
    for p, stats in ctx.by_plan().items():
        plan = ctx.plans[p]
        steps = plan.steps
        level = getattr(plan.optimizer_report, "opt_level", None)
        below_o2 = level is not None and level < 2
        for chain in _chains(steps):
            share = sum(stats[k].share_of_time for k in chain if k in stats)
            secs = sum(stats[k].total_seconds for k in chain if k in stats)
            if not below_o2 and share < ctx.t["chain_min_share"]:
                continue
            names = [steps[k].name for k in chain]
            small = sum(1 for k in chain if k in stats and stats[k].bound == "overhead")
            cost = (
                f", {small} of them overhead-bound (each pays the fixed per-step cost)"
                if small
                else ""
            )
            if below_o2:
                fix = (
                    f"compile with opt_level=2 so the fusion pass merges it into one "
                    f"kernel (this plan was compiled at opt_level={level})"
                )
            else:
                fix = (
                    "it stayed unfused at this opt level: run it on a backend with "
                    "fused kernels (numba, cupy) so it reads and writes memory once"
                )
            out.append(
                Advice(
                    "unfused-chain",
                    f"unfused elementwise chain of {len(chain)} steps ({_names(names)}) takes "
                    f"{_pct(share)} of step time{cost}, one pass over memory per op: {fix}",
                    tuple(names),
                    secs,
                    share,
                )
            )
    return out


def one_thread(ctx: Context) -> list[Advice]:
    """Memory-bound steps far below the roofline that run on one thread of several.

    The bandwidth roof is measured with every thread streaming, which one thread cannot reach.
    """
    cores = ctx.report.threads.cores if ctx.report.threads else 1
    if cores <= 1:
        return []
    out = []
    for s in ctx.report.steps:
        step = ctx.plans[s.plan].steps[s.index]
        if step.threads != 1 or s.bound != "memory" or s.kind == ops.EINSUM:
            continue
        if (
            s.share_of_peak >= ctx.t["one_thread_roof_share"]
            or s.share_of_time < ctx.t["one_thread_min_share"]
        ):
            continue
        bw = ctx.report.peaks[s.backend].bandwidth / 1e9
        if s.backend in NUMBA_BACKENDS:
            fix = (
                "its iteration space is below the numba backend's parallel_threshold: "
                "compile with a lower parallel_threshold=, or batch more work per call"
            )
        else:
            fix = (
                "compile with threads='pool' (the default: every step may use every core), "
                "at opt_level=2 so it joins a fused kernel, or on the numba backend"
            )
        out.append(
            Advice(
                "one-thread",
                f"{s.name} ({s.label}) runs on 1 of {cores} threads: {s.gbps:.2f} GB/s, "
                f"{_pct(s.share_of_peak)} of its roofline ({bw:.1f} GB/s with all threads), "
                f"{_pct(s.share_of_time)} of step time while the other cores sit idle: {fix}",
                (s.name,),
                s.total_seconds,
                s.share_of_time,
            )
        )
    return out


def overhead_bound(ctx: Context) -> list[Advice]:
    """Many steps too small to reach either roof, together taking a large share of time."""
    small = [s for s in ctx.report.steps if s.bound == "overhead"]
    share = sum(s.share_of_time for s in small)
    if len(small) < ctx.t["overhead_min_steps"] or share < ctx.t["overhead_min_share"]:
        return []
    small.sort(key=lambda s: -s.total_seconds)
    names = [s.name for s in small]
    per = ", ".join(
        f"{b} {ctx.report.peaks[b].step_overhead * 1e6:.1f} us"
        for b in sorted({s.backend for s in small})
    )
    gpu = any(s.backend in ctx.device_backends for s in small)
    fix = "batch more work into each call (a larger batch dimension, or tl.run_batches)"
    if gpu:
        fix += ", or capture the plan in a CUDA graph so its launches cost one"
    return [
        Advice(
            "overhead-bound",
            f"{len(small)} of {len(ctx.report.steps)} steps are overhead-bound (too small to reach "
            "the "
            f"memory or compute roof; fixed cost per step: {per}) and take {_pct(share)} of step "
            f"time ({_names(names)}): {fix}",
            tuple(names),
            sum(s.total_seconds for s in small),
            share,
        )
    ]


def transfers_dominate(ctx: Context) -> list[Advice]:
    """Host-device copies taking a large share of the time."""
    secs = sum(h.dur_ns for h in ctx.transfers) * 1e-9
    whole = secs + ctx.report.total_seconds
    if not secs or secs / whole < ctx.t["transfer_min_share"]:
        return []
    per: dict[str, float] = {}
    for h in ctx.transfers:
        per[h.name] = per.get(h.name, 0.0) + h.dur_ns * 1e-9
    names = sorted(per, key=lambda n: -per[n])
    listed = ", ".join(f"{n} {fmt_seconds(per[n])}" for n in names[:MAX_NAMES])
    return [
        Advice(
            "host-device-copies",
            f"host-device copies take {_pct(secs / whole)} of the time ({listed}): keep inputs on "
            "the "
            "device between calls (pass device arrays), keep results there (drop to_host=True) "
            "and "
            f"copy only what you need",
            tuple(names),
            secs,
            secs / whole,
        )
    ]


def _batched_letters(plan: Any, s: StepStats) -> tuple[str, str, str] | None:
    """(spec, batch letters, contracted letters) of a 2+-operand einsum step, else None."""
    node = plan.graph.node(s.node_id)
    ins = [plan.graph.node(i) for i in node.inputs]
    if len(ins) < 2:
        return None
    es = einspec.parse(node.args["spec"], [len(n.shape) for n in ins])
    batch = set(es.inputs[0]).intersection(*map(set, es.inputs[1:])) & set(es.output)
    contracted = es.contracted
    if not batch or not contracted:
        return None
    return str(es), "".join(sorted(batch)), "".join(sorted(contracted))


def batched_einsum(ctx: Context) -> list[Advice]:
    """A batched contraction far below BLAS speed: it runs as a plain einsum loop."""
    out = []
    for s in ctx.report.steps:
        if s.kind != ops.EINSUM or s.bound == "overhead":
            continue
        if s.share_of_peak >= ctx.t["einsum_share"] or s.share_of_time < ctx.t["einsum_min_share"]:
            continue
        found = _batched_letters(ctx.plans[s.plan], s)
        if found is None:
            continue
        spec, batch, contracted = found
        out.append(
            Advice(
                "batched-einsum",
                f"batched contraction {s.name} ({spec}: batch {batch}, summed {contracted}) runs "
                "at "
                f"{s.gflops:.2f} GFLOP/s, {_pct(s.share_of_peak)} of its roofline "
                f"({s.attainable_gflops:.1f} GFLOP/s), as a plain einsum loop would: run it as one "
                f"batched matmul (BLAS gemm over {batch}), e.g. on a backend whose contraction "
                f"engine maps batch indices to BLAS (numpy, numba)",
                (s.name,),
                s.total_seconds,
                s.share_of_time,
            )
        )
    return out


def below_roofline(ctx: Context, skip: set[tuple[int, int]] = frozenset()) -> list[Advice]:
    """Steps large enough to matter that reach only a small fraction of their roofline."""
    out = []
    for s in ctx.report.steps:
        if s.bound == "overhead" or (s.plan, s.index) in skip:
            continue
        if s.share_of_peak >= ctx.t["below_roof_share"]:
            continue
        if s.share_of_time < ctx.t["below_roof_min_share"]:
            continue
        if s.bound == "memory":
            got = f"{s.gbps:.2f} GB/s of {ctx.report.peaks[s.backend].bandwidth / 1e9:.1f} GB/s"
            hint = (
                "look for strided or broadcast operands and temporaries; a fused kernel "
                "reads and writes each element once"
            )
        else:
            got = f"{s.gflops:.2f} GFLOP/s of {s.attainable_gflops:.1f} GFLOP/s"
            hint = (
                "check that it maps to one large matmul and its dtype (float64 runs at about "
                "half the float32 peak)"
            )
        out.append(
            Advice(
                "below-roofline",
                f"{s.name} ({s.label}, {s.bound}-bound) reaches {_pct(s.share_of_peak)} of its "
                f"roofline "
                f"({got}) and takes {_pct(s.share_of_time)} of step time: {hint}",
                (s.name,),
                s.total_seconds,
                s.share_of_time,
            )
        )
    return out


def thread_pools(ctx: Context) -> list[Advice]:
    """numba steps right after BLAS contractions stalling while both thread pools spin."""
    th = ctx.report.threads
    if th is None or th.blas <= 1 or th.numba <= 1 or th.blas + th.numba <= th.cores:
        return []
    stalled: list[StepStats] = []
    lost = 0.0
    for p, stats in ctx.by_plan().items():
        steps = ctx.plans[p].steps
        for k, s in stats.items():
            if k == 0 or s.backend not in NUMBA_BACKENDS:
                continue
            prev = steps[k - 1]
            if prev.kind != ops.EINSUM or len(prev.inputs) < 2:
                continue
            floor = max(s.roofline_seconds, ctx.report.peaks[s.backend].step_overhead)
            excess = (s.seconds - floor) * s.calls
            if excess > 0:
                stalled.append(s)
                lost += excess
    total = ctx.report.total_seconds
    if not stalled or not total or lost / total < ctx.t["threads_min_share"]:
        return []
    stalled.sort(key=lambda s: -s.total_seconds)
    names = [s.name for s in stalled]
    return [
        Advice(
            "thread-pools",
            f"steps right after BLAS contractions ({_names(names)}) lose about "
            f"{_pct(lost / total)} "
            f"of step time waiting: BLAS ({th.blas} threads) and numba ({th.numba} threads) "
            f"oversubscribe {th.cores} cores; let one pool have the cores, e.g. wrap the calls in "
            f"threadpoolctl.threadpool_limits(1, user_api='blas') or lower numba's thread count",
            tuple(names),
            lost,
            lost / total,
        )
    ]


RULES: dict[str, Callable[[Context], list[Advice]]] = {
    "unfused-chain": unfused_chain,
    "batched-einsum": batched_einsum,
    "overhead-bound": overhead_bound,
    "host-device-copies": transfers_dominate,
    "thread-pools": thread_pools,
    "one-thread": one_thread,
    "below-roofline": below_roofline,
}


def run_rules(
    report: BottleneckReport,
    plans: list[Any],
    transfers: list[Any],
    rules: tuple[str, ...] | None,
    overrides: dict[str, float],
    device_backends: set[str],
) -> list[Advice]:
    """Run the named rules (all by default); advice sorted by the time at stake."""
    unknown = [k for k in overrides if k not in THRESHOLDS]
    if unknown:
        raise TensorLogicError(
            f"unknown threshold(s) {unknown}; known: {sorted(THRESHOLDS)}", code="bad_argument"
        )
    names = tuple(RULES) if rules is None else tuple(rules)
    bad = [r for r in names if r not in RULES]
    if bad:
        raise TensorLogicError(
            f"unknown advice rule(s) {bad}; known: {list(RULES)}", code="bad_argument"
        )
    ctx = Context(report, plans, transfers, {**THRESHOLDS, **overrides}, device_backends)
    out: list[Advice] = []
    einsum_named: set[tuple[int, int]] = set()
    for name in names:
        if name == "below-roofline":
            found = below_roofline(ctx, einsum_named)
        else:
            found = RULES[name](ctx)
        if name in ("batched-einsum", "one-thread"):
            # a step these rules explain is not named again as merely "below the roofline"
            named = {a.nodes[0] for a in found}
            einsum_named |= {(s.plan, s.index) for s in report.steps if s.name in named}
        out.extend(found)
    out.sort(key=lambda a: -a.seconds)
    return out
