"""Evaluation of a Datalog program: strata in order, recursive strata to a fixpoint.

Non-recursive strata are batched into one graph, compiled once and run once. A recursive stratum
is evaluated semi-naively under Boolean semantics: its step graph derives, from the relations
``R`` and the tuples new in the last round ``D``, the tuples that are new now; the step is
compiled once and called each round until nothing changes. The fuzzy and probabilistic
semantics iterate the full step (naive evaluation) until the largest change is below ``tol``.

Under Boolean semantics on a host backend, a round whose delta is small runs sparsely instead
(``sparse.py``: joins over index arrays driven by the delta's tuples); ``Options.rounds`` picks
``"auto"`` (per round, by comparing the expected candidate rows with the dense step's FLOPs),
``"dense"`` or ``"sparse"``. Both kinds of round derive the same tuples.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import get_backend
from ..compiler.compile import compile as compile_graph
from ..errors import ProgramError, UnknownPredicateError
from ..ir.graph import EinsumGraph, Tensor
from . import semantics as S
from .analysis import (
    Domains,
    Stratum,
    build_domains,
    check_arities,
    check_safety,
    desugar,
    has_arithmetic,
    stratify,
)
from .ast import Comparison, Const, Literal, Rule, term_vars
from .facts import FactTable
from .joins import RuleBuilder
from .relation import Relation, dense_index
from .relset import Known, Rel
from .sparse import FLOPS_PER_CANDIDATE, OverBudget, SparseStratum
from .sparse_rules import Context, SparseRule
from .symbols import Symbols, sorted_unique

#: dense relations larger than this (bytes, all copies together) are refused by default
DEFAULT_MEMORY_BUDGET = 4 << 30
DEFAULT_MAX_ITERATIONS = 100_000
ROUNDS = ("auto", "dense", "sparse")
REPRESENTATIONS = ("auto", "dense", "sparse")
#: under representation="auto" on the host, a Boolean recursive stratum whose relations have at
#: most this many dense cells switches from sparse to dense (BLAS) rounds before a round would
#: touch more binding rows than that (the last round's rows per delta tuple times the new
#: tuples): measured in bench_datalog.py, sparse rounds win on trees and sparse graphs, dense
#: ones on closures of well-connected graphs (out-degree 8)
DENSE_CELLS = 1 << 22


@dataclass
class Options:
    """Evaluation options shared by the Datalog API, Program.run and the CLI."""

    backend: str = "auto"
    semantics: str = "boolean"
    opt_level: int = 1
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    tol: float = 1e-6
    #: how Boolean recursive rounds run: "auto" (sparse while the delta is small), "dense"
    #: (always the compiled dense step) or "sparse" (index-array joins on host backends, except
    #: for a round whose candidate rows, ~128 bytes each, would not fit the memory budget)
    rounds: str = "auto"
    #: dense FLOPs one sparse candidate row is worth, for the "auto" choice; None measures it
    #: from the rounds' times (starting from sparse.FLOPS_PER_CANDIDATE)
    flops_per_candidate: float | None = None
    #: how relations are stored: "auto" (dense for small domains, sparse otherwise, chosen per
    #: stratum), "dense" (0/1 tensors, the only form on a device backend) or "sparse" (sorted
    #: columns of symbol ids); programs with arithmetic are always sparse
    representation: str = "auto"
    #: the "auto" representation starts a stratum dense when every relation it touches has at
    #: most this many cells (0: sparse first on the host, where a small program then needs no
    #: compiled plan; see DENSE_CELLS for the switch to dense rounds)
    dense_cells: int = 0


@dataclass
class Analysis:
    """A checked program: rules, facts, arities, symbols, domains and strata."""

    rules: list[Rule]
    facts: dict[str, FactTable]
    arity: dict[str, int]
    symbols: Symbols
    fact_ids: dict[str, tuple[list[np.ndarray], np.ndarray | None]]
    domains: Domains
    strata: list[Stratum]
    rule_ids: dict[int, int] = field(default_factory=dict)
    arithmetic: bool = False

    @property
    def predicates(self) -> tuple[str, ...]:
        """Every predicate the program or its facts mention."""
        return tuple(sorted(set(self.arity) | set(self.facts)))

    def shape(self, pred: str) -> tuple[int, ...]:
        """Dense shape of a relation."""
        return self.domains.shape(pred, self.arity.get(pred, 0))

    def dense_facts(self, pred: str) -> np.ndarray:
        """The facts of ``pred`` as a dense float32 tensor (weights, 1 for plain facts)."""
        arr = np.zeros(self.shape(pred), np.float32)
        cols, w = self.fact_ids.get(pred, ([], None))
        n = self.arity.get(pred, 0)
        if n == 0:
            if pred in self.fact_ids and self.facts[pred].n:
                arr[()] = 1.0 if w is None else float(w.max())
            return arr
        if not cols or len(cols[0]) == 0:
            return arr
        idx = tuple(dense_index(self.domains.position_ids(pred, i), c) for i, c in enumerate(cols))
        if w is None:
            arr[idx] = 1.0
        else:
            np.maximum.at(arr, idx, w.astype(np.float32))
        return arr

    def fact_rel(self, pred: str, bits: int, sem: str) -> Rel:
        """The facts of ``pred`` as a sparse relation."""
        n = self.arity.get(pred, 0)
        if pred not in self.fact_ids:
            return Rel.empty(n, sem != "boolean")
        cols, w = self.fact_ids[pred]
        rows = self.facts[pred].n
        if sem != "boolean" and w is None:
            w = np.ones(rows)
        return Rel.build(list(cols), rows, None if sem == "boolean" else w, bits, sem)


def _rule_constants(rules: list[Rule]) -> list[object]:
    out = []
    for r in rules:
        for a in [r.head] + [b.atom for b in r.body if isinstance(b, Literal)]:
            out += [t.value for t in a.args if isinstance(t, Const)]
        for b in r.body:
            if isinstance(b, Comparison):
                out += [t.value for t in (b.left, b.right) if isinstance(t, Const)]
    return out


def analyze(rules: list[Rule], facts: dict[str, FactTable]) -> Analysis:
    """Check arities and safety, move ground empty-body rules into the facts, build the symbol
    table and the domains, stratify."""
    rules = [desugar(r) for r in rules]
    check_arities(rules, facts)
    proper: list[Rule] = []
    ground: dict[str, list[tuple]] = {}
    for rule in rules:
        check_safety(rule)
        if not rule.body:
            row = tuple(a.value for a in rule.head.args if isinstance(a, Const))
            ground.setdefault(rule.head.pred, []).append(row)
        else:
            proper.append(rule)
    facts = dict(facts)
    for pred, rows in ground.items():
        t = FactTable.from_rows(rows)
        t.arity = len(rows[0])
        old = facts.get(pred)
        facts[pred] = t if old is None or old.arity < 0 else old.concat(t)
    arity = check_arities(rules, facts)
    for pred, t in facts.items():
        if t.arity < 0:  # no rows given: the arity the rules use
            facts[pred] = FactTable(arity[pred], 0, [np.zeros(0, np.int64)] * arity[pred])
    symbols = Symbols.from_columns(
        [c for t in facts.values() for c in t.cols], _rule_constants(proper)
    )
    fact_ids = {p: ([symbols.encode(c) for c in t.cols], t.weights) for p, t in facts.items()}
    domains = build_domains(proper, {p: c for p, (c, _) in fact_ids.items()}, arity, symbols)
    strata = stratify(proper, set(arity))
    return Analysis(
        proper,
        facts,
        arity,
        symbols,
        fact_ids,
        domains,
        strata,
        {id(r): k for k, r in enumerate(proper)},
        has_arithmetic(proper),
    )


def check_memory(an: Analysis, budget: int, preds: Any = None) -> None:
    """Refuse relations whose dense tensors (relation, delta, new) would exceed the budget."""
    total = 0
    for pred in an.predicates if preds is None else sorted(preds):
        shape = an.shape(pred)
        nbytes = 4 * math.prod(shape)
        if 3 * nbytes > budget:
            doms = ", ".join(str(s) for s in shape)
            raise ProgramError(
                f"relation {pred!r} needs a dense tensor over domains of sizes ({doms}): "
                f"{nbytes} bytes ({3 * nbytes} with its working copies), over the memory budget "
                f"of {budget} bytes",
                code="memory_budget",
                relation=pred,
                shape=shape,
            )
        total += nbytes
    if total > budget:
        raise ProgramError(
            f"the program's relations need {total} bytes of dense tensors "
            f"together, over the memory budget of {budget} bytes",
            code="memory_budget",
        )


def _ident(k: int) -> str:
    return f"r{k}"


class Evaluator:
    """Runs an analyzed program on one backend; ``env`` holds each relation as a device array."""

    def __init__(self, an: Analysis, opts: Options) -> None:
        S.check_semantics(opts.semantics)
        if not isinstance(opts.max_iterations, int) or opts.max_iterations < 1:
            raise ProgramError(
                f"max_iterations must be a positive int, got {opts.max_iterations!r}",
                code="invalid_option",
            )
        if opts.rounds not in ROUNDS:
            raise ProgramError(
                f"rounds must be one of {ROUNDS}, got {opts.rounds!r}", code="invalid_option"
            )
        if opts.representation not in REPRESENTATIONS:
            raise ProgramError(
                f"representation must be one of {REPRESENTATIONS}, got {opts.representation!r}",
                code="invalid_option",
            )
        if an.arithmetic and opts.representation == "dense":
            raise ProgramError(
                "a program with arithmetic terms adds constants while it runs, "
                "so it needs representation='sparse' or 'auto'",
                code="invalid_option",
            )
        self.an = an
        self.opts = opts
        self._backend = None  # resolved when a dense stratum first needs it
        self.ids = {p: _ident(k) for k, p in enumerate(an.predicates)}
        self.env: dict[str, Any] = {}
        self.iterations: dict[tuple[str, ...], int] = {}
        #: per recursive stratum, one letter per round: "d" dense, "s" sparse, "x" a sparse
        #: attempt that went over its budget, after which the round ran densely
        self.round_kinds: dict[tuple[str, ...], str] = {}
        self.compiles = 0
        #: per stratum (its predicates), "dense" or "sparse": how it ran
        self.stratum_kinds: dict[tuple[str, ...], str] = {}
        self.ctx = Context(an.symbols, opts.semantics, opts.memory_budget)

    @property
    def backend(self):
        """The backend of the dense strata (imported on first use: sparse strata need none)."""
        if self._backend is None:
            self._backend = get_backend(self.opts.backend)
        return self._backend

    # ------------------------------------------------------------------ representations
    def _touched(self, st: Stratum) -> set[str]:
        return set(st.preds) | {
            b.atom.pred for r in st.rules for b in r.body if isinstance(b, Literal)
        }

    def _kind(self, st: Stratum) -> str:
        """How a stratum runs: dense for small domains (on the backend, a device included),
        sparse on the host otherwise."""
        mode = self.opts.representation
        if mode == "sparse" or self.an.arithmetic:
            return "sparse"
        if mode == "dense":
            return "dense"
        cells = [math.prod(self.an.shape(p)) for p in self._touched(st)]
        if self.opts.backend == "cupy":  # dense relations stay on the device while they fit
            return "dense" if 12 * sum(cells) <= self.opts.memory_budget else "sparse"
        r = self.an.rule_ids
        for rule in st.rules:  # a comparison of two variables is a matrix over their domain
            for b in rule.body:
                if isinstance(b, Comparison) and all(
                    not isinstance(t, Const) for t in (b.left, b.right)
                ):
                    v = term_vars(b.left)[0]
                    cells.append(
                        self.an.domains.size(self.an.domains.of_var[(r[id(rule)], v.name)]) ** 2
                    )
        return "dense" if max(cells, default=0) <= self.opts.dense_cells else "sparse"

    def _dense(self, pred: str) -> Any:
        """``pred`` as a dense device array (converted from the sparse form if needed)."""
        cur = self.env.get(pred)
        if cur is None:
            cur = self.backend.to_device(self.an.dense_facts(pred))
        elif isinstance(cur, Rel):
            arr = np.zeros(self.an.shape(pred), np.float32)
            if cur.arity == 0:
                arr[()] = (1.0 if cur.w is None else cur.w[0]) if cur.n else 0.0
            elif cur.n:
                idx = tuple(
                    dense_index(self.an.domains.position_ids(pred, i), c)
                    for i, c in enumerate(cur.cols)
                )
                arr[idx] = 1.0 if cur.w is None else cur.w
            cur = self.backend.to_device(arr)
        self.env[pred] = cur
        return cur

    def _sparse(self, pred: str) -> Rel:
        """``pred`` as a sparse relation (converted from the dense form if needed)."""
        cur = self.env.get(pred)
        sem = self.opts.semantics
        if cur is None:
            cur = self.an.fact_rel(pred, self.ctx.bits, sem)
        elif not isinstance(cur, Rel):
            arr = np.asarray(self.backend.to_host(cur))
            weighted = sem != "boolean"
            if arr.ndim == 0:
                v = float(arr)
                cur = Rel(0, int(v > 0), [], np.array([v])[: int(v > 0)] if weighted else None)
            else:
                nz = np.nonzero(arr > 0)
                cols = [self.an.domains.position_ids(pred, i)[ix] for i, ix in enumerate(nz)]
                cur = Rel(
                    arr.ndim, len(nz[0]), cols, arr[nz].astype(np.float64) if weighted else None
                )
        self.env[pred] = cur
        return cur

    # ------------------------------------------------------------------ helpers
    def _compile(self, g: EinsumGraph):
        self.compiles += 1
        return compile_graph(g, backend=self.backend.name, opt_level=self.opts.opt_level)

    def _builder(self, g: EinsumGraph) -> RuleBuilder:
        return RuleBuilder(
            g, self.opts.semantics, self.an.domains, self.an.rule_ids, self.opts.memory_budget
        )

    def _rules_of(self, b: RuleBuilder, rules: list[Rule], pred: str, source) -> list[Tensor]:
        out = []
        for rule in rules:
            if rule.head.pred == pred:
                t = b.build(rule, source)
                if t is not None:
                    out.append(t)
        return out

    # ------------------------------------------------------------------ driver
    def run(self) -> dict[str, Any]:
        """Evaluate every stratum; returns ``{pred: device array or sparse Rel}``."""
        an = self.an
        for pred in an.predicates:
            self.env.setdefault(pred, None)
        auto = self.opts.representation == "auto"
        batch: list[Stratum] = []
        for st in an.strata:
            if not st.rules:
                continue  # facts only (or empty): already in env
            kind = self._kind(st)
            if kind == "dense" and auto:
                # one stratum at a time, so that one whose dense joins would not fit the
                # memory budget can run sparse instead
                saved = {p: self.env[p] for p in st.preds}
                try:
                    self._dense_strata([st])
                except ProgramError as exc:
                    if exc.code != "memory_budget":
                        raise
                    self.env.update(saved)
                    kind = "sparse"
            elif kind == "dense":
                batch.append(st)
                if st.recursive:
                    self._dense_strata(batch)
                    batch = []
            if kind == "sparse":
                if batch:
                    self._dense_strata(batch)
                    batch = []
                self._sparse_stratum(st)
            self.stratum_kinds[st.preds] = kind
        if batch:
            self._dense_strata(batch)
        return self.env

    def _dense_strata(self, strata: list[Stratum]) -> None:
        """Non-recursive strata, then at most one recursive one (the last), on dense tensors."""
        touched = set().union(*(self._touched(st) for st in strata))
        check_memory(self.an, self.opts.memory_budget, touched)
        for p in touched:
            self._dense(p)
        self._run_batch(strata)
        if strata[-1].recursive:
            self._fixpoint(strata[-1])

    # ------------------------------------------------------------------ sparse strata
    def _sparse_stratum(self, st: Stratum) -> None:
        """One stratum over sparse relations: one pass, semi-naive rounds (Boolean recursion)
        or naive rounds to a numerical fixpoint (fuzzy / probabilistic recursion)."""
        ctx = self.ctx
        own = set(st.preds)
        facts = {p: self._sparse(p) for p in st.preds}
        lower = {p: self._sparse(p) for p in self._touched(st) - own}
        if st.recursive and self.opts.semantics == "boolean":
            cur = self._semi_naive(st, facts, lower)
        else:
            rules = [SparseRule(r) for r in st.rules]
            cur = dict(facts)
            for it in range(1, self.opts.max_iterations + 1):
                src = _source(cur, lower)
                new = self._derive(rules, src, facts, st.preds)
                done = not st.recursive or all(
                    _close(cur[p], new[p], ctx.bits, self.opts.tol) for p in st.preds
                )
                cur = new
                if done:
                    self.iterations[st.preds] = it
                    break
            else:
                self._too_many(st)
        self.env.update(cur)

    def _derive(
        self, rules: list[SparseRule], src, base: dict[str, Rel], preds: tuple[str, ...]
    ) -> dict[str, Rel]:
        """Each predicate's rows: ``base`` and what ``rules`` derive, deduplicated."""
        ctx = self.ctx
        parts: dict[str, list] = {p: [] for p in preds}
        for r in rules:
            parts[r.rule.head.pred].append(r.run(ctx, src))
        out = {}
        for p in preds:
            b = base[p]
            got = [(b.cols, b.n, b.w)] + parts[p]
            out[p] = _build(got, self.an.arity.get(p, 0), ctx)
        return out

    def _semi_naive(
        self, st: Stratum, facts: dict[str, Rel], lower: dict[str, Rel]
    ) -> dict[str, Rel]:
        """Boolean recursion: each round joins the last round's new tuples (one variant per
        recursive atom, the other atoms read whole) and keeps what is new (``relset.Known``)."""
        ctx = self.ctx
        own = set(st.preds)
        exits = [SparseRule(r) for r in st.rules if not _uses(r, st.preds)]
        start = self._derive(exits, _source(facts, lower), facts, st.preds)
        variants = [
            SparseRule(r, k)
            for r in st.rules
            for k, b in enumerate(r.body)
            if isinstance(b, Literal) and not b.negated and b.atom.pred in own
        ]
        bits = ctx.bits
        known = {p: Known(start[p], bits, self.opts.memory_budget) for p in st.preds}
        delta = dict(start)
        cells = self._dense_cells(st)
        costs = _RoundCosts(self.opts.flops_per_candidate)
        for it in range(1, self.opts.max_iterations + 1):
            t0 = time.perf_counter()
            parts: dict[str, list] = {p: [] for p in st.preds}
            for v in variants:

                def src(pred: str, k: int, seed: int = v.seed, delta=delta, known=known) -> Rel:
                    if pred in own:
                        return delta[pred] if k == seed else known[pred].whole()
                    return lower[pred]

                parts[v.rule.head.pred].append(v.run(ctx, src))
            if ctx.bits != bits:  # arithmetic added symbols: keys widen
                bits = ctx.bits
                known = {
                    p: Known(known[p].whole(), bits, self.opts.memory_budget) for p in st.preds
                }
            new = {p: known[p].add(parts[p]) for p in st.preds}
            if all(n.n == 0 for n in new.values()):
                self.iterations[st.preds] = it
                self.round_kinds[st.preds] = "S" * it
                return {p: known[p].whole() for p in st.preds}
            rows = sum(part[1] for ps in parts.values() for part in ps)
            costs.sparse(time.perf_counter() - t0, rows)
            # candidate rows per delta tuple, so the next round's rows are about the new
            # tuples times this (a closure's rounds grow by its out-degree)
            rate = rows / max(sum(d.n for d in delta.values()), 1)
            delta = new
            ahead = rate * sum(d.n for d in new.values())
            if cells is not None and ahead > cells and self._go_dense(st, known, new, rate, costs):
                # the next round would touch more rows than the dense relations have cells:
                # BLAS rounds are cheaper from here (closures of well-connected graphs)
                self.round_kinds[st.preds] = "S" * it + self.round_kinds[st.preds]
                return {p: self.env[p] for p in st.preds}
        self._too_many(st)
        raise AssertionError("unreachable")

    def _dense_cells(self, st: Stratum) -> int | None:
        """The cells of the stratum's largest dense relation, when the stratum could switch
        to dense rounds (Boolean, host, no arithmetic, small domains), else None."""
        if self.opts.representation != "auto" or self.an.arithmetic:
            return None
        cells = max(math.prod(self.an.shape(p)) for p in self._touched(st))
        return cells if cells <= DENSE_CELLS else None

    def _flat(self, pred: str, rel: Rel) -> np.ndarray:
        """Sorted flat indices of a sparse relation's tuples in its dense layout."""
        if rel.arity == 0:
            return np.zeros(rel.n, np.intp)
        idx = [
            dense_index(self.an.domains.position_ids(pred, i), c) for i, c in enumerate(rel.cols)
        ]
        return np.sort(np.ravel_multi_index(idx, self.an.shape(pred)))

    def _go_dense(
        self, st: Stratum, known: dict, delta: dict, rate: float, costs: _RoundCosts
    ) -> bool:
        """Finish a recursive stratum with dense rounds from what is known; False (nothing
        changed) if its dense joins would not fit the memory budget."""
        saved = {p: self.env.get(p) for p in self._touched(st)}
        try:
            check_memory(self.an, self.opts.memory_budget, self._touched(st))
            for p in st.preds:
                self.env[p] = known[p].whole()
            for p in self._touched(st):
                self._dense(p)
            self._fixpoint(st, {p: self._flat(p, d) for p, d in delta.items()}, (rate, costs))
        except ProgramError as exc:
            if exc.code != "memory_budget":
                raise
            self.env.update(saved)
            return False
        return True

    def _run_batch(self, strata: list[Stratum]) -> None:
        """Non-recursive strata (and the first round of a recursive one) as one plan."""
        g = EinsumGraph()
        b = self._builder(g)
        local: dict[str, Tensor] = {}
        inputs: dict[str, str] = {}

        def source(pred: str, _k: int) -> Tensor:
            if pred in local:
                return local[pred]
            name = "R_" + self.ids[pred]
            if name not in inputs:
                inputs[name] = pred
                local_in = g.input(name, self.an.shape(pred))
                local[pred] = local_in
            return local[pred]

        for st in strata:
            # a recursive stratum starts from its facts and its exit rules (no body atom of its
            # own stratum); the fixpoint loop derives the rest
            rules = [r for r in st.rules if not (st.recursive and _uses(r, st.preds))]
            outs: dict[str, Tensor] = {}
            for pred in st.preds:
                fname = "F_" + self.ids[pred]
                facts = g.input(fname, self.an.shape(pred))
                inputs[fname] = pred
                outs[pred] = S.disjoin(
                    g, self.opts.semantics, [facts] + self._rules_of(b, rules, pred, source)
                )
            for pred, t in outs.items():
                local[pred] = t
                g.output(t, name="O_" + self.ids[pred])
        plan = self._compile(g)
        res = plan({name: self.env[pred] for name, pred in inputs.items()})
        for pred in (p for st in strata for p in st.preds):
            self.env[pred] = res["O_" + self.ids[pred]]

    def _fixpoint(
        self,
        st: Stratum,
        delta: dict[str, np.ndarray] | None = None,
        sparse_rounds: tuple[float, _RoundCosts] | None = None,
    ) -> None:
        boolean = self.opts.semantics == "boolean"
        g = EinsumGraph()
        b = self._builder(g)
        own = set(st.preds)
        R = {p: g.input("R_" + self.ids[p], self.an.shape(p)) for p in st.preds}
        D = {p: g.input("D_" + self.ids[p], self.an.shape(p)) for p in st.preds} if boolean else {}
        F = {} if boolean else {p: g.input("F_" + self.ids[p], self.an.shape(p)) for p in st.preds}
        lower: dict[str, Tensor] = {}

        def lower_source(pred: str) -> Tensor:
            if pred not in lower:
                lower[pred] = g.input("L_" + self.ids[pred], self.an.shape(pred))
            return lower[pred]

        changes = []
        for p in st.preds:
            derived: list[Tensor] = []
            if boolean:
                for rule in st.rules:
                    if rule.head.pred != p:
                        continue
                    own_k = [
                        k
                        for k, item in enumerate(rule.body)
                        if isinstance(item, Literal) and item.atom.pred in own
                    ]
                    for dk in own_k:  # semi-naive: one variant per recursive atom, read as delta

                        def source(pred: str, k: int, dk: int = dk) -> Tensor:
                            if pred in own:
                                return D[pred] if k == dk else R[pred]
                            return lower_source(pred)

                        t = b.build(rule, source)
                        if t is not None:
                            derived.append(t)
                if derived:
                    new = S.disjoin(g, "boolean", derived) * g.one_minus(R[p])
                else:
                    new = R[p] * 0.0
                g.output(g.maximum(R[p], new), name="R_" + self.ids[p])
                g.output(new, name="D_" + self.ids[p])
                changes.append(g.sum(new))
            else:

                def source(pred: str, k: int) -> Tensor:
                    return R[pred] if pred in own else lower_source(pred)

                full = S.disjoin(
                    g, self.opts.semantics, [F[p]] + self._rules_of(b, st.rules, p, source)
                )
                g.output(full, name="R_" + self.ids[p])
                changes.append(g.max(abs(full - R[p])))
        total = changes[0]
        for c in changes[1:]:
            total = total + c if boolean else g.maximum(total, c)
        g.output(total, name="changed")
        plan = self._compile(g)
        state = {"R_" + self.ids[p]: self.env[p] for p in st.preds}
        if boolean:
            state.update({"D_" + self.ids[p]: self.env[p] for p in st.preds})
        else:
            state.update(
                {
                    "F_" + self.ids[p]: self.backend.to_device(self.an.dense_facts(p))
                    for p in st.preds
                }
            )
        fixed = {"L_" + self.ids[p]: self.env[p] for p in lower}
        if boolean and all(isinstance(self.env[p], np.ndarray) for p in st.preds):
            self._boolean_rounds(st, plan, fixed, delta, sparse_rounds)
            return
        for it in range(1, self.opts.max_iterations + 1):
            res = plan({**state, **fixed})
            changed = float(self.backend.to_host(res["changed"]))
            state.update({k: v for k, v in res.items() if k != "changed"})
            if (changed == 0.0) if boolean else (changed <= self.opts.tol):
                self.iterations[st.preds] = it
                self.round_kinds[st.preds] = "d" * it
                for p in st.preds:
                    self.env[p] = state["R_" + self.ids[p]]
                return
        self._too_many(st)

    def _too_many(self, st: Stratum) -> None:
        raise ProgramError(
            f"the recursive rules for {', '.join(map(repr, st.preds))} did not reach a fixpoint "
            f"within max_iterations={self.opts.max_iterations} rounds",
            code="max_iterations",
        )

    def _boolean_rounds(
        self,
        st: Stratum,
        plan,
        fixed: dict[str, Any],
        delta: dict[str, np.ndarray] | None = None,
        sparse_rounds: tuple[float, _RoundCosts] | None = None,
    ) -> None:
        """Semi-naive rounds on the host, each one dense (the compiled step) or sparse.

        The relations stay dense numpy arrays; the delta is either dense (after a dense round)
        or a sorted array of flat indices (after a sparse round), converted when the next
        round is of the other kind. ``sparse_rounds`` (taking over from sparse rounds: the
        last one's candidate rows per delta tuple, and their measured costs) seeds the choice.
        """
        mode = self.opts.rounds
        ids = self.ids
        # private copies: sparse rounds update the relations in place
        rel = {p: np.array(self.env[p], np.float32) for p in st.preds}
        dense_delta: dict[str, np.ndarray] | None = dict(rel)
        flat_delta: dict[str, np.ndarray] = {}
        nnz = sum(int(np.count_nonzero(a)) for a in rel.values())
        if delta is not None:  # taking over from sparse rounds: their last new tuples
            dense_delta, flat_delta = None, delta
            nnz = sum(len(a) for a in delta.values())
        sparse = None
        flops = max(plan.concrete.flops, 1)
        cost = _RoundCosts(self.opts.flops_per_candidate)
        rate = 1.0  # candidate rows per delta tuple, as last measured
        if sparse_rounds is not None:
            rate, cost = sparse_rounds
        kinds = []
        # a candidate row holds about a dozen 8-byte index entries at the peak of a round
        cap = self.opts.memory_budget / 128
        for it in range(1, self.opts.max_iterations + 1):
            budget = cap if mode == "sparse" else min(cap, flops / cost.flops_per_candidate)
            go_sparse = mode == "sparse" or (mode == "auto" and nnz * rate <= budget)
            if go_sparse:
                if sparse is None:
                    sparse = SparseStratum(
                        self.an,
                        st.preds,
                        st.rules,
                        {p: a for p, a in self.env.items() if p not in st.preds},
                    )
                if dense_delta is not None:
                    flat_delta = {p: np.flatnonzero(a) for p, a in dense_delta.items()}
                t0 = time.perf_counter()
                try:
                    flat_delta = sparse.round(rel, flat_delta, budget)
                    rate = max(sparse.ctx.candidates / max(nnz, 1), 1e-3)
                    dense_delta = None
                    nnz = sum(len(a) for a in flat_delta.values())
                    kinds.append("s")
                except OverBudget:
                    # try sparse again once the delta has shrunk to half of this one
                    rate = 2 * budget / max(nnz, 1)
                    go_sparse = False
                    kinds.append("x")
                cost.sparse(time.perf_counter() - t0, sparse.ctx.candidates)
            if not go_sparse:
                if dense_delta is None:
                    dense_delta = {}
                    for p in st.preds:
                        d = np.zeros(rel[p].shape, np.float32)
                        d.reshape(-1)[flat_delta[p]] = 1.0
                        dense_delta[p] = d
                inputs = {"R_" + ids[p]: rel[p] for p in st.preds}
                inputs.update({"D_" + ids[p]: dense_delta[p] for p in st.preds})
                t0 = time.perf_counter()
                res = plan({**inputs, **fixed})
                cost.dense(time.perf_counter() - t0, flops)
                rel = {p: res["R_" + ids[p]] for p in st.preds}
                dense_delta = {p: res["D_" + ids[p]] for p in st.preds}
                nnz = int(float(res["changed"]))
                if len(kinds) < it:  # not already marked as an attempt over budget
                    kinds.append("d")
            if nnz == 0:
                self.iterations[st.preds] = it
                self.round_kinds[st.preds] = "".join(kinds)
                for p in st.preds:
                    self.env[p] = rel[p]
                return
        self._too_many(st)

    def results(self) -> dict[str, Relation]:
        """Every relation as a Relation (sparse or dense, host copies)."""
        an = self.an
        if an.arithmetic:
            self._final_domains()
        weighted = self.opts.semantics != "boolean"
        out = {}
        for p in an.predicates:
            cur = self.env.get(p)
            if cur is None:
                cur = self._sparse(p)
            n = an.arity.get(p, 0)
            doms = [an.domains.position_ids(p, i) for i in range(n)]
            if isinstance(cur, Rel):
                out[p] = Relation(
                    p,
                    n,
                    an.symbols,
                    doms,
                    rel=cur,
                    weighted=weighted,
                    memory_budget=self.opts.memory_budget,
                )
            else:
                out[p] = Relation(
                    p,
                    n,
                    an.symbols,
                    doms,
                    dense=np.asarray(self.backend.to_host(cur)),
                    weighted=weighted,
                    memory_budget=self.opts.memory_budget,
                )
        return out

    def _final_domains(self) -> None:
        """Arithmetic added constants: each domain is what its positions hold, in value order."""
        dom = self.an.domains
        parts: dict[int, list[np.ndarray]] = {d: [ids] for d, ids in enumerate(dom.ids)}
        for p in self.an.predicates:
            cur = self._sparse(p)
            for i, c in enumerate(cur.cols):
                parts[dom.of_position[(p, i)]].append(c)
        rank = self.an.symbols.rank()
        for d, ps in parts.items():
            ids = sorted_unique(np.concatenate(ps))
            dom.ids[d] = ids[np.argsort(rank[ids], kind="stable")]
        dom.__post_init__()


