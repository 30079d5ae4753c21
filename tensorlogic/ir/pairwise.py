"""Einsum execution on BLAS: a contraction path from opt_einsum, each pair as one matmul.

``plan_einsum`` does all the index bookkeeping once, at compile time, and returns a closure that
only transposes, reshapes (views where the layout allows) and calls ``matmul``. Contractions with
shared batch indices become batched matmuls (opt_einsum would fall back to ``einsum`` there).
The same plan serves any array module with numpy's API (numpy, CuPy).

Every array the program materializes (a reduced or diagonal operand, an operand regrouped by a
copy, a pairwise result that is not the final one) is listed in ``EinsumPlan.scratch`` as
(shape, dtype), assuming C-contiguous operands. The executor hands those buffers in from its
arena so a steady-state call allocates nothing; called without them, the program allocates.

It sits in the IR because both sides read it: the optimizer's contraction planning costs paths
by their programs (FLOPs, copies, largest intermediate), the backends run them.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import opt_einsum

from ..ir.spec import EinsumSpec, ascii_spec
from . import pair_layout


def choose_path_strategy(n_operands: int) -> str:
    """opt_einsum strategy by network size: exhaustive when cheap, dynamic programming, greedy."""
    if n_operands <= 5:
        return "optimal"
    if n_operands <= 16:
        return "dp"
    return "greedy"


def contraction_path(
    inputs: list[str], output: str, sizes: dict[str, int], strategy: Any = None
) -> tuple[list[tuple[int, ...]], Any]:
    """Pairwise path and opt_einsum's PathInfo for a network of letter terms."""
    shapes = [tuple(sizes[c] for c in t) for t in inputs]
    eq = ",".join(inputs) + "->" + output
    if len(inputs) == 1:
        return [(0,)], None
    if isinstance(strategy, (list, tuple)) and _is_full_path(strategy, len(inputs)):
        # an explicit path is taken as given: opt_einsum's check and PathInfo cost ~10 ms at
        # 200 operands, and the plan computes its own FLOPs and intermediates
        return [tuple(int(i) for i in p) for p in strategy], None
    path, info = opt_einsum.contract_path(
        eq, *shapes, shapes=True, optimize=strategy or choose_path_strategy(len(inputs))
    )
    return [tuple(p) for p in path], info


def _is_full_path(path, n: int) -> bool:
    """Whether ``path`` contracts n operands to one, every step naming live positions."""
    left = n
    for step in path:
        if not isinstance(step, (list, tuple)) or not 1 <= len(step) <= left:
            return False
        if len(set(step)) != len(step) or any(not 0 <= int(i) < left for i in step):
            return False
        left -= len(step) - 1
    return left == 1


@dataclass
class EinsumPlan:
    """A compiled einsum: ``run(xp, arrays, out, scratch=None)`` plus what print(plan) shows.

    ``scratch`` lists (shape, dtype) of the temporaries ``run`` writes into when given them.
    """

    run: Callable[..., Any]
    flops: int
    path: list[tuple[int, ...]]
    description: str
    largest_intermediate: int = 0  # elements of the largest pairwise result along the path
    scratch: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    copied: int = 0  # operand elements copied along the path (layouts that are not BLAS views)
    sums_outside_matmul: bool = False  # sums or diagonals not done by a matmul (see _Scratch)
    gemms: list[tuple[int, int, int, int]] = field(default_factory=list)  # (batch, m, n, k)


class _Scratch:
    """Plan-time registry of temporaries: each request gets an index into the scratch list."""

    def __init__(self) -> None:
        self.specs: list[tuple[tuple[int, ...], str]] = []
        # elements of matmul operands that get copied: into scratch here, or inside matmul
        # when a view has no unit stride in its matrix dims (numpy then cannot hand it to BLAS)
        self.copied = 0
        # sums outside matmul (an operand's own sums or diagonals, a full inner product): a
        # 16-bit einsum with these is widened to float32 first, so they too accumulate in it
        self.sums = False
        self.gemms: list[tuple[int, int, int, int]] = []  # (batch, m, n, k) of each matmul
        # lifetimes, so that temporaries that are never live together share one buffer: each
        # request lives [start, end] in pair steps (-1: before the first pair); a request that
        # holds a value (an operand prepared, a pair's result) lives until the pair reading it
        self.now = -1
        self.value = -1  # the value slot the request being planned would hold
        self.life: list[list[int]] = []
        self.holds: dict[int, int] = {}  # value slot -> request

    def add(self, shape: tuple[int, ...], dtype: str, value: bool = False) -> int:
        self.specs.append((tuple(int(s) for s in shape), _dtype_name(dtype)))
        self.life.append([self.now, self.now])
        if value:
            self.holds[self.value] = len(self.specs) - 1
        return len(self.specs) - 1

    def slots(self, reads: list[tuple[int, int]], last: int):
        """(buffer specs, request -> buffer) sharing buffers between requests of one dtype
        whose lifetimes do not overlap. ``reads``: (value slot, pair step) of every read;
        ``last``: the value slot left at the end (it lives past every step)."""
        for v, step in reads:
            if v in self.holds:
                k = self.holds[v]
                self.life[k][1] = max(self.life[k][1], step)
        if last in self.holds:
            self.life[self.holds[last]][1] = 1 << 30
        order = sorted(range(len(self.specs)), key=lambda k: self.life[k][0])
        bufs: list[list] = []  # [elements, dtype, free from step]
        slot_of = [0] * len(self.specs)
        for k in order:
            start, end = self.life[k]
            shape, dtype = self.specs[k]
            size = math.prod(shape)
            free = [b for b, buf in enumerate(bufs) if buf[1] == dtype and buf[2] < start]
            if free:  # the largest free one: fewest regrowths
                b = max(free, key=lambda b: bufs[b][0])
                bufs[b][0] = max(bufs[b][0], size)
                bufs[b][2] = end
            else:
                b = len(bufs)
                bufs.append([size, dtype, end])
            slot_of[k] = b
        return [((n,), d) for n, d, _ in bufs], slot_of


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype: Any) -> str:
    return np.dtype(dtype).name  # numpy builds the name string on every access


