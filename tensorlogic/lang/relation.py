"""``Relation``: a Datalog result held as arrays, decoded to the user's values only on demand.

A relation keeps its tuples as columns of symbol ids (sparse) or as the dense 0/1 (or weight)
tensor the dense engine produced; ``columns`` decodes each argument with one vectorized
gather, so a ten-million-tuple result costs no Python object until it is iterated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from ..errors import MissingDependencyError, ProgramError
from .relset import Rel
from .symbols import Symbols, search


class Relation:
    """The tuples of one relation.

    ``len(r)``, ``tuple in r`` and iteration (tuples of Python values) work as on a set;
    ``r.columns`` is one numpy array per argument, ``r.weights`` the values under the fuzzy and
    probabilistic semantics (None under the Boolean one), ``r.to_set()``, ``r.to_pandas()`` and
    ``r.to_dense()`` (over ``r.symbols``, when it fits ``memory_budget``) convert.
    """

    def __init__(
        self,
        name: str,
        arity: int,
        symbols: Symbols,
        domains: list[np.ndarray],
        *,
        rel: Rel | None = None,
        dense: np.ndarray | None = None,
        weighted: bool = False,
        memory_budget: int = 4 << 30,
    ) -> None:
        self.name = name
        self.arity = arity
        self._sym = symbols
        self._domains = domains  # per position: the domain's symbol ids, in value order
        self._rel = rel
        self._dense = dense
        self._weighted = weighted
        self._budget = memory_budget
        self._columns: tuple[np.ndarray, ...] | None = None

    # ------------------------------------------------------------------ representation
    @property
    def is_sparse(self) -> bool:
        """Whether the relation was computed in sparse form (else dense)."""
        return self._rel is not None

    def _ids(self) -> Rel:
        if self._rel is None:
            arr = np.asarray(self._dense)
            if self.arity == 0:
                v = float(arr)
                w = np.array([v]) if self._weighted and v > 0 else None
                self._rel = Rel(0, int(v > 0), [], w)
            else:
                nz = np.nonzero(arr > 0)
                cols = [self._domains[i][idx] for i, idx in enumerate(nz)]
                w = arr[nz].astype(np.float64) if self._weighted else None
                self._rel = Rel(self.arity, len(nz[0]), cols, w)
        return self._rel

    def __len__(self) -> int:
        if self._rel is None and self._dense is not None:
            return int(np.count_nonzero(np.asarray(self._dense) > 0))
        return self._ids().n

    @property
    def columns(self) -> tuple[np.ndarray, ...]:
        """One numpy array per argument (int64, float64 or object, by the values held)."""
        if self._columns is None:
            self._columns = tuple(self._sym.decode(c) for c in self._ids().cols)
        return self._columns

    @property
    def weights(self) -> np.ndarray | None:
        """Each tuple's value under the fuzzy / probabilistic semantics, else None."""
        return self._ids().w if self._weighted else None

    def _lists(self) -> list[list]:
        """One Python list of values per argument. When the symbol table is not much larger
        than the columns, values are gathered from its object table, so that equal values are
        one shared object (no new int per tuple: less allocation, and set building hashes
        objects already in cache)."""
        rel = self._ids()
        if len(self._sym) <= 2 * rel.n * max(self.arity, 1):
            objs = self._sym.objects()
            return [objs[c].tolist() for c in rel.cols]
        return [c.tolist() for c in self.columns]

    def __iter__(self) -> Iterator[tuple]:
        if self.arity == 0:
            return iter([()] * len(self))
        return zip(*self._lists())

    def __contains__(self, row: object) -> bool:
        if not isinstance(row, tuple) or len(row) != self.arity:
            return False
        if self.arity == 0:
            return len(self) > 0
        ids = []
        for v in row:
            try:
                i = self._sym.encode_value(v)
            except (TypeError, ValueError):
                return False
            if i < 0:
                return False
            ids.append(np.array([i], np.int64))
        rel = self._ids()
        bits = max(1, (len(self._sym) - 1).bit_length())
        return bool(rel.find(ids, bits)[0] >= 0)

    def to_set(self) -> set[tuple]:
        """Every tuple as a Python set."""
        if self.arity == 0:
            return set(iter(self))
        # the collector stays on: its young-generation passes untrack each batch of new
        # tuples of constants as the set grows, while a pause would leave all of them to one
        # long pass over the whole set afterwards
        return set(zip(*self._lists()))

    def to_pandas(self):
        """A pandas DataFrame, one column per argument (``weight`` added when weighted)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise MissingDependencyError(
                "Relation.to_pandas() needs pandas: pip install pandas"
            ) from exc
        data = {f"c{i}": c for i, c in enumerate(self.columns)}
        if self._weighted:
            data["weight"] = self.weights
        return pd.DataFrame(data)

    @property
    def symbols(self) -> list[np.ndarray]:
        """The values along each axis of ``to_dense()`` (each argument's domain, sorted)."""
        return [self._sym.decode(d) for d in self._domains]

    def to_dense(self) -> np.ndarray:
        """The relation as a float32 tensor over ``symbols`` (1 or the weight per tuple)."""
        if self._dense is not None:
            return np.asarray(self._dense)
        shape = tuple(max(1, len(d)) for d in self._domains)
        nbytes = 4 * math.prod(shape)
        if nbytes > self._budget:
            raise ProgramError(
                f"relation {self.name!r} needs a dense tensor over domains of sizes "
                f"{shape}: {nbytes} bytes, over the memory budget of {self._budget} bytes",
                code="memory_budget",
                relation=self.name,
                shape=shape,
            )
        arr = np.zeros(shape, np.float32)
        rel = self._ids()
        if self.arity == 0:
            arr[()] = (rel.w[0] if rel.w is not None else 1.0) if rel.n else 0.0
            return arr
        idx = tuple(dense_index(d, c) for d, c in zip(self._domains, rel.cols))
        arr[idx] = 1.0 if rel.w is None else rel.w
        return arr

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Relation):
            return self.to_set() == other.to_set()
        if isinstance(other, (set, frozenset)):
            return self.to_set() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = "sparse" if self.is_sparse else "dense"
        return f"Relation({self.name!r}, arity={self.arity}, {len(self)} tuples, {kind})"


def dense_index(domain: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Positions of ``ids`` in ``domain`` (ids in value order, not necessarily id order)."""
    top = int(domain.max()) + 1 if len(domain) else 0
    if len(ids) and top <= 4 * (len(ids) + len(domain)):
        # ids of a small table: one gather from a table of positions (no sort of the ids)
        where = np.empty(top, np.intp)
        where[domain] = np.arange(len(domain))
        return where[ids]
    order = np.argsort(domain, kind="stable")
    return order[search(domain[order], ids)]
