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

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import networkx as nx

from ..errors import ProgramError
from .ast import Atom, Comparison, Const, Literal, Pos, Rule, Scalar, Var, where

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
    if isinstance(value, (str, int, float)) and value == value:  # NaN never equals itself
        return value
    raise program_error("invalid_fact", f"{what}: {value!r} is not a constant; expected a str, "
                        "int or float (not NaN)")


def normalize_facts(facts: Mapping[str, Iterable] | None) -> dict[str, dict[tuple, float]]:
    """Python facts as ``{pred: {tuple: weight}}``; a mapping value gives weights per tuple."""
    out: dict[str, dict[tuple, float]] = {}
    if facts is None:
        return out
    if not isinstance(facts, Mapping):
        raise program_error("invalid_fact", f"facts must map predicate names to iterables of "
                            f"tuples, got {type(facts).__name__}")
    for pred, rows in facts.items():
        if not isinstance(pred, str) or not pred:
            raise program_error("invalid_fact", f"predicate name {pred!r} must be a non-empty str")
        weights = rows if isinstance(rows, Mapping) else None
        table: dict[tuple, float] = {}
        try:
            items = list(weights.items()) if weights is not None else [(r, 1.0) for r in rows]
        except TypeError as exc:
            raise program_error("invalid_fact", f"facts of {pred!r} must be an iterable of "
                                f"tuples, got {type(rows).__name__}") from exc
        for row, w in items:
            if not isinstance(row, (tuple, list)):
                raise program_error("invalid_fact", f"fact {row!r} of {pred!r} must be a tuple "
                                    "of constants")
            tup = tuple(check_constant(v, f"fact {tuple(row)!r} of {pred!r}") for v in row)
            try:
                wv = float(w)
            except (TypeError, ValueError) as exc:
                raise program_error("invalid_fact", f"weight {w!r} of fact {tup!r} of {pred!r} "
                                    "must be a number") from exc
            if not 0.0 <= wv <= 1.0:
                raise program_error("invalid_fact", f"weight {wv} of fact {tup!r} of {pred!r} "
                                    "must lie in [0, 1]")
            table[tup] = max(table.get(tup, 0.0), wv)
        out[pred] = table
    return out


def atoms_of(rule: Rule) -> list[Atom]:
    """Head and body atoms of a rule."""
    return [rule.head] + [b.atom for b in rule.body if isinstance(b, Literal)]


def check_arities(rules: list[Rule], facts: Mapping[str, Mapping[tuple, float]]) -> dict[str, int]:
    """The arity of every predicate mentioned; raises arity_mismatch on a disagreement."""
    arity: dict[str, int] = {}
    origin: dict[str, str] = {}
    for rule in rules:
        for atom in atoms_of(rule):
            if atom.pred in arity and arity[atom.pred] != atom.arity:
                raise program_error(
                    "arity_mismatch", f"predicate {atom.pred!r} used with {atom.arity} "
                    f"argument(s) but {origin[atom.pred]} has {arity[atom.pred]}", atom.pos)
            if atom.pred not in arity:
                arity[atom.pred] = atom.arity
                origin[atom.pred] = f"its use at {atom.pos}" if atom.pos.line else "another use"
    for pred, table in facts.items():
        for row in table:
            if pred in arity and arity[pred] != len(row):
                raise program_error(
                    "arity_mismatch", f"fact {row!r} of {pred!r} has {len(row)} argument(s) but "
                    f"{origin[pred]} has {arity[pred]}")
            if pred not in arity:
                arity[pred] = len(row)
                origin[pred] = f"fact {row!r}"
    return arity


def bound_variables(rule: Rule) -> set[str]:
    """Variables bound by positive atoms, closed under ``X = c`` and ``X = Y`` (Y bound)."""
    bound = {v.name for b in rule.body if isinstance(b, Literal) and not b.negated
             for v in b.atom.variables()}
    changed = True
    while changed:
        changed = False
        for b in rule.body:
            if not isinstance(b, Comparison) or b.op != "=":
                continue
            for x, y in ((b.left, b.right), (b.right, b.left)):
                if isinstance(x, Var) and x.name not in bound and (
                        isinstance(y, Const) or y.name in bound):
                    bound.add(x.name)
                    changed = True
    return bound