@functools.lru_cache(maxsize=None)
def _result_dtype(da: str, db: str) -> str:
    return np.result_type(da, db).name


@functools.lru_cache(maxsize=None)
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def _take(xp, scratch, k: int, shape: tuple[int, ...], dtype: str):
    """Scratch buffer k viewed as ``shape``, or a fresh array when the caller gave none."""
    if scratch is None:
        return xp.empty(shape, dtype)
    buf = scratch[k]  # a shared buffer may be larger than this request
    n = math.prod(shape)
    return (buf if buf.size == n else buf.reshape(-1)[:n]).reshape(shape)


def merge_is_view(shape: tuple[int, ...], perm: list[int], group_lens: list[int]) -> bool:
    """True if a C-contiguous array of ``shape``, transposed by ``perm``, can merge consecutive
    axes into groups of ``group_lens`` axes without a copy (numpy's no-copy reshape rule)."""
    nonunit = [ax for ax in range(len(shape)) if shape[ax] != 1]
    nxt = dict(zip(nonunit, nonunit[1:]))
    pos = 0
    for n in group_lens:
        axes = [perm[i] for i in range(pos, pos + n) if shape[perm[i]] != 1]
        pos += n
        if any(nxt.get(a) != b for a, b in zip(axes, axes[1:])):
            return False
    return True


def _unit_stride_matrix(term: str, rows: list[str], cols: list[str], sizes: dict[str, int]) -> bool:
    """Whether the (rows, cols) matrix view of a C-contiguous operand has a unit stride in one
    of its two dims: its innermost axis of size > 1 belongs to the matrix (not to a batch)."""
    inner = [c for c in term if sizes[c] != 1]
    return not inner or inner[-1] in rows or inner[-1] in cols


def _first_layout(term: str, first: list[list[str]], second: list[list[str]]) -> bool:
    """Whether an operand goes to matmul grouped as ``first`` (else as ``second``): the layout
    that is a view of its memory; when both need a copy, the one that keeps the operand's
    innermost letter innermost, so the copy reads and writes contiguous runs (a transposing
    copy with a long stride on its inner axis ran several times slower on a GPU)."""
    flat_first = "".join(itertools.chain.from_iterable(first))
    if term == flat_first:
        return True
    flat = "".join(itertools.chain.from_iterable(second))
    if term == flat:
        return False
    return not (flat and term and flat[-1] == term[-1] and flat_first[-1:] != term[-1])


def _broadcast_kept_axes(term: str, shape: tuple[int, ...], sizes: dict[str, int]) -> list[int]:
    """Axes to keep: size-1 dimensions that broadcast against a larger size are dropped."""
    return [k for k, (c, d) in enumerate(zip(term, shape)) if not (d == 1 and sizes[c] != 1)]


def _prepare_operand(
    term: str,
    shape: tuple[int, ...],
    kept: list[int],
    sizes: dict[str, int],
    needed: set[str],
    dtype: str,
    scr: _Scratch,
):
    """Squeeze broadcast dims, take diagonals, sum letters nobody else needs.

    Returns (new_term, fn or None) where fn(xp, x, scratch) -> prepared array.
    """
    squeezed = "".join(term[k] for k in kept)
    target = "".join(dict.fromkeys(c for c in squeezed if c in needed))
    if squeezed == term and target == term:
        return term, None
    sq_shape = tuple(shape[k] for k in kept)
    has_repeat = len(set(squeezed)) != len(squeezed)
    spec = ascii_spec(f"{squeezed}->{target}")  # numpy's and CuPy's einsum read only letters
    sum_axes = tuple(k for k, c in enumerate(squeezed) if c not in target)
    t_shape = tuple(sizes[c] for c in target)
    k_out = scr.add(t_shape, dtype, value=True) if (has_repeat or sum_axes) else -1
    scr.sums = scr.sums or has_repeat or bool(sum_axes)

    def prep(xp, x, scratch):
        if squeezed != term:
            x = x.reshape(sq_shape)
        if has_repeat:
            buf = _take(xp, scratch, k_out, t_shape, dtype)
            if xp is np:
                return np.einsum(spec, x, out=buf)
            buf[...] = xp.einsum(spec, x)  # CuPy's einsum takes no ``out``
            return buf
        if sum_axes:
            return x.sum(axis=sum_axes, out=_take(xp, scratch, k_out, t_shape, dtype))
        return x

    return target, prep


@dataclass(frozen=True, eq=False)
class _Groups:
    """A contracting pair's letters: the operands' terms ``a`` and ``b``, the ``batch`` letters
    both keep, the ``contr`` letters summed, each operand's own letters (``left`` of a,
    ``right`` of b), in the order the product lays them out, and every letter's size."""

    a: str
    b: str
    batch: list[str]
    contr: list[str]
    left: list[str]
    right: list[str]
    sizes: dict[str, int]

    def flipped(self) -> "_Groups":
        """The same pair with the operands exchanged (C^T = B^T A^T)."""
        return _Groups(self.b, self.a, self.batch, self.contr, self.right, self.left, self.sizes)

    def counts(self) -> tuple[int, int, int, int]:
        """(batch, rows, cols, contracted) sizes of the pair's GEMMs."""
        size = self.sizes
        groups = (self.batch, self.left, self.right, self.contr)
        return tuple(math.prod(size[c] for c in g) for g in groups)  # type: ignore[return-value]


