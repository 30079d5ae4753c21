"""Value ranges and rounding-error bounds of a graph, for tolerances that fit the computation.

Each node gets a ``Bound``: an interval holding every value it can take given the input ranges, a
bound on its absolute rounding error, and whether every backend must compute it bit-for-bit
(``exact``). The error bound is a first-order propagation: an op passes its inputs' errors through
its slope over their interval and adds its own rounding (a few units in the last place of its
largest result, times the length of any sum it performs). Comparisons, ``step`` and ``where``
conditions are discontinuous; they are only well defined for differential testing on exact
operands, which ``Bound.problem`` reports otherwise, together with domain violations such as
``log`` of an interval reaching zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from .. import dtypes
from ..ir import ops, spec as einspec
from ..ir.fused import FusedBody

# An argument of log / sqrt / reciprocal, a divisor and a pow base must stay this far from zero:
# close to zero their slope (and so any rounding difference) explodes.
MIN_DISTANCE = 0.05
# Units in the last place allowed per transcendental call (libm, numba and CUDA differ by a few).
TRANSCENDENTAL_ULPS = 8.0


@dataclass(frozen=True)
class Bound:
    """Interval ``[lo, hi]`` of a tensor's values, absolute error bound ``err``, exactness."""

    lo: float
    hi: float
    err: float = 0.0
    exact: bool = False
    problem: str | None = None  # why the value is not well defined for differential testing
    domain: bool = False  # the problem is an argument out of an op's domain (inputs can fix it)

    @property
    def mag(self) -> float:
        """Largest absolute value."""
        return max(abs(self.lo), abs(self.hi))

    @property
    def finite(self) -> bool:
        """True when the interval and the error bound are finite."""
        return all(math.isfinite(v) for v in (self.lo, self.hi, self.err))


def _eps(dtype: str) -> float:
    return dtypes.eps(dtype)


def _sum_growth(k: int) -> float:
    """Rounding growth of a k-term sum: blocked or pairwise summation, with slack."""
    return 2.0 * math.sqrt(k) + math.log2(max(k, 1)) + 1.0


