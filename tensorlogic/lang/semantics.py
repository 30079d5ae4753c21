"""How truth values combine: Boolean, fuzzy (product / max) and probabilistic (noisy-or).

A semantics says how to join two relations (conjunction followed by projecting variables away),
how to project variables away from one relation (existential quantification), how to combine
several derivations of one tuple (disjunction) and how to negate. Each builds graph nodes.

* ``boolean`` (default): values are exactly 0 or 1. A join is an einsum (a count of matches)
  followed by ``step`` -- the step after each join keeps counts from growing along a chain of
  joins. Disjunction is ``maximum``. Negation is ``1 - x``.
* ``fuzzy``: values in [0, 1]; conjunction is the product, existential projection and
  disjunction are ``max`` (the max-product / Viterbi semiring). Negation is ``1 - x``.
* ``probabilistic``: values in [0, 1]; conjunction is the product, projection and disjunction
  are noisy-or ``1 - prod(1 - p)``, which treats derivations as independent events.
  Negation is ``1 - x``. Recursive programs iterate to a numerical fixpoint.
"""

from __future__ import annotations

from ..errors import ProgramError
from ..ir.graph import EinsumGraph, Tensor

SEMANTICS = ("boolean", "fuzzy", "probabilistic")


def check_semantics(name: object) -> str:
    """``name`` if it is a known semantics, else a ProgramError(code='invalid_option')."""
    if name not in SEMANTICS:
        raise ProgramError(
            f"unknown semantics {name!r}; expected one of {SEMANTICS}", code="invalid_option"
        )
    return name  # type: ignore[return-value]


def _spec(terms: list[str], out: str) -> str:
    return ",".join(terms) + "->" + out


def project(g: EinsumGraph, sem: str, t: Tensor, letters: str, keep: str) -> Tensor:
    """Quantify away the letters of ``letters`` not in ``keep`` (result ordered as ``keep``)."""
    gone = [k for k, ch in enumerate(letters) if ch not in keep]
    if not gone:
        return t if letters == keep else g.einsum(_spec([letters], keep), t)
    if sem == "boolean":
        return g.step(g.einsum(_spec([letters], keep), t))
    order = "".join(ch for ch in letters if ch in keep)
    if sem == "fuzzy":
        r = g.max(t, axis=tuple(gone))
    else:
        r = g.one_minus(g.prod(g.one_minus(t), axis=tuple(gone)))
    return r if order == keep else g.einsum(_spec([order], keep), r)


def join(g: EinsumGraph, sem: str, a: Tensor, la: str, b: Tensor, lb: str, keep: str) -> Tensor:
    """Conjunction of two relations, projected onto ``keep``."""
    union = la + "".join(ch for ch in lb if ch not in la)
    if sem == "boolean":
        r = g.einsum(_spec([la, lb], keep), a, b)
        return g.step(r) if set(union) - set(keep) else r
    r = g.einsum(_spec([la, lb], union), a, b)
    return project(g, sem, r, union, keep)


def disjoin(g: EinsumGraph, sem: str, ts: list[Tensor]) -> Tensor:
    """Disjunction of relations of one shape."""
    out = ts[0]
    if sem == "probabilistic":
        if len(ts) == 1:
            return out
        miss = g.one_minus(ts[0])
        for t in ts[1:]:
            miss = miss * g.one_minus(t)
        return g.one_minus(miss)
    for t in ts[1:]:
        out = g.maximum(out, t)
    return out


def negate(g: EinsumGraph, t: Tensor) -> Tensor:
    """Negation (complement)."""
    return g.one_minus(t)
