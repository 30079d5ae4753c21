"""One symbol table for a whole Datalog program: every constant gets an int64 id.

The table is built once, vectorized, from the facts' columns and the rules' constants: numbers
first in numeric order, then strings in string order, so ids compare like the values they
stand for. Arithmetic may add numbers while the fixpoint runs; they get ids at the end and
``rank`` (the canonical order) is then recomputed when an ordering comparison needs it.

Constants are identified by Python equality: ``1`` and ``1.0`` are one constant (an integral
float is kept as the int), ``"1"`` and ``1`` are two.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

INT, FLOAT, STR = 0, 1, 2
_I64 = np.iinfo(np.int64)
#: integral floats in this range look up the integer table (so 2.0 finds 2)
_EXACT = float(2**62)


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``a`` (sort based: numpy's hash-based unique is slow on
    structured integer keys)."""
    a = np.sort(a)
    if len(a) < 2:
        return a
    keep = np.empty(len(a), bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def search(sorted_keys: np.ndarray, q: np.ndarray, side: str = "left") -> np.ndarray:
    """``np.searchsorted`` with the queries sorted first: binary searches in increasing order
    stay in cache (measured 30x faster than random order on a million keys)."""
    if len(q) < 1024 or bool((q[1:] >= q[:-1]).all()):
        return np.searchsorted(sorted_keys, q, side)
    order = np.argsort(q)
    out = np.empty(len(q), np.int64)
    out[order] = np.searchsorted(sorted_keys, q[order], side)
    return out


def split_kinds(col: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A column of constants as (kind per row, int values, float values, str values).

    ``col`` is int, float, str or object dtype (checked by ``facts.py``); the value arrays hold
    only the rows of their kind, in row order. Integral floats count as ints.
    """
    n = len(col)
    if col.dtype.kind in "iub":
        return np.zeros(n, np.int8), col.astype(np.int64), np.zeros(0), np.zeros(0, object)
    if col.dtype.kind == "f":
        return _float_kinds(col.astype(np.float64))
    if col.dtype.kind == "U":
        return np.full(n, STR, np.int8), np.zeros(0, np.int64), np.zeros(0), col.astype(object)
    vals = col.tolist()
    kind = np.fromiter(
        (STR if isinstance(v, str) else FLOAT if isinstance(v, float) else INT for v in vals),
        np.int8,
        n,
    )
    if (kind == FLOAT).any():
        fi = np.flatnonzero(kind == FLOAT)
        f = np.array([vals[i] for i in fi], np.float64)
        kind[fi[(f == np.trunc(f)) & (np.abs(f) < _EXACT)]] = INT
    ints = np.array([int(v) for v, k in zip(vals, kind) if k == INT], np.int64)
    flts = np.array([v for v, k in zip(vals, kind) if k == FLOAT], np.float64)
    strs = np.empty(int((kind == STR).sum()), object)
    strs[:] = [v for v, k in zip(vals, kind) if k == STR]
    return kind, ints, flts, strs


def _float_kinds(f: np.ndarray):
    integral = (f == np.trunc(f)) & (np.abs(f) < _EXACT)
    kind = np.where(integral, INT, FLOAT).astype(np.int8)
    return kind, f[integral].astype(np.int64), f[~integral], np.zeros(0, object)


class Symbols:
    """The program's constants; id ``i`` stands for ``values()[i]``."""

    def __init__(self, ints: np.ndarray, floats: np.ndarray, strs: np.ndarray) -> None:
        ints = sorted_unique(np.asarray(ints, np.int64))
        floats = sorted_unique(np.asarray(floats, np.float64))
        strs = np.asarray(sorted(set(strs.tolist())) if len(strs) else [], object)
        # numbers in numeric order: merge ints and (non-integral) floats by value
        fv = np.concatenate([ints.astype(np.float64), floats])
        kinds = np.concatenate([np.zeros(len(ints), np.int8), np.ones(len(floats), np.int8)])
        order = np.lexsort((np.arange(len(fv)), fv)) if len(floats) else np.arange(len(fv))
        self.kind = np.concatenate([kinds[order], np.full(len(strs), STR, np.int8)])
        iv = np.concatenate([ints, np.zeros(len(floats), np.int64)])[order]
        self.ival = np.concatenate([iv, np.zeros(len(strs), np.int64)])
        self.fval = np.concatenate([fv[order], np.full(len(strs), np.nan)])
        self._int_keys = ints
        self._int_ids = np.flatnonzero(self.kind == INT).astype(np.int64)
        self._flt_keys = floats
        self._flt_ids = np.flatnonzero(self.kind == FLOAT).astype(np.int64)
        self._str_keys = strs
        self._str_ids = np.arange(len(fv), len(fv) + len(strs), dtype=np.int64)
        self._values: np.ndarray | None = None
        self._objects: np.ndarray | None = None
        self._rank: np.ndarray | None = np.arange(len(self.kind), dtype=np.int64)
        self._identity: bool | None = None
        self._all_int: bool | None = None

    # ------------------------------------------------------------------ building
    @classmethod
    def from_columns(cls, cols: Iterable[np.ndarray], consts: Iterable[object] = ()) -> Symbols:
        """The table of every constant in ``cols`` (numpy columns) and ``consts``."""
        ints, flts, strs = [np.zeros(0, np.int64)], [np.zeros(0)], [np.zeros(0, object)]
        for c in cols:
            _, i, f, s = split_kinds(c)
            ints.append(sorted_unique(i))
            flts.append(f)
            strs.append(np.asarray(sorted(set(s.tolist())), object) if len(s) else s)
        extra = np.empty(0, object)
        consts = list(consts)
        if consts:
            extra = np.empty(len(consts), object)
            extra[:] = consts
            _, i, f, s = split_kinds(extra)
            ints.append(i)
            flts.append(f)
            strs.append(s)
        return cls(np.concatenate(ints), np.concatenate(flts), np.concatenate(strs))

    def __len__(self) -> int:
        return len(self.kind)

    # ------------------------------------------------------------------ encode / decode
    @staticmethod
    def _find(keys: np.ndarray, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Ids of ``q`` in the sorted ``keys`` (-1 where absent)."""
        if len(keys) == 0 or len(q) == 0:
            return np.full(len(q), -1, np.int64)
        i = search(keys, q)
        i[i == len(keys)] = 0
        return np.where(keys[i] == q, ids[i], -1)

    def encode(self, col: np.ndarray) -> np.ndarray:
        """Ids of a column of constants; -1 for a constant not in the table."""
        kind, i, f, s = split_kinds(col)
        out = np.empty(len(col), np.int64)
        if (kind == INT).all():
            return self._find(self._int_keys, self._int_ids, i)
        out[kind == INT] = self._find(self._int_keys, self._int_ids, i)
        out[kind == FLOAT] = self._find(self._flt_keys, self._flt_ids, f)
        if len(s):
            out[kind == STR] = (
                self._find(self._str_keys, self._str_ids, np.asarray(s, object))
                if len(self._str_keys)
                else -1
            )
        return out

    def encode_value(self, v: object) -> int:
        """The id of one constant, or -1."""
        a = np.empty(1, object)
        a[0] = v
        return int(self.encode(a)[0])

    def add_numbers(self, ival: np.ndarray, fval: np.ndarray, is_int: np.ndarray) -> np.ndarray:
        """Ids of computed numbers (ints where ``is_int``, else floats), adding new ones."""
        out = np.empty(len(ival), np.int64)
        integral = is_int | ((fval == np.trunc(fval)) & (np.abs(fval) < _EXACT))
        iv = np.where(is_int, ival, np.where(integral & ~is_int, fval, 0).astype(np.int64))
        out[integral] = self._add(iv[integral], INT)
        out[~integral] = self._add(fval[~integral], FLOAT)
        return out

    def _add(self, q: np.ndarray, kind: int) -> np.ndarray:
        keys, ids = (
            (self._int_keys, self._int_ids) if kind == INT else (self._flt_keys, self._flt_ids)
        )
        got = self._find(keys, ids, q)
        miss = got < 0
        if miss.any():
            new = sorted_unique(q[miss])
            start = len(self.kind)
            new_ids = np.arange(start, start + len(new), dtype=np.int64)
            self.kind = np.concatenate([self.kind, np.full(len(new), kind, np.int8)])
            if kind == INT:
                self.ival = np.concatenate([self.ival, new])
                self.fval = np.concatenate([self.fval, new.astype(np.float64)])
            else:
                self.ival = np.concatenate([self.ival, np.zeros(len(new), np.int64)])
                self.fval = np.concatenate([self.fval, new])
            allk = np.concatenate([keys, new])
            alli = np.concatenate([ids, new_ids])
            o = np.argsort(allk, kind="stable")
            if kind == INT:
                self._int_keys, self._int_ids = allk[o], alli[o]
            else:
                self._flt_keys, self._flt_ids = allk[o], alli[o]
            self._values = self._objects = None
            self._rank = None
            self._identity = self._all_int = None
            got = self._find(
                self._int_keys if kind == INT else self._flt_keys,
                self._int_ids if kind == INT else self._flt_ids,
                q,
            )
        return got

    def values(self) -> np.ndarray:
        """Every constant by id: int64 when all are ints, else an object array."""
        if self._values is None:
            if (self.kind == INT).all():
                self._values = self.ival.copy()
            else:
                v = np.empty(len(self.kind), object)
                isint = self.kind == INT
                v[isint] = self.ival[isint].tolist()
                isf = self.kind == FLOAT
                v[isf] = self.fval[isf].tolist()
                v[self._str_ids] = self._str_keys
                self._values = v
        return self._values

    def objects(self) -> np.ndarray:
        """Every constant by id as a Python object (an object array, built once): gathering
        from it shares one object per constant instead of making one per tuple."""
        if self._objects is None or len(self._objects) != len(self.kind):
            v = self.values()
            if v.dtype != object:
                o = np.empty(len(v), object)
                o[:] = v.tolist()
                v = o
            self._objects = v
        return self._objects

    def decode(self, ids: np.ndarray) -> np.ndarray:
        """The constants of ``ids`` (int64, float64 or object, by what they hold)."""
        ids = np.asarray(ids, np.int64)
        if len(ids) == 0:
            return self.values()[:0]
        if self._identity is None:  # ints 0..n-1 in order: every id is its own value
            n = len(self.kind)
            self._identity = bool(
                (self.kind == INT).all()
                and (
                    n == 0
                    or (
                        self.ival[0] == 0
                        and self.ival[-1] == n - 1
                        and (self.ival == np.arange(n)).all()
                    )
                )
            )
        if self._identity:
            out = ids.view()
            out.flags.writeable = False  # the relation's own ids: read-only
            return out
        if self._all_int is None:
            self._all_int = bool((self.kind == INT).all())
        if self._all_int:
            return self.ival[ids]
        k = self.kind[ids]
        if (k == INT).all():
            return self.ival[ids]
        if (k == FLOAT).all():
            return self.fval[ids]
        return self.values()[ids]

    def value(self, i: int) -> object:
        """One constant."""
        return self.decode(np.array([i]))[0].item() if self.kind[i] != STR else self.values()[i]

    # ------------------------------------------------------------------ order
    def rank(self) -> np.ndarray:
        """Position of each id in the canonical order (numbers by value, then strings)."""
        if self._rank is None:
            srank = np.zeros(len(self.kind), np.int64)
            srank[self._str_ids] = np.arange(len(self._str_ids))
            order = np.lexsort((srank, self.fval, self.kind == STR))
            self._rank = np.empty(len(order), np.int64)
            self._rank[order] = np.arange(len(order))
        return self._rank

    def is_str(self) -> np.ndarray:
        """True for the ids of strings."""
        return self.kind == STR
