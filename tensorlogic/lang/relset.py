"""Sparse relations: sorted, deduplicated columns of int64 symbol ids (and weights).

A row of ids packs into one int64 key when ``arity * bits`` fits in 62 bits (``bits`` = width
of the largest symbol id); set operations (deduplication, difference, membership, the join
index) are then sorts and binary searches over int64 keys. Wider rows (e.g. arity 4 over ten
million constants) are ranked column by column: two columns are packed, the packed values are
replaced by their dense ranks, and the next column is packed onto the rank, so any arity works.

Why sorted columns rather than a sparse-matrix library: Datalog needs joins of any arity,
negation (set difference), constants and repeated variables, which sorted int64 keys give
uniformly; measured on the 2-vCPU development machine, they also beat python-graphblas
(any-pair ``mxm`` masked by the complement) and scipy.sparse (CSR products) on the semi-naive
ancestors workload, and stay within 1.5x of scipy's products on dense-ish closures (see
benchmarks/RESULTS.md, "bench_datalog").
"""

from __future__ import annotations

import numpy as np

from . import keysets
from .symbols import search, sorted_unique

#: bits of one packed key
KEY_BITS = 62
#: a join index over at most this many key values is a table of row starts (O(1) lookups)
STARTS_BITS = 22
#: ... once the probes of the index add up to this fraction of its key space (a table costs
#: a few passes over the key space; a binary search of a sorted probe about a cache miss)
STARTS_PROBES = 16
#: a recursive relation whose keys span at most this many bits keeps a map of its tuples (one
#: byte per possible tuple) for the semi-naive difference
BITMAP_BITS = 26
#: a larger key space gets a bitmap once its words are at most this many per known tuple
#: (reading the sorted tuples back is then a scan of a few words per tuple)
BITMAP_WORDS_PER_TUPLE = 4
#: otherwise a filter of this many bits over hashed keys answers "surely new" for most
#: candidates without a binary search in the sorted chunks
FILTER_BITS = 25


def _hash(keys: np.ndarray) -> np.ndarray:
    """Fibonacci hashing of int64 keys onto FILTER_BITS bits."""
    with np.errstate(over="ignore"):
        h = keys.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return (h >> np.uint64(64 - FILTER_BITS)).astype(np.intp)


def pack(cols: list[np.ndarray], bits: int) -> np.ndarray | None:
    """Rows of ids as int64 keys in lexicographic order, or None when they do not fit."""
    if len(cols) * bits > KEY_BITS:
        return None
    if len(cols) == 1:
        return cols[0]
    k = cols[0] << bits
    for c in cols[1:-1]:
        k |= c
        k <<= bits
    k |= cols[-1]
    return k


def unpack(keys: np.ndarray, arity: int, bits: int) -> list[np.ndarray]:
    """The columns of packed keys."""
    if arity == 1:
        return [keys]
    mask = (1 << bits) - 1
    out = [keys >> (bits * (arity - 1))]  # the leading column needs no mask
    for i in range(1, arity - 1):
        c = keys >> (bits * (arity - 1 - i))
        c &= mask  # in place: one new array per column
        out.append(c)
    out.append(keys & mask)
    return out


