"""Rules over sparse relations: binding tables extended atom by atom, with no loop per tuple.

A rule runs as a *binding table* (one column of symbol ids per bound variable, plus a weight
column under the fuzzy and probabilistic semantics). It starts from one atom (in a semi-naive
round, the atom read as the delta) and is extended item by item: a positive atom sharing
variables with the table joins through a sorted index of its relation (``relset.Rel.index``);
an atom whose variables are all bound, a negated atom and a comparison filter rows; ``X = term``
binds a column, computing arithmetic vectorized and adding new numbers to the symbol table.
Variables that nothing later needs are dropped (and the rows deduplicated) as soon as possible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError
from .ast import Arith, Comparison, Const, Literal, Rule, Var, term_vars, where
from . import keysets
from .relset import Rel, combine, group, joint_keys, pack, search
from .symbols import INT, STR, Symbols

#: bytes one binding-table row costs per column at the peak of a join (ids, gathers, keys)
ROW_BYTES = 32
#: a relation is sorted to learn whether some of its positions determine the others (unless
#: it knows already) only when it has at most this many rows per row of the binding table that
#: would be deduplicated: a failed check should cost little next to the deduplication
UNIQUE_CHECK_ROWS = 0.125

_ORDER = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


@dataclass
class Table:
    """``m`` rows of bindings: one id column per bound variable, weights or None.

    ``distinct`` says that no two rows are equal; ``deps`` lists what makes some variables
    functions of others in these rows: ``(view, names)`` for a joined relation (rows agreeing
    on the names where ``view`` is unique agree on all its names) and ``(None, (x, *ys))``
    for ``x`` computed from ``ys``. A projection that drops only variables the kept ones
    determine leaves distinct rows distinct, with no deduplication.
    """

    m: int
    cols: dict[str, np.ndarray]
    w: np.ndarray | None
    distinct: bool = True
    deps: tuple = ()

    def take(self, idx: np.ndarray) -> Table:
        """The rows selected by a boolean mask (or an index array of distinct rows)."""
        cols = {v: c[idx] for v, c in self.cols.items()}
        w = None if self.w is None else self.w[idx]
        m = int(np.count_nonzero(idx)) if idx.dtype == bool else len(idx)
        return Table(m, cols, w, self.distinct, self.deps)

    def with_rows(self, m: int, cols: dict[str, np.ndarray], w: np.ndarray | None) -> Table:
        """Other rows (a filter or a new column of these), with what is known of these."""
        return Table(m, cols, w, self.distinct, self.deps)

    def determines(self, kept: list[str], gone: list[str], bits: int) -> bool:
        """Whether the values of ``kept`` determine those of ``gone`` in every row: the
        closure of ``kept`` under the functional dependencies of ``deps``. A relation is
        checked for uniqueness (a sort, remembered by the relation) only when it is much
        smaller than this table, since deduplicating the table is what the check would save."""
        have = set(kept)
        todo = sorted(self.deps, key=lambda d: 0 if d[0] is None else d[0].n)
        grew = True
        while grew and not set(gone) <= have:
            grew = False
            for view, names in todo:
                if set(names) <= have:
                    continue
                if view is None:
                    if set(names[1:]) <= have:
                        have.add(names[0])
                        grew = True
                    continue
                pos = tuple(k for k, v in enumerate(names) if v in have)
                if (
                    pos
                    and (view.knows_unique(pos) or view.n <= UNIQUE_CHECK_ROWS * self.m)
                    and view.unique_on(pos, bits)
                ):
                    have |= set(names)
                    grew = True
        return set(gone) <= have


class Context:
    """What rules read while they run: symbols, semantics, key width, memory budget."""

    def __init__(self, symbols: Symbols, sem: str, budget: int) -> None:
        self.sym = symbols
        self.sem = sem
        self.weighted = sem != "boolean"
        self.budget = budget
        self.bits = 1
        self._scratch: dict[int, np.ndarray] = {}
        self.refresh()

    def scratch(self, space: int) -> np.ndarray | None:
        """An empty bitmap over ``2**space`` keys for deduplication (kept empty between uses),
        or None when it would take more than a sixteenth of the memory budget."""
        bm = self._scratch.get(space)
        if bm is None:
            if 8 * keysets.words(space) * 16 > self.budget:
                return None
            if len(self._scratch) >= 2:  # key widths vary little: keep the two latest
                del self._scratch[next(iter(self._scratch))]
            bm = self._scratch[space] = keysets.bitmap(space)
        return bm

    def refresh(self) -> bool:
        """Update the key width to the symbol table's size; True if it changed."""
        bits = max(1, (len(self.sym) - 1).bit_length())
        changed = bits != self.bits
        self.bits = bits
        return changed

    def charge(self, rule: Rule, rows: int, ncols: int) -> None:
        """Refuse a binding table whose rows would not fit the memory budget."""
        need = rows * max(ncols, 1) * ROW_BYTES
        if need > self.budget:
            raise ProgramError(
                f"the rule for {rule.head.pred!r}{where(rule.pos)} would build {rows} binding "
                f"rows ({need} bytes), over the memory budget of {self.budget} bytes",
                code="memory_budget",
            )


