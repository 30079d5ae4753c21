"""Sparse semi-naive rounds: a rule's joins over numpy index arrays, driven by a small delta.

A dense round multiplies whole relations (``n^3`` work per join) however few tuples are new. When
the delta holds few tuples, it is cheaper to start from those tuples and extend them atom by
atom: each delta tuple is a row of a *binding table* (one index column per variable); a positive
atom whose variables are partly bound extends the rows with the matching tuples of its relation
(found through an index of the relation sorted by the bound positions); an atom whose variables
are all bound, a negated atom and a comparison filter the rows; ``X = c`` / ``X = Y`` bind a
column. The head's tuples are then checked against the dense relation (kept up to date, it is
the membership test), deduplicated, and become the next delta.

The relations stay dense (they are the result and the membership bitmap); only the work of a
round follows the delta. The driver in ``fixpoint.py`` chooses, round by round, between this and
the compiled dense step by comparing the expected number of candidate rows with the dense step's
FLOPs; a sparse round that overruns its budget stops and the round is run densely instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .analysis import Domains
from .ast import Comparison, Const, Literal, Rule, Var
from .joins import _compare

#: dense FLOPs that one candidate row of a sparse round costs about as much time as (measured
#: on the development machine with OpenBLAS float32 matmul against this module's gathers)
FLOPS_PER_CANDIDATE = 8000.0

#: key spaces up to this size get a table of row starts (8 bytes a key); larger ones are
#: searched in the sorted keys
STARTS_LIMIT = 1 << 22

_ORDER = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


class OverBudget(Exception):
    """A sparse round generated more candidate rows than its budget allows."""


@dataclass
class Table:
    """Rows of variable bindings: ``m`` rows, one index column per bound variable."""

    m: int
    cols: dict[str, np.ndarray]

    def take(self, keep: np.ndarray) -> Table:
        """The rows where the boolean mask ``keep`` is true."""
        return Table(int(np.count_nonzero(keep)), {v: c[keep] for v, c in self.cols.items()})

    def empty(self) -> Table:
        """No rows, the same columns."""
        return Table(0, {v: c[:0] for v, c in self.cols.items()})


def _named(lit: Literal) -> list[str]:
    """The distinct named variables of an atom in order of first appearance."""
    return list(
        dict.fromkeys(a.name for a in lit.atom.args if isinstance(a, Var) and not a.anonymous)
    )


class Context:
    """What the variants of one stratum read during one round, with per-round caches."""

    def __init__(self, an, lower: Mapping[str, np.ndarray]) -> None:
        self.an = an
        self.dom: Domains = an.domains
        self.lower = lower
        self.rel: dict[str, np.ndarray] = dict(lower)
        self._views: dict[tuple, np.ndarray] = {}
        self._index: dict[tuple, tuple] = {}
        self._cmp: dict[tuple, np.ndarray] = {}
        self._is_str: dict[int, np.ndarray] = {}
        self.candidates = 0
        self.budget = math.inf

    def new_round(self, own: Mapping[str, np.ndarray], budget: float) -> None:
        """Point at this round's relations; forget views of relations that changed."""
        self.rel.update(own)
        for key in [k for k in self._views if k[0] in own]:
            del self._views[key]
        for key in [k for k in self._index if k[0][0] in own]:
            del self._index[key]
        self.candidates = 0
        self.budget = budget

    def charge(self, rows: int) -> None:
        """Count candidate rows; raise OverBudget past the round's budget."""
        self.candidates += rows
        if self.candidates > self.budget:
            raise OverBudget

    # ------------------------------------------------------------------ atoms as views
    def view(self, lit: Literal) -> np.ndarray:
        """The atom's relation as a bool array over its named variables (``_named`` order):
        constants selected, repeated variables on the diagonal, ``_`` projected away."""
        atom = lit.atom
        pattern = []
        letters: dict[str, str] = {}
        for i, a in enumerate(atom.args):
            if isinstance(a, Const):  # every constant of a rule is in its position's domain
                pattern.append(("c", self.dom.index[self.dom.of_position[(atom.pred, i)]][a.value]))
            elif a.anonymous:
                pattern.append(("_",))
            else:
                pattern.append(("v", letters.setdefault(a.name, chr(97 + len(letters)))))
        key = (atom.pred, tuple(pattern))
        v = self._views.get(key)
        if v is not None:
            return v
        arr = self.rel[atom.pred]
        if any(p[0] == "c" for p in pattern):
            arr = arr[tuple(p[1] if p[0] == "c" else slice(None) for p in pattern)]
        spare = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
        terms = "".join(p[1] if p[0] == "v" else next(spare) for p in pattern if p[0] != "c")
        out = "".join(dict.fromkeys(p[1] for p in pattern if p[0] == "v"))
        if terms != out:  # diagonal and projection; a sum of 0/1 values is > 0 iff one is 1
            arr = np.einsum(f"{terms}->{out}", arr)
        v = np.asarray(arr > 0)
        self._views[key] = v
        return v

    def index(self, lit: Literal, bound: tuple[int, ...]) -> tuple:
        """The view's true entries sorted by the ``bound`` axes: (row starts per key or sorted
        keys, free-axis columns); built once per relation state."""
        view = self.view(lit)
        key = ((lit.atom.pred, lit.atom.args), bound)
        hit = self._index.get(key)
        if hit is not None:
            return hit
        free = tuple(k for k in range(view.ndim) if k not in bound)
        nz = np.nonzero(view.transpose(bound + free))
        bshape = tuple(view.shape[k] for k in bound)
        free_cols = nz[len(bound) :]
        if not bound:
            hit = (None, None, free_cols, len(free_cols[0]))
        else:
            keys = np.ravel_multi_index(nz[: len(bound)], bshape) if len(bound) > 1 else nz[0]
            space = math.prod(bshape)
            if space <= STARTS_LIMIT:
                starts = np.zeros(space + 1, np.intp)
                np.cumsum(np.bincount(keys, minlength=space), out=starts[1:])
                hit = ("starts", starts, free_cols, bshape)
            else:
                hit = ("sorted", keys, free_cols, bshape)
        self._index[key] = hit
        return hit

    # ------------------------------------------------------------------ comparisons
    def is_str(self, d: int) -> np.ndarray:
        """Per index of domain ``d``: whether the constant is a string (its order class)."""
        v = self._is_str.get(d)
        if v is None:
            v = np.zeros(self.dom.size(d), bool)
            v[: len(self.dom.values[d])] = [isinstance(x, str) for x in self.dom.values[d]]
            self._is_str[d] = v
        return v

    def cmp_vector(self, op: str, d: int, value, const_left: bool) -> np.ndarray:
        """``values[i] op value`` (or ``value op values[i]``) for each index of domain ``d``."""
        key = (op, d, type(value).__name__, value, const_left)
        v = self._cmp.get(key)
        if v is None:
            v = np.zeros(self.dom.size(d), bool)
            v[: len(self.dom.values[d])] = [
                _compare(op, value, a) if const_left else _compare(op, a, value)
                for a in self.dom.values[d]
            ]
            self._cmp[key] = v
        return v


