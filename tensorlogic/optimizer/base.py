"""Pass protocol, PassResult, and the PassManager that runs a pipeline per opt level."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from .. import config, options as compile_options
from ..errors import GraphError, TensorLogicError
from ..runtime import hooks
from ..ir.graph import EinsumGraph


@dataclass
class PassResult:
    """What a pass returns: the new graph, whether it changed anything, and statistics."""

    graph: EinsumGraph
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)


class Pass(Protocol):
    """A graph-to-graph transformation that never mutates its input."""

    name: str

    def __call__(self, graph: EinsumGraph) -> PassResult:
        """Run the pass."""


@dataclass
class PassRecord:
    """One run of one pass."""

    name: str
    seconds: float
    changed: bool
    stats: dict[str, Any]


@dataclass
class OptimizerReport:
    """Timings and statistics of every pass the optimizer ran."""

    opt_level: int
    records: list[PassRecord] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0

    @property
    def seconds(self) -> float:
        """Total optimizer time."""
        return sum(r.seconds for r in self.records)

    def __str__(self) -> str:
        head = (
            f"optimizer O{self.opt_level}: {self.nodes_before} -> {self.nodes_after} nodes "
            f"in {self.seconds * 1e3:.2f} ms"
        )
        lines = [head]
        for r in self.records:
            if r.changed or r.stats:
                stats = ", ".join(f"{k}={v}" for k, v in r.stats.items())
                lines.append(
                    f"  {r.name}: {r.seconds * 1e3:.2f} ms{' changed' if r.changed else ''}"
                    f"{' (' + stats + ')' if stats else ''}"
                )
        return "\n".join(lines)


# opt level -> the passes it runs, in order (each pipeline repeats to a fixpoint). O1 cleans up:
# dead code, duplicate subexpressions, constant subgraphs, algebraic identities. O2 also
# rewrites hand-written layer norms and written-out attention (before merge and fusion, which
# would take the pattern apart), merges einsum chains, turns those without data reuse into
# products and sums, and plans the contraction order of the rest before fusion groups what is
# left into kernels. O3 is O2 until a pass needs autotuning.
_O2 = [
    "dce",
    "cse",
    "fold",
    "simplify",
    "layernorm",
    "attention",
    "merge",
    "product_sum",
    "attention_layout",
    "contraction",
    "fusion",
]
PIPELINES: dict[int, list[str]] = {
    0: [],
    1: ["dce", "cse", "fold", "simplify"],
    2: list(_O2),
    3: list(_O2),
}
PASSES: dict[str, Callable[..., Pass]] = {}


def register_pass(name: str, factory: Callable[..., Pass], levels: tuple[int, ...] = ()) -> None:
    """Make a pass known; a pass from outside the package also names the opt levels whose
    pipelines it joins (at the end). The built-in passes are placed by ``PIPELINES``.

    ``factory(options)`` builds the pass from the compile options (a read-only mapping).
    """
    PASSES[name] = factory
    compile_options.PASS_NAMES.add(name)  # so skip_passes= is checked by name
    for lvl in levels:
        if name not in PIPELINES[lvl]:
            PIPELINES[lvl].append(name)


class PassManager:
    """Runs a list of passes to a fixpoint, timing each, validating in debug mode."""

    def __init__(
        self, passes: list[Pass], opt_level: int, max_rounds: int = 8, debug: int | None = None
    ) -> None:
        self.passes = passes
        self.opt_level = opt_level
        self.max_rounds = max_rounds
        self.debug = config.debug_level() if debug is None else debug

    def run(self, graph: EinsumGraph) -> tuple[EinsumGraph, OptimizerReport]:
        """Optimize ``graph`` (left unchanged) and return the new graph and a report."""
        report = OptimizerReport(self.opt_level, nodes_before=len(graph))
        # a fixpoint: stop as soon as every pass has run once, unchanged, on the current graph.
        # Passes are idempotent (tested), so the pass that made the last change need not run
        # again on its own result: the loop ends when it comes round to that pass.
        n = len(self.passes)
        last_change = None  # index of the pass that changed the graph last
        for step in range(self.max_rounds * n):
            k = step % n
            if k == last_change or (last_change is None and step == n):
                break
            p = self.passes[k]
            t0 = time.perf_counter()
            res = p(graph)
            dt = time.perf_counter() - t0
            hooks.compile_event("optimizer", p.name, t0, dt, changed=res.changed)
            report.records.append(PassRecord(p.name, dt, res.changed, dict(res.stats)))
            if self.debug >= 2:
                try:
                    res.graph.validate()
                except TensorLogicError as exc:
                    raise GraphError(
                        f"optimizer pass {p.name!r} produced an invalid graph: {exc}"
                    ) from exc
            graph = res.graph
            if res.changed:
                last_change = k
        if self.debug >= 1:
            graph.validate()
        report.nodes_after = len(graph)
        return graph, report


@dataclass
class FunctionPass:
    """A pass made of a function ``fn(graph, options) -> PassResult`` and its options."""

    name: str
    fn: Callable[[EinsumGraph, Mapping[str, Any]], PassResult]
    options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, graph: EinsumGraph) -> PassResult:
        """Run the pass with its options."""
        return self.fn(graph, self.options)


def function_pass(
    name: str,
    fn: Callable[[EinsumGraph, Mapping[str, Any]], PassResult],
    levels: tuple[int, ...] = (),
) -> Callable[[EinsumGraph, Mapping[str, Any] | None], PassResult]:
    """Register ``fn`` as the pass ``name`` (see ``register_pass`` for ``levels``); returns a
    direct caller of it."""
    register_pass(name, lambda options=None: FunctionPass(name, fn, dict(options or {})), levels)

    def run(graph: EinsumGraph, options: Mapping[str, Any] | None = None) -> PassResult:
        return fn(graph, dict(options or {}))

    run.__name__ = name
    run.__doc__ = fn.__doc__
    return run


def optimize(
    graph: EinsumGraph, opt_level: int, options: Mapping[str, Any] | None = None
) -> tuple[EinsumGraph, OptimizerReport]:
    """Run the pipeline of ``opt_level`` over ``graph``; ``options`` are the compile options."""
    if opt_level not in PIPELINES:
        raise GraphError(f"opt_level must be one of {sorted(PIPELINES)}, got {opt_level!r}")
    missing = [name for name in PIPELINES[opt_level] if name not in PASSES]
    if missing:
        raise GraphError(f"opt level {opt_level} runs passes {missing} that are not registered")
    # ``skip_passes`` drops named passes from the pipeline (the O3 autotuner's variants)
    skip = set((options or {}).get("skip_passes") or ())
    passes = [
        PASSES[name](dict(options or {})) for name in PIPELINES[opt_level] if name not in skip
    ]
    return PassManager(passes, opt_level).run(graph)