def _named(lit: Literal) -> list[str]:
    return list(
        dict.fromkeys(a.name for a in lit.atom.args if isinstance(a, Var) and not a.anonymous)
    )


def _vars_of(item) -> set[str]:
    if isinstance(item, Literal):
        return set(_named(item))
    return {v.name for t in (item.left, item.right) for v in term_vars(t)}


# ---------------------------------------------------------------------- atom views
def atom_view(ctx: Context, lit: Literal, rel: Rel) -> Rel:
    """The relation as seen by an atom: rows matching its constants and repeated variables,
    projected onto its distinct named variables (in order of first appearance)."""
    atom = lit.atom
    keep = None
    first: dict[str, int] = {}
    for i, a in enumerate(atom.args):
        if isinstance(a, Const):
            cid = ctx.sym.encode_value(a.value)
            m = rel.cols[i] == cid
        elif a.anonymous or a.name not in first:
            if not a.anonymous:
                first[a.name] = i
            continue
        else:
            m = rel.cols[i] == rel.cols[first[a.name]]
        keep = m if keep is None else keep & m
    pos = list(first.values())
    if keep is None and pos == list(range(rel.arity)):
        return rel
    cols = [c if keep is None else c[keep] for c in (rel.cols[i] for i in pos)]
    w = rel.w if keep is None or rel.w is None else rel.w[keep]
    n = len(cols[0]) if cols else (rel.n if keep is None else int(np.count_nonzero(keep)))
    if not cols:
        return Rel.build([], min(n, 1) if w is None else n, w, ctx.bits, ctx.sem)
    if pos == sorted(pos) and len(pos) == rel.arity and rel.ordered:
        return Rel(len(pos), n, cols, w)  # a filtered sorted relation stays sorted and distinct
    return Rel.build(cols, n, w, ctx.bits, ctx.sem)


# ---------------------------------------------------------------------- arithmetic
@dataclass
class Num:
    """Numeric values of a term per row: ints where ``is_int``, floats elsewhere; rows where
    the term is undefined (a string operand, a division by zero) have ``ok`` False."""

    is_int: np.ndarray
    ival: np.ndarray
    fval: np.ndarray
    ok: np.ndarray