def _pair(
    a: str,
    b: str,
    keep: set[str],
    sizes: dict[str, int],
    out_order: str | None,
    dts: tuple[str, str],
    scr: _Scratch,
    matmul: Callable | None = None,
    chooser: pair_layout.Chooser | None = None,
    consumer: "_Consumer | None" = None,
):
    """Plan one pairwise contraction.

    Returns (result_term, result_dtype, fn(xp, A, B, out, scratch) -> C, flops). With
    ``out_order`` set the result is the einsum's output and lands in ``out``; otherwise it goes
    into a scratch buffer. ``matmul(A, B, out)`` replaces ``xp.matmul`` for products written
    into a C-contiguous buffer (the CPU backends' split GEMM). With a ``chooser`` (host
    backends), a pair whose merged matmul layout needs copies may run as a strided batch
    instead (``pair_layout``), whichever it picks. ``consumer``: the pair that will read this
    result (host plans); the product, in either layout, then writes the result in the letter
    order that pair reads as a view, where its GEMMs can (``_consumer_order``).
    """
    batch = [c for c in a if c in b and c in keep]
    contr = [c for c in a if c in b and c not in keep]
    left = [c for c in a if c not in b]
    right = [c for c in b if c not in a]
    swap = False
    if out_order is not None:
        # order groups by the output so the result can land in ``out`` directly
        key = out_order.index
        batch.sort(key=key)
        left.sort(key=key)
        right.sort(key=key)
        if out_order != "".join(batch + left + right) and out_order == "".join(
            batch + right + left
        ):
            swap = True
    da, db = dts
    if swap:
        a, b, left, right, da, db = b, a, right, left, db, da
    rdt = _result_dtype(da, db)
    result = "".join(batch + left + right)
    nb = math.prod(sizes[c] for c in batch)
    nl = math.prod(sizes[c] for c in left)
    nr = math.prod(sizes[c] for c in right)
    nc = math.prod(sizes[c] for c in contr)
    res_shape = tuple(sizes[c] for c in result)
    flops = nb * nl * nr * max(nc, 1) * (2 if contr else 1)
    direct = out_order is not None and out_order == result

    if not contr:
        k_res = -1 if direct else scr.add(res_shape, rdt, value=True)
        # no summed index: a broadcasting multiply (the reshapes only add unit axes: views)
        perm_a = [a.index(c) for c in batch + left]
        perm_b = [b.index(c) for c in batch + right]
        shp_a = tuple(sizes[c] for c in batch + left) + (1,) * len(right)
        shp_b = tuple(sizes[c] for c in batch) + (1,) * len(left) + tuple(sizes[c] for c in right)

        def mul(xp, A, B, out, scratch):
            A2 = A.transpose(perm_a).reshape(shp_a)
            B2 = B.transpose(perm_b).reshape(shp_b)
            if out is None:
                out = _take(xp, scratch, k_res, res_shape, rdt)
            return xp.multiply(A2, B2, out=out)

        return result, rdt, (_swapped(mul) if swap else mul), flops

    if not (batch or left or right) and a == b:
        # a full inner product of two operands laid out alike: one BLAS dot
        k_res = -1 if direct else scr.add(res_shape, rdt, value=True)
        scr.sums = True

        def dot(xp, A, B, out, scratch):
            if out is None:
                out = _take(xp, scratch, k_res, res_shape, rdt)
            out[...] = xp.dot(A.reshape(-1), B.reshape(-1))
            return out

        return result, rdt, dot, flops

    groups = _Groups(a, b, batch, contr, left, right, sizes)
    lay = _merged_layout(groups)
    # an intermediate's reader, for its letter order (floats: the integer products are einsums)
    usable = consumer is not None and out_order is None and np.dtype(rdt).kind in "fc"
    reader = consumer if usable else None
    if chooser is not None:
        picked = _choose_layout(
            groups, out_order, (da, db), rdt, scr, matmul, chooser, flops, lay, reader
        )
        if picked is not None:
            result, fn = picked
            return result, rdt, (_swapped(fn) if swap else fn), flops
    result, fn = _gemm(groups, out_order, (da, db), rdt, scr, matmul, lay, reader)
    return result, rdt, (_swapped(fn) if swap else fn), flops


@dataclass(frozen=True)
class _Consumer:
    """The pair that reads a result: its other operand's term, the letters it keeps, and
    whether the result is its first operand."""

    partner: str
    keep: frozenset
    first: bool


def _consumer_order(natural: str, rows: str, cols: str, consumer: _Consumer | None) -> str | None:
    """A letter order for a pair's result that its consumer reads as a matmul view, where the
    natural order (the product's batch letters, then ``rows``, then ``cols``) would be copied
    there, and the pair's GEMMs can write the new order directly: each GEMM's rows one stride,
    its columns the innermost, unit-stride run. None: keep the natural order.

    Attention's value product ``bhqs,bhsk->bhqk`` followed by the output projection
    ``bhqk,hkd->bqd`` is the case this is for: written as ``bqhk`` (each head's rows step over
    all heads), the projection reads it as one (b q) x (h k) matrix instead of copying 1 MB
    through a head transpose (166 us of the B=4 S=256 block's 2.3 ms on 16 cores)."""
    if consumer is None or not rows or not cols:
        return None
    p, keep = consumer.partner, consumer.keep
    shared = [c for c in p if c in natural]
    cb = [c for c in shared if c in keep]  # the consumer's batch and summed letters, in the
    cc = [c for c in shared if c not in keep]  # partner's order (the first operand's, or ours)
    free = [c for c in natural if c not in p]
    if len(shared) + len(free) != len(natural):
        return None
    orders = (
        [cb + free + cc, cb + cc + free] if consumer.first else [cb + cc + free, cb + free + cc]
    )
    if natural in ("".join(o) for o in orders):
        return None
    for o in orders:
        cand = "".join(o)
        if cand.endswith(cols) and rows in cand[: len(cand) - len(cols)]:
            return cand
    return None