def _source(rels: dict[str, Rel], lower: dict[str, Rel]):
    def src(pred: str, k: int) -> Rel:
        return rels[pred] if pred in rels else lower[pred]

    return src


def _build(parts: list, arity: int, ctx: Context) -> Rel:
    """One relation from several (columns, count, weights) parts, deduplicated."""
    parts = [p for p in parts if p[1]]
    weighted = ctx.weighted
    if not parts:
        return Rel.empty(arity, weighted)
    cols = [np.concatenate([p[0][i] for p in parts]) for i in range(arity)]
    n = sum(p[1] for p in parts)
    w = (
        np.concatenate([p[2] if p[2] is not None else np.ones(p[1]) for p in parts])
        if weighted
        else None
    )
    return Rel.build(cols, n, w, ctx.bits, ctx.sem)


def _close(a: Rel, b: Rel, bits: int, tol: float) -> bool:
    """Same tuples, and weights within ``tol``."""
    if a.n != b.n:
        return False
    if a.arity == 0:
        return a.n == 0 or abs(float(a.w[0]) - float(b.w[0])) <= tol
    idx = a.find(b.cols, bits)
    if (idx < 0).any():
        return False
    return a.w is None or float(np.max(np.abs(a.w[idx] - b.w), initial=0.0)) <= tol


