"""Facts given from Python, as columns: per-tuple inputs, numpy arrays, tuples of columns or
pandas DataFrames all become one ``FactTable`` (one numpy array per argument, weights or None).

Array inputs are checked and kept whole (no Python object per tuple); the symbol table later
encodes each column with one vectorized lookup.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .analysis import check_constant, program_error


@dataclass
class FactTable:
    """The facts of one predicate: ``n`` rows, one column per argument, weights or None."""

    arity: int
    n: int
    cols: list[np.ndarray]
    weights: np.ndarray | None = None

    @classmethod
    def from_rows(cls, rows: list[tuple], weights: list[float] | None = None) -> FactTable:
        """From checked Python tuples of one length."""
        arity = len(rows[0]) if rows else 0
        cols = []
        for i in range(arity):
            c = np.empty(len(rows), object)
            c[:] = [r[i] for r in rows]
            cols.append(_tighten(c))
        w = None if weights is None else np.asarray(weights, np.float64)
        return cls(arity, len(rows), cols, w)

    def concat(self, other: FactTable) -> FactTable:
        """Both tables' rows (one arity)."""
        cols = [_concat(a, b) for a, b in zip(self.cols, other.cols)]
        if self.weights is None and other.weights is None:
            w = None
        else:
            w = np.concatenate([_ones(self), _ones(other)])
        return FactTable(self.arity, self.n + other.n, cols, w)


def _ones(t: FactTable) -> np.ndarray:
    return np.ones(t.n) if t.weights is None else t.weights


def _concat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == b.dtype.kind and a.dtype.kind in "iuf":
        return np.concatenate([a, b])
    out = np.empty(len(a) + len(b), object)
    out[: len(a)] = a.tolist()
    out[len(a) :] = b.tolist()
    return out


def _tighten(c: np.ndarray) -> np.ndarray:
    """An object column of plain ints as int64 (vectorized encoding then takes the fast path)."""
    if len(c) and all(type(v) is int for v in c.tolist()):
        try:
            return c.astype(np.int64)
        except OverflowError:
            return c
    return c


def check_column(col: object, pred: str, i: int) -> np.ndarray:
    """One argument column as a numpy array of constants, or invalid_fact."""
    a = np.asarray(col)
    if a.ndim != 1:
        raise program_error(
            "invalid_fact",
            f"column {i} of the facts of {pred!r} must be one-dimensional, got shape {a.shape}",
        )
    k = a.dtype.kind
    if k in "iu":
        return a.astype(np.int64) if k == "u" and a.dtype.itemsize < 8 else a
    if k == "b":
        return a.astype(np.int64)
    if k == "f":
        if np.isnan(a).any():
            raise program_error(
                "invalid_fact",
                f"column {i} of the facts of {pred!r} holds NaN; "
                "expected constants (str, int or float, not NaN)",
            )
        return a.astype(np.float64)
    if k == "U":
        return a
    if k == "O":
        vals = a.tolist()
        if not all(isinstance(v, (str, int, float)) and not _nan(v) for v in vals):
            for v in vals:
                check_constant(v, f"column {i} of the facts of {pred!r}")
        return _tighten(a)
    raise program_error(
        "invalid_fact",
        f"column {i} of the facts of {pred!r} has dtype "
        f"{a.dtype}; expected ints, floats or strings",
    )


def _nan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _is_column(x: object) -> bool:
    return getattr(x, "ndim", None) == 1 and hasattr(x, "__len__")


