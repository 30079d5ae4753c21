"""assert_backends_agree: every backend and opt level computes what numpy at O0 computes.

Inputs are fresh random arrays (never zeros) drawn from value ranges that keep every op well
defined: an input that reaches a ``log``, ``sqrt``, ``reciprocal``, divisor or ``pow`` base is
drawn positive. Tolerances come from the graph itself: ``bounds.analyze`` propagates value ranges
and rounding errors (which grow with the dtype's epsilon and the length of every sum) to each
output.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from .. import backends as _backends
from .. import dtypes
from ..compiler.compile import compile as _compile
from ..ir import ops
from . import bounds as _bounds
from .reference import evaluate as _reference

DEFAULT_RANGE = (-2.0, 2.0)
POSITIVE_RANGE = (0.5, 2.0)
OPT_LEVELS = (0, 1, 2, 3)
SAFETY = 8.0  # the tolerance is this many times the propagated error bound
DEFAULT_SYMBOL_SIZE = 3


@dataclass
class Tolerance:
    """Allowed ``|got - want| <= atol + rtol * |want|`` for one output, and where it came from."""

    rtol: float
    atol: float
    source: str


@dataclass
class AgreementReport:
    """What ``assert_backends_agree`` compared: worst error per (backend, opt level, output)."""

    seed: int
    sizes: dict[str, int]
    ranges: dict[str, tuple[float, float]]
    tolerances: dict[str, Tolerance]
    errors: dict[tuple[str, int, str], float] = field(default_factory=dict)
    reference_errors: dict[str, float] = field(default_factory=dict)


def _ancestors_inputs(graph, nid: int) -> set[str]:
    seen, stack, names = set(), [nid], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        node = graph.node(n)
        if node.kind == ops.INPUT:
            names.add(node.name)
        stack.extend(node.inputs)
    return names


def choose_ranges(
    graph,
    sizes: Mapping[str, int],
    given: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, tuple[float, float]]:
    """Value range per input: ``DEFAULT_RANGE``, or ``POSITIVE_RANGE`` for inputs that reach an op
    whose argument must stay away from zero (ranges in ``given`` are kept as they are)."""
    given = dict(given or {})
    ranges = {name: given.get(name, DEFAULT_RANGE) for name in graph.inputs}
    bound_graph = graph.bind(dict(sizes)) if graph.symbols else graph
    for _ in range(len(graph) + 1):
        bnds = _bounds.analyze(bound_graph, ranges)
        changed = False
        for nid in (n for n, b in bnds.items() if b.domain):
            for name in _ancestors_inputs(bound_graph, nid):
                if name not in given and ranges[name] != POSITIVE_RANGE:
                    ranges[name] = POSITIVE_RANGE
                    changed = True
        if not changed:
            break
    return ranges


def _largest_sum(graph) -> int:
    """The longest sum any node performs (einsum contraction or reduction length)."""
    from ..ir import spec as einspec

    k = 1
    for node in graph.nodes:
        if node.kind == ops.EINSUM:
            shapes = [tuple(graph.node(i).shape) for i in node.inputs]
            es = einspec.parse(node.args["spec"], [len(s) for s in shapes])
            sz = einspec.letter_sizes(es, shapes)
            k = max(k, math.prod(int(sz[c]) for c in es.contracted))
        elif node.kind in (ops.REDUCE, ops.ROWOP):
            shape = graph.node(node.inputs[0]).shape
            axes = node.args["axes"] if node.kind == ops.REDUCE else [node.args["axis"]]
            k = max(k, math.prod(int(shape[a]) for a in axes))
    return k


def derive_tolerances(
    graph,
    sizes: Mapping[str, int],
    ranges: Mapping[str, tuple[float, float]],
) -> dict[str, Tolerance]:
    """Per-output tolerance from the propagated error bound; a dtype and sum-length rule where
    the bound is not finite (then the absolute part scales with the reference's magnitude)."""
    g = graph.bind(dict(sizes)) if graph.symbols else graph
    bnds = _bounds.analyze(g, ranges)
    k = _largest_sum(g)
    tols: dict[str, Tolerance] = {}
    for name, nid in g.outputs.items():
        b = bnds[nid]
        eps = dtypes.eps(g.node(nid).dtype)
        if b.finite and not b.problem:
            tols[name] = Tolerance(4 * eps, SAFETY * b.err + eps * 1e-3, "error bound")
        else:
            r = 64 * eps * math.sqrt(k) * (len(g) + 1)
            tols[name] = Tolerance(
                r, math.nan, f"dtype/sum-length rule ({b.problem or 'unbounded'})"
            )
    return tols


def random_inputs(
    graph,
    sizes: Mapping[str, int],
    ranges: Mapping[str, tuple[float, float]],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Fresh uniform random inputs in their ranges, with symbols bound to ``sizes``."""
    out = {}
    for name, nid in graph.inputs.items():
        node = graph.node(nid)
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in node.shape)
        lo, hi = ranges[name]
        x = rng.uniform(lo, hi, size=shape)
        out[name] = np.array(x, dtype=node.dtype)  # C-contiguous, and rank 0 stays rank 0
    return out


def _host(x: Any) -> np.ndarray:
    return np.asarray(x.get() if hasattr(x, "get") else x)


def _compare(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> tuple[bool, float, float, tuple]:
    """(ok, worst |diff|, allowed there, index of the worst element)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False, math.inf, 0.0, ()
    atol = tol.atol
    if math.isnan(atol):  # the dtype rule: absolute part relative to the result's scale
        atol = tol.rtol * max(1.0, float(np.nanmax(np.abs(want))) if want.size else 1.0)
    both_nan = np.isnan(got) & np.isnan(want)
    diff = np.where(both_nan, 0.0, np.abs(got - want))
    diff = np.where(np.isnan(diff), np.inf, diff)
    allowed = atol + tol.rtol * np.abs(np.nan_to_num(want))
    if diff.size == 0:
        return True, 0.0, atol, ()
    excess = diff - allowed
    k = np.unravel_index(int(np.argmax(excess)), diff.shape)
    return (
        bool((diff <= allowed).all()),
        float(diff[k]),
        float(allowed[k]),
        tuple(int(i) for i in k),
    )


def _describe(graph) -> str:
    lines = []
    for n in graph.nodes:
        shape = tuple(n.shape)
        ins = ", ".join(graph.node(i).name for i in n.inputs)
        lines.append(f"  {n.name} = {n.label}({ins}) -> {shape} {n.dtype}")
    lines.append(f"  outputs: {dict((k, graph.node(v).name) for k, v in graph.outputs.items())}")
    return "\n".join(lines)


def assert_backends_agree(
    graph,
    backends: Iterable[str] | None = None,
    opt_levels: Iterable[int] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    sizes: Mapping[str, int] | None = None,
    seed: int | None = None,
    check_reference: bool = True,
) -> AgreementReport:
    """Assert that every backend at every opt level matches the numpy backend at O0.

    Args:
        graph: the EinsumGraph to check.
        backends: backend names (default: every available backend).
        opt_levels: opt levels (default: 0-3).
        rtol, atol: fixed tolerances for every output (default: derived per output from the
            dtype, the value ranges and the length of every sum; see ``derive_tolerances``).
        inputs: arrays to use instead of random ones.
        ranges: value range per input (default: ``choose_ranges``).
        sizes: sizes of symbolic dimensions (default: 3 each).
        seed: seed of the random inputs (default: a fresh one, printed in any failure).
        check_reference: also check numpy O0 against the independent float64 interpreter.

    Returns an ``AgreementReport``; raises AssertionError naming the backend, opt level, output,
    worst element and seed on the first disagreement. Parameters are checked like inputs (on
    random values), since a plan takes them as data.
    """
    if graph.parameters:
        graph = graph.with_parameters_as_inputs()
    names = tuple(backends) if backends is not None else _backends.available_backends()
    levels = tuple(opt_levels) if opt_levels is not None else OPT_LEVELS
    sizes = {s: int((sizes or {}).get(s, DEFAULT_SYMBOL_SIZE)) for s in graph.symbols}
    seed = secrets.randbits(32) if seed is None else int(seed)
    rng = np.random.default_rng(seed)
    rngs = choose_ranges(graph, sizes, ranges)
    tols = derive_tolerances(graph, sizes, rngs)
    if rtol is not None or atol is not None:
        tols = {
            k: Tolerance(
                rtol if rtol is not None else 0.0, atol if atol is not None else 0.0, "given"
            )
            for k in tols
        }
    if inputs is None:
        inputs = random_inputs(graph, sizes, rngs, rng)
    report = AgreementReport(seed, sizes, rngs, tols)

    def fail(what: str, name: str, worst: float, allowed: float, where: tuple) -> None:
        raise AssertionError(
            f"{what}: output {name!r} differs by {worst:.3g} at index {where} (allowed "
            f"{allowed:.3g}; "
            f"tolerance from {tols[name].source}); seed={seed}, sizes={sizes}, ranges={rngs}\n"
            f"graph:\n{_describe(graph)}"
        )

    def run(be: str, lvl: int) -> dict[str, np.ndarray]:
        try:
            plan = _compile(graph, backend=be, opt_level=lvl, cache=False)
            return {k: _host(v) for k, v in plan(dict(inputs), to_host=True).items()}
        except Exception as exc:
            exc.add_note(
                f"while running backend {be!r} at O{lvl}; seed={seed}, sizes={sizes}\n"
                f"graph:\n{_describe(graph)}"
            )
            raise

    want = run("numpy", 0)
    if check_reference:
        ref = _reference(graph, inputs, sizes)
        for name, w in want.items():
            ok, worst, allowed, where = _compare(w, ref[name], tols[name])
            report.reference_errors[name] = worst
            if not ok:
                fail("numpy O0 vs the reference interpreter", name, worst, allowed, where)
    for be in names:
        for lvl in levels:
            if be == "numpy" and lvl == 0:
                continue
            got = run(be, lvl)
            for name, w in want.items():
                ok, worst, allowed, where = _compare(got[name], w, tols[name])
                report.errors[(be, lvl, name)] = worst
                if not ok:
                    fail(f"backend {be!r} at O{lvl} vs numpy at O0", name, worst, allowed, where)
    return report
