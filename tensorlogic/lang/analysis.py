"""Static checks and structure of a Datalog program: arities, safety, strata and domains.

* Arity: every fact and atom of one predicate has the same number of arguments.
* Safety: every head variable, every variable of a negated atom and of an ordering comparison
  is bound by a positive body atom (or by ``X = c`` / ``X = Y`` with ``Y`` bound).
* Stratification: predicates are grouped into strongly connected components of the dependency
  graph; a negative edge inside a component is negation through recursion and is rejected.
* Domains: argument positions connected through a rule variable share one domain (a symbol
  table), so each relation is a dense tensor over the domains of its positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from ..errors import ProgramError
from .ast import (
    Arith,
    Atom,
    Comparison,
    Const,
    Literal,
    Pos,
    Rule,
    Scalar,
    Var,
    term_vars,
    where,
)
from .symbols import Symbols, sorted_unique

Key = tuple  # ("pos", pred, i) for an argument position or ("var", rule_no, name)


def program_error(code: str, message: str, pos: Pos | None = None) -> ProgramError:
    """A ProgramError with ``code``; the message names the position when there is one."""
    ctx = {"line": pos.line, "column": pos.col} if pos is not None and pos.line else {}
    return ProgramError(message + (where(pos) if pos is not None else ""), code=code, **ctx)


def check_constant(value: object, what: str) -> Scalar:
    """A fact argument as a plain Python scalar (numpy scalars unwrapped)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()  # numpy scalar -> Python scalar
        except (TypeError, ValueError):
            pass
    if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
        raise program_error("invalid_fact", f"{what}: {value} does not fit in a 64-bit integer")
    if isinstance(value, (str, int, float)) and value == value:  # NaN never equals itself
        return value
    raise program_error(
        "invalid_fact",
        f"{what}: {value!r} is not a constant; expected a str, int or float (not NaN)",
    )


def atoms_of(rule: Rule) -> list[Atom]:
    """Head and body atoms of a rule."""
    return [rule.head] + [b.atom for b in rule.body if isinstance(b, Literal)]


def check_arities(rules: list[Rule], facts: Mapping[str, Any]) -> dict[str, int]:
    """The arity of every predicate mentioned; raises arity_mismatch on a disagreement.

    ``facts`` maps predicates to FactTables (arity -1: no rows, arity unknown)."""
    arity: dict[str, int] = {}
    origin: dict[str, str] = {}
    for rule in rules:
        for atom in atoms_of(rule):
            if atom.pred in arity and arity[atom.pred] != atom.arity:
                raise program_error(
                    "arity_mismatch",
                    f"predicate {atom.pred!r} used with {atom.arity} "
                    f"argument(s) but {origin[atom.pred]} has {arity[atom.pred]}",
                    atom.pos,
                )
            if atom.pred not in arity:
                arity[atom.pred] = atom.arity
                origin[atom.pred] = f"its use at {atom.pos}" if atom.pos.line else "another use"
    for pred, table in facts.items():
        if table.arity < 0:
            continue
        if pred in arity and arity[pred] != table.arity:
            what = (
                f"fact {tuple(c[0] for c in table.cols)!r} of {pred!r} has"
                if table.n
                else f"{pred!r} is declared with"
            )
            raise program_error(
                "arity_mismatch",
                f"{what} {table.arity} argument(s) but {origin[pred]} has {arity[pred]}",
            )
        if pred not in arity:
            arity[pred] = table.arity
            origin[pred] = "its facts"
    for pred in facts:
        arity.setdefault(pred, 0)
    return arity


def desugar(rule: Rule, start: int = 0) -> Rule:
    """Arithmetic in atoms moved into comparisons: ``p(X+1) :- ...`` becomes
    ``p(V) :- ..., V = X+1`` with a fresh variable V (named so that no program can clash)."""
    extra: list[Comparison] = []

    def fresh(t):
        if not isinstance(t, Arith):
            return t
        v = Var(f"#{start + len(extra)}", t.pos)
        extra.append(Comparison("=", v, t, t.pos))
        return v

    head = Atom(rule.head.pred, tuple(fresh(t) for t in rule.head.args), rule.head.pos)
    body = []
    for b in rule.body:
        if isinstance(b, Literal) and any(isinstance(t, Arith) for t in b.atom.args):
            a = b.atom
            b = Literal(Atom(a.pred, tuple(fresh(t) for t in a.args), a.pos), b.negated)
        body.append(b)
    if not extra:
        return rule
    return Rule(head, tuple(body) + tuple(extra), rule.pos)


