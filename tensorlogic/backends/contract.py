"""Einsum execution on BLAS: a contraction path from opt_einsum, each pair as one matmul.

``plan_einsum`` does all the index bookkeeping once, at compile time, and returns a closure that
only transposes, reshapes (views where the layout allows) and calls ``matmul``. Contractions with
shared batch indices become batched matmuls (opt_einsum would fall back to ``einsum`` there).
The same plan serves any array module with numpy's API (numpy, CuPy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import opt_einsum

from ..ir.spec import EinsumSpec


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
    path, info = opt_einsum.contract_path(
        eq, *shapes, shapes=True, optimize=strategy or choose_path_strategy(len(inputs)))
    return [tuple(p) for p in path], info


@dataclass
class EinsumPlan:
    """A compiled einsum: ``run(xp, arrays, out)`` plus what print(plan) shows about it."""

    run: Callable[[Any, list, Any], Any]
    flops: int
    path: list[tuple[int, ...]]
    description: str
    largest_intermediate: int = 0  # elements of the largest pairwise result along the path


def _group_layout(term: str, groups: list[list[str]]) -> bool:
    """True if a C-contiguous operand with letters ``term`` is laid out as groups in this order."""
    return term == "".join("".join(g) for g in groups)


def _broadcast_kept_axes(term: str, shape: tuple[int, ...], sizes: dict[str, int]) -> list[int]:
    """Axes to keep: size-1 dimensions that broadcast against a larger size are dropped."""
    return [k for k, (c, d) in enumerate(zip(term, shape)) if not (d == 1 and sizes[c] != 1)]


def _prepare_operand(term: str, shape: tuple[int, ...], kept: list[int], needed: set[str]):
    """Squeeze broadcast dims, take diagonals, sum letters nobody else needs.

    Returns (new_term, fn or None) where fn(xp, x) -> prepared array.
    """
    squeezed = "".join(term[k] for k in kept)
    target = "".join(dict.fromkeys(c for c in squeezed if c in needed))
    if squeezed == term and target == term:
        return term, None
    sq_shape = tuple(shape[k] for k in kept)
    has_repeat = len(set(squeezed)) != len(squeezed)
    spec = f"{squeezed}->{target}"
    sum_axes = tuple(k for k, c in enumerate(squeezed) if c not in target)

    def prep(xp, x):
        if squeezed != term:
            x = x.reshape(sq_shape)
        if has_repeat:
            return xp.einsum(spec, x)
        if sum_axes:
            return x.sum(axis=sum_axes)
        return x

    return target, prep


def _pair(a: str, b: str, keep: set[str], sizes: dict[str, int], out_order: str | None):
    """Plan one pairwise contraction; returns (result_term, fn(xp, A, B, out) -> C, flops)."""
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
        if out_order != "".join(batch + left + right) and out_order == "".join(batch + right + left):
            swap = True
    if swap:
        a, b, left, right = b, a, right, left
    result = "".join(batch + left + right)
    nb = math.prod(sizes[c] for c in batch)
    nl = math.prod(sizes[c] for c in left)
    nr = math.prod(sizes[c] for c in right)
    nc = math.prod(sizes[c] for c in contr)
    res_shape = tuple(sizes[c] for c in result)
    flops = nb * nl * nr * max(nc, 1) * (2 if contr else 1)

    if not contr:
        # no summed index: a broadcasting multiply
        perm_a = [a.index(c) for c in batch + left]
        perm_b = [b.index(c) for c in batch + right]
        shp_a = tuple(sizes[c] for c in batch + left) + (1,) * len(right)
        shp_b = tuple(sizes[c] for c in batch) + (1,) * len(left) + tuple(sizes[c] for c in right)

        def mul(xp, A, B, out):
            A2 = A.transpose(perm_a).reshape(shp_a)
            B2 = B.transpose(perm_b).reshape(shp_b)
            return xp.multiply(A2, B2, out=out)

        return result, _swapped(mul) if swap else mul, flops

    # choose per operand the matrix layout that is a view of its memory
    a_lc = _group_layout(a, [batch, left, contr]) or not _group_layout(a, [batch, contr, left])
    b_cr = _group_layout(b, [batch, contr, right]) or not _group_layout(b, [batch, right, contr])
    perm_a = [a.index(c) for c in batch + (left + contr if a_lc else contr + left)]
    perm_b = [b.index(c) for c in batch + (contr + right if b_cr else right + contr)]
    shp_a = (nb, nl, nc) if a_lc else (nb, nc, nl)
    shp_b = (nb, nc, nr) if b_cr else (nb, nr, nc)
    squeeze = nb == 1

    def mm(xp, A, B, out):
        A2 = A.transpose(perm_a).reshape(shp_a)
        B2 = B.transpose(perm_b).reshape(shp_b)
        if not a_lc:
            A2 = A2.swapaxes(1, 2)
        if not b_cr:
            B2 = B2.swapaxes(1, 2)
        if squeeze:
            A2, B2 = A2[0], B2[0]
        if out is not None and out.ndim > 0 and out.flags.c_contiguous:
            target = out.reshape((nl, nr) if squeeze else (nb, nl, nr))
            xp.matmul(A2, B2, out=target)
            return out
        C = xp.matmul(A2, B2).reshape(res_shape)
        if out is not None:
            out[...] = C
            return out
        return C

    return result, _swapped(mm) if swap else mm, flops


def _swapped(fn):
    """The same pairwise kernel with its operands given in the caller's (unswapped) order."""
    return lambda xp, A, B, out: fn(xp, B, A, out)


