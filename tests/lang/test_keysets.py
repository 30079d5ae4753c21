"""Bitmap key sets (``keysets``): the numba kernels and the numpy forms against plain Python,
and ``Known`` in its bitmap and sorted-chunk forms against Python sets, on fresh random keys."""

from __future__ import annotations

import numpy as np
import pytest

from tensorlogic.lang import keysets, relset
from tensorlogic.lang.relset import Known, Rel


@pytest.fixture(params=["numpy", "kernel"])
def path(request, monkeypatch):
    """Both implementations: the numba kernels from the first key on, or numpy only."""
    monkeypatch.setattr(keysets, "KERNEL_MIN", 1 if request.param == "kernel" else 1 << 62)
    monkeypatch.setattr(keysets, "EXPAND_MIN", 1)
    return request.param


@pytest.mark.parametrize("space", [3, 6, 13, 20])
def test_mark_new_scan_distinct_expand(path, space):
    rng = np.random.default_rng(space)
    n = 3000
    keys = rng.integers(0, 1 << space, n)
    known = rng.integers(0, 1 << space, n // 3)
    bm = keysets.bitmap(space)
    keysets.mark_new(bm, known)
    seen = set(known.tolist())
    want = []
    for i, k in enumerate(keys.tolist()):
        if k not in seen:
            seen.add(k)
            want.append(i)
    got = keysets.mark_new(bm, keys)
    assert got.dtype == np.int64 and got.tolist() == want
    assert keysets.scan(bm.copy()).tolist() == sorted(seen)
    cleared = bm.copy()
    assert keysets.scan(cleared, clear=True).tolist() == sorted(seen) and not cleared.any()
    scratch = keysets.bitmap(space)
    first = keysets.distinct(keys, scratch)
    assert not scratch.any()
    assert first.tolist() == sorted(
        {k: i for i, k in reversed(list(enumerate(keys.tolist())))}.values()
    )
    lo = rng.integers(0, 50, 400)
    hi = lo + rng.integers(0, 4, 400)
    rows, pos, total = keysets.expand(lo, hi)
    want_rows = [i for i in range(400) for _ in range(hi[i] - lo[i])]
    want_pos = [j for i in range(400) for j in range(lo[i], hi[i])]
    assert total == len(want_rows) and rows.tolist() == want_rows and pos.tolist() == want_pos


def _form(known: Known) -> str:
    return "byte" if known.bytemap is not None else "bit" if known.bitmap is not None else "chunks"


@pytest.mark.parametrize("form", ["byte", "bit", "chunks", "grows"])
def test_known_matches_python_sets(path, form, monkeypatch):
    if form != "byte":
        monkeypatch.setattr(relset, "BITMAP_BITS", 0)
        # bit: a bitmap from the start; chunks: never one; grows: sorted chunks until the
        # tuples are dense enough for a bitmap
        monkeypatch.setattr(
            relset, "BITMAP_WORDS_PER_TUPLE", {"bit": 1 << 40, "chunks": 0, "grows": 1}[form]
        )
    rng = np.random.default_rng(7)
    bits, arity = 5, 2
    start = rng.integers(0, 1 << bits, (10, arity))
    rel = Rel.build([start[:, 0], start[:, 1]], 10, None, bits)
    known = Known(rel, bits, 1 << 30)
    want = set(map(tuple, start.tolist()))
    kinds = {_form(known)}
    for _ in range(12):
        parts = []
        for _ in range(int(rng.integers(1, 3))):
            m = int(rng.integers(0, 120))
            c = rng.integers(0, 1 << bits, (m, arity))
            parts.append(([c[:, 0], c[:, 1]], m, None))
        new = known.add(parts)
        cand = {tuple(r) for p in parts for r in zip(*(x.tolist() for x in p[0]))}
        # scanned as they come (a bitmap's delta is unordered until sorted on demand)
        assert set(zip(*(c.tolist() for c in new.cols))) == cand - want
        assert set(new.rows()) == cand - want
        assert len(new.rows()) == new.n
        k = new.keys(bits)
        assert (np.diff(k) > 0).all()  # sorted, distinct
        want |= cand
        assert set(known.whole().rows()) == want
        kinds.add(_form(known))
    assert kinds == ({"chunks", "bit"} if form == "grows" else {form})


def _runs(rel: Rel, positions: tuple[int, ...], q: list[tuple]) -> list[set]:
    """For each probe, the set of rows whose ``positions`` equal it (plain Python)."""
    rows = rel.rows()
    return [{r for r in rows if tuple(r[i] for i in positions) == p} for p in q]


def _looked_up(ix, rel_bits: int, q: list[tuple]) -> list[set]:
    qk = relset.pack([np.array(c, np.int64) for c in zip(*q)], rel_bits)
    lo, hi = ix.lookup(qk)
    cols = [c.tolist() for c in ix.cols]
    return [{tuple(c[j] for c in cols) for j in range(a, b)} for a, b in zip(lo, hi)]


@pytest.mark.parametrize("lookup", ["search", "starts"])
@pytest.mark.parametrize("positions", [(0,), (1,), (1, 2), (2, 0)])
def test_join_index_lookups_and_merges_match_python(positions, lookup, monkeypatch):
    # a recursive relation's index is merged from the last round's and the new tuples';
    # lookups are binary searches, or (once probed enough) go through a table of starts
    monkeypatch.setattr(relset, "STARTS_PROBES", 0 if lookup == "search" else 1 << 30)
    rng = np.random.default_rng(len(positions) * 10 + positions[0])
    bits, arity = 4, 3

    def rows(m):
        c = rng.integers(0, 1 << bits, (m, arity))
        return [c[:, i] for i in range(arity)], m, None

    start = Rel.build(*rows(40)[:3], bits)
    known = Known(start, bits, 1 << 30)
    kinds = set()
    for _ in range(10):
        whole = known.whole()
        ix = whole.index(positions, bits)
        q = [tuple(int(x) for x in r) for r in rng.integers(0, 1 << bits, (60, len(positions)))]
        assert _looked_up(ix, bits, q) == _runs(whole, positions, q)
        kinds.add(ix.starts is not None)
        known.add([rows(int(rng.integers(0, 80)))])
    whole = known.whole()
    fresh = Rel.build(whole.cols, whole.n, None, bits).index(positions, bits)
    merged = whole.index(positions, bits)
    assert merged.keys.tolist() == fresh.keys.tolist()
    assert sorted(zip(*(c.tolist() for c in merged.cols))) == sorted(whole.rows())
    assert kinds == {lookup == "starts"}


def test_unordered_relation_sorts_on_demand():
    """A delta left unordered scans in its own order and sorts itself for lookups, indexes
    and keys."""
    rng = np.random.default_rng(4)
    bits = 6
    keys = rng.permutation(1 << (2 * bits))[:300]
    rel = Rel.from_keys(2, keys, bits, ordered=False)
    assert not rel.ordered
    pairs = set(zip(*(c.tolist() for c in rel.cols)))
    assert pairs == {(int(k) >> bits, int(k) & 63) for k in keys}
    assert rel.unique_on((0, 1), bits) and not rel.unique_on((0,), bits)
    assert (np.diff(rel.keys(bits)) > 0).all() and rel.ordered
    assert rel.rows() == sorted(pairs)
    q = [
        np.array([r[0] for r in sorted(pairs)[:5]] + [63]),
        np.array([r[1] for r in sorted(pairs)[:5]] + [63]),
    ]
    assert (rel.find(q, bits)[:5] == np.arange(5)).all()
    ix = Rel.from_keys(2, keys, bits, ordered=False).index((1,), bits)
    assert sorted(zip(*(c.tolist() for c in ix.cols))) == sorted(pairs)
    with pytest.raises(AssertionError):
        Rel(2, 2, [keys[:2], keys[:2]], None, None, ordered=False)


@pytest.mark.parametrize(("kt", "kv"), [(1, 1), (2, 1), (0, 2), (3, 3)])
def test_expand_gather_matches_expand_then_gathers(path, kt, kv):
    rng = np.random.default_rng(kt * 10 + kv)
    m, nv = 300, 80
    lo = rng.integers(0, nv - 4, m)
    hi = lo + rng.integers(0, 4, m)
    tcols = [rng.integers(0, 1000, m) for _ in range(kt)]
    vcols = [rng.integers(0, 1000, nv) for _ in range(kv)]
    rows, pos, total = keysets.expand(lo, hi)
    got = keysets.expand_gather(lo, hi, total, tcols, vcols)
    if path == "kernel":
        assert got is not None
    if got is not None:
        want = [c[rows] for c in tcols] + [c[pos] for c in vcols]
        assert len(got) == kt + kv
        assert all(g.tolist() == w.tolist() for g, w in zip(got, want))