def has_arithmetic(rules: Iterable[Rule]) -> bool:
    """Whether any comparison of ``rules`` computes (their domains then grow while they run)."""
    return any(
        isinstance(t, Arith)
        for r in rules
        for b in r.body
        if isinstance(b, Comparison)
        for t in (b.left, b.right)
    )


def bound_variables(rule: Rule) -> set[str]:
    """Variables bound by positive atoms, closed under ``X = term`` (the term's variables
    bound)."""
    bound = {
        v.name
        for b in rule.body
        if isinstance(b, Literal) and not b.negated
        for v in b.atom.variables()
    }
    changed = True
    while changed:
        changed = False
        for b in rule.body:
            if not isinstance(b, Comparison) or b.op != "=":
                continue
            for x, y in ((b.left, b.right), (b.right, b.left)):
                if (
                    isinstance(x, Var)
                    and x.name not in bound
                    and all(v.name in bound for v in term_vars(y))
                ):
                    bound.add(x.name)
                    changed = True
    return bound


def check_safety(rule: Rule) -> None:
    """Raise unbound_variable for a head, negated or comparison variable nothing binds."""
    bound = bound_variables(rule)
    for v in rule.head.variables():
        if v.anonymous:
            raise program_error(
                "unbound_variable",
                f"anonymous variable '_' in the head of a rule for {rule.head.pred!r}",
                v.pos,
            )
        if v.name not in bound and not v.name.startswith("#"):  # "#": see its comparison
            kind = "fact" if not rule.body else "rule"
            raise program_error(
                "unbound_variable",
                f"variable {v.name!r} in the head of a {kind} "
                f"for {rule.head.pred!r} is not bound by a positive body atom",
                v.pos,
            )
    for b in rule.body:
        if isinstance(b, Literal) and not b.negated:
            for t in b.atom.args:
                for v in term_vars(t) if isinstance(t, Arith) else ():
                    if v.anonymous:
                        raise program_error(
                            "unbound_variable",
                            "anonymous variable '_' in an arithmetic term",
                            v.pos,
                        )
            continue
        terms = b.atom.args if isinstance(b, Literal) else (b.left, b.right)
        for t in terms:
            for v in term_vars(t):
                if isinstance(b, Comparison) and v.anonymous:
                    raise program_error(
                        "unbound_variable", "anonymous variable '_' in a comparison", v.pos
                    )
                if not v.anonymous and v.name not in bound and not v.name.startswith("#"):
                    what = "negated atom" if isinstance(b, Literal) else "comparison"
                    raise program_error(
                        "unbound_variable",
                        f"variable {v.name!r} in a {what} of a "
                        f"rule for {rule.head.pred!r} is not bound by a positive "
                        "body atom",
                        v.pos,
                    )


@dataclass
class Stratum:
    """One strongly connected component of the dependency graph, with its rules."""

    preds: tuple[str, ...]
    rules: list[Rule]
    recursive: bool


def stratify(rules: list[Rule], preds: Iterable[str]) -> list[Stratum]:
    """Components in evaluation order; raises cyclic_negation for negation through recursion."""
    g = nx.DiGraph()
    g.add_nodes_from(sorted(preds))
    neg_edges: dict[tuple[str, str], Pos] = {}
    for rule in rules:
        for b in rule.body:
            if isinstance(b, Literal):
                g.add_edge(b.atom.pred, rule.head.pred)
                if b.negated:
                    neg_edges.setdefault((b.atom.pred, rule.head.pred), b.atom.pos)
    cond = nx.condensation(g)
    members = cond.graph["mapping"]
    for (a, h), pos in neg_edges.items():
        if members[a] == members[h]:
            raise program_error(
                "cyclic_negation",
                f"{h!r} depends negatively on {a!r} through "
                "recursion, so the program cannot be stratified",
                pos,
            )
    by_head: dict[str, list[Rule]] = {}
    for rule in rules:
        by_head.setdefault(rule.head.pred, []).append(rule)
    strata = []
    for c in nx.lexicographical_topological_sort(cond, key=lambda c: min(cond.nodes[c]["members"])):
        ps = tuple(sorted(cond.nodes[c]["members"]))
        rs = [r for p in ps for r in by_head.get(p, [])]
        recursive = len(ps) > 1 or g.has_edge(ps[0], ps[0])
        strata.append(Stratum(ps, rs, recursive))
    return strata


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}

    def find(self, k: Key) -> Key:
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: Key, b: Key) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb, key=repr)] = min(ra, rb, key=repr)


