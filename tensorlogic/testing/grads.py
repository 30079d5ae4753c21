"""assert_grads_agree: tl.grad / tl.vjp against central finite differences.

The graph is widened to float64 (complex128) and its gradient, compiled on every backend at
every opt level asked for, is compared with central differences of the widened forward graph
on the numpy backend at O0. A scalar real output is differentiated with ``grad``; any other
output with ``vjp`` and a random cotangent (the differences are then taken of
``sum(Re(conj(cotangent) * output))``). Elements where the function has a kink inside the step
(relu at 0, a tie of max, a step; seen as one-sided differences that disagree) are skipped and
counted. Graphs in a narrower dtype are also differentiated as they are and compared with the
float64 gradient within a tolerance of their dtype.
"""

from __future__ import annotations

import math
import secrets
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from .. import backends as _backends
from .. import dtypes
from ..autodiff import DIFFERENTIABLE_LEAVES, grad, vjp
from ..autodiff.tools import inexact
from ..compiler.compile import compile as _compile
from ..errors import GradError
from ..ir import ops
from ..ir.graph import EinsumGraph
from .agree import DEFAULT_SYMBOL_SIZE, choose_ranges, random_inputs

GRAD_OPT_LEVELS = (0, 2)
STEP = 1e-5  # relative finite-difference step (float64)
RTOL, ATOL = 1e-4, 1e-6  # allowed |analytic - fd| <= ATOL * scale + RTOL * |fd|
KINK = 1e-3  # one-sided differences further apart than this (relative) mark a kink
# a narrower dtype's gradient vs the float64 one: |got - want| <= tol * max(1, max |want|)
DTYPE_TOL = {"float32": 2e-3, "complex64": 2e-3, "float16": 6e-2, "bfloat16": 1.2e-1}
COTANGENT = "cotangent__"


@dataclass
class GradReport:
    """What ``assert_grads_agree`` compared: worst error per (backend, opt level, wrt)."""

    seed: int
    of: str
    wrt: tuple[str, ...]
    errors: dict[tuple[str, int, str], float] = field(default_factory=dict)
    dtype_errors: dict[tuple[str, int, str], float] = field(default_factory=dict)
    checked: int = 0  # elements compared with finite differences
    skipped: int = 0  # elements at a kink or a non-finite value


def widen(graph: EinsumGraph, as_inputs: Iterable[str] = ()) -> EinsumGraph:
    """A copy of ``graph`` computing in float64 (complex128): every float input, constant and
    cast widened, every other node rebuilt (and re-inferred) from its operands; the constants
    named in ``as_inputs`` become inputs of the same name."""
    as_inputs = set(as_inputs)

    def wide(dt: str) -> str:
        k = dtypes.kind(dt)
        return "float64" if k == "f" else "complex128" if k == "c" else dt

    g = EinsumGraph()
    ids: dict[int, int] = {}
    for node in graph.nodes:
        if (
            node.kind == ops.INPUT
            or node.name in as_inputs
            or (node.kind in DIFFERENTIABLE_LEAVES and node.kind != ops.CONSTANT)
        ):
            t = g.input(node.name, node.shape, wide(node.dtype))
        elif node.kind == ops.CONSTANT:
            arr = graph.constants[node.id]
            t = g.constant(np.asarray(arr).astype(wide(node.dtype)), name=node.name)
        else:
            args = dict(node.args)
            if node.kind == ops.CAST:
                args["dtype"] = wide(node.dtype)
            shape = node.shape if node.kind == ops.FUSED else None
            dtype = wide(node.dtype) if node.kind == ops.FUSED else None
            nid = g.add_node(
                node.kind,
                node.op,
                [ids[i] for i in node.inputs],
                args,
                name=node.name,
                shape=shape,
                dtype=dtype,
            )
            t = g.tensor(nid)
        ids[node.id] = t.id
    for name, nid in graph.outputs.items():
        g.output(g.tensor(ids[nid]), name)
    return g


def _leaf_value(graph: EinsumGraph, node) -> np.ndarray:
    """The value a leaf other than an input holds (a constant's or a parameter's array)."""
    if node.kind == ops.PARAMETER:
        return graph.parameter_values[node.id]
    return graph.constants[node.id]


def _differentiable(graph: EinsumGraph) -> list[str]:
    return [
        n.name
        for n in graph.nodes
        if n.kind in DIFFERENTIABLE_LEAVES and n.kind != ops.CONSTANT and inexact(n.dtype)
    ]


def _transform(
    graph: EinsumGraph, of: str, wrt: Sequence[str], sizes: Mapping[str, int]
) -> EinsumGraph:
    try:
        return _differentiate(graph, of, wrt)
    except GradError:
        if not graph.symbols:
            raise
        # some rules need concrete sizes (a repeated index over a symbolic dimension)
        return _differentiate(graph.bind(sizes), of, wrt)


