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

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import opt_einsum

from ..ir.spec import EinsumSpec, ascii_spec


def choose_path_strategy(n_operands: int) -> str:
    """opt_einsum strategy by network size: exhaustive when cheap, dynamic programming, greedy."""
    if n_operands <= 5:
        return "optimal"
    if n_operands <= 16:
        return "dp"
    return "greedy"


def contraction_path(inputs: list[str], output: str, sizes: dict[str, int],
                     strategy: Any = None) -> tuple[list[tuple[int, ...]], Any]:
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
        eq, *shapes, shapes=True, optimize=strategy or choose_path_strategy(len(inputs)))
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

    def add(self, shape: tuple[int, ...], dtype: str) -> int:
        self.specs.append((tuple(int(s) for s in shape), np.dtype(dtype).name))
        return len(self.specs) - 1


def _take(xp, scratch, k: int, shape: tuple[int, ...], dtype: str):
    """Scratch buffer k viewed as ``shape``, or a fresh array when the caller gave none."""
    if scratch is None:
        return xp.empty(shape, dtype)
    return scratch[k].reshape(shape)


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


def _group_layout(term: str, groups: list[list[str]]) -> bool:
    """True if a C-contiguous operand with letters ``term`` is laid out as groups in this order."""
    return term == "".join("".join(g) for g in groups)


def _first_layout(term: str, first: list[list[str]], second: list[list[str]]) -> bool:
    """Whether an operand goes to matmul grouped as ``first`` (else as ``second``): the layout
    that is a view of its memory; when both need a copy, the one that keeps the operand's
    innermost letter innermost, so the copy reads and writes contiguous runs (a transposing
    copy with a long stride on its inner axis ran several times slower on a GPU)."""
    if _group_layout(term, first):
        return True
    if _group_layout(term, second):
        return False
    flat = "".join("".join(g) for g in second)
    return not (flat and term and flat[-1] == term[-1]
                and "".join("".join(g) for g in first)[-1:] != term[-1])


def _broadcast_kept_axes(term: str, shape: tuple[int, ...], sizes: dict[str, int]) -> list[int]:
    """Axes to keep: size-1 dimensions that broadcast against a larger size are dropped."""
    return [k for k, (c, d) in enumerate(zip(term, shape)) if not (d == 1 and sizes[c] != 1)]


def _prepare_operand(term: str, shape: tuple[int, ...], kept: list[int], sizes: dict[str, int],
                     needed: set[str], dtype: str, scr: _Scratch):
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
    k_out = scr.add(t_shape, dtype) if (has_repeat or sum_axes) else -1
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


def _regroup(xp, X, perm, shp, k, dtype, scratch):
    """X transposed by perm and reshaped to shp; through scratch k when plan time saw a copy."""
    T = X.transpose(perm)
    if k < 0:
        return T.reshape(shp)
    buf = _take(xp, scratch, k, shp, dtype)
    xp.copyto(buf.reshape(T.shape), T)
    return buf