def _ranks(k: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ranks of ``k`` (equal values, equal ranks; order kept) and their count."""
    order = np.argsort(k)
    s = k[order]
    step = np.empty(len(s), np.int64)
    if len(s):
        step[0] = 0
        np.not_equal(s[1:], s[:-1], out=step[1:])
    r = np.cumsum(step)
    out = np.empty(len(k), np.int64)
    out[order] = r
    return out, int(r[-1]) + 1 if len(r) else 0


def joint_keys(tables: list[list[np.ndarray]], bits: int) -> list[np.ndarray]:
    """int64 keys of the rows of several tables (same arity >= 1), comparable across tables
    and ordered lexicographically."""
    packed = [pack(t, bits) for t in tables]
    if all(p is not None for p in packed):
        return packed  # type: ignore[return-value]
    lens = [len(t[0]) for t in tables]
    cols = [np.concatenate([t[i] for t in tables]) for i in range(len(tables[0]))]
    k, width = cols[0], bits
    for c in cols[1:]:
        if width + bits > KEY_BITS:
            k, n = _ranks(k)
            width = max(1, (n - 1).bit_length())
        k = (k << bits) | c
        width += bits
    return np.split(k, np.cumsum(lens)[:-1])


def member(sorted_keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Index of each ``q`` in ``sorted_keys`` or -1."""
    if len(sorted_keys) == 0:
        return np.full(len(q), -1, np.int64)
    i = search(sorted_keys, q)
    i[i == len(sorted_keys)] = 0
    return np.where(sorted_keys[i] == q, i, -1)


def group(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): ``keys[order]`` sorted; ``starts`` the first position of each value."""
    order = np.argsort(keys)
    s = keys[order]
    if len(s) == 0:
        return order, np.zeros(0, np.intp)
    first = np.empty(len(s), bool)
    first[0] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    return order, np.flatnonzero(first)


def combine(w: np.ndarray, starts: np.ndarray, sem: str) -> np.ndarray:
    """Weights of the rows of each group (``w`` in group order) combined under ``sem``:
    fuzzy max, probabilistic noisy-or."""
    if len(w) == 0:
        return w
    if sem == "fuzzy":
        return np.maximum.reduceat(w, starts)
    with np.errstate(divide="ignore"):
        miss = np.add.reduceat(np.log1p(-np.minimum(w, 1.0)), starts)
    return -np.expm1(miss)


class Rel:
    """A relation: ``n`` distinct rows as ``arity`` columns of ids in lexicographic order,
    with weights (float64) under the fuzzy and probabilistic semantics, else None.

    A Boolean relation made from packed keys may be *unordered* (``ordered`` False): a
    semi-naive delta is mostly scanned whole, where order does not matter, so its keys are
    sorted only when something needs them sorted (``keys``, lookups, indexes)."""

    __slots__ = ("_cols", "_index", "_keys", "_unique", "arity", "n", "ordered", "w")

    def __init__(
        self,
        arity: int,
        n: int,
        cols: list[np.ndarray] | None,
        w: np.ndarray | None = None,
        keys: tuple[int, np.ndarray] | None = None,
        ordered: bool = True,
    ) -> None:
        self.arity = arity
        self.n = n
        self._cols = cols
        self.w = w
        self._keys: tuple[int, np.ndarray | None] | None = keys
        self._index: dict[tuple, tuple] = {}
        self._unique: dict[tuple[int, ...], bool] = {}
        self.ordered = ordered or n <= 1
        if not self.ordered and (keys is None or keys[1] is None or w is not None):
            raise AssertionError("only Boolean relations of packed keys may be unordered")

    @classmethod
    def from_keys(cls, arity: int, keys: np.ndarray, bits: int, ordered: bool = True) -> Rel:
        """A Boolean relation from distinct packed keys, sorted unless ``ordered`` is False
        (columns unpacked on use)."""
        return cls(arity, len(keys), None, None, (bits, keys), ordered)

    def _order(self) -> None:
        """Sort an unordered relation's keys (its columns are unpacked again on use)."""
        if not self.ordered:
            bits, keys = self._keys  # type: ignore[misc]
            self._keys = (bits, np.sort(keys))
            self._cols = None
            self.ordered = True

    @property
    def cols(self) -> list[np.ndarray]:
        """One id column per argument (in the keys' order: sorted unless unordered)."""
        if self._cols is None:
            bits, keys = self._keys  # type: ignore[misc]
            self._cols = unpack(keys, self.arity, bits)
        return self._cols

    @classmethod
    def empty(cls, arity: int, weighted: bool) -> Rel:
        """No rows."""
        return cls(
            arity,
            0,
            [np.zeros(0, np.int64) for _ in range(arity)],
            np.zeros(0) if weighted else None,
        )

    @classmethod
    def build(
        cls, cols: list[np.ndarray], n: int, w: np.ndarray | None, bits: int, sem: str = "boolean"
    ) -> Rel:
        """The distinct rows of ``cols`` (``n`` rows; weights of repeats combined by ``sem``);
        rows of weight 0 are dropped."""
        if w is not None:
            keep = w > 0
            if not keep.all():
                cols = [c[keep] for c in cols]
                w = w[keep]
                n = len(w)
        if not cols:  # nullary: the empty tuple, or nothing
            if n == 0:
                return cls(0, 0, [], None if w is None else np.zeros(0))
            ww = None if w is None else combine(w, np.zeros(1, np.intp), sem)
            return cls(0, 1, [], ww)
        keys = joint_keys([cols], bits)[0]
        if w is None:
            p = pack(cols, bits)
            if p is not None:
                return cls.from_keys(len(cols), sorted_unique(keys), bits)
        order, starts = group(keys)
        pick = order[starts]
        out = cls(len(cols), len(pick), [c[pick] for c in cols])
        if w is not None:
            out.w = combine(w[order], starts, sem)
        return out

    def keys(self, bits: int) -> np.ndarray | None:
        """Sorted packed keys of the rows (None when they do not fit)."""
        self._order()
        if self._keys is None or self._keys[0] != bits:
            self._keys = (bits, pack(self.cols, bits) if self.arity else None)
        return self._keys[1]

    def find_rows(self, other: Rel, bits: int) -> np.ndarray:
        """Row index in this relation of each row of ``other`` (same arity) or -1."""
        mine, theirs = self.keys(bits), other.keys(bits) if other.arity else None
        if mine is not None and theirs is not None:
            return member(mine, theirs)
        return self.find(other.cols, bits)

    def find(self, cols: list[np.ndarray], bits: int) -> np.ndarray:
        """Row index of each probe row (columns ``cols``, all positions) or -1."""
        self._order()
        if self.arity == 0:
            m = len(cols[0]) if cols else 1
            return np.zeros(m, np.int64) if self.n else np.full(m, -1, np.int64)
        mine = self.keys(bits)
        if mine is not None:
            return member(mine, pack(cols, bits))
        a, b = joint_keys([self.cols, cols], bits)
        return member(a, b)  # a is sorted: ranks keep the lexicographic order

    def index(self, positions: tuple[int, ...], bits: int) -> JoinIndex | None:
        """A join index on ``positions`` (built once per relation); None when the keys do
        not pack."""
        self._order()
        ix = self._index.get((positions, bits))
        if ix is None:
            sub = [self.cols[i] for i in positions]
            k = pack(sub, bits)
            if k is None:
                return None
            cols, w = self.cols, self.w
            if positions == tuple(range(len(positions))):
                sk = k  # rows are sorted on a prefix already
            else:
                perm = np.argsort(k)
                sk = k[perm]
                cols = [c[perm] for c in cols]
                w = None if w is None else w[perm]
            ix = self._index[(positions, bits)] = JoinIndex(sk, len(positions) * bits, cols, w)
        return ix

    def knows_unique(self, positions: tuple[int, ...]) -> bool:
        """Whether ``unique_on(positions)`` is answered without work."""
        positions = tuple(sorted(set(positions)))
        return len(positions) == self.arity or self.n <= 1 or positions in self._unique

    def unique_on(self, positions: tuple[int, ...], bits: int) -> bool:
        """Whether no two rows agree on ``positions`` (the values there determine the row);
        a sort of the relation the first time, then remembered."""
        positions = tuple(sorted(set(positions)))
        if len(positions) == self.arity or self.n <= 1:
            return True
        if not positions:
            return False
        hit = self._unique.get(positions)
        if hit is None:
            ix = self._index.get((positions, bits))
            if ix is not None:
                s = ix.keys  # already sorted by these positions
            else:
                sub = [self.cols[i] for i in positions]
                k = pack(sub, bits)
                s = np.sort(joint_keys([sub], bits)[0] if k is None else k)
            hit = self._unique[positions] = bool((s[1:] != s[:-1]).all())
        return hit

    def merged_index(self, old: Rel, new: Rel) -> None:
        """Give this relation (the rows of ``old`` and of ``new``, disjoint) every join index
        ``old`` has, each merged from ``old``'s and ``new``'s in one linear pass instead of
        sorted again: a recursive relation grows by a small delta per round while its index
        is read every round."""
        for (positions, bits), ix in old._index.items():
            nix = new.index(positions, bits)
            if (positions, bits) in self._index or nix is None:
                continue
            # new rows go after the old rows of equal key
            at = np.searchsorted(ix.keys, nix.keys, "right") + np.arange(len(nix.keys))
            mine = np.ones(len(ix.keys) + len(nix.keys), bool)
            mine[at] = False

            def merge(a: np.ndarray, b: np.ndarray, at=at, mine=mine) -> np.ndarray:
                out = np.empty(len(mine), a.dtype)
                out[at] = b
                out[mine] = a
                return out

            cols = [merge(a, b) for a, b in zip(ix.cols, nix.cols)]
            w = None if ix.w is None or nix.w is None else merge(ix.w, nix.w)
            self._index[(positions, bits)] = JoinIndex(merge(ix.keys, nix.keys), ix.space, cols, w)

    def rows(self):
        """Every row as a tuple of ids (for tests and small relations)."""
        self._order()
        return list(zip(*(c.tolist() for c in self.cols))) if self.arity else [()] * self.n


class JoinIndex:
    """The rows of a relation sorted by the packed keys of some of its positions: ``keys``
    (sorted, ``space`` bits wide), ``cols`` and ``w`` the columns and weights in that order
    (copies, so that a join gathers each once).

    Lookups are binary searches until the probes seen add up to 1/``STARTS_PROBES`` of the key
    space;
    a key space that small (at most ``STARTS_BITS``) then gets a table of where each key's
    rows start (O(1) lookups). A recursive relation's index, rebuilt each round and probed
    by one delta, thus never pays for a table over the whole key space; a relation probed
    round after round gets one.
    """

    __slots__ = ("cols", "keys", "probes", "space", "starts", "w")

    def __init__(
        self, keys: np.ndarray, space: int, cols: list[np.ndarray], w: np.ndarray | None
    ) -> None:
        self.keys = keys
        self.space = space
        self.cols = cols
        self.w = w
        self.starts: np.ndarray | None = None
        self.probes = 0

    def lookup(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each probe key, the run ``lo:hi`` of its rows."""
        self.probes += len(q)
        if (
            self.starts is None
            and self.space <= STARTS_BITS
            and self.probes * STARTS_PROBES >= 1 << self.space
        ):
            self.starts = np.zeros((1 << self.space) + 1, np.int64)
            np.cumsum(np.bincount(self.keys, minlength=1 << self.space), out=self.starts[1:])
        if self.starts is not None:
            return self.starts[q], self.starts[q + 1]
        if len(q) < 1024 or bool((q[1:] >= q[:-1]).all()):
            return np.searchsorted(self.keys, q, "left"), np.searchsorted(self.keys, q, "right")
        # binary searches in increasing order stay in cache
        order = np.argsort(q)
        sq = q[order]
        lo, hi = np.empty(len(q), np.int64), np.empty(len(q), np.int64)
        lo[order] = np.searchsorted(self.keys, sq, "left")
        hi[order] = np.searchsorted(self.keys, sq, "right")
        return lo, hi


def difference(a: Rel, b: Rel, bits: int) -> Rel:
    """The rows of ``a`` not in ``b`` (Boolean relations)."""
    if a.arity == 0:
        return Rel(0, 0 if b.n else a.n, [])
    if a.n == 0 or b.n == 0:
        return a
    keep = b.find_rows(a, bits) < 0
    if keep.all():
        return a
    ka = a.keys(bits)
    if ka is not None:
        return Rel.from_keys(a.arity, ka[keep], bits)
    return Rel(a.arity, int(np.count_nonzero(keep)), [c[keep] for c in a.cols])


def merge_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two sorted arrays of disjoint values as one sorted array: the stable sort (timsort)
    finds the two runs and merges them in one pass."""
    out = np.concatenate([a, b])
    out.sort(kind="stable")
    return out


def union(a: Rel, b: Rel, bits: int) -> Rel:
    """The rows of two disjoint Boolean relations, sorted."""
    if b.n == 0:
        return a
    if a.n == 0:
        return b
    if a.arity == 0:
        return Rel(0, 1, [])
    ka, kb = a.keys(bits), b.keys(bits)
    if ka is not None and kb is not None:
        return Rel.from_keys(a.arity, merge_sorted(ka, kb), bits)
    cols = [np.concatenate([x, y]) for x, y in zip(a.cols, b.cols)]
    order = np.argsort(joint_keys([cols], bits)[0])
    return Rel(a.arity, len(order), [c[order] for c in cols])


class Known:
    """The tuples of one recursive relation found so far, for semi-naive rounds.

    When the packed keys span at most ``BITMAP_BITS``, a byte per possible key (numpy fancy
    indexing). In a larger space, once the tuples are dense enough (the words of a bitmap of one
    bit per possible key at most ``BITMAP_WORDS_PER_TUPLE`` times the tuples, within a sixteenth
    of the memory budget), that bitmap (``keysets``): a round's candidates are deduplicated and
    told from known tuples in one pass, with no sort. Otherwise a few sorted
    chunks (each round's new tuples merged into the last chunk while that one is not much larger,
    so a round costs about its own size) behind a hashed filter that clears most new candidates
    without a binary search.
    """

    def __init__(self, start: Rel, bits: int, budget: int) -> None:
        self.arity = start.arity
        self.bits = bits
        self.space = self.arity * bits
        self.budget = budget
        self.bitmap: np.ndarray | None = None
        self.n = start.n
        self.chunks = [start]
        self._whole: Rel | None = start
        # the last whole relation handed out and the tuples added since: its join indexes
        # are merged into the next one's (tracked only while it has indexes)
        self._last: Rel | None = start
        self._fresh: list[Rel] = []
        self.filter = None
        self.bytemap: np.ndarray | None = None
        if 0 < self.arity and self.space <= BITMAP_BITS and (1 << self.space) <= budget // 4:
            # small key spaces: a byte per key, all numpy (fancy indexing is vectorized)
            self.bytemap = np.zeros(1 << self.space, bool)
            self.bytemap[start.keys(bits)] = True
        elif self._use_bitmap(start.n):
            self._to_bitmap()
        elif self.arity and self.space <= KEY_BITS:
            self.filter = np.zeros(1 << FILTER_BITS, bool)
            self.filter[_hash(start.keys(bits))] = True

    def _use_bitmap(self, n: int) -> bool:
        if not 0 < self.arity or self.space > KEY_BITS:
            return False
        w = keysets.words(self.space)
        return 8 * w * 16 <= self.budget and w <= BITMAP_WORDS_PER_TUPLE * n

    def _to_bitmap(self) -> None:
        self.bitmap = keysets.bitmap(self.space)
        for c in self.chunks:
            keysets.mark_new(self.bitmap, c.keys(self.bits))
        self.filter = None
        self.chunks = []

    def add(self, cand: list[tuple[list[np.ndarray], int, object]]) -> Rel:
        """The distinct candidate rows (``(columns, count, _)`` parts) not known yet; they
        become known."""
        new = self._add(cand)
        if self._last is not None and not self._last._index:
            self._last, self._fresh = None, []
        if new.n and self._last is not None:
            self._fresh.append(new)
        return new

    def _add(self, cand: list[tuple[list[np.ndarray], int, object]]) -> Rel:
        parts = [p for p in cand if p[1]]
        if self.arity == 0:
            if parts and self.whole().n == 0:
                self.chunks = [Rel(0, 1, [])]
                self._whole = self.chunks[0]
                return Rel(0, 1, [])
            return Rel(0, 0, [])
        if not parts:
            return Rel.empty(self.arity, False)
        if self.bytemap is not None:
            keys = np.concatenate([pack(p[0], self.bits) for p in parts])
            keys = keys[~self.bytemap[keys]]
            if len(keys) * 8 > len(self.bytemap):  # many: read them back from a byte map
                mark = np.zeros(len(self.bytemap), bool)
                mark[keys] = True
                keys = np.flatnonzero(mark)
            else:
                keys = sorted_unique(keys)
            self.bytemap[keys] = True
            if len(keys):
                self.n += len(keys)
                self._whole = None
            return Rel.from_keys(self.arity, keys, self.bits)
        if self.bitmap is not None:
            keys = np.concatenate([pack(p[0], self.bits) for p in parts])
            # first occurrences of the unknown keys: distinct, left unsorted (a delta is
            # mostly scanned, and sorted on demand otherwise)
            keys = keys[keysets.mark_new(self.bitmap, keys)]
            new = Rel.from_keys(self.arity, keys, self.bits, ordered=False)
            if len(keys):
                self.n += len(keys)
                self._whole = None
            return new
        cols = [np.concatenate([p[0][i] for p in parts]) for i in range(self.arity)]
        new = Rel.build(cols, len(cols[0]), None, self.bits)
        if self.filter is not None and new.n:
            k = new.keys(self.bits)
            h = _hash(k)
            maybe = np.flatnonzero(self.filter[h])
            if len(maybe):
                seen = np.zeros(len(maybe), bool)
                for c in self.chunks:
                    seen |= member(c.keys(self.bits), k[maybe]) >= 0
                if seen.any():
                    keep = np.ones(len(k), bool)
                    keep[maybe[seen]] = False
                    k, h = k[keep], h[keep]
                    new = Rel.from_keys(self.arity, k, self.bits)
            self.filter[h] = True
        else:
            for c in self.chunks:
                new = difference(new, c, self.bits)
        if new.n:
            self.n += new.n
            self._whole = None
            self.chunks.append(new)
            if self._use_bitmap(self.n):
                self._to_bitmap()
                return new
            # with a filter, chunks are searched only for the few candidates it cannot clear,
            # so they are merged only when a rule reads the whole relation (or at the end)
            while (
                self.filter is None
                and len(self.chunks) > 1
                and self.chunks[-2].n <= 4 * self.chunks[-1].n
            ):
                last = self.chunks.pop()
                self.chunks[-1] = union(self.chunks[-1], last, self.bits)
        return new

    def whole(self) -> Rel:
        """Every tuple known, as one sorted relation."""
        if self._whole is None:
            if self.bytemap is not None:
                self._whole = Rel.from_keys(self.arity, np.flatnonzero(self.bytemap), self.bits)
            elif self.bitmap is not None:
                self._whole = Rel.from_keys(self.arity, keysets.scan(self.bitmap), self.bits)
            elif len(self.chunks) > 2 and self.chunks[0].keys(self.bits) is not None:
                k = np.concatenate([c.keys(self.bits) for c in self.chunks])
                k.sort()
                self._whole = Rel.from_keys(self.arity, k, self.bits)
                self.chunks = [self._whole]
            else:
                merged = self.chunks[0]
                for c in self.chunks[1:]:
                    merged = union(merged, c, self.bits)
                self.chunks = [merged]
                self._whole = merged
            if self._last is not None and self._fresh and self.arity:
                fresh = self._fresh[0]
                for f in self._fresh[1:]:
                    fresh = union(fresh, f, self.bits)
                self._whole.merged_index(self._last, fresh)
            self._last, self._fresh = self._whole, []
        return self._whole
