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
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..backends import get_backend
from ..compiler.compile import compile as compile_graph
from ..errors import ProgramError, UnknownPredicateError
from ..ir.graph import EinsumGraph, Tensor
from . import semantics as S
from .analysis import (
    Domains, Stratum, build_domains, check_arities, check_safety, stratify,
)
from .ast import Const, Literal, Rule
from .joins import RuleBuilder
from .sparse import FLOPS_PER_CANDIDATE, OverBudget, SparseStratum

#: dense relations larger than this (bytes, all copies together) are refused by default
DEFAULT_MEMORY_BUDGET = 4 << 30
DEFAULT_MAX_ITERATIONS = 100_000
ROUNDS = ("auto", "dense", "sparse")


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


@dataclass
class Analysis:
    """A checked program: rules, facts, arities, domains and strata."""

    rules: list[Rule]
    facts: dict[str, dict[tuple, float]]
    arity: dict[str, int]
    domains: Domains
    strata: list[Stratum]
    rule_ids: dict[int, int] = field(default_factory=dict)

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
        for row, w in self.facts.get(pred, {}).items():
            idx = tuple(self.domains.index[self.domains.of_position[(pred, i)]][v]
                        for i, v in enumerate(row))
            arr[idx] = max(arr[idx], w)
        return arr

    def decode(self, pred: str, arr: np.ndarray) -> set[tuple]:
        """The tuples whose value is nonzero."""
        n = self.arity.get(pred, 0)
        vals = [self.domains.values[self.domains.of_position[(pred, i)]] for i in range(n)]
        if n == 0:
            return {()} if float(arr) > 0 else set()
        # whole columns at a time: index arrays -> object arrays of the constants -> lists
        cols = []
        for i, idx in enumerate(np.nonzero(np.asarray(arr) > 0)):
            table = np.empty(len(vals[i]), object)
            table[:] = vals[i]
            cols.append(table[idx].tolist())
        return set(zip(*cols))


def analyze(rules: list[Rule], facts: dict[str, dict[tuple, float]]) -> Analysis:
    """Check arities and safety, move ground empty-body rules into the facts, stratify."""
    facts = {p: dict(t) for p, t in facts.items()}
    check_arities(rules, facts)
    proper: list[Rule] = []
    for rule in rules:
        check_safety(rule)
        if not rule.body:
            row = tuple(a.value for a in rule.head.args if isinstance(a, Const))
            facts.setdefault(rule.head.pred, {})[row] = 1.0
        else:
            proper.append(rule)
    arity = check_arities(rules, facts)
    domains = build_domains(proper, facts, arity)
    preds = set(arity)
    strata = stratify(proper, preds)
    return Analysis(proper, facts, arity, domains, strata,
                    {id(r): k for k, r in enumerate(proper)})


def check_memory(an: Analysis, budget: int) -> None:
    """Refuse relations whose dense tensors (relation, delta, new) would exceed the budget."""
    total = 0
    for pred in an.predicates:
        shape = an.shape(pred)
        nbytes = 4 * math.prod(shape)
        if 3 * nbytes > budget:
            doms = ", ".join(str(s) for s in shape)
            raise ProgramError(
                f"relation {pred!r} needs a dense tensor over domains of sizes ({doms}): "
                f"{nbytes} bytes ({3 * nbytes} with its working copies), over the memory budget "
                f"of {budget} bytes", code="memory_budget", relation=pred, shape=shape)
        total += nbytes
    if total > budget:
        raise ProgramError(f"the program's relations need {total} bytes of dense tensors "
                           f"together, over the memory budget of {budget} bytes",
                           code="memory_budget")


def _ident(k: int) -> str:
    return f"r{k}"