def _interval_mul(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    c = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    c = [0.0 if math.isnan(v) else v for v in c]  # 0 * inf
    return min(c), max(c)


def _distance_from_zero(b: Bound) -> float:
    if b.lo > 0:
        return b.lo
    if b.hi < 0:
        return -b.hi
    return 0.0


def _gelu(x: float) -> float:
    return 0.5 * x * (1 + math.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def _safe_exp(x: float) -> float:
    return math.exp(x) if x < 700 else math.inf


def _merge(*problems: str | None) -> str | None:
    return next((p for p in problems if p), None)


def _out_of_domain(prior: str | None, message: str) -> Bound:
    """An undefined value: its op's argument can come too close to zero (or below it)."""
    return Bound(-math.inf, math.inf, math.inf, False, _merge(prior, message), prior is None)


def unary(op: str, x: Bound, dtype: str) -> Bound:
    """Bound of an elementwise unary op."""
    e = _eps(dtype)
    lo, hi, err = x.lo, x.hi, x.err
    prob = x.problem
    t = TRANSCENDENTAL_ULPS
    if op == "neg":
        return Bound(-hi, -lo, err, x.exact, prob)
    if op == "abs":
        low = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
        return Bound(low, x.mag, err, x.exact, prob)
    if op == "relu":
        return Bound(max(lo, 0.0), max(hi, 0.0), err, x.exact, prob)
    if op == "step":
        if not x.exact:
            prob = _merge(prob, "step of a value that backends may round differently")
        return Bound(0.0, 1.0, 0.0, x.exact, prob)
    if op == "one_minus":
        r = Bound(1 - hi, 1 - lo)
        return Bound(r.lo, r.hi, err + e * r.mag, False, prob)
    if op == "square":
        low = 0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)
        m = x.mag
        return Bound(low, m * m, 2 * m * err + err * err + e * m * m, False, prob)
    if op == "exp":
        top = _safe_exp(hi)
        return Bound(_safe_exp(lo), top, top * (_safe_exp(err) - 1) + t * e * top, False, prob)
    if op in ("log", "sqrt", "reciprocal"):
        d = _distance_from_zero(x)
        if op != "reciprocal" and lo < MIN_DISTANCE:
            return _out_of_domain(
                prob, f"{op} of a value in [{lo:.3g}, {hi:.3g}]; expected >= {MIN_DISTANCE}"
            )
        if op == "reciprocal" and d < MIN_DISTANCE:
            return _out_of_domain(prob, f"reciprocal of a value in [{lo:.3g}, {hi:.3g}] near zero")
        if err >= d / 2:
            return Bound(-math.inf, math.inf, math.inf, False, prob)
        dn = d - err  # the computed argument stays at least this far from zero
        if op == "log":
            r = (math.log(lo), math.log(hi))
            return Bound(*r, err / dn + t * e * max(map(abs, r)) + t * e, False, prob)
        if op == "sqrt":
            return Bound(
                math.sqrt(lo),
                math.sqrt(hi),
                err / (2 * math.sqrt(dn)) + e * math.sqrt(hi),
                False,
                prob,
            )
        r = sorted((1 / lo, 1 / hi))
        return Bound(r[0], r[1], err / (dn * dn) + e / d, False, prob)
    if op in ("sigmoid", "tanh"):
        if op == "tanh":
            r, slope = (math.tanh(lo), math.tanh(hi)), 1.0
        else:
            r, slope = (0.5 * math.tanh(lo / 2) + 0.5, 0.5 * math.tanh(hi / 2) + 0.5), 0.25
        return Bound(*r, slope * err + t * e, False, prob)
    if op == "softplus":

        def sp(v: float) -> float:
            return max(v, 0.0) + math.log1p(math.exp(-abs(v)))

        r = (sp(lo), sp(hi))
        return Bound(*r, err + t * e * (max(map(abs, r)) + 1), False, prob)
    if op == "gelu":
        low = -0.18 if lo < 0 else _gelu(lo)
        high = max(_gelu(hi), 0.0)
        m = x.mag
        # slope of the tanh-approximate gelu is below 1.13 everywhere
        return Bound(low, high, 1.13 * err + t * e * (m + 1) * (1 + 0.2 * m * m), False, prob)
    if op == "gelu_grad":
        # gelu's slope lies in [-0.129, 1.129]; its own slope (gelu'') is at most 0.8 in size
        m = x.mag
        return Bound(-0.13, 1.13, 0.8 * err + t * e * (m + 1) * (1 + 0.3 * m * m), False, prob)
    raise ValueError(f"no bound rule for unary op {op!r}")


def binary(op: str, a: Bound, b: Bound, dtype: str) -> Bound:
    """Bound of an elementwise binary op (broadcasting does not change bounds)."""
    e = _eps(dtype)
    prob = _merge(a.problem, b.problem)
    exact = a.exact and b.exact
    if op in ("gt", "ge", "lt", "le", "eq", "ne"):
        if not exact:
            prob = _merge(prob, f"comparison {op} of values that backends may round differently")
        return Bound(0.0, 1.0, 0.0, exact, prob)
    if op in ("maximum", "minimum"):
        f = max if op == "maximum" else min
        return Bound(f(a.lo, b.lo), f(a.hi, b.hi), max(a.err, b.err), exact, prob)
    if op in ("add", "sub"):
        lo, hi = (a.lo + b.lo, a.hi + b.hi) if op == "add" else (a.lo - b.hi, a.hi - b.lo)
        return Bound(lo, hi, a.err + b.err + e * max(abs(lo), abs(hi)), False, prob)
    if op == "mul":
        lo, hi = _interval_mul((a.lo, a.hi), (b.lo, b.hi))
        err = a.mag * b.err + b.mag * a.err + a.err * b.err + e * max(abs(lo), abs(hi))
        return Bound(lo, hi, err, False, prob)
    if op == "div":
        d = _distance_from_zero(b)
        if d < MIN_DISTANCE or b.err >= d / 2:
            return _out_of_domain(
                prob, f"division by a value in [{b.lo:.3g}, {b.hi:.3g}] near zero"
            )
        dn = d - b.err
        lo, hi = _interval_mul((a.lo, a.hi), tuple(sorted((1 / b.lo, 1 / b.hi))))
        err = a.err / dn + a.mag * b.err / (dn * dn) + e * max(abs(lo), abs(hi))
        return Bound(lo, hi, err, False, prob)
    if op == "pow":
        if a.lo < MIN_DISTANCE or a.err >= a.lo / 2:
            return _out_of_domain(
                prob, f"pow with a base in [{a.lo:.3g}, {a.hi:.3g}]; expected >= {MIN_DISTANCE}"
            )
        ln = (math.log(a.lo), math.log(a.hi))
        elo, ehi = _interval_mul(ln, (b.lo, b.hi))
        top = _safe_exp(ehi)
        mag_ln = max(map(abs, ln))
        slope_err = b.mag * a.err / (a.lo - a.err) + mag_ln * b.err
        err = top * (_safe_exp(slope_err) - 1) + TRANSCENDENTAL_ULPS * e * top
        return Bound(_safe_exp(elo), top, err, False, prob)
    raise ValueError(f"no bound rule for binary op {op!r}")


def ternary(op: str, c: Bound, a: Bound, b: Bound, dtype: str) -> Bound:
    """Bound of a three-operand op: ``where(c, a, b)``, whose condition must be exact."""
    if op != "where":
        raise ValueError(f"no bound rule for three-operand op {op!r}")
    prob = _merge(c.problem, a.problem, b.problem)
    if not c.exact:
        prob = _merge(prob, "where with a condition that backends may round differently")
    return Bound(
        min(a.lo, b.lo), max(a.hi, b.hi), max(a.err, b.err), c.exact and a.exact and b.exact, prob
    )


def reduce(op: str, x: Bound, k: int, dtype: str) -> Bound:
    """Bound of a reduction of ``k`` elements."""
    e = _eps(dtype)
    g = _sum_growth(k)
    if op in ("max", "min"):
        return Bound(x.lo, x.hi, x.err, x.exact, x.problem)
    if op == "sum":
        lo, hi = k * x.lo, k * x.hi
        return Bound(lo, hi, k * x.err + g * e * k * x.mag, False, x.problem)
    if op == "mean":
        return Bound(x.lo, x.hi, x.err + (g + 1) * e * x.mag, False, x.problem)
    if op == "prod":
        m = x.mag
        top = m**k if k else 1.0
        lo = x.lo**k if x.lo >= 0 else -top
        hi = x.hi**k if x.lo >= 0 else top
        # relative error of a k-term product: k relative errors of its factors plus k roundings
        if x.lo >= 0 and x.lo > 2 * x.err:
            rel = k * x.err / (x.lo - x.err)
        else:
            rel = k * x.err / max(m, 1e-300) if m else 0.0
            top = max(top, (m + x.err) ** k)
        err = top * ((1 + rel) * (1 + e) ** k - 1) if math.isfinite(top) else math.inf
        return Bound(lo, hi, err, False, x.problem)
    if op == "logsumexp":
        lse_hi = x.hi + math.log(max(k, 1))
        lse_lo = x.lo + math.log(max(k, 1))
        return Bound(
            lse_lo,
            lse_hi,
            x.err + TRANSCENDENTAL_ULPS * e * (abs(lse_hi) + abs(lse_lo) + g),
            False,
            x.problem,
        )
    raise ValueError(f"no bound rule for reduction {op!r}")


def rowop(op: str, x: Bound, k: int, dtype: str, eps: float = 0.0) -> Bound:
    """Bound of a softmax, log-softmax or layer_norm over rows of ``k`` elements."""
    e = _eps(dtype)
    g = _sum_growth(k)
    if op == "layer_norm":
        # |x - mean| <= sqrt((k - 1) * var), so every value is within sqrt(k - 1); an error d in
        # the centred values moves the result by at most d * (1 + sqrt(k - 1)) / sqrt(eps)
        # (through the numerator and through the standard deviation), whatever the variance
        top = math.sqrt(max(k - 1, 0))
        if eps <= 0:
            return Bound(-top, top, math.inf, False, x.problem or "layer_norm with eps=0")
        centred = 2 * x.err + 4 * g * e * x.mag
        err = centred * (1 + top) / math.sqrt(eps) + TRANSCENDENTAL_ULPS * e * (g + 1) * max(
            top, 1.0
        )
        return Bound(-top, top, err, False, x.problem)
    if op == "softmax":
        # softmax is 1-Lipschitz from max-norm to max-norm
        return Bound(0.0, 1.0, x.err + TRANSCENDENTAL_ULPS * e * g, False, x.problem)
    span = x.hi - x.lo
    lo = -span - math.log(max(k, 1))
    return Bound(lo, 0.0, 2 * x.err + TRANSCENDENTAL_ULPS * e * (abs(lo) + g), False, x.problem)


def row_grad(op: str, xs: Sequence[Bound], k: int, dtype: str, eps: float) -> Bound:
    """Bound of a row op's backward: its row program (``ops.ROW_GRAD_PROGRAMS``) in interval
    arithmetic, each reduction over rows of ``k`` elements."""
    env: dict[str, Bound] = dict(zip(ops.ROW_GRAD_OPERANDS[op], xs))
    env["inv_n"] = Bound(1.0 / max(k, 1), 1.0 / max(k, 1), 0.0, True)
    env["eps"] = Bound(eps, eps, 0.0, True)

    def value(e) -> Bound:
        if isinstance(e, str):
            return env[e]
        if isinstance(e, (int, float)):
            return Bound(float(e), float(e), 0.0, True)
        name, *args = e
        return elementwise(name, [value(a) for a in args], dtype)

    for st in ops.ROW_GRAD_PROGRAMS[op]:
        if st.kind == "reduce":
            env[st.name] = reduce(st.combine, value(st.expr), k, dtype)
        elif st.kind in ("let", "map"):
            env[st.name] = value(st.expr)
        else:
            return value(st.expr)
    raise ValueError(f"the {op} backward row program has no write step")


def einsum(
    spec_text: str, xs: Sequence[Bound], shapes: Sequence[tuple[int, ...]], dtype: str
) -> Bound:
    """Bound of an einsum: each result element sums K products of one element per operand."""
    es = einspec.parse(spec_text, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, list(shapes))
    k = math.prod(int(sizes[c]) for c in es.contracted)
    e = _eps(dtype)
    lo, hi = 1.0, 1.0
    for x in xs:
        lo, hi = _interval_mul((lo, hi), (x.lo, x.hi))
    mags = [x.mag for x in xs]
    term_mag = math.prod(mags)
    term_err = 0.0
    for i, x in enumerate(xs):
        term_err += x.err * math.prod(
            m + xj.err for j, (m, xj) in enumerate(zip(mags, xs)) if j != i
        )
    # a contraction path may multiply the operands in any order and sum in blocks
    err = k * term_err + e * k * term_mag * (_sum_growth(k) + len(xs))
    prob = _merge(*(x.problem for x in xs))
    exact = len(xs) == 1 and k == 1 and xs[0].exact  # a transposition or a diagonal
    return Bound(k * lo, k * hi, 0.0 if exact else err, exact, prob)


def fused(body: FusedBody, xs: Sequence[Bound], space: tuple[int, ...], dtype: str) -> Bound:
    """Bound of a fused node: its program instruction by instruction, its tail, then a row-op
    tail's epilogue instruction by instruction."""

    def run(instrs, tail: Bound | None) -> list[Bound]:
        vals: list[Bound] = []

        def ref(r) -> Bound:
            kind, v = r
            if kind == "in":
                return xs[v]
            if kind == "tmp":
                return vals[v]
            if kind == "tail":
                return tail
            return Bound(float(v), float(v), 0.0, True)

        for ins in instrs:
            args = [ref(r) for r in ins.args]
            vals.append(elementwise(ins.op, args, dtype))
        return vals

    vals = run(body.instrs, None)
    v = vals[-1] if vals else xs[0]  # an empty prologue: the tail reads input 0
    if body.tail is None:
        return v
    k = math.prod(space[a] for a in body.axes) if body.axes else 1
    if body.tail in ops.ROW_OPS:
        r = rowop(body.tail, v, k, dtype, body.eps)
        return run(body.epilogue, r)[-1] if body.epilogue else r
    return reduce(body.tail, v, k, dtype)


def elementwise(op: str, args: Sequence[Bound], dtype: str) -> Bound:
    """Bound of any elementwise op of the table, by its arity."""
    return _BY_ARITY[ops.ELEMENTWISE[op].arity](op, *args, dtype)


_BY_ARITY = {1: unary, 2: binary, 3: ternary}


def node_bound(
    node,
    in_bounds: Sequence[Bound],
    in_shapes: Sequence[tuple[int, ...]],
    constant: np.ndarray | None = None,
) -> Bound:
    """Bound of one graph node from its inputs' bounds and concrete shapes."""
    kind, op, dt = node.kind, node.op, node.dtype
    if kind == ops.CONSTANT:
        a = np.asarray(constant, dtype=np.float64)
        if a.size == 0:
            return Bound(0.0, 0.0, 0.0, True)
        return Bound(float(a.min()), float(a.max()), 0.0, True)
    if kind == ops.EINSUM:
        return einsum(node.args["spec"], in_bounds, in_shapes, dt)
    if kind in ops.ELEMENTWISE_KINDS:
        return elementwise(op, in_bounds, dt)
    if kind == ops.REDUCE:
        k = math.prod(in_shapes[0][a] for a in node.args["axes"])
        return reduce(op, in_bounds[0], k, dt)
    if kind == ops.ROWOP:
        return rowop(
            op, in_bounds[0], in_shapes[0][node.args["axis"]], dt, float(node.args.get("eps", 0.0))
        )
    if kind == ops.ROWGRAD:
        k = in_shapes[0][node.args["axis"]]
        return row_grad(op, in_bounds, k, dt, float(node.args.get("eps", 0.0)))
    if kind in (ops.TRANSPOSE, ops.RESHAPE):
        return in_bounds[0]
    if kind == ops.CAST:
        x = in_bounds[0]
        return Bound(x.lo, x.hi, x.err + _eps(dt) * x.mag, x.exact, x.problem)
    if kind == ops.FUSED:
        body = FusedBody.from_args(node.args["body"])
        return fused(body, in_bounds, tuple(body.space), dt)
    if kind == ops.ATTENTION:
        from ..ir import attention as attn_ir

        lay = attn_ir.layout_of(node.args, len(in_shapes[0]))
        canon = [attn_ir.canonical_shape(s, j) for s, j in zip(in_shapes[:3], lay)]
        return attention(in_bounds, canon, float(node.args["scale"]), dt)
    raise ValueError(f"no bound rule for node kind {kind!r}")


def attention(
    xs: Sequence[Bound], shapes: Sequence[tuple[int, ...]], scale: float, dtype: str
) -> Bound:
    """Bound of ``softmax(scale * q k^T + mask) v``: the scores' bound through the softmax,
    then a convex combination of v's rows (so within v's range), summed over Sk keys."""
    q, k, v = xs[:3]
    d, sk = shapes[0][-1], shapes[1][-2]
    qk = einsum("qd,kd->qk", [q, k], [(1, d), (1, d)], dtype)
    a = abs(scale)
    s = Bound(
        min(qk.lo * scale, qk.hi * scale),
        max(qk.lo * scale, qk.hi * scale),
        qk.err * a + _eps(dtype) * qk.mag * a,
        False,
        qk.problem,
    )
    if len(xs) == 4:
        s = binary("add", s, xs[3], dtype)
    p = rowop("softmax", s, sk, dtype)
    pv = einsum("k,ke->e", [p, v], [(sk,), (sk, 1)], dtype)
    # causal or -inf masks only drop keys: the result stays a convex combination of v's rows
    return Bound(v.lo, v.hi, pv.err, False, _merge(pv.problem, s.problem))


def analyze(
    graph,
    ranges: Mapping[str, tuple[float, float]],
    shape_of: Callable[[int], tuple[int, ...]] | None = None,
) -> dict[int, Bound]:
    """Bounds of every node of a graph with concrete shapes, given each input's value range."""
    shape_of = shape_of or (lambda nid: tuple(graph.node(nid).shape))
    out: dict[int, Bound] = {}
    for node in graph.nodes:
        if node.kind == ops.INPUT:
            lo, hi = ranges[node.name]
            out[node.id] = Bound(float(lo), float(hi), 0.0, True)
            continue
        out[node.id] = node_bound(
            node,
            [out[i] for i in node.inputs],
            [shape_of(i) for i in node.inputs],
            graph.constants.get(node.id),
        )
    return out