class _PerDomain:
    """A list-like view that builds one entry per domain on first use."""

    def __init__(self, make) -> None:
        self._make = make
        self._cache: dict[int, Any] = {}

    def __getitem__(self, d: int):
        if d not in self._cache:
            self._cache[d] = self._make(d)
        return self._cache[d]


@dataclass
class Domains:
    """Symbol tables: each argument position's domain, its constants' ids (sorted, so in the
    canonical order of the values) and, built on first use, their values and indices."""

    of_position: dict[tuple[str, int], int] = field(default_factory=dict)
    of_var: dict[tuple[int, str], int] = field(default_factory=dict)
    ids: list[np.ndarray] = field(default_factory=list)
    symbols: Symbols | None = None

    def __post_init__(self) -> None:
        self.values = _PerDomain(lambda d: self.symbols.decode(self.ids[d]).tolist())
        self.index = _PerDomain(lambda d: {v: i for i, v in enumerate(self.values[d])})

    def size(self, d: int) -> int:
        """Dense size of domain ``d`` (at least 1 so that no tensor has a zero dimension)."""
        return max(1, len(self.ids[d]))

    def shape(self, pred: str, arity: int) -> tuple[int, ...]:
        """Dense shape of a relation."""
        return tuple(self.size(self.of_position[(pred, i)]) for i in range(arity))

    def position_ids(self, pred: str, i: int) -> np.ndarray:
        """The sorted symbol ids of the domain of argument ``i`` of ``pred``."""
        return self.ids[self.of_position[(pred, i)]]


def build_domains(
    rules: list[Rule],
    fact_ids: Mapping[str, list[np.ndarray]],
    arity: Mapping[str, int],
    symbols: Symbols,
) -> Domains:
    """Unify argument positions through rule variables and collect each domain's constants
    (``fact_ids``: each predicate's facts as columns of symbol ids)."""
    uf = _UnionFind()
    consts: list[tuple[Key, object]] = []
    for pred, n in arity.items():
        for i in range(n):
            uf.find(("pos", pred, i))
    for r, rule in enumerate(rules):
        for atom in atoms_of(rule):
            for i, t in enumerate(atom.args):
                key = ("pos", atom.pred, i)
                if isinstance(t, Var):
                    uf.union(("var", r, t.name), key)
                elif isinstance(t, Const):
                    consts.append((key, t.value))
        for b in rule.body:
            if isinstance(b, Comparison):
                lt, rt = b.left, b.right
                if isinstance(lt, Var) and isinstance(rt, Var):
                    uf.union(("var", r, lt.name), ("var", r, rt.name))
                elif b.op == "=":
                    for x, y in ((lt, rt), (rt, lt)):
                        if isinstance(x, Var) and isinstance(y, Const):
                            consts.append((("var", r, x.name), y.value))
                for x in (lt, rt):
                    for v in term_vars(x):
                        uf.find(("var", r, v.name))
    roots: dict[Key, int] = {}
    dom = Domains(symbols=symbols)
    for k in sorted(uf.parent, key=repr):
        root = uf.find(k)
        if root not in roots:
            roots[root] = len(roots)
    parts: list[list[np.ndarray]] = [[] for _ in roots]
    for key, v in consts:
        i = symbols.encode_value(v)
        if i >= 0:
            parts[roots[uf.find(key)]].append(np.array([i], np.int64))
    for pred, cols in fact_ids.items():
        for i, c in enumerate(cols):
            parts[roots[uf.find(("pos", pred, i))]].append(c)
    dom.ids = [sorted_unique(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]
    for k in uf.parent:
        if k[0] == "pos":
            dom.of_position[(k[1], k[2])] = roots[uf.find(k)]
        else:
            dom.of_var[(k[1], k[2])] = roots[uf.find(k)]
    return dom