def _choose_layout(
    groups: _Groups,
    out_order,
    dts,
    rdt,
    scr,
    matmul,
    chooser,
    flops,
    lay,
    reader=None,
):
    """(result term, pair function) of the fastest way found to run a contracting pair, or
    None for the merged layout as planned: the merged (copying where needed) or the strided
    layout, each in both orientations (C = A B, or C^T = B^T A^T through the same BLAS call
    with the roles exchanged, which differs in speed for skinny products)."""
    a, b, sizes, contr = groups.a, groups.b, groups.sizes, groups.contr
    size = _itemsize(rdt)
    nb = groups.counts()[0]
    copies = sum(_gemm_copies(groups, lay))
    if not copies and pair_layout.estimate_ns(0, nb, flops) < pair_layout.MEASURE_MIN_NS:
        return None  # no copy to save, too small to time the orientations: as planned
    cands = []  # (flipped, strided layout or None, result term, elements copied, calls)
    for flip, g in ((False, groups), (True, groups.flipped())):
        res = "".join(g.batch + g.left + g.right)  # batch + the first operand's free + ...
        cands.append((flip, None, res, copies, nb))
        sp = None
        if copies:
            sp = pair_layout.strided_pair(g.a, g.b, g.batch, g.contr, g.left, g.right, sizes)
        if sp is not None:
            cands.append((flip, sp, sp.result, 0, sp.calls))
    if out_order is not None:
        # the einsum's last pair: only layouts that land in the output as it is laid out (a
        # transposing copy of the whole result afterwards would eat what they save)
        cands = cands[:1] + [c for c in cands[1:] if c[2] == out_order]
        if len(cands) == 1:
            return None
    ests = []
    for _flip, _sp, res, copied, calls in cands:
        final = 0 if out_order is None or res == out_order else math.prod(sizes[c] for c in res)
        ests.append(pair_layout.estimate_ns((copied + final) * size, calls, flops))

    def build(i: int, s: _Scratch):
        flip, sp, _res, _c, _n = cands[i]
        if sp is not None:
            res, fn = _strided(sp, out_order, sizes, rdt, s, matmul, reader)
        elif flip:  # the flipped pair has its own layout
            g, fdts = groups.flipped(), (dts[1], dts[0])
            res, fn = _gemm(g, out_order, fdts, rdt, s, matmul, None, reader)
        else:
            res, fn = _gemm(groups, out_order, dts, rdt, s, matmul, lay, reader)
        return res, (_swapped(fn) if flip else fn)

    def trial(i: int):
        s = _Scratch()
        res, fn = build(i, s)
        if out_order != res:
            return fn, s.specs
        # a final pair that writes straight into the einsum's output
        out = np.empty(tuple(sizes[c] for c in res), rdt)
        return (lambda xp, A, B, _out, scratch: fn(xp, A, B, out, scratch)), s.specs

    shapes = [(tuple(sizes[c] for c in t), d) for t, d in zip((a, b), dts)]
    # the step up to a renaming of its letters, for the memo of timed choices
    name = {c: str(k) for k, c in enumerate(dict.fromkeys(a + b))}
    key = (
        tuple(name[c] for c in a),
        tuple(name[c] for c in b),
        None if out_order is None else tuple(name[c] for c in out_order),
        frozenset(name[c] for c in contr),
        tuple(sizes[c] for c in name),
        tuple(dts),
        matmul,
        len(cands),
    )
    pick = [lambda i=i: trial(i) for i in range(len(cands))]
    best = chooser.choose(ests, pick, shapes, key)
    return None if best == 0 else build(best, scr)


@dataclass(frozen=True)
class _Merged:
    """How the merged layout reads each operand: grouped (batch, rows, cols) in the order that
    is a view of its memory where one is (``a_lc``: A as [batch][left][contr], else
    [batch][contr][left]; ``b_cr`` likewise), the permutations, and whether that grouping is a
    view (else a copy into scratch) with a unit stride BLAS can use (else matmul copies)."""

    a_lc: bool
    b_cr: bool
    perm_a: list[int]
    perm_b: list[int]
    lens_a: list[int]
    lens_b: list[int]
    view_a: bool
    view_b: bool
    unit_a: bool
    unit_b: bool


def _merged_layout(groups: _Groups) -> _Merged:
    """The merged layout of a pair (planned once per pair: both the choice between layouts and
    the program read it)."""
    a, b, batch, contr = groups.a, groups.b, groups.batch, groups.contr
    left, right, sizes = groups.left, groups.right, groups.sizes
    a_lc = _first_layout(a, [batch, left, contr], [batch, contr, left])
    b_cr = _first_layout(b, [batch, contr, right], [batch, right, contr])
    order_a = batch + (left + contr if a_lc else contr + left)
    order_b = batch + (contr + right if b_cr else right + contr)
    perm_a = [a.index(c) for c in order_a]
    perm_b = [b.index(c) for c in order_b]
    lens_a = [len(batch), len(left), len(contr)] if a_lc else [len(batch), len(contr), len(left)]
    lens_b = [len(batch), len(contr), len(right)] if b_cr else [len(batch), len(right), len(contr)]
    return _Merged(
        a_lc,
        b_cr,
        perm_a,
        perm_b,
        lens_a,
        lens_b,
        merge_is_view(tuple(sizes[c] for c in a), perm_a, lens_a),
        merge_is_view(tuple(sizes[c] for c in b), perm_b, lens_b),
        _unit_stride_matrix(a, left, contr, sizes),
        _unit_stride_matrix(b, contr, right, sizes),
    )


def _gemm_copies(groups: _Groups, lay: _Merged | None = None) -> tuple[int, int]:
    """Elements of each operand copied into the merged (batch, rows, cols) matmul layout."""
    lay = lay or _merged_layout(groups)
    nb, nl, nr, nc = groups.counts()
    return (
        0 if lay.view_a and lay.unit_a else nb * nl * nc,
        0 if lay.view_b and lay.unit_b else nb * nc * nr,
    )


def _same(fn):
    return fn