class Variant:
    """One semi-naive variant of a rule: the body literal ``dk`` reads the delta.

    The join order is fixed when the variant is built: filters as soon as their variables are
    bound, then the positive atom sharing the most bound variables, then binding equalities,
    then cross products.
    """

    def __init__(self, rule: Rule, dk: int, an, rule_no: int) -> None:
        self.rule = rule
        self.dk = dk
        self.an = an
        self.r = rule_no
        self.seed: Literal = rule.body[dk]  # type: ignore[assignment]
        self.never = False  # a constant comparison is false: the variant derives nothing
        self.ops: list[tuple] = []
        self._plan()

    def _var_dom(self, name: str) -> int:
        return self.an.domains.of_var[(self.r, name)]

    def _plan(self) -> None:
        rule = self.rule
        bound = set(_named(self.seed))
        rest = [item for k, item in enumerate(rule.body) if k != self.dk]
        head_vars = {a.name for a in rule.head.args if isinstance(a, Var)}

        def vars_of(item) -> set[str]:
            if isinstance(item, Literal):
                return set(_named(item))
            return {t.name for t in (item.left, item.right) if isinstance(t, Var)}

        while rest:
            pick = None
            for item in rest:  # filters first
                if vars_of(item) <= bound:
                    pick = item
                    break
            if pick is None:
                best = None
                for item in rest:
                    if isinstance(item, Literal) and not item.negated:
                        shared = len(set(_named(item)) & bound)
                        if shared and (best is None or shared > best[0]):
                            best = (shared, item)
                pick = best[1] if best else None
            if pick is None:
                for item in rest:
                    if isinstance(item, Comparison) and item.op == "=":
                        vs = vars_of(item)
                        if len(vs - bound) == 1 and (len(vs) == 1 or vs & bound):
                            pick = item
                            break
            if pick is None:
                pick = next(
                    (item for item in rest if isinstance(item, Literal) and not item.negated), None
                )
            if pick is None:  # unreachable for a safe rule
                raise AssertionError(f"no evaluable body item left in {rule}")
            rest.remove(pick)
            if isinstance(pick, Comparison):
                lt, rt = pick.left, pick.right
                if isinstance(lt, Const) and isinstance(rt, Const):
                    if not _compare(pick.op, lt.value, rt.value):
                        self.never = True
                    continue
                free = vars_of(pick) - bound
                if free:
                    x = next(iter(free))
                    other = rt if isinstance(lt, Var) and lt.name == x else lt
                    self.ops.append(("bind", x, other))
                    bound.add(x)
                else:
                    self.ops.append(("cmp", pick))
            elif pick.negated:
                self.ops.append(("neg", pick))
            else:
                names = _named(pick)
                b = tuple(k for k, v in enumerate(names) if v in bound)
                free_vars = [v for k, v in enumerate(names) if k not in b]
                self.ops.append(("join", pick, b, [names[k] for k in b], free_vars))
                bound |= set(names)
            needed = set(head_vars).union(*(vars_of(i) for i in rest)) if rest else head_vars
            gone = sorted(bound - needed)
            if gone:
                self.ops.append(("drop", gone, bool(rest)))
                bound -= set(gone)

    # ------------------------------------------------------------------ running
    def run(self, ctx: Context, delta: np.ndarray) -> np.ndarray:
        """Flat indices of the head tuples derived from ``delta`` (flat indices of the seed's
        relation), possibly repeated."""
        an = self.an
        head = self.rule.head
        head_shape = an.shape(head.pred)
        if self.never or len(delta) == 0:
            return np.zeros(0, np.intp)
        t = self._seed(ctx, delta)
        for op in self.ops:
            if t.m == 0:
                return np.zeros(0, np.intp)
            t = getattr(self, "_" + op[0])(ctx, t, *op[1:])
        if t.m == 0:
            return np.zeros(0, np.intp)
        if not head.args:
            return np.zeros(1, np.intp)
        cols = []
        for i, a in enumerate(head.args):
            if isinstance(a, Var):
                cols.append(t.cols[a.name])
            else:
                d = an.domains.of_position[(head.pred, i)]
                cols.append(np.full(t.m, an.domains.index[d][a.value], np.intp))
        return np.ravel_multi_index(cols, head_shape) if len(cols) > 1 else cols[0]

    def _seed(self, ctx: Context, delta: np.ndarray) -> Table:
        atom = self.seed.atom
        shape = self.an.shape(atom.pred)
        ctx.charge(len(delta))
        if not atom.args:
            return Table(1, {})
        coords = np.unravel_index(delta, shape) if len(shape) > 1 else (delta,)
        keep = np.ones(len(delta), bool)
        first: dict[str, int] = {}
        anon = False
        for i, a in enumerate(atom.args):
            if isinstance(a, Const):
                d = self.an.domains.of_position[(atom.pred, i)]
                keep &= coords[i] == self.an.domains.index[d][a.value]
            elif a.anonymous:
                anon = True
            elif a.name in first:
                keep &= coords[i] == coords[first[a.name]]
            else:
                first[a.name] = i
        cols = {v: np.asarray(coords[i], np.intp)[keep] for v, i in first.items()}
        t = Table(int(np.count_nonzero(keep)), cols)
        if anon and self.ops:
            t = _dedupe(t, {v: shape[i] for v, i in first.items()})
        return t

    def _join(
        self,
        ctx: Context,
        t: Table,
        lit: Literal,
        bound: tuple[int, ...],
        bnames: list[str],
        free: list[str],
    ) -> Table:
        view = ctx.view(lit)
        if not free:  # every variable bound: a lookup
            if view.ndim == 0:
                return t if bool(view) else t.empty()
            return t.take(view[tuple(t.cols[v] for v in bnames)])
        kind, table, free_cols, bshape = ctx.index(lit, bound)
        if kind is None:  # nothing shared: every row meets every tuple
            n = bshape
            ctx.charge(t.m * n)
            rows = np.repeat(np.arange(t.m), n)
            pos = np.tile(np.arange(n), t.m)
        else:
            q = (
                np.ravel_multi_index([t.cols[v] for v in bnames], bshape)
                if len(bnames) > 1
                else t.cols[bnames[0]]
            )
            if kind == "starts":
                lo, hi = table[q], table[q + 1]
            else:
                lo = np.searchsorted(table, q, "left")
                hi = np.searchsorted(table, q, "right")
            cnt = hi - lo
            total = int(cnt.sum())
            ctx.charge(total)
            rows = np.repeat(np.arange(t.m), cnt)
            # position of each output row inside its key's run of the index
            pos = np.arange(total) + np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
        cols = {v: c[rows] for v, c in t.cols.items()}
        for v, c in zip(free, free_cols):
            cols[v] = c[pos]
        return Table(len(rows), cols)

    def _neg(self, ctx: Context, t: Table, lit: Literal) -> Table:
        view = ctx.view(lit)
        if view.ndim == 0:
            return t.empty() if bool(view) else t
        return t.take(~view[tuple(t.cols[v] for v in _named(lit))])

    def _cmp(self, ctx: Context, t: Table, c: Comparison) -> Table:
        lt, rt = c.left, c.right
        if isinstance(lt, Var) and isinstance(rt, Var):
            a, b = t.cols[lt.name], t.cols[rt.name]
            if c.op == "=":
                return t.take(a == b)
            if c.op == "!=":
                return t.take(a != b)
            # a domain lists numbers in numeric order, then strings in string order, so an
            # ordering holds between two constants of one class exactly when it holds between
            # their indices; numbers and strings are never ordered against each other
            s = ctx.is_str(self._var_dom(lt.name))
            return t.take((s[a] == s[b]) & _ORDER[c.op](a, b))
        var, const = (lt, rt) if isinstance(lt, Var) else (rt, lt)
        vec = ctx.cmp_vector(c.op, self._var_dom(var.name), const.value, const_left=var is rt)
        return t.take(vec[t.cols[var.name]])

    def _bind(self, ctx: Context, t: Table, x: str, other) -> Table:
        if isinstance(other, Var):
            col = t.cols[other.name]
        else:
            # ``X = c`` put c into X's domain
            col = np.full(t.m, self.an.domains.index[self._var_dom(x)][other.value], np.intp)
        cols = dict(t.cols)
        cols[x] = col
        return Table(t.m, cols)

    def _drop(self, ctx: Context, t: Table, gone: list[str], dedupe: bool) -> Table:
        t = Table(t.m, {v: c for v, c in t.cols.items() if v not in gone})
        if dedupe:
            t = _dedupe(t, {v: self.an.domains.size(self._var_dom(v)) for v in t.cols})
        return t


