"""Learning the weights of rules and facts under the fuzzy and probabilistic semantics.

The program's rules become one differentiable graph over dense relations (the dense joins of
``joins.RuleBuilder``: product conjunction, ``max`` or noisy-or projection and disjunction),
recursive strata unrolled for a fixed number of rounds, each round ``facts OR rules(previous
round)`` as the fixpoint iteration computes it. A learned rule weight ``sigmoid(theta_r)``
scales what the rule derives; a learned fact weight ``sigmoid(theta)`` replaces each given
fact's weight (facts not given stay false). The loss is the mean binary cross-entropy between
the derived values and the examples' targets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import ProgramError
from ..ir.graph import EinsumGraph, Tensor
from . import semantics as S
from .facts import normalize_facts
from .fixpoint import Analysis, analyze
from .joins import RuleBuilder

_EPS = 1e-6


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def rule_label(rule) -> str:
    """How a rule is named in ``Program.rule_weights``: its head and line."""
    return f"{rule.head.pred} (line {rule.pos.line})" if rule.pos.line else rule.head.pred


class WeightedGraph:
    """The graph of a program's rules with learnable weights, and how to read it back."""

    def __init__(
        self,
        rules: list,
        facts: Mapping[str, Iterable],
        semantics: str,
        learn_rules: bool,
        learn_facts: Iterable[str],
        rounds: int | None,
        init_rule_weight: float,
        memory_budget: int,
    ) -> None:
        if semantics not in ("fuzzy", "probabilistic"):
            raise ProgramError(
                f"weights are learned under the 'fuzzy' or 'probabilistic' "
                f"semantics, got {semantics!r} (Boolean truth values have no "
                "gradient)",
                code="invalid_option",
            )
        an: Analysis = analyze(rules, normalize_facts(dict(facts)))
        if an.arithmetic:
            raise ProgramError(
                "weights cannot be learned for rules with arithmetic", code="invalid_option"
            )
        self.an = an
        learn_facts = list(learn_facts)
        unknown = [p for p in learn_facts if p not in an.predicates]
        if unknown:
            raise ProgramError(
                f"learn_facts names {unknown}, which are no relations of the "
                f"program; its relations are {list(an.predicates)}",
                code="unknown_predicate",
            )
        g = self.g = EinsumGraph()
        b = RuleBuilder(g, semantics, an.domains, an.rule_ids, memory_budget)
        env: dict[str, Tensor] = {}
        self.fact_params: dict[str, tuple[str, np.ndarray]] = {}
        for k, pred in enumerate(an.predicates):
            base = an.dense_facts(pred)
            if pred in learn_facts:
                mask = (base > 0).astype(np.float32)
                theta = g.parameter(
                    f"fact_{k}", np.where(mask > 0, _logit(base), 0.0).astype(np.float32)
                )
                env[pred] = g.sigmoid(theta) * g.constant(mask)
                self.fact_params[pred] = (theta.name, mask)
            else:
                env[pred] = g.constant(base)
        self.rule_params: dict[str, str] = {}
        weight: dict[int, Tensor] = {}
        if learn_rules:
            for r, rule in enumerate(an.rules):
                w = g.parameter(f"rule_{r}", np.float32(_logit(np.float64(init_rule_weight))))
                weight[id(rule)] = g.sigmoid(w)
                self.rule_params[rule_label(rule)] = w.name
        for st in an.strata:
            if not st.rules:
                continue
            base = {p: env[p] for p in st.preds}
            cur = dict(base)
            n = (
                (
                    rounds
                    if rounds is not None
                    else max(max(an.shape(p), default=1) for p in st.preds)
                )
                if st.recursive
                else 1
            )
            for _ in range(n):

                def source(pred: str, _k: int, cur=cur) -> Tensor:
                    return cur[pred] if pred in cur else env[pred]

                new = {}
                for p in st.preds:
                    parts = [base[p]]
                    for rule in st.rules:
                        if rule.head.pred != p:
                            continue
                        t = b.build(rule, source)
                        if t is not None:
                            parts.append(t * weight[id(rule)] if id(rule) in weight else t)
                    new[p] = S.disjoin(g, semantics, parts)
                cur = new
            env.update(cur)
        self.env = env

    def cells(self, pred: str, rows: Mapping[tuple, float]) -> tuple[np.ndarray, np.ndarray]:
        """Dense target and mask of ``pred`` for examples ``{tuple: target}``."""
        an = self.an
        if pred not in self.env:
            raise ProgramError(
                f"examples name {pred!r}, which is no relation of the program",
                code="unknown_predicate",
            )
        shape = an.shape(pred)
        target = np.zeros(shape, np.float32)
        mask = np.zeros(shape, np.float32)
        arity = an.arity.get(pred, 0)
        for tup, value in rows.items():
            tup = tup if isinstance(tup, tuple) else (tup,)
            if len(tup) != arity:
                raise ProgramError(
                    f"example {tup!r} of {pred!r} has {len(tup)} values; expected {arity}",
                    code="arity_mismatch",
                )
            v = float(value)
            if not 0.0 <= v <= 1.0:
                raise ProgramError(
                    f"example {tup!r} of {pred!r}: target {value!r} is not in [0, 1]",
                    code="invalid_fact",
                )
            idx = []
            for i, c in enumerate(tup):
                d = an.domains.of_position[(pred, i)]
                pos = an.domains.index[d].get(c)
                if pos is None:
                    raise ProgramError(
                        f"example {tup!r} of {pred!r}: {c!r} is not a constant "
                        f"of argument {i} (no fact or rule mentions it there)",
                        code="invalid_fact",
                    )
                idx.append(pos)
            target[tuple(idx)] = v
            mask[tuple(idx)] = 1.0
        return target, mask

    def add_loss(self, examples: Mapping[str, Mapping[tuple, float]]) -> None:
        """Output ``loss``: the mean cross-entropy over every example cell."""
        g = self.g
        total, count = None, 0.0
        for pred, rows in examples.items():
            if not isinstance(rows, Mapping):
                raise ProgramError(
                    f"examples of {pred!r} must be a dict tuple -> target", code="invalid_fact"
                )
            target, mask = self.cells(pred, rows)
            p = self.env[pred]
            t = g.constant(target)
            ce = -(t * g.log(p + _EPS) + (1.0 - t) * g.log(1.0 + _EPS - p))
            part = g.sum(ce * g.constant(mask))
            total = part if total is None else total + part
            count += float(mask.sum())
        if total is None or count == 0:
            raise ProgramError("fit_weights: no examples given", code="missing_data")
        g.output(total * (1.0 / count), name="loss")
        for k, pred in enumerate(self.an.predicates):
            g.output(self.env[pred] * 1.0, name=f"rel_{k}")

    def read(
        self, plan: Any
    ) -> tuple[dict[str, float], dict[str, dict[tuple, float]], dict[str, np.ndarray]]:
        """Learned rule weights, learned fact weights, and every relation's dense values."""
        params = {k: np.asarray(plan.backend.to_host(v)) for k, v in plan.parameters.items()}
        sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
        rules = {label: float(sig(params[name])) for label, name in self.rule_params.items()}
        facts = {}
        for pred, (name, mask) in self.fact_params.items():
            w = sig(params[name])
            dom = [
                self.an.domains.values[self.an.domains.of_position[(pred, i)]]
                for i in range(mask.ndim)
            ]
            facts[pred] = {
                tuple(dom[i][j] for i, j in enumerate(ix)): float(w[ix])
                for ix in zip(*np.nonzero(mask))
            }
        out = plan({}, to_host=True)
        rels = {pred: np.asarray(out[f"rel_{k}"]) for k, pred in enumerate(self.an.predicates)}
        return rules, facts, rels


__all__ = ["WeightedGraph", "rule_label"]