def prepared_terms(es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int]) -> list[str]:
    """The operand terms the pairwise program contracts (after squeezes, diagonals, sums).

    A contraction path for ``plan_einsum`` is a path over these terms.
    """
    return _prepare_all(es, shapes, sizes)[0]


def _prepare_all(es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int]):
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
    for t, shp, kp in zip(es.inputs, shapes, kept):
        needed = {c for c in t if counts.get(c, 0) > 1 or c in out_letters}
        nt, fn = _prepare_operand(t, shp, kp, needed)
        terms.append(nt)
        preps.append(fn)
        if fn is not None:
            flops += math.prod(shp)
    return terms, preps, flops


def plan_einsum(es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int],
                strategy: Any = None) -> EinsumPlan:
    """Compile an einsum with concrete shapes into a pairwise-matmul program.

    ``strategy`` is an opt_einsum strategy name or an explicit path over ``prepared_terms``.
    """
    n = len(es.inputs)
    terms, preps, flops = _prepare_all(es, shapes, sizes)

    if n == 1:
        term = terms[0]
        perm = [term.index(c) for c in es.output]
        identity = perm == list(range(len(term)))
        prep = preps[0]

        def run_single(xp, arrays, out):
            x = arrays[0] if prep is None else prep(xp, arrays[0])
            x = x if identity else x.transpose(perm)
            out[...] = x
            return out

        return EinsumPlan(run_single, flops, [(0,)], f"{es}")

    path, info = contraction_path(terms, es.output, sizes, strategy)
    program = []
    largest = 0
    live = list(terms)
    for k, step in enumerate(path):
        idx = sorted(step, reverse=True)
        picked = [live[i] for i in sorted(step)]
        for i in idx:
            live.pop(i)
        final = k == len(path) - 1
        keep = set(es.output).union(*[set(t) for t in live])
        # fold a multi-operand step pairwise, left to right
        acc = picked[0]
        pair_fns = []
        for j, other in enumerate(picked[1:]):
            last_pair = j == len(picked) - 2
            rest = set().union(*[set(t) for t in picked[j + 2:]]) if not last_pair else set()
            res, fn, f = _pair(acc, other, keep | rest, sizes, es.output if final and last_pair else None)
            pair_fns.append(fn)
            flops += f
            largest = max(largest, math.prod(sizes[c] for c in res))
            acc = res
        live.append(acc)
        program.append((tuple(sorted(step)), pair_fns))
    result_term = live[0]
    final_perm = [result_term.index(c) for c in es.output]
    direct = result_term == es.output

    def run(xp, arrays, out):
        ops_ = [a if p is None else p(xp, a) for a, p in zip(arrays, preps)]
        for k, (idx, fns) in enumerate(program):
            picked = [ops_[i] for i in idx]
            for i in sorted(idx, reverse=True):
                ops_.pop(i)
            last = k == len(program) - 1
            acc = picked[0]
            for j, fn in enumerate(fns):
                target = out if (last and direct and j == len(fns) - 1) else None
                acc = fn(xp, acc, picked[j + 1], target)
            ops_.append(acc)
        res = ops_[0]
        if res is out:
            return out
        out[...] = res if direct else res.transpose(final_perm)
        return out

    desc = f"{es} path={path}"
    return EinsumPlan(run, flops, path, desc, largest)
