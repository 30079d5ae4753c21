"""Hypothesis strategies for random EinsumGraphs that differential testing can trust.

``graph_cases()`` draws a ``GraphCase``: a graph of every op kind (einsum with broadcasting,
repeated indices, ellipsis and implicit outputs; elementwise ops with broadcasting and scalar
operands; where; reductions; row ops; transpose; reshape; cast), float32 or float64 (sometimes
mixed), inputs with a symbolic batch dimension, plus the value range of every input and the size
of every symbol. Every node is kept only if ``bounds`` says its value is well defined and its
rounding error stays small: positive arguments for log/sqrt/pow/div, exact operands for
comparisons, bounded magnitudes, so a disagreement between backends is a bug, not noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from .. import dtypes
from ..errors import ShapeError
from ..ir import infer, ops
from ..ir.graph import EinsumGraph, Tensor
from . import bounds as _bounds

SIZES = (1, 2, 3, 4, 5)
SYMBOL = "B"
MAX_MAGNITUDE = 1e4
ERROR_BUDGET = 2e-4  # largest error bound kept, relative to max(magnitude, 1)
HALF_ERROR_EPS = 16  # 16-bit dtypes: the budget is this many of the dtype's epsilons
RANGES = ((-2.0, 2.0), (-1.0, 1.0), (-3.0, 0.5))
POSITIVE_RANGES = ((0.5, 2.0), (0.25, 1.0), (1.0, 3.0))
SCALARS = (2.0, 0.5, -1.5, 3.0, 1.0, -0.25)
OP_KINDS = (
    "unary",
    "binary",
    "compare",
    "where",
    "reduce",
    "rowop",
    "einsum",
    "transpose",
    "reshape",
    "cast",
)
OP_WEIGHTS = (4, 4, 2, 1, 2, 1, 4, 1, 1, 1)


@dataclass
class GraphCase:
    """A random graph with the input ranges and symbol sizes it was built for."""

    graph: EinsumGraph
    ranges: dict[str, tuple[float, float]]
    sizes: dict[str, int]
    ops_used: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        lines = [f"GraphCase(sizes={self.sizes}, ranges={self.ranges})"]
        for n in self.graph.nodes:
            ins = ", ".join(self.graph.node(i).name for i in n.inputs)
            lines.append(f"  {n.name} = {n.label}({ins}) {tuple(n.shape)} {n.dtype}")
        lines.append(f"  outputs {dict(self.graph.outputs)}")
        return "\n".join(lines)


@dataclass
class _Entry:
    t: Tensor
    b: _bounds.Bound


class _Builder:
    """Grows one graph op by op, drawing every choice from hypothesis."""

    def __init__(self, draw, dtype: str, symbolic: bool) -> None:
        self.draw = draw
        self.g = EinsumGraph()
        self.dtype = dtype
        # the second dtype a graph mixes in: float64 beside float32, float32 beside the others
        self.other = "float64" if dtype == "float32" else "float32"
        self.sizes = {SYMBOL: draw(st.sampled_from((1, 2, 3)))} if symbolic else {}
        self.symbolic = symbolic
        self.ranges: dict[str, tuple[float, float]] = {}
        self.pool: list[_Entry] = []
        self.bounds: dict[int, _bounds.Bound] = {}
        self.ops_used: list[str] = []

    # ------------------------------------------------------------------ helpers
    def cshape(self, shape) -> tuple[int, ...]:
        return tuple(self.sizes[d] if isinstance(d, str) else d for d in shape)

    def choice(self, seq):
        return self.draw(st.sampled_from(seq))

    def coin(self, p: float) -> bool:
        return self.draw(st.integers(0, 999)) < p * 1000

    def accept(self, make) -> _Entry | None:
        """Run ``make()`` (which adds nodes); keep the result if its bound is usable."""
        before = set(n.id for n in self.g.nodes)
        t = make()
        new = [n.id for n in self.g.nodes if n.id not in before]
        for nid in new:
            node = self.g.node(nid)
            self.bounds[nid] = _bounds.node_bound(
                node,
                [self.bounds[i] for i in node.inputs],
                [self.cshape(self.g.node(i).shape) for i in node.inputs],
                self.g.constants.get(nid),
            )
        b = self.bounds[t.id]
        budget = max(ERROR_BUDGET, HALF_ERROR_EPS * dtypes.eps(t.node.dtype))
        ok = (
            b.finite
            and not b.problem
            and b.mag <= MAX_MAGNITUDE
            and b.err <= budget * max(b.mag, 1.0)
        )
        if not ok:
            for nid in reversed(new):
                self.g.remove_node(nid)
                del self.bounds[nid]
            return None
        e = _Entry(t, b)
        if t.node.kind != ops.CONSTANT:
            self.pool.append(e)
        return e

    def new_shape(self, rank: int | None = None) -> tuple:
        rank = self.draw(st.integers(0, 3)) if rank is None else rank
        dims: list[Any] = [self.choice(SIZES) for _ in range(rank)]
        if self.symbolic and rank and self.coin(0.35):
            dims[0] = SYMBOL
        return tuple(dims)

    def new_input(self, shape=None, positive: bool = False, dtype: str | None = None) -> _Entry:
        shape = self.new_shape() if shape is None else tuple(shape)
        name = f"x{len(self.ranges)}"
        dt = dtype or (self.other if self.coin(0.1) else self.dtype)
        self.ranges[name] = self.choice(POSITIVE_RANGES if positive else RANGES + POSITIVE_RANGES)
        t = self.g.input(name, shape, dt)
        lo, hi = self.ranges[name]
        self.bounds[t.id] = _bounds.Bound(lo, hi, 0.0, True)
        e = _Entry(t, self.bounds[t.id])
        self.pool.append(e)
        return e

    def pick(self, pred=lambda e: True) -> _Entry | None:
        cands = [e for e in self.pool if pred(e)]
        if not cands:
            return None
        # favour recent tensors so graphs grow deep, not only wide
        k = self.draw(st.integers(0, len(cands) - 1))
        k = max(k, self.draw(st.integers(0, len(cands) - 1)))
        return cands[k]

    def operand(self, pred=lambda e: True) -> _Entry:
        e = self.pick(pred)
        return e if e is not None else self.new_input()

    def positive(self, e: _Entry) -> _Entry:
        """A tensor with values >= 0.25 made from ``e`` (or a fresh positive input)."""
        if e.b.lo >= 0.25:
            return e
        how = self.choice(("sigmoid", "exp_tanh", "square", "input"))
        g, t = self.g, e.t
        made = None
        if how == "sigmoid":
            made = self.accept(lambda: g.sigmoid(t) + 0.5)
        elif how == "exp_tanh":
            made = self.accept(lambda: g.exp(g.tanh(t)))
        elif how == "square" and e.b.mag <= 10:
            made = self.accept(lambda: g.square(t) + 0.25)
        return made or self.new_input(t.shape, positive=True, dtype=t.dtype)

    def bounded(self, e: _Entry, limit: float) -> _Entry:
        """``e`` if its magnitude is at most ``limit``, else a squashed copy."""
        if e.b.mag <= limit:
            return e
        made = self.accept(lambda: self.g.tanh(e.t))
        return made or self.new_input(e.t.shape, dtype=e.t.dtype)

    def partner(self, a: _Entry, exact: bool = False) -> Any:
        """A second operand that broadcasts with ``a``: a tensor, a new input or a scalar."""
        how = self.choice(("pool", "input", "scalar", "pool", "input"))
        if how == "scalar":
            return self.choice(SCALARS)
        if how == "pool":

            def fits(e: _Entry) -> bool:
                if exact and not e.b.exact:
                    return False
                try:
                    infer.broadcast([a.t.shape, e.t.shape], "")
                except ShapeError:
                    return False
                return True

            e = self.pick(fits)
            if e is not None:
                return e
        shape = list(a.t.shape)
        if shape and self.coin(0.3):
            shape = shape[self.draw(st.integers(1, len(shape))) :]  # a trailing suffix
        shape = [1 if self.coin(0.25) else d for d in shape]
        if len(shape) == len(a.t.shape) < 3 and self.coin(0.15):
            shape = [self.choice(SIZES)] + shape  # the partner widens the result
        return self.new_input(shape)

    # ------------------------------------------------------------------ ops
    def op_unary(self) -> _Entry | None:
        op = self.choice(ops.UNARY_OPS)
        x = self.operand(lambda e: e.b.exact) if op == "step" else self.operand()
        if op in ("log", "sqrt", "reciprocal"):
            x = self.positive(x)
        elif op in ("exp", "softplus"):
            x = self.bounded(x, 4.0)
        elif op in ("square", "gelu", "gelu_grad"):
            x = self.bounded(x, 10.0)
        return self.accept(lambda: self.g.unary(op, x.t))

    def op_binary(self) -> _Entry | None:
        op = self.choice(("add", "sub", "mul", "div", "pow", "maximum", "minimum"))
        a = self.operand()
        if op == "pow":
            a = self.positive(self.bounded(a, 3.0))
            b = self.choice((2.0, 0.5, -1.0, 3.0, 1.5)) if self.coin(0.5) else self.partner(a)
            if isinstance(b, _Entry):
                b = self.bounded(b, 2.0)
        else:
            b = self.partner(a)
        if op == "div":
            b = self.positive(b) if isinstance(b, _Entry) else b
        ta = a.t
        tb = b.t if isinstance(b, _Entry) else b
        if op != "pow" and op != "div" and self.coin(0.3):
            ta, tb = tb, ta  # scalar on the left too (reflected operators)
        elif op == "div" and not isinstance(b, _Entry) and self.coin(0.3):
            a2 = self.positive(a)
            ta, tb = b, a2.t  # scalar / positive tensor
        return self.accept(lambda: self.g.binary(op, ta, tb))

    def op_compare(self) -> _Entry | None:
        op = self.choice(("gt", "ge", "lt", "le", "eq", "ne"))
        a = self.operand(lambda e: e.b.exact)
        b = self.partner(a, exact=True)
        if self.coin(0.2):
            b = a  # x op x: equality holds everywhere
        tb = b.t if isinstance(b, _Entry) else b
        # the comparison is bool (numpy's); it is used as a mask of the compared tensor, so the
        # graph goes on in a's dtype and fusion meets masks
        return self.accept(lambda: self.g.binary("mul", a.t, self.g.binary(op, a.t, tb)))

    def op_where(self) -> _Entry | None:
        c = self.operand(lambda e: e.b.exact)
        a = self.partner(c)
        b = self.partner(c)
        ta = a.t if isinstance(a, _Entry) else a
        tb = b.t if isinstance(b, _Entry) else b
        shapes = [c.t.shape] + [t.shape for t in (ta, tb) if isinstance(t, Tensor)]
        try:
            infer.broadcast(shapes, "")
        except ShapeError:
            tb = self.new_input(c.t.shape).t  # a and b widened the result in different ways
        if not isinstance(a, _Entry) and not isinstance(b, _Entry):
            tb = self.new_input(c.t.shape).t
        return self.accept(lambda: self.g.where(c.t, ta, tb))

    def op_reduce(self) -> _Entry | None:
        op = self.choice(ops.REDUCTIONS)
        x = self.operand()
        if op == "prod":
            x = self.bounded(x, 1.5)
        elif op == "logsumexp":
            x = self.bounded(x, 10.0)
        rank = len(x.t.shape)
        if rank == 0 or self.coin(0.15):
            axis = None
        else:
            axes = self.draw(
                st.lists(
                    st.integers(-rank, rank - 1),
                    min_size=1,
                    max_size=rank,
                    unique_by=lambda a: a % rank,
                )
            )
            axis = axes[0] if len(axes) == 1 and self.coin(0.5) else tuple(axes)
        keep = self.coin(0.4)
        return self.accept(lambda: self.g.reduce(op, x.t, axis, keep))

    def op_rowop(self) -> _Entry | None:
        x = self.operand(lambda e: len(e.t.shape) >= 1)
        if len(x.t.shape) == 0:
            x = self.new_input(self.new_shape(self.draw(st.integers(1, 3))))
        x = self.bounded(x, 20.0)
        rank = len(x.t.shape)
        axis = self.draw(st.integers(-rank, rank - 1))
        op = self.choice(ops.ROW_OPS)
        if self.coin(0.4):
            return self.row_epilogue(op, x)
        return self.accept(lambda: getattr(self.g, op)(x.t, axis))

    def row_epilogue(self, op: str, x: _Entry) -> _Entry | None:
        """A row op over the last axis with the consumers fusion folds into it: an affine
        scale and shift by per-column vectors (``y * gamma + beta``, as after a layer norm),
        then maybe a residual of the full shape or a scalar, then maybe an activation."""
        shape = tuple(x.t.shape)
        gamma = self.new_input(shape[-1:], dtype=x.t.dtype)
        beta = self.new_input(shape[-1:], dtype=x.t.dtype) if self.coin(0.7) else None
        extra = self.choice(("residual", "scalar", "none"))
        res = self.new_input(shape, dtype=x.t.dtype) if extra == "residual" else None
        scale = self.choice(SCALARS)
        act = self.choice(("relu", "tanh", None))
        g = self.g

        def make():
            y = getattr(g, op)(x.t, -1) * gamma.t
            if beta is not None:
                y = y + beta.t
            if res is not None:
                y = y + res.t
            elif extra == "scalar":
                y = y * scale
            return g.unary(act, y) if act else y

        return self.accept(make)

    def op_transpose(self) -> _Entry | None:
        x = self.operand(lambda e: len(e.t.shape) >= 2)
        perm = self.draw(st.permutations(range(len(x.t.shape))))
        return self.accept(lambda: self.g.transpose(x.t, perm))

    def op_reshape(self) -> _Entry | None:
        x = self.operand(lambda e: len(e.t.shape) >= 1)
        # merge runs of adjacent concrete dims, keep symbols alone, sprinkle size-1 dims
        target: list[Any] = []
        run = 1
        for d in x.t.shape:
            if isinstance(d, str):
                if run > 1 or (target and self.coin(0.3)):
                    target.append(run)
                run = 1
                target.append(d)
            elif self.coin(0.5):
                run *= d
            else:
                if run > 1:
                    target.append(run)
                run = d
        target.append(run)
        if self.coin(0.3):
            target.insert(self.draw(st.integers(0, len(target))), 1)
        ints = [k for k, d in enumerate(target) if isinstance(d, int)]
        if ints and self.coin(0.3):
            target[self.choice(ints)] = -1
        return self.accept(lambda: self.g.reshape(x.t, target))

    def op_cast(self) -> _Entry | None:
        x = self.operand()
        to = "float64" if x.t.dtype == "float32" else "float32"
        return self.accept(lambda: self.g.cast(x.t, to))

    def op_einsum(self) -> _Entry | None:
        x = self.operand(lambda e: len(e.t.shape) >= 1)
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        size: dict[str, Any] = {}
        rank = len(x.t.shape)
        ell_k = self.draw(st.integers(1, rank)) if rank and self.coin(0.25) else 0
        ell_dims = list(x.t.shape[:ell_k])
        term = ""
        for d in x.t.shape[ell_k:]:
            same = [c for c in dict.fromkeys(term) if size[c] == d]
            if same and self.coin(0.2):
                term += self.choice(same)  # a repeated index: the diagonal
            else:
                c = next(letters)
                size[c] = d
                term += c
        terms = [("..." if ell_k else "") + term]
        operands = [x]
        for _ in range(self.draw(st.integers(0, 2))):
            named = list(size)
            t = ""
            shape: list[Any] = []
            if ell_k and self.coin(0.6):
                k = self.draw(st.integers(0, ell_k))
                shape += [1 if self.coin(0.2) else d for d in ell_dims[ell_k - k :]]
                t = "..."
            picks = (
                self.draw(st.lists(st.sampled_from(named), max_size=3, unique=True))
                if named
                else []
            )
            if self.coin(0.4) or not picks:
                c = next(letters)
                size[c] = self.choice(SIZES)
                picks.append(c)
            repeat = bool(picks) and self.coin(0.1)
            if repeat:
                picks.append(picks[0])  # a repeated index in the new operand
            for c in picks:
                t += c
                # a repeated index needs equal sizes; any other may broadcast from size 1
                shape.append(1 if picks.count(c) == 1 and self.coin(0.12) else size[c])
            operands.append(self.new_input(shape))
            terms.append(t)
        used = list(dict.fromkeys("".join(terms).replace(".", "")))
        work = math.prod(self.sizes.get(size[c], size[c]) for c in used)
        if work > 20000:
            return None  # keep every case small and fast
        if self.coin(0.1):
            spec = ",".join(terms)  # implicit output
        else:
            out = (
                self.draw(st.lists(st.sampled_from(used), max_size=4, unique=True)) if used else []
            )
            out_s = "".join(out)
            if ell_k:
                k = self.draw(st.integers(0, len(out_s)))
                out_s = out_s[:k] + "..." + out_s[k:]
            spec = ",".join(terms) + "->" + out_s
        ts = [o.t for o in operands]
        return self.accept(lambda: self.g.einsum(spec, *ts))


@st.composite
def graph_cases(
    draw,
    max_ops: int = 8,
    dtypes: tuple[str, ...] = ("float32", "float64"),
    symbolic: bool = True,
    kinds: tuple[str, ...] = OP_KINDS,
) -> GraphCase:
    """A random ``GraphCase`` of 1 to ``max_ops`` ops of the given kinds."""
    b = _Builder(draw, draw(st.sampled_from(dtypes)), symbolic and draw(st.booleans()))
    weights = [w for k, w in zip(OP_KINDS, OP_WEIGHTS) if k in kinds]
    names = [k for k in OP_KINDS if k in kinds]
    table = [k for k, w in zip(names, weights) for _ in range(w)]
    n_ops = draw(st.integers(1, max_ops))
    last = None
    for _ in range(n_ops):
        kind = draw(st.sampled_from(table))
        made = getattr(b, f"op_{kind}")()
        if made is not None:
            last = made
            b.ops_used.append(kind)
    if last is None:  # every attempt was out of bounds: one plain op keeps the case useful
        # on a fresh input: a pooled intermediate may already carry a 16-bit rounding error
        # that leaves no room for another op
        x = b.new_input()
        last = b.accept(lambda: b.g.tanh(x.t))
        b.ops_used.append("unary")
    b.g.output(last.t, "out0")
    for k in range(draw(st.integers(0, 2))):
        e = b.pick()
        b.g.output(e.t, f"out{k + 1}")
    if draw(st.integers(0, 9)) == 0:
        b.g.output(last.t, "alias")  # one node under two output names
    return GraphCase(b.g, dict(b.ranges), dict(b.sizes), b.ops_used)


def dtypes_of(case: GraphCase) -> set[str]:
    """Dtypes used by a case's nodes."""
    return {n.dtype for n in case.graph.nodes}


__all__ = ["GraphCase", "graph_cases", "dtypes_of"]