class Evaluator:
    """Runs an analyzed program on one backend; ``env`` holds each relation as a device array."""

    def __init__(self, an: Analysis, opts: Options) -> None:
        S.check_semantics(opts.semantics)
        if not isinstance(opts.max_iterations, int) or opts.max_iterations < 1:
            raise ProgramError(f"max_iterations must be a positive int, got "
                               f"{opts.max_iterations!r}", code="invalid_option")
        if opts.rounds not in ROUNDS:
            raise ProgramError(f"rounds must be one of {ROUNDS}, got {opts.rounds!r}",
                               code="invalid_option")
        self.an = an
        self.opts = opts
        self.backend = get_backend(opts.backend)
        self.ids = {p: _ident(k) for k, p in enumerate(an.predicates)}
        self.env: dict[str, Any] = {}
        self.iterations: dict[tuple[str, ...], int] = {}
        #: per recursive stratum, one letter per round: "d" dense, "s" sparse, "x" a sparse
        #: attempt that went over its budget, after which the round ran densely
        self.round_kinds: dict[tuple[str, ...], str] = {}
        self.compiles = 0

    # ------------------------------------------------------------------ helpers
    def _compile(self, g: EinsumGraph):
        self.compiles += 1
        return compile_graph(g, backend=self.backend.name, opt_level=self.opts.opt_level)

    def _builder(self, g: EinsumGraph) -> RuleBuilder:
        return RuleBuilder(g, self.opts.semantics, self.an.domains, self.an.rule_ids,
                           self.opts.memory_budget)

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
        """Evaluate every stratum; returns ``{pred: device array}``."""
        an = self.an
        check_memory(an, self.opts.memory_budget)
        for pred in an.predicates:
            self.env[pred] = self.backend.to_device(an.dense_facts(pred))
        batch: list[Stratum] = []
        for st in an.strata:
            if not st.rules:
                continue  # facts only (or empty): already in env
            batch.append(st)
            if st.recursive:
                self._run_batch(batch)
                batch = []
                self._fixpoint(st)
        if batch:
            self._run_batch(batch)
        return self.env

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
                outs[pred] = S.disjoin(g, self.opts.semantics,
                                       [facts] + self._rules_of(b, rules, pred, source))
            for pred, t in outs.items():
                local[pred] = t
                g.output(t, name="O_" + self.ids[pred])
        plan = self._compile(g)
        res = plan({name: self.env[pred] for name, pred in inputs.items()})
        for pred in (p for st in strata for p in st.preds):
            self.env[pred] = res["O_" + self.ids[pred]]

    def _fixpoint(self, st: Stratum) -> None:
        boolean = self.opts.semantics == "boolean"
        g = EinsumGraph()
        b = self._builder(g)
        own = set(st.preds)
        R = {p: g.input("R_" + self.ids[p], self.an.shape(p)) for p in st.preds}
        D = {p: g.input("D_" + self.ids[p], self.an.shape(p)) for p in st.preds} if boolean else {}
        F = {} if boolean else {p: g.input("F_" + self.ids[p], self.an.shape(p))
                                for p in st.preds}
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
                    own_k = [k for k, item in enumerate(rule.body)
                             if isinstance(item, Literal) and item.atom.pred in own]
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
                full = S.disjoin(g, self.opts.semantics,
                                 [F[p]] + self._rules_of(b, st.rules, p, source))
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
            state.update({"F_" + self.ids[p]: self.backend.to_device(self.an.dense_facts(p))
                          for p in st.preds})
        fixed = {"L_" + self.ids[p]: self.env[p] for p in lower}
        if boolean and all(isinstance(self.env[p], np.ndarray) for p in st.preds):
            self._boolean_rounds(st, plan, fixed)
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
            f"within max_iterations={self.opts.max_iterations} rounds", code="max_iterations")

    def _boolean_rounds(self, st: Stratum, plan, fixed: dict[str, Any]) -> None:
        """Semi-naive rounds on the host, each one dense (the compiled step) or sparse.

        The relations stay dense numpy arrays; the delta is either dense (after a dense round)
        or a sorted array of flat indices (after a sparse round), converted when the next
        round is of the other kind.
        """
        mode = self.opts.rounds
        ids = self.ids
        # private copies: sparse rounds update the relations in place
        rel = {p: np.array(self.env[p], np.float32) for p in st.preds}
        dense_delta: dict[str, np.ndarray] | None = dict(rel)
        flat_delta: dict[str, np.ndarray] = {}
        nnz = sum(int(np.count_nonzero(a)) for a in rel.values())
        sparse = None
        flops = max(plan.concrete.flops, 1)
        cost = _RoundCosts(self.opts.flops_per_candidate)
        rate = 1.0  # candidate rows per delta tuple, as last measured
        kinds = []
        # a candidate row holds about a dozen 8-byte index entries at the peak of a round
        cap = self.opts.memory_budget / 128
        for it in range(1, self.opts.max_iterations + 1):
            budget = cap if mode == "sparse" else min(cap, flops / cost.flops_per_candidate)
            go_sparse = mode == "sparse" or (mode == "auto" and nnz * rate <= budget)
            if go_sparse:
                if sparse is None:
                    sparse = SparseStratum(self.an, st.preds, st.rules,
                                           {p: a for p, a in self.env.items()
                                            if p not in st.preds})
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

    def results(self) -> dict[str, np.ndarray]:
        """Host copies of every relation."""
        return {p: np.asarray(self.backend.to_host(a)) for p, a in self.env.items()}


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


def evaluate_rules(rules: list[Rule], facts: dict[str, dict[tuple, float]],
                   opts: Options) -> tuple[Analysis, dict[str, np.ndarray], Evaluator]:
    """Analyze and evaluate; returns the analysis, dense relations on the host, the evaluator."""
    an = analyze(rules, facts)
    ev = Evaluator(an, opts)
    ev.run()
    return an, ev.results(), ev


class Relations(dict):
    """``{relation: set of tuples}``; looking up a relation the program never mentions raises
    UnknownPredicateError (code ``unknown_predicate``, also a KeyError)."""

    def __missing__(self, key: object) -> set[tuple]:
        known = ", ".join(sorted(self)) or "none"
        raise UnknownPredicateError(f"unknown relation {key!r}; the program's relations are: "
                                    f"{known}", relation=key)


def decode_all(an: Analysis, dense: Mapping[str, np.ndarray]) -> Relations:
    """Every relation as a set of tuples."""
    return Relations({p: an.decode(p, dense[p]) for p in an.predicates})