def table_of(pred: str, rows: object) -> FactTable:
    """The facts of ``pred`` in any accepted form as a FactTable (raises invalid_fact)."""
    if hasattr(rows, "to_numpy") and hasattr(rows, "columns"):  # a pandas DataFrame
        cols = [check_column(rows[c].to_numpy(), pred, i) for i, c in enumerate(rows.columns)]
        return FactTable(len(cols), len(rows), cols)
    if isinstance(rows, np.ndarray):
        if rows.ndim == 1:
            return FactTable(1, len(rows), [check_column(rows, pred, 0)])
        if rows.ndim != 2:
            raise program_error(
                "invalid_fact",
                f"an array of facts of {pred!r} must be N x arity, got shape {rows.shape}",
            )
        cols = [check_column(rows[:, i], pred, i) for i in range(rows.shape[1])]
        return FactTable(rows.shape[1], rows.shape[0], cols)
    if isinstance(rows, (tuple, list)) and rows and all(_is_column(c) for c in rows):
        lens = {len(c) for c in rows}  # type: ignore[arg-type]
        if len(lens) != 1:
            raise program_error(
                "invalid_fact",
                f"the columns of the facts of {pred!r} have different lengths {sorted(lens)}",
            )
        cols = [check_column(c, pred, i) for i, c in enumerate(rows)]
        return FactTable(len(cols), lens.pop(), cols)
    weights = rows if isinstance(rows, Mapping) else None
    if weights is None and isinstance(rows, list) and rows and isinstance(rows[0], tuple):
        # a list of tuples of ints (the common case) converts in one C loop
        try:
            arr = np.array(rows)
        except (ValueError, OverflowError, TypeError):
            arr = None
        if arr is not None and arr.ndim == 2 and arr.dtype.kind == "i" and arr.shape[1]:
            return FactTable(
                arr.shape[1],
                arr.shape[0],
                [np.ascontiguousarray(arr[:, i], np.int64) for i in range(arr.shape[1])],
            )
    try:
        items = list(weights.items()) if weights is not None else [(r, 1.0) for r in rows]
    except TypeError as exc:
        raise program_error(
            "invalid_fact",
            f"facts of {pred!r} must be an iterable of tuples, got {type(rows).__name__}",
        ) from exc
    table: dict[tuple, float] = {}
    arity = None
    for row, w in items:
        if not isinstance(row, (tuple, list)):
            raise program_error(
                "invalid_fact", f"fact {row!r} of {pred!r} must be a tuple of constants"
            )
        tup = tuple(check_constant(v, f"fact {tuple(row)!r} of {pred!r}") for v in row)
        if arity is not None and len(tup) != arity:
            raise program_error(
                "arity_mismatch",
                f"fact {tup!r} of {pred!r} has {len(tup)} "
                f"argument(s) but fact {next(iter(table))!r} has {arity}",
            )
        arity = len(tup)
        try:
            wv = float(w)
        except (TypeError, ValueError) as exc:
            raise program_error(
                "invalid_fact", f"weight {w!r} of fact {tup!r} of {pred!r} must be a number"
            ) from exc
        if not 0.0 <= wv <= 1.0:
            raise program_error(
                "invalid_fact", f"weight {wv} of fact {tup!r} of {pred!r} must lie in [0, 1]"
            )
        table[tup] = max(table.get(tup, 0.0), wv)
    t = FactTable.from_rows(list(table), list(table.values()) if weights is not None else None)
    t.arity = arity if arity is not None else -1  # -1: no rows, arity unknown
    return t


def normalize_facts(facts: Mapping[str, Iterable] | None) -> dict[str, FactTable]:
    """Python facts as ``{pred: FactTable}``."""
    if facts is None:
        return {}
    if not isinstance(facts, Mapping):
        raise program_error(
            "invalid_fact",
            f"facts must map predicate names to iterables of tuples, got {type(facts).__name__}",
        )
    out: dict[str, FactTable] = {}
    for pred, rows in facts.items():
        if not isinstance(pred, str) or not pred:
            raise program_error("invalid_fact", f"predicate name {pred!r} must be a non-empty str")
        out[pred] = table_of(pred, rows)
    return out


def with_declared(tables: dict[str, FactTable], relations: Mapping[str, int]) -> None:
    """Give each ``.decl`` relation its arity: an empty table where no facts are given (so it
    exists, with that arity, even when nothing derives it); given facts must agree."""
    for pred, arity in relations.items():
        t = tables.get(pred)
        if t is None or t.arity < 0:
            tables[pred] = FactTable(arity, 0, [np.zeros(0, np.int64) for _ in range(arity)])
        elif t.arity != arity:
            row = tuple(c[0] for c in t.cols) if t.n else ()
            raise program_error(
                "arity_mismatch",
                f"fact {row!r} of {pred!r} has {t.arity} argument(s) but its .decl has {arity}",
            )