def _strided(
    sp: "pair_layout.StridedPair",
    out_order: str | None,
    sizes: dict[str, int],
    rdt: str,
    scr: _Scratch,
    matmul: Callable | None = None,
    reader: _Consumer | None = None,
):
    """(result term, pair function) of a strided batched matmul (no copies; see
    ``pair_layout``); ``matmul`` as in ``_gemm``; ``reader``: the pair that reads the result
    (``_consumer_order``)."""
    want = _consumer_order(sp.result, sp.rows, sp.cols, reader)
    term = want or sp.result
    res_shape = tuple(sizes[c] for c in term)
    to_natural = None if want is None else [want.index(c) for c in sp.result]
    direct = out_order is not None and out_order == sp.result
    k_res = -1 if direct else scr.add(res_shape, rdt, value=True)
    scr.gemms.append(
        (
            sp.calls,
            *sp.mm_shape[-2:],
            math.prod(sp.shape_a[-1:] if not sp.swap_a else sp.shape_a[-2:-1]),
        )
    )
    exact = np.dtype(rdt).kind in "iu"  # numpy's einsum loops: exact, wrapping as matmul's
    flops = 2 * math.prod(sp.mm_shape) * sp.shape_a[-1 if not sp.swap_a else -2]
    small = flops < getattr(matmul, "min_flops", 0)
    host_mm = np.matmul if matmul is None or small or exact else matmul

    def run(xp, A, B, out, scratch):
        Av, Bv = sp.views(A, B)
        C = (
            out
            if out is not None and out.flags.c_contiguous
            else _take(xp, scratch, k_res, res_shape, rdt)
        )
        target = (C if to_natural is None else C.transpose(to_natural)).reshape(sp.mm_shape)
        if exact and xp is np:
            np.einsum("...ij,...jk->...ik", Av, Bv, out=target)
        else:
            (host_mm if xp is np else xp.matmul)(Av, Bv, out=target)
        if out is not None and C is not out:
            out[...] = C
            return out
        return C

    return term, run


def _gemm(
    groups: _Groups,
    out_order,
    dts,
    rdt,
    scr,
    matmul,
    lay=None,
    reader: _Consumer | None = None,
):
    """(result term, pair function) of the merged layout: one (batched) matmul after copying
    each operand that is not a view of that layout (``lay``: the pair's ``_merged_layout``).
    ``reader``: the pair that reads the result; where it reads another letter order than
    batch + left + right as a view (``_consumer_order``), the GEMMs write that order."""
    batch, left, right, sizes = groups.batch, groups.left, groups.right, groups.sizes
    want = _consumer_order("".join(batch + left + right), "".join(left), "".join(right), reader)
    if want is not None:
        return _gemm_into(groups, dts, rdt, scr, matmul, lay, want)
    da, db = dts
    result = "".join(batch + left + right)
    res_shape = tuple(sizes[c] for c in result)
    direct = out_order is not None and out_order == result
    k_res = -1 if direct else scr.add(res_shape, rdt, value=True)
    nb, nl, nr, nc = groups.counts()
    # per operand the matrix layout that is a view of its memory
    lay = lay or _merged_layout(groups)
    a_lc, b_cr = lay.a_lc, lay.b_cr
    ops_ = _plan_operands(lay, nb, nl, nr, nc, dts, scr)
    k_a, k_b, tr_a, tr_b = ops_.k_a, ops_.k_b, ops_.tr_a, ops_.tr_b
    squeeze = nb == 1
    mm_shape = (nl, nr) if squeeze else (nb, nl, nr)
    # everything a call needs is decided here: a small call is mostly Python overhead
    shp_a2, shp_b2 = (
        (ops_.shape_a[1:], ops_.shape_b[1:]) if squeeze else (ops_.shape_a, ops_.shape_b)
    )
    int_mm = _int_matmul(squeeze) if np.dtype(rdt).kind in "iu" else None
    small = 2 * nb * nl * nr * nc < getattr(matmul, "min_flops", 0)
    plain_mm = None if matmul is None or small else matmul  # None: the array module's own
    host_mm = int_mm or plain_mm or np.matmul

    def mm(xp, A, B, out, scratch):
        A2 = _operand(xp, A, tr_a, shp_a2, k_a, da, scratch)
        B2 = _operand(xp, B, tr_b, shp_b2, k_b, db, scratch)
        if not a_lc:
            A2 = A2.swapaxes(-1, -2)
        if not b_cr:
            B2 = B2.swapaxes(-1, -2)
        mmul = host_mm if xp is np else plain_mm or xp.matmul
        if out is None:
            C = _take(xp, scratch, k_res, res_shape, rdt)
            mmul(A2, B2, out=C.reshape(mm_shape))
            return C
        if out.flags.c_contiguous:
            mmul(A2, B2, out=out.reshape(mm_shape))
            return out
        out[...] = (mmul if mmul is int_mm else xp.matmul)(A2, B2).reshape(res_shape)
        return out

    return result, mm


@dataclass(frozen=True)
class _Operands:
    """How a merged-layout product reads its operands: each as (batch, rows, cols) in the
    grouping that is a view of it (``shape_*``), through scratch ``k_*`` where that reshape
    copies (else -1), after the transpose ``tr_*`` (None: none)."""

    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    k_a: int
    k_b: int
    tr_a: list[int] | None
    tr_b: list[int] | None


def _plan_operands(lay: _Merged, nb: int, nl: int, nr: int, nc: int, dts, scr) -> _Operands:
    """The operands of a merged-layout product (``_Operands``); registers their copies and the
    GEMM with ``scr``."""
    shp_a = (nb, nl, nc) if lay.a_lc else (nb, nc, nl)
    shp_b = (nb, nc, nr) if lay.b_cr else (nb, nr, nc)
    # operands are C-contiguous in their term order (inputs, or results of earlier steps)
    k_a = -1 if lay.view_a else scr.add(shp_a, dts[0])
    k_b = -1 if lay.view_b else scr.add(shp_b, dts[1])
    if k_a >= 0 or not lay.unit_a:
        scr.copied += nb * nl * nc
    if k_b >= 0 or not lay.unit_b:
        scr.copied += nb * nc * nr
    scr.gemms.append((nb, nl, nr, nc))
    tr_a = None if lay.perm_a == sorted(lay.perm_a) else lay.perm_a  # None: no transpose needed
    tr_b = None if lay.perm_b == sorted(lay.perm_b) else lay.perm_b
    return _Operands(shp_a, shp_b, k_a, k_b, tr_a, tr_b)