def _pair(a: str, b: str, keep: set[str], sizes: dict[str, int], out_order: str | None,
          dts: tuple[str, str], scr: _Scratch, matmul: Callable | None = None):
    """Plan one pairwise contraction.

    Returns (result_term, result_dtype, fn(xp, A, B, out, scratch) -> C, flops). With
    ``out_order`` set the result is the einsum's output and lands in ``out``; otherwise it goes
    into a scratch buffer. ``matmul(A, B, out)`` replaces ``xp.matmul`` for products written
    into a C-contiguous buffer (the CPU backends' split GEMM).
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
    rdt = np.result_type(da, db).name
    result = "".join(batch + left + right)
    nb = math.prod(sizes[c] for c in batch)
    nl = math.prod(sizes[c] for c in left)
    nr = math.prod(sizes[c] for c in right)
    nc = math.prod(sizes[c] for c in contr)
    res_shape = tuple(sizes[c] for c in result)
    flops = nb * nl * nr * max(nc, 1) * (2 if contr else 1)
    direct = out_order is not None and out_order == result
    k_res = -1 if direct else scr.add(res_shape, rdt)

    if not contr:
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
        scr.sums = True
        def dot(xp, A, B, out, scratch):
            if out is None:
                out = _take(xp, scratch, k_res, res_shape, rdt)
            out[...] = xp.dot(A.reshape(-1), B.reshape(-1))
            return out

        return result, rdt, dot, flops

    # choose per operand the matrix layout that is a view of its memory
    a_lc = _first_layout(a, [batch, left, contr], [batch, contr, left])
    b_cr = _first_layout(b, [batch, contr, right], [batch, right, contr])
    order_a = batch + (left + contr if a_lc else contr + left)
    order_b = batch + (contr + right if b_cr else right + contr)
    perm_a = [a.index(c) for c in order_a]
    perm_b = [b.index(c) for c in order_b]
    lens_a = [len(batch), len(left), len(contr)] if a_lc else [len(batch), len(contr), len(left)]
    lens_b = [len(batch), len(contr), len(right)] if b_cr else [len(batch), len(right), len(contr)]
    shp_a = (nb, nl, nc) if a_lc else (nb, nc, nl)
    shp_b = (nb, nc, nr) if b_cr else (nb, nr, nc)
    # operands are C-contiguous in their term order (inputs, or results of earlier steps)
    k_a = -1 if merge_is_view(tuple(sizes[c] for c in a), perm_a, lens_a) else scr.add(shp_a, da)
    k_b = -1 if merge_is_view(tuple(sizes[c] for c in b), perm_b, lens_b) else scr.add(shp_b, db)
    if k_a >= 0 or not _unit_stride_matrix(a, left, contr, sizes):
        scr.copied += nb * nl * nc
    if k_b >= 0 or not _unit_stride_matrix(b, contr, right, sizes):
        scr.copied += nb * nc * nr
    squeeze = nb == 1
    mm_shape = (nl, nr) if squeeze else (nb, nl, nr)
    scr.gemms.append((nb, nl, nr, nc))

    int_mm = _int_matmul(squeeze) if np.dtype(rdt).kind in "iu" else None

    def mm(xp, A, B, out, scratch):
        A2 = _regroup(xp, A, perm_a, shp_a, k_a, da, scratch)
        B2 = _regroup(xp, B, perm_b, shp_b, k_b, db, scratch)
        if not a_lc:
            A2 = A2.swapaxes(1, 2)
        if not b_cr:
            B2 = B2.swapaxes(1, 2)
        if squeeze:
            A2, B2 = A2[0], B2[0]
        mmul = (int_mm if int_mm is not None and xp is np else
                xp.matmul if matmul is None else matmul)
        if out is None:
            C = _take(xp, scratch, k_res, res_shape, rdt)
            mmul(A2, B2, out=C.reshape(mm_shape))
            return C
        if out.flags.c_contiguous:
            mmul(A2, B2, out=out.reshape(mm_shape))
            return out
        out[...] = (mmul if mmul is int_mm else xp.matmul)(A2, B2).reshape(res_shape)
        return out

    return result, rdt, (_swapped(mm) if swap else mm), flops


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


def _prepare_all(es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int],
                 dts: list[str], scr: _Scratch):
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
    for t, shp, kp, dt in zip(es.inputs, shapes, kept, dts):
        needed = {c for c in t if counts.get(c, 0) > 1 or c in out_letters}
        nt, fn = _prepare_operand(t, shp, kp, sizes, needed, dt, scr)
        terms.append(nt)
        preps.append(fn)
        if fn is not None:
            flops += math.prod(shp)
    return terms, preps, flops


def plan_einsum(es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int],
                strategy: Any = None, dtypes: list[str] | None = None,
                matmul: Callable | None = None) -> EinsumPlan:
    """Compile an einsum with concrete shapes (and operand dtypes) into a pairwise-matmul program.

    ``strategy`` is an opt_einsum strategy name or an explicit path over ``prepared_terms``;
    ``matmul(A, B, out)``, if given, computes the products (see ``_pair``).
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

        return EinsumPlan(run_single, flops, [(0,)], f"{es}", 0, scr.specs,
                          sums_outside_matmul=scr.sums, gemms=scr.gemms)

    path, info = contraction_path(terms, es.output, sizes, strategy)
    program = []
    largest = 0
    live = list(terms)
    live_dt = list(dts)
    for k, step in enumerate(path):
        idx = sorted(step, reverse=True)
        picked = [live[i] for i in sorted(step)]
        picked_dt = [live_dt[i] for i in sorted(step)]
        for i in idx:
            live.pop(i)
            live_dt.pop(i)
        final = k == len(path) - 1
        keep = set(es.output).union(*[set(t) for t in live])
        # fold a multi-operand step pairwise, left to right
        acc, acc_dt = picked[0], picked_dt[0]
        pair_fns = []
        for j, other in enumerate(picked[1:]):
            last_pair = j == len(picked) - 2
            rest = set().union(*[set(t) for t in picked[j + 2:]]) if not last_pair else set()
            res, res_dt, fn, f = _pair(acc, other, keep | rest, sizes,
                                       es.output if final and last_pair else None,
                                       (acc_dt, picked_dt[j + 1]), scr, matmul)
            pair_fns.append(fn)
            flops += f
            largest = max(largest, math.prod(sizes[c] for c in res))
            acc, acc_dt = res, res_dt
        live.append(acc)
        live_dt.append(acc_dt)
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

        return EinsumPlan(run_pair, flops, path, f"{es} path={path}", largest, scr.specs,
                          scr.copied, scr.sums, scr.gemms)

    def run(xp, arrays, out, scratch=None):
        ops_ = [a if p is None else p(xp, a, scratch) for a, p in zip(arrays, preps)]
        for k, (idx, fns) in enumerate(program):
            picked = [ops_[i] for i in idx]
            for i in sorted(idx, reverse=True):
                ops_.pop(i)
            last = k == len(program) - 1
            acc = picked[0]
            for j, fn in enumerate(fns):
                target = out if (last and direct and j == len(fns) - 1) else None
                acc = fn(xp, acc, picked[j + 1], target, scratch)
            ops_.append(acc)
        res = ops_[0]
        if res is out:
            return out
        out[...] = res if direct else res.transpose(final_perm)
        return out

    desc = f"{es} path={path}"
    return EinsumPlan(run, flops, path, desc, largest, scr.specs, scr.copied, scr.sums,
                      scr.gemms)