class _RoundCosts:
    """What a sparse candidate row costs in dense FLOPs: fixed when given, else measured.

    BLAS throughput and the cost of numpy gathers vary with the machine and its load in
    different ways, so the "auto" choice calibrates itself from the latest dense round and the
    latest sparse round that was large enough to time (at least MIN_CANDIDATES rows and a
    quarter of the largest one so far: a small round is mostly fixed overhead).
    """

    MIN_CANDIDATES = 1000

    def __init__(self, fixed: float | None) -> None:
        self.fixed = fixed
        self.flops_per_candidate = fixed if fixed is not None else FLOPS_PER_CANDIDATE
        self._per_flop: float | None = None
        self._per_candidate: float | None = None
        self._largest = 0

    def sparse(self, seconds: float, candidates: int) -> None:
        """Record a sparse round (or an attempt stopped over budget)."""
        if candidates >= max(self.MIN_CANDIDATES, self._largest // 4):
            self._largest = max(self._largest, candidates)
            self._per_candidate = seconds / candidates
            self._update()

    def dense(self, seconds: float, flops: int) -> None:
        """Record a dense round."""
        self._per_flop = seconds / flops
        self._update()

    def _update(self) -> None:
        if self.fixed is None and self._per_flop and self._per_candidate:
            self.flops_per_candidate = self._per_candidate / self._per_flop


def _uses(rule: Rule, preds: tuple[str, ...]) -> bool:
    return any(isinstance(b, Literal) and b.atom.pred in preds for b in rule.body)


def evaluate_rules(
    rules: list[Rule], facts: dict[str, FactTable], opts: Options
) -> tuple[Analysis, dict[str, Relation], Evaluator]:
    """Analyze and evaluate; returns the analysis, every relation, the evaluator."""
    an = analyze(rules, facts)
    ev = Evaluator(an, opts)
    ev.run()
    return an, ev.results(), ev


class Relations(dict):
    """``{relation: set of tuples or Relation}``; looking up a relation the program never
    mentions raises UnknownPredicateError (code ``unknown_predicate``, also a KeyError)."""

    def __missing__(self, key: object) -> set[tuple]:
        known = ", ".join(sorted(self)) or "none"
        raise UnknownPredicateError(
            f"unknown relation {key!r}; the program's relations are: {known}", relation=key
        )


def decode_all(an: Analysis, rels: Mapping[str, Relation]) -> Relations:
    """Every relation as a set of tuples."""
    return Relations({p: rels[p].to_set() for p in an.predicates})