def _gemm_into(groups: _Groups, dts, rdt, scr, matmul, lay, want: str):
    """``_gemm`` of an intermediate written in the letter order ``want``: a buffer of that
    order, seen through a transpose as (*batch, rows, cols) with the columns innermost, so that
    each GEMM writes its block with a row stride (batch axes stay apart: any strides)."""
    da, db = dts
    sizes = groups.sizes
    shape = tuple(sizes[c] for c in want)
    k_res = scr.add(shape, rdt, value=True)
    order = groups.batch + groups.left + groups.right
    perm = [want.index(c) for c in order]
    nb, nl, nr, nc = groups.counts()
    bshape = tuple(sizes[c] for c in groups.batch)
    mm_shape = (*bshape, nl, nr)
    lay = lay or _merged_layout(groups)
    ops_ = _plan_operands(lay, nb, nl, nr, nc, dts, scr)
    small = 2 * nb * nl * nr * nc < getattr(matmul, "min_flops", 0)
    host_mm = np.matmul if matmul is None or small else matmul  # floats only (``_pair``)
    split_a, split_b = (*bshape, nl, nc), (*bshape, nc, nr)

    def mm(xp, A, B, out, scratch):
        A2 = _operand(xp, A, ops_.tr_a, ops_.shape_a, ops_.k_a, da, scratch)
        B2 = _operand(xp, B, ops_.tr_b, ops_.shape_b, ops_.k_b, db, scratch)
        if not lay.a_lc:
            A2 = A2.swapaxes(-1, -2)
        if not lay.b_cr:
            B2 = B2.swapaxes(-1, -2)
        C = _take(xp, scratch, k_res, shape, rdt)
        target = C.transpose(perm).reshape(mm_shape)
        (host_mm if xp is np else xp.matmul)(A2.reshape(split_a), B2.reshape(split_b), out=target)
        return C

    return want, mm


def _operand(xp, X, perm, shape, k: int, dtype: str, scratch):
    """X transposed by perm (None: as it is) and reshaped to shape; through scratch k when
    plan time saw that the reshape copies."""
    T = X if perm is None else X.transpose(perm)
    if k < 0:
        return T.reshape(shape)
    buf = _take(xp, scratch, k, shape, dtype)
    xp.copyto(buf.reshape(T.shape), T)
    return buf


def _int_matmul(squeeze: bool):
    """An exact integer matmul: numpy's einsum loops, which wrap around in the operands' dtype
    like matmul's but vectorize (256^3 int32: ~5x faster than numpy's integer matmul, which
    has no BLAS). Bool keeps matmul (or-of-ands that stops at the first true)."""
    subs = "ij,jk->ik" if squeeze else "bij,bjk->bik"

    def run(A, B, out=None):
        return np.einsum(subs, A, B, out=out)

    return run


def _swapped(fn):
    """The pair function called with its operands in the order it was planned for."""

    def run(xp, A, B, out, scratch):
        return fn(xp, B, A, out, scratch)

    return run


def prepared_terms(
    es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int]
) -> list[str]:
    """The operand terms the pairwise program contracts (after squeezes, diagonals, sums).

    A contraction path for ``plan_einsum`` is a path over these terms.
    """
    return _prepare_all(es, shapes, sizes, ["float64"] * len(es.inputs), _Scratch())[0]


@dataclass(frozen=True)
class PathCosts:
    """What a path costs, as its ``EinsumPlan`` would report it, without building the plan."""

    flops: int
    largest_intermediate: int


def path_costs(
    es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int], path
) -> PathCosts:
    """FLOPs and largest intermediate of ``plan_einsum(es, shapes, sizes, path)``.

    The optimizer costs a path with this and leaves the program itself to the backend, which
    plans it once with what only it knows (dtypes, its matmul, layouts timed on its host):
    building the pairwise program twice was a third of the first compile of a large network.
    Letter order within a term changes neither count, so terms here are letter sets.
    """
    kept = [_broadcast_kept_axes(t, shp, sizes) for t, shp in zip(es.inputs, shapes)]
    counts: dict[str, int] = {}
    for t, kp in zip(es.inputs, kept):
        for c in {t[k] for k in kp}:
            counts[c] = counts.get(c, 0) + 1
    out_set = set(es.output)
    live: list[set[str]] = []
    flops = 0
    for t, shp, kp in zip(es.inputs, shapes, kept):
        squeezed = [t[k] for k in kp]
        target = {c for c in squeezed if counts.get(c, 0) > 1 or c in out_set}
        if (
            len(squeezed) != len(t)
            or len(set(squeezed)) != len(squeezed)
            or len(target) != len(squeezed)
        ):
            flops += math.prod(shp)  # the operand is prepared (squeezed, diagonal or summed)
        live.append(target)
    if len(live) == 1:
        return PathCosts(flops, 0)
    largest = 0
    uses: dict[str, int] = {}
    for t in live:
        for c in t:
            uses[c] = uses.get(c, 0) + 1
    for step in path:
        picked = [live[i] for i in sorted(step)]
        for i in sorted(step, reverse=True):
            live.pop(i)
        for t in picked:
            for c in t:
                uses[c] -= 1
        keep = out_set | {c for t in picked for c in t if uses[c] > 0}
        acc = picked[0]
        for j, other in enumerate(picked[1:]):
            rest = set().union(*picked[j + 2 :])
            shared = acc & other
            contr = {c for c in shared if c not in keep and c not in rest}
            res = acc ^ other | (shared - contr)
            nc = max(math.prod(sizes[c] for c in contr), 1)
            flops += math.prod(sizes[c] for c in res) * nc * (2 if contr else 1)
            largest = max(largest, math.prod(sizes[c] for c in res))
            acc = res
        live.append(acc)
        for c in acc:
            uses[c] += 1
    return PathCosts(flops, largest)


