"""Einsum specification parsing: explicit and implicit outputs, ellipsis, repeated indices.

``parse(spec, ranks)`` turns any spec numpy accepts into an ``EinsumSpec`` whose terms use letters
only (ellipsis dimensions get fresh letters), so every later stage sees one plain form.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from ..errors import ShapeError, SpecError

LETTERS = string.ascii_uppercase + string.ascii_lowercase  # numpy's implicit-output order


@dataclass(frozen=True)
class EinsumSpec:
    """A normalized einsum: one letter string per operand and one for the output."""

    inputs: tuple[str, ...]
    output: str

    def __str__(self) -> str:
        return ",".join(self.inputs) + "->" + self.output

    @property
    def letters(self) -> tuple[str, ...]:
        """All letters in order of first appearance."""
        seen: dict[str, None] = {}
        for term in (*self.inputs, self.output):
            for ch in term:
                seen.setdefault(ch)
        return tuple(seen)

    @property
    def contracted(self) -> frozenset[str]:
        """Letters summed over (absent from the output)."""
        return frozenset("".join(self.inputs)) - frozenset(self.output)


def _check_term(term: str, spec: str, pos: int) -> None:
    body = term.replace("...", "", 1)
    for ch in body:
        if ch == ".":
            raise SpecError(
                f"einsum spec {spec!r}: a '.' outside a complete '...' in term {term!r} "
                f"(operand {pos}); expected letters and at most one '...'"
            )
        if ch not in LETTERS:
            raise SpecError(
                f"einsum spec {spec!r}: invalid index character {ch!r} in term {term!r} "
                f"(operand {pos}); expected ASCII letters a-z, A-Z"
            )


def parse(spec: str, ranks: list[int] | tuple[int, ...]) -> EinsumSpec:
    """Parse and normalize ``spec`` for operands of the given ranks.

    Raises SpecError for malformed specs, naming the spec and the offending term.
    """
    if not isinstance(spec, str):
        raise SpecError(f"einsum spec must be a string, got {type(spec).__name__}")
    raw = spec.replace(" ", "")
    if (
        raw.count("->") > 1
        or (raw.count("-") != raw.count("->"))
        or (raw.count(">") != raw.count("->"))
    ):
        raise SpecError(
            f"einsum spec {spec!r}: expected at most one '->' separating inputs and output"
        )
    explicit = "->" in raw
    lhs, out = raw.split("->") if explicit else (raw, None)
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise SpecError(
            f"einsum spec {spec!r} has {len(terms)} input "
            f"term(s) but {len(ranks)} operand(s) were given"
        )
    for i, t in enumerate(terms):
        _check_term(t, spec, i)
    if out is not None:
        if "," in out:
            raise SpecError(f"einsum spec {spec!r}: the output term {out!r} may not contain ','")
        _check_term(out, spec, -1)

    used = set("".join(terms) + (out or "")) - {"."}
    fresh = [c for c in LETTERS if c not in used]
    n_ell = 0
    for i, (t, r) in enumerate(zip(terms, ranks)):
        named = len(t.replace("...", ""))
        if "..." in t:
            if named > r:
                raise SpecError(
                    f"einsum spec {spec!r}: term {t!r} names "
                    f"{named} indices but operand {i} has rank {r}"
                )
            n_ell = max(n_ell, r - named)
        elif named != r:
            raise SpecError(
                f"einsum spec {spec!r}: term {t!r} has {named} indices but operand {i} has rank {r}"
            )
    if n_ell > len(fresh):
        raise SpecError(f"einsum spec {spec!r}: too many distinct indices (at most 52)")
    ell = "".join(fresh[:n_ell])

    def expand(term: str, rank: int) -> str:
        if "..." not in term:
            return term
        k = rank - len(term.replace("...", ""))
        return term.replace("...", ell[n_ell - k:] if k else "")

    inputs = tuple(expand(t, r) for t, r in zip(terms, ranks))
    if out is None:
        counts: dict[str, int] = {}
        for t in inputs:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        output = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        if "..." in out:
            output = out.replace("...", ell)
        else:
            output = out
            if n_ell:
                # numpy never sums broadcast (ellipsis) dimensions: it rejects such specs
                raise SpecError(
                    f"einsum spec {spec!r}: the inputs have {n_ell} ellipsis dimension(s) but the "
                    f"output {out!r} has no '...'; expected '...' in the output"
                )
        present = set("".join(inputs))
        for ch in output:
            if output.count(ch) > 1:
                raise SpecError(
                    f"einsum spec {spec!r}: output index {ch!r} appears more than once in {out!r}"
                )
            if ch not in present:
                raise SpecError(
                    f"einsum spec {spec!r}: output index {ch!r} does not appear in any input term"
                )
    return EinsumSpec(inputs, output)


def letter_sizes(
    es: EinsumSpec, shapes: list[tuple], spec_text: str = "", where: str = ""
) -> dict[str, object]:
    """Size of every letter, broadcasting size-1 dimensions like numpy.

    Dimensions may be ints or symbol names (str); a symbol equals only itself or broadcasts
    against 1. Raises ShapeError naming the letter and the operands that disagree.
    """
    sizes: dict[str, object] = {}
    origin: dict[str, int] = {}
    for k, (term, shape) in enumerate(zip(es.inputs, shapes)):
        for ch, d in zip(term, shape):
            if ch not in sizes or (sizes[ch] == 1 and d != 1):
                sizes[ch] = d
                origin[ch] = k
            elif d != 1 and d != sizes[ch]:
                raise ShapeError(
                    f"{where}einsum {spec_text or es}: index "
                    f"{ch!r} has size {sizes[ch]} in operand "
                    f"{origin[ch]} (shape {tuple(shapes[origin[ch]])}) but {d} in operand {k} "
                    f"(shape {tuple(shape)}); expected equal sizes (or 1 to broadcast)"
                )
    return sizes


def output_shape(es: EinsumSpec, sizes: dict[str, object]) -> tuple:
    """Shape of the einsum's result."""
    return tuple(sizes[ch] for ch in es.output)


def canonical(es: EinsumSpec) -> EinsumSpec:
    """Alpha-rename letters in order of first appearance: ``xy,yz->xz`` becomes ``ab,bc->ac``."""
    mapping = {
        ch: LETTERS[26 + i] if i < 26 else LETTERS[i - 26] for i, ch in enumerate(es.letters)
    }
    return EinsumSpec(
        tuple("".join(mapping[c] for c in t) for t in es.inputs),
        "".join(mapping[c] for c in es.output),
    )
