"""Datalog on tensors: ``evaluate(rules, facts)`` returns every relation as a set of tuples.

Rules use the usual syntax (``ancestor(X, Z) :- parent(X, Y), ancestor(Y, Z).``) or the
paper's (``Ancestor(x,z) = Ancestor(x,y) Parent(y,z)``). A bare identifier is a variable
whatever its case; constants are quoted strings or numbers; ``_`` is an anonymous variable (each
one independent); ``not atom`` is stratified negation; ``=``, ``!=``, ``<``, ``<=``, ``>``,
``>=`` compare variables and constants (``X = c`` and ``X = Y`` with ``Y`` bound also bind
``X``; ordering compares numbers with numbers and strings with strings, and is false between a
number and a string). Facts are ground atoms in the text or Python tuples in ``facts``, where
``"1"`` and ``1`` are different constants.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .errors import ProgramError
from .lang.facts import normalize_facts, with_declared
from .lang.fixpoint import (
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_MEMORY_BUDGET,
    Options,
    Relations,
    decode_all,
    evaluate_rules,
)
from .lang.parser import parse_datalog
from .lang.relation import Relation


def _rules_text(rules: str | Iterable[str]) -> str:
    if isinstance(rules, str):
        return rules
    try:
        items = list(rules)
    except TypeError as exc:
        raise ProgramError(
            f"rules must be a string or a list of rule strings, got {type(rules).__name__}",
            code="parse_error",
        ) from exc
    for r in items:
        if not isinstance(r, str):
            raise ProgramError(
                f"each rule must be a string, got {type(r).__name__}", code="parse_error"
            )
    return "\n".join(items)


def evaluate(
    rules: str | Iterable[str],
    facts: Mapping[str, Iterable] | None = None,
    *,
    backend: str = "auto",
    semantics: str = "boolean",
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    rounds: str = "auto",
    representation: str = "auto",
    as_relations: bool = False,
) -> dict[str, set[tuple]] | dict[str, Relation]:
    """Evaluate Datalog ``rules`` over ``facts`` to a fixpoint.

    Args:
        rules: program text, or a list of rule strings (joined by new lines).
        facts: ``{predicate: facts}``, the facts an iterable of tuples, a mapping
            ``{tuple: weight}`` (weights in [0, 1] for the fuzzy and probabilistic semantics),
            an N x arity numpy array, a tuple of numpy columns or a pandas DataFrame.
        backend: a registered backend name or ``"auto"``.
        semantics: ``"boolean"`` (default), ``"fuzzy"`` or ``"probabilistic"``; a tuple is in
            the result when its value is above zero.
        max_iterations: rounds a recursive stratum may take before ``max_iterations`` is raised.
        memory_budget: bytes the dense relations may take; larger ones raise ``memory_budget``.
        rounds: how Boolean recursive rounds run on a host backend: ``"auto"`` (joins over index
            arrays while the new tuples are few, the compiled dense step otherwise, chosen round
            by round), ``"dense"`` or ``"sparse"`` (but dense for a round whose candidate rows
            would not fit ``memory_budget``). All three give the same relations.
        representation: ``"auto"`` (per stratum: dense 0/1 tensors when every relation it
            touches has at most ``DENSE_CELLS`` cells, sorted columns of symbol ids otherwise),
            ``"dense"`` or ``"sparse"``. Programs with arithmetic always run sparse.
        as_relations: return ``{name: Relation}`` (arrays, decoded lazily) instead of sets.

    Returns:
        Every predicate mentioned by the rules or the facts, mapped to its set of tuples (a dict
        whose lookup of any other name raises ``unknown_predicate``, also a KeyError).

    Raises:
        ProgramError: with ``code`` ``parse_error``, ``arity_mismatch``, ``unbound_variable``,
            ``cyclic_negation``, ``invalid_fact``, ``max_iterations``, ``memory_budget`` or
            ``invalid_option``.
    """
    parsed, declared = parse_datalog(_rules_text(rules))
    opts = Options(
        backend=backend,
        semantics=semantics,
        max_iterations=max_iterations,
        memory_budget=memory_budget,
        rounds=rounds,
        representation=representation,
    )
    tables = normalize_facts(facts)
    with_declared(tables, declared)
    an, rels, _ = evaluate_rules(parsed, tables, opts)
    if as_relations:
        return Relations(rels)
    return decode_all(an, rels)


__all__ = ["Relation", "evaluate"]