def _differentiate(graph: EinsumGraph, of: str, wrt: Sequence[str]) -> EinsumGraph:
    node = graph.node(graph.outputs[of])
    if node.shape == () and dtypes.kind(node.dtype) == "f":
        return grad(graph, of, list(wrt))
    return vjp(graph, of, list(wrt), COTANGENT)


def _host(x) -> np.ndarray:
    return np.asarray(x.get() if hasattr(x, "get") else x)


def assert_grads_agree(
    graph: EinsumGraph,
    of: str | None = None,
    wrt: Iterable[str] | None = None,
    *,
    backends: Iterable[str] | None = None,
    opt_levels: Iterable[int] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    sizes: Mapping[str, int] | None = None,
    seed: int | None = None,
    check_dtype: bool = True,
) -> GradReport:
    """Assert that the gradient of output ``of`` matches central finite differences.

    Args:
        graph: the forward graph.
        of: the output to differentiate (default: the first output).
        wrt: inputs (or constants) to differentiate with respect to (default: every float or
            complex input).
        backends: backends to run the gradient graph on (default: every available one).
        opt_levels: opt levels (default: 0 and 2).
        ranges: value range per input (default: ``choose_ranges``, positive where needed).
        sizes: sizes of symbolic dimensions (default: 3 each).
        seed: seed of the random inputs and cotangent (default: fresh, printed on failure).
        check_dtype: also compare a narrower graph's own gradient with the float64 one.

    Returns a ``GradReport``; raises AssertionError naming the backend, opt level, input,
    element and seed on the first disagreement.
    """
    of = next(iter(graph.outputs)) if of is None else of
    wrt = tuple(_differentiable(graph) if wrt is None else wrt)
    names = tuple(backends) if backends is not None else _backends.available_backends()
    levels = tuple(opt_levels) if opt_levels is not None else GRAD_OPT_LEVELS
    seed = secrets.randbits(32) if seed is None else int(seed)
    rng = np.random.default_rng(seed)
    sizes = {s: int((sizes or {}).get(s, DEFAULT_SYMBOL_SIZE)) for s in graph.symbols}
    report = GradReport(seed, of, wrt)
    if not wrt:
        return report
    held = [w for w in wrt if graph.node(w).kind != ops.INPUT]  # leaves holding a value
    g64 = widen(graph, held)
    with warnings.catch_warnings():  # the range analysis reads complex constants' real parts
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        chosen = choose_ranges(g64, sizes, ranges)
    inputs = random_inputs(g64, sizes, chosen, rng)
    for w in g64.inputs:  # leaves that hold a value are differentiated at that value
        if w not in graph.inputs:
            inputs[w] = np.asarray(_leaf_value(graph, graph.node(w))).astype(g64.node(w).dtype)
    for name, x in inputs.items():
        if dtypes.kind(x.dtype.name) == "c":
            inputs[name] = x + 1j * rng.uniform(-1.0, 1.0, x.shape)
    out_node = g64.node(g64.outputs[of])
    back64 = _transform(g64, of, wrt, sizes)
    ct = None
    if COTANGENT in back64.inputs:
        shape = tuple(sizes.get(d, d) if isinstance(d, str) else d for d in out_node.shape)
        ct = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        if dtypes.kind(out_node.dtype) == "c":
            ct = ct + 1j * rng.uniform(-1.0, 1.0, shape)
        ct = np.asarray(ct, dtype=out_node.dtype)
    context = f"of={of!r}, wrt={wrt}, seed={seed}, sizes={sizes}"

    def run(g: EinsumGraph, be: str, lvl: int, feed: dict) -> dict[str, np.ndarray]:
        try:
            plan = _compile(g, backend=be, opt_level=lvl, cache=False)
            return {k: _host(v) for k, v in plan(dict(feed), to_host=True).items()}
        except Exception as exc:
            exc.add_note(f"while running the gradient on {be!r} at O{lvl}; {context}")
            raise

    feed = dict(inputs) if ct is None else {**inputs, COTANGENT: ct}
    fd, scale = _finite_differences(g64, of, wrt, inputs, ct, report)
    want: dict[str, np.ndarray] | None = None
    for be in names:
        for lvl in levels:
            got = run(back64, be, lvl, feed)
            want = want or got
            for w in wrt:
                a, (f, ok) = got[f"grad_{w}"], fd[w]
                diff = np.where(ok, np.abs(a - f), 0.0)
                diff = np.where(np.isnan(diff), np.inf, diff)
                allowed = ATOL * scale + RTOL * np.abs(f)
                report.errors[(be, lvl, w)] = float(diff.max(initial=0.0))
                if (diff > allowed).any():
                    k = np.unravel_index(int(np.argmax(diff - allowed)), diff.shape)
                    raise AssertionError(
                        f"gradient of {of!r} wrt {w!r} on {be!r} at O{lvl}: element "
                        f"{tuple(int(i) for i in k)} is {a[k]!r}, finite differences give "
                        f"{f[k]!r} (allowed {allowed[k]:.3g}); {context}\n{_describe(graph)}"
                    )
    if check_dtype and want is not None and _tolerance(graph):
        _check_narrow(graph, of, wrt, sizes, inputs, ct, want, names, levels, report, context)
    return report


