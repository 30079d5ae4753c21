"""Einsum specification parsing: explicit and implicit outputs, ellipsis, repeated indices.

``parse(spec, ranks)`` turns any spec numpy accepts into an ``EinsumSpec`` whose terms use letters
only (ellipsis dimensions get fresh letters), so every later stage sees one plain form.

Indices are numpy's 52 ASCII letters plus opt_einsum's extended symbols (``opt_einsum.get_symbol``:
any non-ASCII character but surrogates), so a network may have any number of indices;
``interleaved`` turns numpy's ``op0, [0, 1], op1, [1, 2], [0, 2]`` form into such a spec.
"""

from __future__ import annotations

import functools

import string
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import opt_einsum

from ..errors import ShapeError, SpecError

LETTERS = string.ascii_uppercase + string.ascii_lowercase  # numpy's implicit-output order
_LETTER_SET = frozenset(LETTERS)
MAX_INDICES = 1 << 20  # distinct indices in one einsum: far past any real network


def symbol(i: int) -> str:
    """The i-th index symbol: the 52 ASCII letters, then ``chr(i + 140)`` as opt_einsum's
    ``get_symbol``, skipping the surrogates (which ``get_symbol`` yields for 55156 <= i < 55296)."""
    if i < 52:
        return LETTERS[i]
    c = i + 140
    return chr(c if c < 0xD800 else c + 0x800)


def symbols(avoid: set[str] | frozenset[str] = frozenset()) -> Iterator[str]:
    """Every index symbol in order, skipping ``avoid`` (fresh letters never run out)."""
    i = 0
    while True:
        c = symbol(i)
        if c not in avoid:
            yield c
        i += 1


def is_index(ch: str) -> bool:
    """Whether ``ch`` may name an index: an ASCII letter or a non-ASCII, non-surrogate character
    (``get_symbol`` yields every one of those from 192 on, Unicode spaces included)."""
    if ch in _LETTER_SET:
        return True
    o = ord(ch)
    return o >= 128 and not 0xD800 <= o <= 0xDFFF


def _show(spec: str, limit: int = 120) -> str:
    """``repr(spec)`` for an error message, shortened in the middle when a network is huge."""
    r = repr(spec)
    return r if len(r) <= limit else f"{r[: limit // 2]}...{r[-limit // 2 :]} ({len(spec)} chars)"


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
                f"einsum spec {_show(spec)}: a '.' outside a complete '...' in term {_show(term)} "
                f"(operand {pos}); expected letters and at most one '...'"
            )
        if not is_index(ch):
            raise SpecError(
                f"einsum spec {_show(spec)}: invalid index character {ch!r} in term {_show(term)} "
                f"(operand {pos}); expected ASCII letters a-z, A-Z or opt_einsum's extended "
                f"symbols (non-ASCII characters, opt_einsum.get_symbol)"
            )


def parse(spec: str, ranks: list[int] | tuple[int, ...]) -> EinsumSpec:
    """Parse and normalize ``spec`` for operands of the given ranks.

    Raises SpecError for malformed specs, naming the spec and the offending term. Memoized
    (an EinsumSpec is immutable): graphs, and above all gradient graphs, repeat a few specs.
    """
    if isinstance(spec, str):
        try:
            key = tuple(int(r) for r in ranks)
        except (TypeError, ValueError):
            return _parse(spec, ranks)
        return _parse_cached(spec, key)
    return _parse(spec, ranks)


@functools.lru_cache(maxsize=4096)
def _parse_cached(spec: str, ranks: tuple[int, ...]) -> EinsumSpec:
    return _parse(spec, ranks)