def check_safety(rule: Rule) -> None:
    """Raise unbound_variable for a head, negated or comparison variable nothing binds."""
    bound = bound_variables(rule)
    for v in rule.head.variables():
        if v.anonymous:
            raise program_error("unbound_variable", f"anonymous variable '_' in the head of a "
                                f"rule for {rule.head.pred!r}", v.pos)
        if v.name not in bound:
            kind = "fact" if not rule.body else "rule"
            raise program_error("unbound_variable", f"variable {v.name!r} in the head of a {kind} "
                                f"for {rule.head.pred!r} is not bound by a positive body atom",
                                v.pos)
    for b in rule.body:
        terms = b.atom.args if isinstance(b, Literal) and b.negated else (
            (b.left, b.right) if isinstance(b, Comparison) else ())
        for t in terms:
            if isinstance(t, Var) and not t.anonymous and t.name not in bound:
                what = "negated atom" if isinstance(b, Literal) else "comparison"
                raise program_error("unbound_variable", f"variable {t.name!r} in a {what} of a "
                                    f"rule for {rule.head.pred!r} is not bound by a positive "
                                    "body atom", t.pos)
            if isinstance(b, Comparison) and isinstance(t, Var) and t.anonymous:
                raise program_error("unbound_variable", "anonymous variable '_' in a comparison",
                                    t.pos)


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
            raise program_error("cyclic_negation", f"{h!r} depends negatively on {a!r} through "
                                "recursion, so the program cannot be stratified", pos)
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


def _sort_key(v: Scalar) -> tuple:
    # numbers first in numeric order, then strings; equal-valued int/float collapse as in Python
    return (1, v, "") if isinstance(v, str) else (0, v, type(v).__name__)


@dataclass
class Domains:
    """Symbol tables: each argument position's domain, its sorted constants and their indices."""

    of_position: dict[tuple[str, int], int] = field(default_factory=dict)
    values: list[list[Scalar]] = field(default_factory=list)
    index: list[dict[Scalar, int]] = field(default_factory=list)
    of_var: dict[tuple[int, str], int] = field(default_factory=dict)

    def size(self, d: int) -> int:
        """Dense size of domain ``d`` (at least 1 so that no tensor has a zero dimension)."""
        return max(1, len(self.values[d]))

    def shape(self, pred: str, arity: int) -> tuple[int, ...]:
        """Dense shape of a relation."""
        return tuple(self.size(self.of_position[(pred, i)]) for i in range(arity))


def build_domains(rules: list[Rule], facts: Mapping[str, Mapping[tuple, float]],
                  arity: Mapping[str, int]) -> Domains:
    """Unify argument positions through rule variables and collect each domain's constants."""
    uf = _UnionFind()
    consts: list[tuple[Key, Scalar]] = []
    for pred, n in arity.items():
        for i in range(n):
            uf.find(("pos", pred, i))
    for r, rule in enumerate(rules):
        for atom in atoms_of(rule):
            for i, t in enumerate(atom.args):
                key = ("pos", atom.pred, i)
                if isinstance(t, Var):
                    uf.union(("var", r, t.name), key)
                else:
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
                    if isinstance(x, Var):
                        uf.find(("var", r, x.name))
    for pred, table in facts.items():
        for row in table:
            for i, v in enumerate(row):
                consts.append((("pos", pred, i), v))
    roots: dict[Key, int] = {}
    dom = Domains()
    for k in sorted(uf.parent, key=repr):
        root = uf.find(k)
        if root not in roots:
            roots[root] = len(roots)
            dom.values.append([])
    seen: list[dict[Scalar, None]] = [{} for _ in roots]
    for key, v in consts:
        seen[roots[uf.find(key)]].setdefault(v)
    for d, vals in enumerate(seen):
        dom.values[d] = sorted(vals, key=_sort_key)
        dom.index.append({v: i for i, v in enumerate(dom.values[d])})
    for k in uf.parent:
        if k[0] == "pos":
            dom.of_position[(k[1], k[2])] = roots[uf.find(k)]
        else:
            dom.of_var[(k[1], k[2])] = roots[uf.find(k)]
    return dom
