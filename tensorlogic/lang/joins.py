"""One Datalog rule as graph nodes: atoms become factors, factors are joined pairwise.

An atom ``p(X, "a", X, _)`` becomes a factor over its distinct named variables: a constant
selects with a one-hot vector, a repeated variable takes a diagonal, and ``_`` is projected away.
A negated atom is the complement of its factor, a comparison is a constant 0/1 tensor over the
domains of its variables. The factors are then joined two at a time (the pair sharing the most
variables first), projecting each variable away as soon as no remaining factor or the head needs
it. The head is finally laid out with one-hot vectors for head constants and identity matrices
for repeated head variables.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import ProgramError
from ..ir.graph import EinsumGraph, Tensor
from ..ir.spec import symbols
from . import semantics as S
from .analysis import Domains
from .ast import Comparison, Const, Literal, Rule, Scalar, Var, where

#: how a rule reads a relation: (pred, index of the body literal) -> tensor
Source = Callable[[str, int], Tensor]


def _compare(op: str, a: Scalar, b: Scalar) -> bool:
    if op == "=":
        return a == b
    if op == "!=":
        return a != b
    if isinstance(a, str) != isinstance(b, str):
        return False  # numbers and strings are not ordered against each other
    return {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op](a, b)


_ORDER = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


class RuleBuilder:
    """Builds the nodes of rules into one graph under one semantics."""

    def __init__(
        self,
        g: EinsumGraph,
        sem: str,
        domains: Domains,
        rule_ids: Mapping[int, int],
        memory_budget: int,
    ) -> None:
        self.g = g
        self.sem = sem
        self.dom = domains
        self.rule_ids = rule_ids  # id(rule) -> rule number used by the domain tables
        self.budget = memory_budget
        self._consts: dict[tuple, Tensor] = {}

    # ------------------------------------------------------------------ constants
    def _const(self, key: tuple, make: Callable[[], np.ndarray]) -> Tensor:
        t = self._consts.get(key)
        if t is None:
            t = self.g.constant(make().astype(np.float32))
            self._consts[key] = t
        return t

    def onehot(self, d: int, value: Scalar) -> Tensor:
        """A 0/1 vector over domain ``d`` selecting ``value``."""

        def make() -> np.ndarray:
            v = np.zeros(self.dom.size(d))
            v[self.dom.index[d][value]] = 1
            return v

        return self._const(("onehot", d, type(value).__name__, value), make)

    def eye(self, d: int) -> Tensor:
        """The identity over domain ``d``."""
        return self._const(("eye", d), lambda: np.eye(self.dom.size(d)))

    def _order_keys(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Per domain value: its rank in the canonical order, and whether it is a string."""
        sym = self.dom.symbols
        ids = self.dom.ids[d]
        return sym.rank()[ids], sym.is_str()[ids]

    def cmp_matrix(self, op: str, d: int) -> Tensor:
        """``M[i, j] = values[i] op values[j]`` over domain ``d`` (vectorized; the memory budget
        is checked before anything quadratic is allocated)."""
        n = self.dom.size(d)
        if 4 * n * n > self.budget:
            raise ProgramError(
                f"a comparison over a domain of {n} constants needs a dense {n} x {n} matrix: "
                f"{4 * n * n} bytes, over the memory budget of {self.budget} bytes (the sparse "
                "representation compares without one)",
                code="memory_budget",
            )

        def make() -> np.ndarray:
            m = np.zeros((n, n))
            r, is_str = self._order_keys(d)
            k = len(r)
            if op == "=":
                m[:k, :k] = r[:, None] == r[None, :]
            elif op == "!=":
                m[:k, :k] = r[:, None] != r[None, :]
            else:
                m[:k, :k] = (is_str[:, None] == is_str[None, :]) & _ORDER[op](
                    r[:, None], r[None, :]
                )
            return m

        return self._const(("cmp2", op, d), make)

    def cmp_vector(self, op: str, d: int, value: Scalar, const_left: bool) -> Tensor:
        """``v[i] = values[i] op value`` (or ``value op values[i]``) over domain ``d``."""

        def make() -> np.ndarray:
            v = np.zeros(self.dom.size(d))
            r, is_str = self._order_keys(d)
            c = self.dom.symbols.encode_value(value)  # rule constants are in the table
            rc, sc = self.dom.symbols.rank()[c], isinstance(value, str)
            if op in ("=", "!="):
                v[: len(r)] = (r == rc) if op == "=" else (r != rc)
            else:
                a, b = (rc, r) if const_left else (r, rc)
                v[: len(r)] = (is_str == sc) & _ORDER[op](a, b)
            return v

        return self._const(("cmp1", op, d, type(value).__name__, value, const_left), make)

    # ------------------------------------------------------------------ rule body
    def _budget(self, rule: Rule, letters: str, doms: Mapping[str, int]) -> None:
        n = math.prod(self.dom.size(doms[ch]) for ch in letters)
        if 4 * n > self.budget:
            sizes = ", ".join(str(self.dom.size(doms[ch])) for ch in letters)
            raise ProgramError(
                f"the rule for {rule.head.pred!r}{where(rule.pos)} needs a dense intermediate "
                f"over domains of sizes ({sizes}): {4 * n} bytes, over the memory budget of "
                f"{self.budget} bytes",
                code="memory_budget",
            )

    def build(self, rule: Rule, source: Source) -> Tensor | None:
        """The head relation derived by ``rule`` (None if a constant comparison is false)."""
        r = self.rule_ids[id(rule)]
        g = self.g
        names: dict[str, str] = {}
        doms: dict[str, int] = {}
        fresh = symbols()  # ASCII letters, then opt_einsum's symbols: never runs out

        def letter_of(var: str) -> str:
            if var not in names:
                names[var] = next(fresh)
                doms[names[var]] = self.dom.of_var[(r, var)]
            return names[var]

        factors: list[tuple[Tensor, str]] = []
        for k, item in enumerate(rule.body):
            if isinstance(item, Literal):
                t, ls = self._atom(rule, item, source(item.atom.pred, k), letter_of, fresh, doms)
                if item.negated:
                    t = S.negate(g, t)
                factors.append((t, ls))
                continue
            f = self._comparison(item, letter_of, r)
            if f is False:
                return None
            if f is not True:
                factors.append(f)
        head_vars = "".join(dict.fromkeys(letter_of(v.name) for v in rule.head.variables()))
        result, ls = self._join_all(rule, factors, head_vars, doms)
        return self._head(rule, result, ls, names, r)

    def _atom(self, rule, lit: Literal, rel: Tensor, letter_of, fresh, doms):
        atom = lit.atom
        terms, extra, ops_ = [], [], [rel]
        for i, t in enumerate(atom.args):
            d = self.dom.of_position[(atom.pred, i)]
            if isinstance(t, Var) and not t.anonymous:
                terms.append(letter_of(t.name))
                continue
            ch = next(fresh)
            doms[ch] = d
            terms.append(ch)
            if isinstance(t, Const):
                extra.append(ch)
                ops_.append(self.onehot(d, t.value))
        named = "".join(
            dict.fromkeys(
                ch for ch, t in zip(terms, atom.args) if isinstance(t, Var) and not t.anonymous
            )
        )
        anon = "".join(
            dict.fromkeys(
                ch for ch, t in zip(terms, atom.args) if isinstance(t, Var) and t.anonymous
            )
        )
        spec_in = ["".join(terms)] + extra
        mid = named + anon
        if spec_in == [mid]:
            t = rel
        else:
            # selection by one-hot vectors and diagonals is exact under every semantics
            t = self.g.einsum(",".join(spec_in) + "->" + mid, *ops_)
        return S.project(self.g, self.sem, t, mid, named), named

    def _comparison(self, c: Comparison, letter_of, r: int):
        lt, rt = c.left, c.right
        if isinstance(lt, Const) and isinstance(rt, Const):
            return _compare(c.op, lt.value, rt.value)
        if isinstance(lt, Var) and isinstance(rt, Var):
            a, b = letter_of(lt.name), letter_of(rt.name)
            d = self.dom.of_var[(r, lt.name)]
            m = self.cmp_matrix(c.op, d)
            if a == b:
                return self.g.einsum("ii->i", m), a
            return m, a + b
        var, const = (lt, rt) if isinstance(lt, Var) else (rt, lt)
        d = self.dom.of_var[(r, var.name)]
        return self.cmp_vector(c.op, d, const.value, const_left=var is rt), letter_of(var.name)

    def _join_all(self, rule, factors, head: str, doms) -> tuple[Tensor, str]:
        g, sem = self.g, self.sem
        if not factors:
            return self._const(("one",), lambda: np.ones(())), ""

        def needed(skip: set[int]) -> set[str]:
            s = set(head)
            for k, (_, ls) in enumerate(factors):
                if k not in skip:
                    s |= set(ls)
            return s

        # project each factor onto the variables something else needs
        for k, (t, ls) in enumerate(factors):
            keep = "".join(ch for ch in ls if ch in needed({k}))
            if keep != ls:
                factors[k] = (S.project(g, sem, t, ls, keep), keep)
        while len(factors) > 1:
            best = None
            for i in range(len(factors)):
                for j in range(i + 1, len(factors)):
                    li, lj = factors[i][1], factors[j][1]
                    union = set(li) | set(lj)
                    size = math.prod(self.dom.size(doms[ch]) for ch in union)
                    score = (-len(set(li) & set(lj)), size, i, j)
                    if best is None or score < best[0]:
                        best = (score, i, j)
            _, i, j = best
            (a, la), (b, lb) = factors[i], factors[j]
            rest = needed({i, j})
            union = la + "".join(ch for ch in lb if ch not in la)
            keep = "".join(ch for ch in union if ch in rest)
            self._budget(rule, keep if sem == "boolean" else union, doms)
            t = S.join(g, sem, a, la, b, lb, keep)
            factors = [f for k, f in enumerate(factors) if k not in (i, j)] + [(t, keep)]
        t, ls = factors[0]
        keep = "".join(ch for ch in ls if ch in head)
        return S.project(g, sem, t, ls, keep), keep

    def _head(self, rule: Rule, t: Tensor, ls: str, names, r: int) -> Tensor:
        terms, ops_, out, used = [ls], [t], [], set(ls)
        spare = symbols(set(names.values()))
        for i, a in enumerate(rule.head.args):
            d = self.dom.of_position[(rule.head.pred, i)]
            if isinstance(a, Var):
                ch = names[a.name]
                if ch in out:  # a repeated head variable: copy along an identity
                    ch2 = next(spare)
                    terms.append(ch + ch2)
                    ops_.append(self.eye(d))
                    ch = ch2
                out.append(ch)
            else:
                ch = next(spare)
                terms.append(ch)
                ops_.append(self.onehot(d, a.value))
                out.append(ch)
        spec = ",".join(terms) + "->" + "".join(out)
        if len(ops_) == 1 and ls == "".join(out):
            return t
        del used
        return self.g.einsum(spec, *ops_)