def _num(ctx: Context, t, table: Table) -> Num:
    m = table.m
    if isinstance(t, Const):
        v = t.value
        if isinstance(v, str):
            z = np.zeros(m, bool)
            return Num(z, np.zeros(m, np.int64), np.zeros(m), z)
        is_int = isinstance(v, int)
        return Num(
            np.full(m, is_int),
            np.full(m, int(v) if is_int else 0, np.int64),
            np.full(m, float(v)),
            np.ones(m, bool),
        )
    if isinstance(t, Var):
        ids = table.cols[t.name]
        k = ctx.sym.kind[ids]
        return Num(k == INT, ctx.sym.ival[ids], ctx.sym.fval[ids], k != STR)
    a, b = _num(ctx, t.left, table), _num(ctx, t.right, table)
    is_int = a.is_int & b.is_int
    ok = a.ok & b.ok
    with np.errstate(all="ignore"):
        if t.op in "+-*":
            f = {"+": np.add, "-": np.subtract, "*": np.multiply}[t.op]
            return Num(is_int, f(a.ival, b.ival), f(a.fval, b.fval), ok)
        zero = np.where(is_int, b.ival == 0, b.fval == 0)
        ok = ok & ~zero
        bi = np.where(b.ival == 0, 1, b.ival)
        q = (np.abs(a.ival) // np.abs(bi)) * np.sign(a.ival) * np.sign(bi)  # toward zero
        if t.op == "/":
            return Num(is_int, q, np.where(is_int, q, a.fval / np.where(zero, 1, b.fval)), ok)
        r = a.ival - bi * q
        return Num(is_int, r, np.where(is_int, r, np.fmod(a.fval, np.where(zero, 1, b.fval))), ok)


def _compare_num(op: str, a: Num, b: Num) -> np.ndarray:
    both_int = a.is_int & b.is_int
    if op in ("=", "!="):
        eq = np.where(both_int, a.ival == b.ival, a.fval == b.fval)
        return eq if op == "=" else ~eq
    f = _ORDER[op]
    return np.where(both_int, f(a.ival, b.ival), f(a.fval, b.fval))


# ---------------------------------------------------------------------- one rule
class SparseRule:
    """One rule (or one semi-naive variant: body item ``seed`` read as the delta), planned once
    and run over sparse relations."""

    def __init__(self, rule: Rule, seed: int | None = None) -> None:
        self.rule = rule
        self.seed = seed
        self.never = False
        self.ops: list[tuple] = []
        self._plan()

    def _plan(self) -> None:
        rule = self.rule
        body = list(enumerate(rule.body))
        head_vars = {v.name for v in rule.head.variables()}
        bound: set[str] = set()
        rest = list(body)
        if self.seed is not None:
            first = rule.body[self.seed]
            rest = [(k, it) for k, it in body if k != self.seed]
            self.ops.append(("scan", self.seed, first))
            bound |= set(_named(first))
        while rest:
            pick = None
            for k, item in rest:  # filters first
                if _vars_of(item) <= bound and not (
                    isinstance(item, Comparison) and item.op == "=" and self._binds(item, bound)
                ):
                    pick = (k, item)
                    break
            if pick is None:
                for k, item in rest:
                    if isinstance(item, Comparison) and item.op == "=" and self._binds(item, bound):
                        pick = (k, item)
                        break
            if pick is None:
                best = None
                for k, item in rest:
                    if isinstance(item, Literal) and not item.negated:
                        shared = len(set(_named(item)) & bound)
                        if best is None or shared > best[0]:
                            best = (shared, (k, item))
                pick = best[1] if best else None
            if pick is None:  # unreachable for a safe rule
                raise AssertionError(f"no evaluable body item left in {rule}")
            rest.remove(pick)
            k, item = pick
            if isinstance(item, Comparison):
                lt, rt = item.left, item.right
                if isinstance(lt, Const) and isinstance(rt, Const):
                    from .joins import _compare

                    if not _compare(item.op, lt.value, rt.value):
                        self.never = True
                    continue
                if item.op == "=" and self._binds(item, bound):
                    x, other = (
                        (lt, rt) if isinstance(lt, Var) and lt.name not in bound else (rt, lt)
                    )
                    self.ops.append(("bind", x.name, other))
                    bound.add(x.name)
                else:
                    self.ops.append(("cmp", item))
            elif item.negated:
                self.ops.append(("neg", k, item))
            else:
                names = _named(item)
                b = [v for v in names if v in bound]
                self.ops.append(("join", k, item, b, [v for v in names if v not in bound], None))
                bound |= set(names)
            needed = head_vars.union(*(_vars_of(i) for _, i in rest))
            gone = sorted(bound - needed)
            if gone:
                # the last drop leaves deduplication to the head's relation
                drop = (gone, bool(rest))
                if self.ops[-1][0] == "join":  # the join gathers no column it would drop
                    self.ops[-1] = self.ops[-1][:-1] + (drop,)
                else:
                    self.ops.append(("drop", *drop))
                bound -= set(gone)

    @staticmethod
    def _binds(c: Comparison, bound: set[str]) -> bool:
        for x, y in ((c.left, c.right), (c.right, c.left)):
            if (
                isinstance(x, Var)
                and x.name not in bound
                and all(v.name in bound for v in term_vars(y))
            ):
                return True
        return False

    # ------------------------------------------------------------------ running
    def run(
        self, ctx: Context, source: Callable[[str, int], Rel]
    ) -> tuple[list[np.ndarray], int, np.ndarray | None]:
        """The head rows derived (columns, count, weights), possibly repeated."""
        head = self.rule.head
        t = Table(1, {}, np.ones(1) if ctx.weighted else None)
        if not self.never:
            for op in self.ops:
                t = getattr(self, "_" + op[0])(ctx, t, source, *op[1:])
                if t.m == 0:
                    break
        else:
            t = t.take(np.zeros(0, np.intp))
        if t.m == 0:
            return [np.zeros(0, np.int64) for _ in head.args], 0, None
        cols = []
        for a in head.args:
            if isinstance(a, Var):
                cols.append(t.cols[a.name])
            else:
                cols.append(np.full(t.m, ctx.sym.encode_value(a.value), np.int64))
        return cols, t.m, t.w

    def _scan(self, ctx, t: Table, source, k: int, lit: Literal) -> Table:
        return self._join(ctx, t, source, k, lit, [], _named(lit), None)

    def _join(
        self,
        ctx,
        t: Table,
        source,
        k: int,
        lit: Literal,
        b: list[str],
        free: list[str],
        drop: tuple[list[str], bool] | None,
    ) -> Table:
        """Join with the atom's relation, then drop the variables ``drop`` names (without
        gathering their columns when no deduplication needs them)."""
        view = atom_view(ctx, lit, source(lit.atom.pred, k))
        names = _named(lit)
        if not free:  # every variable bound: a semi-join
            if view.arity == 0:
                if view.n == 0:
                    out = t.take(np.zeros(0, np.intp))
                else:
                    out = t if view.w is None else t.with_rows(t.m, t.cols, t.w * view.w[0])
            else:
                idx = view.find([t.cols[v] for v in names], ctx.bits)
                hit = idx >= 0
                out = t.take(hit)
                if out.w is not None:
                    out.w = out.w * view.w[idx[hit]]
            return out if drop is None else self._drop(ctx, out, source, *drop)
        bpos = tuple(names.index(v) for v in b)
        fpos = [names.index(v) for v in free]
        if not b:  # nothing shared: every row meets every tuple
            total = t.m * view.n
            ctx.charge(self.rule, total, len(t.cols) + len(free))
            if t.m == 1:  # a scan (the first atom): the relation's columns as they are
                cols = {v: np.repeat(c, view.n) for v, c in t.cols.items()}
                for v, i in zip(free, fpos):
                    cols[v] = view.cols[i]
                w = None if t.w is None else t.w[0] * view.w
                out = Table(view.n, cols, w, t.distinct, t.deps + ((view, tuple(names)),))
                return out if drop is None else self._drop(ctx, out, source, *drop)
            runs = None
            vcols, vw = view.cols, view.w
        else:
            ix = view.index(bpos, ctx.bits)
            if ix is None:  # keys too wide to pack: rank the probe and the build together
                sub = [view.cols[i] for i in bpos]
                kb, kq = joint_keys([sub, [t.cols[v] for v in b]], ctx.bits)
                perm = np.argsort(kb)
                sk = kb[perm]
                lo, hi = search(sk, kq, "left"), search(sk, kq, "right")
                vcols = [c[perm] for c in view.cols]
                vw = None if view.w is None else view.w[perm]
            else:
                lo, hi = ix.lookup(pack([t.cols[v] for v in b], ctx.bits))
                vcols, vw = ix.cols, ix.w
            total = int((hi - lo).sum())
            ctx.charge(self.rule, total, len(t.cols) + len(free))
            runs = (lo, hi)
        # distinct rows joined with a relation's distinct rows stay distinct
        out = Table(total, {}, None, t.distinct, t.deps + ((view, tuple(names)),))
        skip: set[str] = set()
        if drop is not None:
            gone, dedupe = drop
            kept = [v for v in [*t.cols, *free] if v not in gone]
            if kept and (not dedupe or (out.distinct and out.determines(kept, gone, ctx.bits))):
                skip = set(gone)
                out.distinct = out.distinct and dedupe
        tnames = [v for v in t.cols if v not in skip]
        fnames = [(v, i) for v, i in zip(free, fpos) if v not in skip]
        fused = None
        if runs is not None and t.w is None:
            fused = keysets.expand_gather(
                *runs, total, [t.cols[v] for v in tnames], [vcols[i] for _, i in fnames]
            )
        if fused is not None:
            out.cols = dict(zip(tnames + [v for v, _ in fnames], fused))
        else:
            if runs is None:
                rows = np.repeat(np.arange(t.m), view.n)
                pos = np.tile(np.arange(view.n), t.m)
            else:
                rows, pos, _ = keysets.expand(*runs)
            for v in tnames:
                out.cols[v] = t.cols[v][rows]
            for v, i in fnames:
                out.cols[v] = vcols[i][pos]
            out.w = None if t.w is None else t.w[rows] * vw[pos]
        if drop is None or skip:
            return out
        return self._drop(ctx, out, source, *drop)

    def _neg(self, ctx, t: Table, source, k: int, lit: Literal) -> Table:
        view = atom_view(ctx, lit, source(lit.atom.pred, k))
        names = _named(lit)
        if view.arity == 0:
            idx = np.full(t.m, 0 if view.n else -1, np.int64)
        else:
            idx = view.find([t.cols[v] for v in names], ctx.bits)
        hit = idx >= 0
        if t.w is None:
            return t.take(~hit)
        w = t.w.copy()
        w[hit] *= 1.0 - view.w[idx[hit]]
        return t.with_rows(t.m, t.cols, w).take(w > 0)

    def _cmp(self, ctx, t: Table, source, c: Comparison) -> Table:
        lt, rt = c.left, c.right
        if isinstance(lt, Arith) or isinstance(rt, Arith):
            a, b = _num(ctx, lt, t), _num(ctx, rt, t)
            # an undefined arithmetic term drops the row; a string side compared with a number
            # is unequal and unordered
            undefined = (~a.ok if isinstance(lt, Arith) else False) | (
                ~b.ok if isinstance(rt, Arith) else False
            )
            res = np.where(a.ok & b.ok, _compare_num(c.op, a, b), c.op == "!=")
            return t.take(res & ~undefined)
        ids = [
            t.cols[x.name]
            if isinstance(x, Var)
            else np.full(t.m, ctx.sym.encode_value(x.value), np.int64)
            for x in (lt, rt)
        ]
        a, b = ids
        if c.op == "=":
            return t.take(a == b)
        if c.op == "!=":
            return t.take(a != b)
        s = ctx.sym.is_str()
        r = ctx.sym.rank()
        return t.take((s[a] == s[b]) & _ORDER[c.op](r[a], r[b]))

    def _bind(self, ctx, t: Table, source, x: str, other) -> Table:
        cols = dict(t.cols)
        # x is a function of the term's variables
        dep = ((None, (x, *(v.name for v in term_vars(other)))),)
        if isinstance(other, Var):
            cols[x] = t.cols[other.name]
            return Table(t.m, cols, t.w, t.distinct, t.deps + dep)
        if isinstance(other, Const):
            cols[x] = np.full(t.m, ctx.sym.encode_value(other.value), np.int64)
            return Table(t.m, cols, t.w, t.distinct, t.deps + dep)
        n = _num(ctx, other, t)
        keep = t.take(n.ok)
        ids = ctx.sym.add_numbers(n.ival[n.ok], n.fval[n.ok], n.is_int[n.ok])
        ctx.refresh()
        keep.cols[x] = ids
        keep.deps = t.deps + dep
        return keep

    def _drop(self, ctx, t: Table, source, gone: list[str], dedupe: bool) -> Table:
        names = [v for v in t.cols if v not in gone]
        if names and dedupe and t.distinct and t.determines(names, gone, ctx.bits):
            # the dropped variables are functions of the kept ones: no two rows become equal
            return t.with_rows(t.m, {v: t.cols[v] for v in names}, t.w)
        if not dedupe and (names or t.w is None):
            return (
                Table(t.m, {v: t.cols[v] for v in names}, t.w, False, t.deps)
                if names
                else Table(min(t.m, 1), {}, None)
            )
        if not names:
            if t.m == 0:
                return Table(0, {}, t.w)
            w = None if t.w is None else combine(t.w, np.zeros(1, np.intp), ctx.sem)
            return Table(1, {}, w)
        cols = [t.cols[v] for v in names]
        if t.w is None and t.m >= keysets.KERNEL_MIN:
            # many rows: first occurrences through a bitmap, one pass, no sort
            key = pack(cols, ctx.bits)
            bm = None if key is None else ctx.scratch(len(cols) * ctx.bits)
            if bm is not None:
                pick = keysets.distinct(key, bm)
                kept = {v: c[pick] for v, c in zip(names, cols)}
                return Table(len(pick), kept, None, True, t.deps)
        if t.w is None:
            r = Rel.build(cols, t.m, None, ctx.bits)
            return Table(r.n, dict(zip(names, r.cols)), None, True, t.deps)
        key = joint_keys([cols], ctx.bits)[0]
        order, starts = group(key)
        pick = order[starts]
        w = combine(t.w[order], starts, ctx.sem)
        return Table(len(pick), {v: c[pick] for v, c in zip(names, cols)}, w, True, t.deps)
