"""Tensor equations (Domingos' notation) -> one EinsumGraph.

``Y[i] = relu(W[i,j] X[j] + B[i])``: tensors written side by side are joined (an einsum);
indices that the left side does not name are summed (or maxed / averaged under ``max=`` /
``avg=``) where a product ends; terms add; equations with one left side add (``max=`` ones take
the maximum); a nonlinearity applies elementwise; ``softmax`` / ``log_softmax`` normalize over
the left side's marked index (``Comp[p, p'.]``) or its last one. The graph is built for the
concrete shapes of the data, so that every index has a size.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Mapping

import networkx as nx
import numpy as np

from ..ir.graph import EinsumGraph, Tensor
from ..ir.spec import symbol
from .analysis import program_error
from .ast import BinOp, Call, Equation, Expr, Neg, Number, Pos, Ref

Value = tuple[Tensor, tuple[str, ...]]  # a tensor and the index name of each axis

_UNARY = {
    "step": "step",
    "relu": "relu",
    "sig": "sigmoid",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "softplus": "softplus",
    "abs": "abs",
    "gelu": "gelu",
}


def refs_of(e: Expr) -> list[Ref]:
    """Every tensor reference in an expression."""
    if isinstance(e, Ref):
        return [e]
    if isinstance(e, BinOp):
        return refs_of(e.left) + refs_of(e.right)
    if isinstance(e, Neg):
        return refs_of(e.operand)
    if isinstance(e, Call):
        return [r for a in e.args for r in refs_of(a)]
    return []


def order_equations(eqs: list[Equation]) -> list[str]:
    """Left-side names in dependency order; a cycle raises ``recursive_equation``."""
    g = nx.DiGraph()
    pos: dict[str, Pos] = {}
    for eq in eqs:
        g.add_node(eq.lhs.name)
        pos.setdefault(eq.lhs.name, eq.pos)
    for eq in eqs:
        for r in refs_of(eq.expr):
            if r.name in g:
                g.add_edge(r.name, eq.lhs.name)
    try:
        return list(nx.lexicographical_topological_sort(g))
    except nx.NetworkXUnfeasible:
        cycle = [a for a, _ in nx.find_cycle(g)]
        raise program_error(
            "recursive_equation",
            f"tensor equations for {cycle} depend on "
            "each other in a cycle; recursion is supported for Datalog rules "
            "only",
            pos[cycle[0]],
        ) from None


class EquationBuilder:
    """Builds all equations of a program into ``g`` over known tensors ``env``."""

    def __init__(self, g: EinsumGraph, env: Mapping[str, Tensor]) -> None:
        self.g = g
        self.env = dict(env)
        self.sizes: dict[str, int] = {}
        self.projection = "sum"
        self.lhs_order: tuple[str, ...] = ()

    def _layout(self, idx) -> tuple[str, ...]:
        """Indices in the order of the left side (others after them, as they appear), so
        intermediates are laid out like the result: row ops over its last index run along
        contiguous rows and no transpose is left at the end."""
        rank = {n: k for k, n in enumerate(self.lhs_order)}
        names = tuple(dict.fromkeys(idx))
        return tuple(sorted(names, key=lambda n: (rank.get(n, len(rank)), names.index(n))))

    # ------------------------------------------------------------------ helpers
    def _letters(self, *groups: tuple[str, ...]) -> dict[str, str]:
        names = list(dict.fromkeys(n for grp in groups for n in grp))
        # lowercase letters first (readable specs), then the rest of the ASCII letters and
        # opt_einsum's symbols: any number of indices
        letters = itertools.chain(string.ascii_letters, (symbol(i) for i in itertools.count(52)))
        return dict(zip(names, letters))

    def _size(self, name: str, n: int, pos: Pos, tensor: str) -> None:
        if self.sizes.setdefault(name, n) != n:
            raise program_error(
                "shape_mismatch",
                f"index {name!r} of {tensor!r} has size {n} "
                f"but size {self.sizes[name]} elsewhere in the equation",
                pos,
            )

    def project(self, v: Value, keep: set[str]) -> Value:
        """Sum (or max / average) away the indices not in ``keep``."""
        t, idx = v
        gone = tuple(k for k, n in enumerate(idx) if n not in keep)
        if not gone:
            return v
        rest = tuple(n for n in idx if n in keep)
        op = {"sum": "sum", "max": "max", "avg": "mean"}[self.projection]
        return self.g.reduce(op, t, axis=gone), rest

    def align(self, v: Value, order: tuple[str, ...]) -> Tensor:
        """``v`` laid out along ``order`` (an index absent from ``v`` becomes a size-1 axis)."""
        t, idx = v
        present = tuple(n for n in order if n in idx)
        if present != idx:
            L = self._letters(idx)
            t = self.g.einsum("".join(L[n] for n in idx) + "->" + "".join(L[n] for n in present), t)
        if len(present) != len(order):
            t = self.g.reshape(t, tuple(self.sizes[n] if n in idx else 1 for n in order))
        return t

    def broadcast(self, v: Value, order: tuple[str, ...]) -> Tensor:
        """``v`` laid out along ``order`` at full size."""
        t = self.align(v, order)
        if any(n not in v[1] for n in order):
            ones = np.ones(tuple(self.sizes[n] for n in order), np.dtype(t.dtype))
            t = t * self.g.constant(ones)
        return t

    # ------------------------------------------------------------------ expressions
    def expr(self, e: Expr, keep: set[str]) -> Value:
        """Evaluate ``e``; the result's indices are a subset of ``keep``."""
        if isinstance(e, Number):
            return self.g.constant(np.float32(e.value)), ()
        if isinstance(e, Ref):
            return self.project(self.ref(e), keep)
        if isinstance(e, Neg):
            t, idx = self.expr(e.operand, keep)
            return -t, idx
        if isinstance(e, Call):
            return self.call(e, keep)
        if e.op == "*":
            return self.product(_factors(e), keep)
        left, right = self.expr(e.left, keep), self.expr(e.right, keep)
        order = self._layout(left[1] + right[1])
        a, b = self.align(left, order), self.align(right, order)
        op = {"+": "add", "-": "sub", "/": "div"}[e.op]
        return self.g.binary(op, a, b), order

    def ref(self, r: Ref) -> Value:
        if r.name not in self.env:
            raise program_error(
                "missing_data",
                f"tensor {r.name!r} is neither data given to "
                "run(), a relation, nor the left side of an equation",
                r.pos,
            )
        t = self.env[r.name]
        names = tuple(i.name for i in r.indices)
        if len(names) != len(t.shape):
            raise program_error(
                "arity_mismatch",
                f"{r.name!r} has {len(t.shape)} dimension(s) but is indexed with {len(names)}",
                r.pos,
            )
        for n, d in zip(names, t.shape):
            self._size(n, int(d), r.pos, r.name)
        distinct = tuple(dict.fromkeys(names))
        if distinct != names:  # a repeated index is a diagonal
            L = self._letters(names)
            t = self.g.einsum(
                "".join(L[n] for n in names) + "->" + "".join(L[n] for n in distinct), t
            )
        return t, distinct

    def product(self, factors: list[Expr], keep: set[str]) -> Value:
        idx_of = [{i.name for r in refs_of(f) for i in r.indices} for f in factors]
        vals: list[Value] = []
        for k, f in enumerate(factors):
            others = set().union(*(idx_of[j] for j in range(len(factors)) if j != k))
            vals.append(self.expr(f, keep | others))
        union = tuple(dict.fromkeys(n for _, idx in vals for n in idx))
        L = self._letters(union)
        full = self.projection != "sum"
        out = self._layout(union if full else tuple(n for n in union if n in keep))
        spec = (
            ",".join("".join(L[n] for n in idx) for _, idx in vals)
            + "->"
            + "".join(L[n] for n in out)
        )
        t = self.g.einsum(spec, *[t for t, _ in vals])
        return self.project((t, out), keep)

    def call(self, c: Call, keep: set[str]) -> Value:
        g = self.g
        t, idx = self.expr(c.args[0], keep)
        if c.func in ("softmax", "log_softmax"):
            if not idx:
                raise program_error("shape_mismatch", f"{c.func} needs at least one index", c.pos)
            axis = idx.index(self.softmax_index) if self.softmax_index in idx else len(idx) - 1
            fn = g.softmax if c.func == "softmax" else g.log_softmax
            return fn(t, axis=axis), idx
        if len(c.args) == 2:  # sig(x, T): a temperature
            temp, tidx = self.expr(c.args[1], keep)
            order = tuple(dict.fromkeys(idx + tidx))
            t, idx = self.align((t, idx), order) / self.align((temp, tidx), order), order
        return g.unary(_UNARY[c.func], t), idx

    # ------------------------------------------------------------------ equations
    def equation_group(self, eqs: list[Equation]) -> Tensor:
        """All equations of one left side, combined, laid out along the left side's indices."""
        lhs = eqs[0].lhs
        names = tuple(i.name for i in lhs.indices)
        if len(set(names)) != len(names):
            raise program_error(
                "parse_error", f"the left side of {lhs.name!r} repeats an index", lhs.pos
            )
        projections = {eq.projection for eq in eqs}
        if len(projections) > 1:
            raise program_error(
                "parse_error",
                f"equations for {lhs.name!r} mix projections {sorted(projections)}",
                eqs[1].pos,
            )
        self.lhs_order = names
        marked = [i.name for i in lhs.indices if i.marked]
        self.softmax_index = marked[0] if marked else None
        self.projection = eqs[0].projection
        total: Tensor | None = None
        for eq in eqs:
            v = self.expr(eq.expr, set(names))
            missing = [n for n in names if n not in self.sizes]
            if missing:
                raise program_error(
                    "unbound_variable",
                    f"index {missing[0]!r} of {lhs.name!r} appears on no tensor of the right side",
                    eq.pos,
                )
            t = self.broadcast(v, names)
            if total is None:
                total = t
            else:
                total = self.g.maximum(total, t) if self.projection == "max" else total + t
        assert total is not None
        return total


def _factors(e: Expr) -> list[Expr]:
    if isinstance(e, BinOp) and e.op == "*":
        return _factors(e.left) + _factors(e.right)
    return [e]


def build_equations(
    g: EinsumGraph, eqs: list[Equation], env: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Add every equation to ``g``; returns the tensor of each left-side name."""
    b = EquationBuilder(g, env)
    groups: dict[str, list[Equation]] = {}
    for eq in eqs:
        groups.setdefault(eq.lhs.name, []).append(eq)
    out: dict[str, Tensor] = {}
    for name in order_equations(eqs):
        b.sizes = {}
        t = b.equation_group(groups[name])
        b.env[name] = t
        out[name] = t
    return out