def _tolerance(graph: EinsumGraph) -> float:
    """The narrowest float dtype of the graph's tolerance (0: everything is float64, or the
    graph computes a bool: a comparison may flip with the precision, e.g. ``x > float32(x)``,
    and the narrow graph is then another function, not a rounding of the float64 one)."""
    if any(n.dtype == "bool" and n.kind != ops.INPUT for n in graph.nodes):
        return 0.0
    return max((DTYPE_TOL.get(n.dtype, 0.0) for n in graph.nodes), default=0.0)


def _check_narrow(graph, of, wrt, sizes, inputs, ct, want, names, levels, report, context) -> None:
    """The graph's gradient in its own dtypes against the float64 gradient."""
    back = _transform(graph, of, wrt, sizes)
    feed = {}
    for name, nid in back.inputs.items():
        src = ct if name == COTANGENT else inputs[name]
        feed[name] = np.asarray(src).astype(back.node(nid).dtype)
    for be in names:
        for lvl in levels:
            plan = _compile(back, backend=be, opt_level=lvl, cache=False)
            got = {k: _host(v) for k, v in plan(dict(feed), to_host=True).items()}
            for w in wrt:
                dt = back.node(back.outputs[f"grad_{w}"]).dtype
                tol = _tolerance(graph)
                ref = want[f"grad_{w}"]
                bound = tol * max(1.0, float(np.nanmax(np.abs(ref), initial=0.0)))
                a = np.asarray(got[f"grad_{w}"]).astype(ref.dtype)
                diff = np.abs(a - ref)
                both_nan = np.isnan(a) & np.isnan(ref)
                diff = np.where(both_nan, 0.0, np.where(np.isnan(diff), np.inf, diff))
                report.dtype_errors[(be, lvl, w)] = float(diff.max(initial=0.0))
                if (diff > bound).any():
                    k = np.unravel_index(int(np.argmax(diff)), diff.shape)
                    raise AssertionError(
                        f"{dt} gradient of {of!r} wrt {w!r} on {be!r} at O{lvl}: element "
                        f"{tuple(int(i) for i in k)} is {a[k]!r}, the float64 gradient "
                        f"{ref[k]!r} (allowed {bound:.3g}); {context}\n{_describe(graph)}"
                    )


def _finite_differences(g64, of, wrt, inputs, ct, report):
    """Central differences of the (scalar) function per element of each ``wrt`` input, with a
    mask of the elements where they are trustworthy, and the function's scale."""
    plan = _compile(g64, backend="numpy", opt_level=0, cache=False)

    def f(feed) -> float:
        y = np.asarray(plan(feed)[of])
        if ct is None:
            return float(y)
        return float(np.sum((np.conj(ct) * y).real))

    base = f(dict(inputs))
    out, mags = {}, [abs(base)]
    for w in wrt:
        x0 = inputs[w]
        parts = [1.0, 1j] if np.iscomplexobj(x0) else [1.0]
        fd = np.zeros(x0.shape, x0.dtype)
        ok = np.ones(x0.shape, bool)
        for idx in np.ndindex(*x0.shape):
            for unit in parts:
                ref = x0[idx].real if unit == 1.0 else x0[idx].imag
                h = STEP * max(1.0, abs(float(ref)))
                vals = []
                for sgn in (1.0, -1.0):
                    x = x0.copy()
                    x[idx] = x[idx] + sgn * h * unit
                    vals.append(f({**inputs, w: x}))
                right, left = (vals[0] - base) / h, (base - vals[1]) / h
                central = (vals[0] - vals[1]) / (2 * h)
                good = (
                    math.isfinite(central)
                    and math.isfinite(base)
                    and abs(right - left) <= KINK * max(1.0, abs(central))
                )
                ok[idx] &= good
                fd[idx] += central * (1.0 if unit == 1.0 else 1j)
                mags.append(abs(central) if math.isfinite(central) else 0.0)
        report.checked += int(ok.sum())
        report.skipped += int((~ok).sum())
        out[w] = (fd, ok)
    return out, max(1.0, *(m for m in mags if math.isfinite(m)))


def _describe(graph) -> str:
    lines = []
    for n in graph.nodes:
        ins = ", ".join(graph.node(i).name for i in n.inputs)
        lines.append(f"  {n.name} = {n.label}({ins}) -> {tuple(n.shape)} {n.dtype}")
    lines.append(f"  outputs: {dict((k, graph.node(v).name) for k, v in graph.outputs.items())}")
    return "\n".join(lines)


__all__ = ["GradReport", "assert_grads_agree", "widen"]