def _parse(spec: str, ranks: list[int] | tuple[int, ...]) -> EinsumSpec:
    if not isinstance(spec, str):
        raise SpecError(f"einsum spec must be a string, got {type(spec).__name__}")
    raw = spec.replace(" ", "")
    if (
        raw.count("->") > 1
        or (raw.count("-") != raw.count("->"))
        or (raw.count(">") != raw.count("->"))
    ):
        raise SpecError(
            f"einsum spec {_show(spec)}: expected at most one '->' separating inputs and output"
        )
    explicit = "->" in raw
    lhs, out = raw.split("->") if explicit else (raw, None)
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise SpecError(
            f"einsum spec {_show(spec)} has {len(terms)} input "
            f"term(s) but {len(ranks)} operand(s) were given"
        )
    for i, t in enumerate(terms):
        _check_term(t, spec, i)
    if out is not None:
        if "," in out:
            raise SpecError(
                f"einsum spec {_show(spec)}: the output term {_show(out)} may not contain ','"
            )
        _check_term(out, spec, -1)

    used = set("".join(terms) + (out or "")) - {"."}
    if len(used) > MAX_INDICES:
        raise SpecError(
            f"einsum spec: {len(used)} distinct indices; expected at most {MAX_INDICES}"
        )
    n_ell = 0
    for i, (t, r) in enumerate(zip(terms, ranks)):
        named = len(t.replace("...", ""))
        if "..." in t:
            if named > r:
                raise SpecError(
                    f"einsum spec {_show(spec)}: term {_show(t)} names "
                    f"{named} indices but operand {i} has rank {r}"
                )
            n_ell = max(n_ell, r - named)
        elif named != r:
            raise SpecError(
                f"einsum spec {_show(spec)}: term {_show(t)} has {named} indices but operand {i} "
                f"has rank {r}"
            )
    fresh = symbols(used)
    ell = "".join(next(fresh) for _ in range(n_ell))

    def expand(term: str, rank: int) -> str:
        if "..." not in term:
            return term
        k = rank - len(term.replace("...", ""))
        return term.replace("...", ell[n_ell - k :] if k else "")

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
                    f"einsum spec {_show(spec)}: the inputs have {n_ell} ellipsis dimension(s) "
                    f"but the "
                    f"output {_show(out)} has no '...'; expected '...' in the output"
                )
        present = set("".join(inputs))
        for ch in output:
            if output.count(ch) > 1:
                raise SpecError(
                    f"einsum spec {_show(spec)}: output index {ch!r} appears more than once in "
                    f"{_show(out)}"
                )
            if ch not in present:
                raise SpecError(
                    f"einsum spec {_show(spec)}: output index {ch!r} does not appear in any "
                    f"input term"
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
        ch: LETTERS[26 + i] if i < 26 else symbol(i - 26) if i < 52 else symbol(i)
        for i, ch in enumerate(es.letters)
    }
    return EinsumSpec(
        tuple("".join(mapping[c] for c in t) for t in es.inputs),
        "".join(mapping[c] for c in es.output),
    )


def interleaved(args: tuple[Any, ...], where: str = "einsum") -> tuple[str, list[Any]]:
    """numpy's interleaved form ``op0, sub0, op1, sub1, ..., [out]`` as (spec, operands).

    A sublist holds non-negative ints (index ``k`` becomes ``symbol(k)``) and at most one
    ``...``. Raises SpecError naming the argument and what was expected.
    """
    n = len(args)
    if n < 2:
        raise SpecError(
            f"{where}: interleaved form needs an operand and its sublist, got {n} argument(s)"
        )
    operands = list(args[0 : n - n % 2 : 2])
    subs = list(args[1 : n - n % 2 : 2])
    out = args[-1] if n % 2 else None

    def term(sub: Any, what: str) -> str:
        if isinstance(sub, np.ndarray):
            sub = sub.tolist()
        if not isinstance(sub, (list, tuple)):
            raise SpecError(
                f"{where}: {what} is a {type(sub).__name__}; expected a list of "
                f"index integers (and at most one ...)"
            )
        parts = []
        for j, k in enumerate(sub):
            if k is Ellipsis:
                if "..." in parts:
                    raise SpecError(f"{where}: {what} has more than one '...'")
                parts.append("...")
            elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
                if not 0 <= int(k) < MAX_INDICES:
                    raise SpecError(
                        f"{where}: {what} entry {j} is {int(k)}; expected an index "
                        f"in [0, {MAX_INDICES})"
                    )
                parts.append(symbol(int(k)))
            else:
                raise SpecError(
                    f"{where}: {what} entry {j} is {k!r} "
                    f"({type(k).__name__}); expected a non-negative int or ..."
                )
        return "".join(parts)

    terms = [term(s, f"sublist of operand {i} (argument {2 * i + 1})") for i, s in enumerate(subs)]
    spec = ",".join(terms)
    if out is not None:
        spec += "->" + term(out, f"output sublist (argument {n - 1})")
    return spec, operands


def ascii_spec(spec: str) -> str | None:
    """``spec`` with its symbols renamed to ASCII letters (what numpy's einsum reads), or None
    when it has more than 52 distinct indices. Renaming keeps the implicit output's order."""
    used = sorted({c for c in spec if is_index(c)})
    if all(c in _LETTER_SET for c in used):
        return spec
    if len(used) > 52:
        return None
    table = {ord(c): LETTERS[i] for i, c in enumerate(used)}
    return spec.translate(table)


def np_einsum(spec: str, *xs: Any, **kw: Any) -> Any:
    """``np.einsum`` for any spec: extended symbols are renamed to letters, and a spec past
    52 indices runs as opt_einsum's contraction (numpy's einsum takes only letters)."""
    text = ascii_spec(spec)
    if text is not None:
        return np.einsum(text, *xs, **kw)
    out = kw.get("out")
    r = opt_einsum.contract(spec, *xs)
    if out is not None:
        out[...] = r
        return out
    return r