def _dedupe(t: Table, sizes: Mapping[str, int]) -> Table:
    """The distinct rows of ``t``."""
    if t.m <= 1:
        return t
    if not t.cols:
        return Table(1, {})
    names = list(t.cols)
    shape = tuple(sizes[v] for v in names)
    if math.prod(shape) >= 1 << 62:  # the row key would overflow: keep the repeats
        return t
    key = (
        np.ravel_multi_index([t.cols[v] for v in names], shape)
        if len(names) > 1
        else t.cols[names[0]]
    )
    uniq = _distinct(key, math.prod(shape))
    if len(uniq) == t.m:
        return t
    cols = np.unravel_index(uniq, shape) if len(names) > 1 else (uniq,)
    return Table(len(uniq), {v: np.asarray(c, np.intp) for v, c in zip(names, cols)})


def _distinct(flat_idx: np.ndarray, size: int) -> np.ndarray:
    """The sorted distinct values of ``flat_idx`` (all in ``range(size)``)."""
    if len(flat_idx) * 8 > size:  # many: mark a bitmap and read it back, O(size)
        mark = np.zeros(size, bool)
        mark[flat_idx] = True
        return np.flatnonzero(mark)
    s = np.sort(flat_idx)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


class SparseStratum:
    """The semi-naive variants of a recursive stratum, run over index arrays."""

    def __init__(
        self, an, preds: tuple[str, ...], rules: list[Rule], lower: Mapping[str, np.ndarray]
    ) -> None:
        self.an = an
        self.preds = preds
        own = set(preds)
        self.variants: list[Variant] = []
        for rule in rules:
            for k, item in enumerate(rule.body):
                if isinstance(item, Literal) and item.atom.pred in own:
                    self.variants.append(Variant(rule, k, an, an.rule_ids[id(rule)]))
        self.ctx = Context(an, lower)

    def round(
        self, rel: Mapping[str, np.ndarray], delta: Mapping[str, np.ndarray], budget: float
    ) -> dict[str, np.ndarray]:
        """The new tuples (sorted flat indices) of every predicate, and ``rel`` updated with them.

        ``rel`` holds the dense relations of this stratum (updated in place), ``delta`` the flat
        indices of the tuples new in the last round. Raises OverBudget, before changing anything,
        when more than ``budget`` candidate rows would be generated.
        """
        self.ctx.new_round(rel, budget)
        found: dict[str, list[np.ndarray]] = {p: [] for p in self.preds}
        for v in self.variants:
            found[v.rule.head.pred].append(v.run(self.ctx, delta[v.seed.atom.pred]))
        new: dict[str, np.ndarray] = {}
        for p in self.preds:
            flat = rel[p].reshape(-1)
            cand = np.concatenate(found[p]) if found[p] else np.zeros(0, np.intp)
            new[p] = _distinct(cand[flat[cand] == 0], flat.size)
        for p in self.preds:
            rel[p].reshape(-1)[new[p]] = 1.0
        return new