def _prepare_all(
    es: EinsumSpec,
    shapes: list[tuple[int, ...]],
    sizes: dict[str, int],
    dts: list[str],
    scr: _Scratch,
):
    """(terms, preparation functions, their FLOPs) for every operand."""
    kept = [_broadcast_kept_axes(t, shp, sizes) for t, shp in zip(es.inputs, shapes)]
    counts: dict[str, int] = {}
    for t, kp in zip(es.inputs, kept):
        for c in {t[k] for k in kp}:
            counts[c] = counts.get(c, 0) + 1
    out_letters = set(es.output)
    terms: list[str] = []
    preps = []
    flops = 0
    for i, (t, shp, kp, dt) in enumerate(zip(es.inputs, shapes, kept, dts)):
        needed = {c for c in t if counts.get(c, 0) > 1 or c in out_letters}
        scr.value = i
        nt, fn = _prepare_operand(t, shp, kp, sizes, needed, dt, scr)
        terms.append(nt)
        preps.append(fn)
        if fn is not None:
            flops += math.prod(shp)
    return terms, preps, flops


# plans by (spec, shapes, strategy, dtypes, matmul, host): a plan's ``run`` holds no state of
# its own (arrays and scratch come in each call), so equal einsums share one. Layers repeat the
# same contractions, and a gradient graph holds three per weight (its forward, and the
# products that give the input's and the weight's cotangents): planning each one anew (an
# opt_einsum path search, layout choices) was most of the compile time of such graphs
_PLANS: "OrderedDict[tuple, EinsumPlan]" = OrderedDict()
_PLANS_SIZE = 1024
_plans_lock = threading.Lock()


def _layout_tunables() -> tuple:
    """The cost-model constants host plans are chosen by (a plan made under others differs)."""
    pl = pair_layout
    return (
        pl.COPY_NS_PER_BYTE,
        pl.CALL_NS,
        pl.NS_PER_FLOP,
        pl.MEASURE_MIN_NS,
        pl.MEASURE_MAX_BYTES,
        pl.CLEAR_RATIO,
        pl.MEASURE_BUDGET_S,
        pl.MEASURE_BUDGET_CALLS,
        pl.MEASURE_BUDGET_MIN_S,
        pl.TIMING_RUNS,
        pl.CONTEXT_SETUP_S,
    )


def plan_einsum(
    es: EinsumSpec,
    shapes: list[tuple[int, ...]],
    sizes: dict[str, int],
    strategy: Any = None,
    dtypes: list[str] | None = None,
    matmul: Callable | None = None,
    host: bool = False,
) -> EinsumPlan:
    """Compile an einsum with concrete shapes (and operand dtypes) into a pairwise-matmul program
    (memoized; see ``_plan_einsum``)."""
    try:
        key = (
            str(es),
            tuple(tuple(int(d) for d in s) for s in shapes),
            strategy if strategy is None or isinstance(strategy, str) else repr(strategy),
            None if dtypes is None else tuple(np.dtype(d).name for d in dtypes),
            matmul,
            bool(host),
            _layout_tunables() if host else (),
        )
        hash(key)
    except TypeError:  # an unhashable matmul or strategy: plan without the memo
        return _plan_einsum(es, shapes, sizes, strategy, dtypes, matmul, host)
    with _plans_lock:
        hit = _PLANS.get(key)
        if hit is not None:
            _PLANS.move_to_end(key)
            return hit
    plan = _plan_einsum(es, shapes, sizes, strategy, dtypes, matmul, host)
    with _plans_lock:
        _PLANS[key] = plan
        while len(_PLANS) > _PLANS_SIZE:
            _PLANS.popitem(last=False)
    return plan


def _plan_einsum(
    es: EinsumSpec,
    shapes: list[tuple[int, ...]],
    sizes: dict[str, int],
    strategy: Any = None,
    dtypes: list[str] | None = None,
    matmul: Callable | None = None,
    host: bool = False,
) -> EinsumPlan:
    """Compile an einsum with concrete shapes (and operand dtypes) into a pairwise-matmul program.

    ``strategy`` is an opt_einsum strategy name or an explicit path over ``prepared_terms``;
    ``matmul(A, B, out)``, if given, computes the products (see ``_pair``). ``host``: the
    program runs on numpy arrays, so pairs may run as strided batches, chosen by timing them
    (``pair_layout``).
    """
    n = len(es.inputs)
    dts = [np.dtype(d).name for d in dtypes] if dtypes is not None else ["float64"] * n
    scr = _Scratch()
    terms, preps, flops = _prepare_all(es, shapes, sizes, dts, scr)

    if n == 1:
        term = terms[0]
        perm = [term.index(c) for c in es.output]
        identity = perm == list(range(len(term)))
        prep = preps[0]

        def run_single(xp, arrays, out, scratch=None):
            x = arrays[0] if prep is None else prep(xp, arrays[0], scratch)
            x = x if identity else x.transpose(perm)
            out[...] = x
            return out

        specs, run_single = _shared_scratch(scr, [(0, 0)], -2, run_single)
        return EinsumPlan(
            run_single,
            flops,
            [(0,)],
            f"{es}",
            0,
            specs,
            sums_outside_matmul=scr.sums,
            gemms=scr.gemms,
        )

    path, info = contraction_path(terms, es.output, sizes, strategy)
    chooser = None
    if host:
        # layout timing may cost a few of this einsum's estimated calls (``pair_layout``)
        def budget() -> float:
            pairs = sum(len(step) - 1 for step in path)
            return pair_layout.budget_for(path_costs(es, shapes, sizes, path).flops, pairs)

        chooser = pair_layout.Chooser(True, budget)
    program = []
    largest = 0
    n_pairs = 0
    live = list(terms)
    live_dt = list(dts)
    out_set = set(es.output)
    # who reads each step's result (host plans lay results out for their readers)
    readers = _readers(terms, path, out_set) if host else {}
    live_ids = list(range(n))
    term_of = dict(enumerate(terms))
    uses: dict[str, int] = {}  # letter -> live operands holding it
    for t in live:
        for c in set(t):
            uses[c] = uses.get(c, 0) + 1
    for k, step in enumerate(path):
        idx = sorted(step, reverse=True)
        picked = [live[i] for i in sorted(step)]
        picked_dt = [live_dt[i] for i in sorted(step)]
        for i in idx:
            live.pop(i)
            live_dt.pop(i)
            live_ids.pop(i)
        reader = readers.get(k)
        consumer = None
        if reader is not None and reader[0] < n + k:  # its other operand's order is known
            consumer = _Consumer(term_of[reader[0]], reader[2], reader[1])
        for t in picked:
            for c in set(t):
                uses[c] -= 1
        final = k == len(path) - 1
        # letters of this step that another live operand or the output still needs (counted
        # incrementally: rebuilding the set from every live operand is quadratic in the size)
        keep = out_set | {c for t in picked for c in t if uses[c] > 0}
        # fold a multi-operand step pairwise, left to right
        acc, acc_dt = picked[0], picked_dt[0]
        pair_fns = []
        for j, other in enumerate(picked[1:]):
            last_pair = j == len(picked) - 2
            rest = set().union(*[set(t) for t in picked[j + 2 :]]) if not last_pair else set()
            scr.now, scr.value = n_pairs, n + n_pairs
            n_pairs += 1
            res, res_dt, fn, f = _pair(
                acc,
                other,
                keep | rest,
                sizes,
                es.output if final and last_pair else None,
                (acc_dt, picked_dt[j + 1]),
                scr,
                matmul,
                chooser,
                consumer if len(picked) == 2 else None,
            )
            pair_fns.append(fn)
            flops += f
            largest = max(largest, math.prod(sizes[c] for c in res))
            acc, acc_dt = res, res_dt
        live.append(acc)
        live_dt.append(acc_dt)
        live_ids.append(n + k)
        term_of[n + k] = acc
        for c in set(acc):
            uses[c] += 1
        program.append((tuple(sorted(step)), pair_fns))
    result_term = live[0]
    final_perm = [result_term.index(c) for c in es.output]
    direct = result_term == es.output

    if len(program) == 1 and len(program[0][1]) == 1 and direct and all(p is None for p in preps):
        # one pairwise contraction straight into ``out``: skip the generic program loop, whose
        # Python bookkeeping is a visible share of a small call
        (pair_fn,) = program[0][1]

        def run_pair(xp, arrays, out, scratch=None):
            res = pair_fn(xp, arrays[0], arrays[1], out, scratch)
            if res is not out:
                out[...] = res
            return out

        specs, run_pair = _shared_scratch(scr, [(0, 0), (1, 0)], n, run_pair)
        return EinsumPlan(
            run_pair,
            flops,
            path,
            f"{es} path={path}",
            largest,
            specs,
            scr.copied,
            scr.sums,
            scr.gemms,
        )

    # the program as flat pairs over value slots (operands first, then each pair's result), so
    # a call does no list bookkeeping: (fn, slot of A, slot of B, whether it writes ``out``)
    flat = []
    slots = list(range(n))
    for k, (idx, fns) in enumerate(program):
        picked = [slots[i] for i in idx]
        for i in sorted(idx, reverse=True):
            slots.pop(i)
        acc = picked[0]
        for j, fn in enumerate(fns):
            to_out = k == len(program) - 1 and direct and j == len(fns) - 1
            flat.append((fn, acc, picked[j + 1], to_out))
            acc = n + len(flat) - 1
        slots.append(acc)
    flat = tuple(flat)
    n_values = n + len(flat)
    final_slot = slots[0]
    any_prep = any(p is not None for p in preps)

    def run(xp, arrays, out, scratch=None):
        vals = [None] * n_values
        vals[:n] = (
            [a if p is None else p(xp, a, scratch) for a, p in zip(arrays, preps)]
            if any_prep
            else arrays
        )
        k = n
        for fn, i, j, to_out in flat:
            vals[k] = fn(xp, vals[i], vals[j], out if to_out else None, scratch)
            vals[i] = vals[j] = None  # each value is read once: let a fresh one go early
            k += 1
        res = vals[final_slot]
        if res is out:
            return out
        out[...] = res if direct else res.transpose(final_perm)
        return out

    reads = [(v, p) for p, (_fn, i, j, _o) in enumerate(flat) for v in (i, j)]
    specs, run = _shared_scratch(scr, reads, final_slot, run)
    desc = f"{es} path={path}"
    return EinsumPlan(run, flops, path, desc, largest, specs, scr.copied, scr.sums, scr.gemms)


def _readers(terms: list[str], path, out_set: set[str]) -> dict:
    """For each two-operand step of ``path`` whose result the next step reading it contracts
    with one other operand: step -> (that operand's id, whether the result is that step's
    first operand, the letters that step keeps). Ids: operands 0..n-1, step k's result n + k."""
    n = len(terms)
    live = list(range(n))
    letters = {i: frozenset(t) for i, t in enumerate(terms)}
    pending: dict[int, int] = {}  # result id -> the step that made it (two operands)
    found = {}
    for k, step in enumerate(path):
        idx = sorted(step)
        picked = [live[i] for i in idx]
        for i in reversed(idx):
            live.pop(i)
        rest = frozenset().union(*(letters[j] for j in live))
        mine = frozenset().union(*(letters[j] for j in picked))
        keep = frozenset(out_set) | (mine & rest)
        if len(picked) == 2:
            for pos, r in enumerate(picked):
                if r in pending:
                    found[pending.pop(r)] = (picked[1 - pos], pos == 0, keep)
        for r in picked:
            pending.pop(r, None)
        letters[n + k] = mine & keep
        live.append(n + k)
        if len(picked) == 2:
            pending[n + k] = k
    return found


def _shared_scratch(scr: _Scratch, reads, last: int, run):
    """(scratch specs, run) where temporaries never live together share buffers: ``run``
    wrapped to hand each request its shared buffer (see ``_Scratch.slots``)."""
    specs, slot_of = scr.slots(reads, last)
    if len(specs) == len(slot_of):
        return scr.specs, run  # nothing shared: every request keeps its own buffer

    def shared(xp, arrays, out, scratch=None):
        if scratch is not None:
            scratch = [scratch[b] for b in slot_of]
        return run(xp, arrays, out, scratch)

    return specs, shared
