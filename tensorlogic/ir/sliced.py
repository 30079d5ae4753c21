"""Sliced einsum execution: fix some contracted indices, contract each slice, sum the slices.

When the largest intermediate of a contraction path exceeds ``path_memory_limit``, the
contraction pass picks indices to slice (cotengra's slicing, inner indices only) and records
them in the node's ``path_slices``. Each slice is the same network with those indices fixed: a
smaller einsum planned once by ``pairwise.plan_einsum`` along the same path, so every
intermediate shrinks by the sliced sizes while the FLOPs grow only by the redundancy slicing
adds. The slices' results add up into the output (summing a contracted index is additive).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from . import pairwise
from .spec import EinsumSpec


def sliced_spec(es: EinsumSpec, shapes: list[tuple[int, ...]], sliced: list[str]):
    """(spec, shapes) of one slice: the sliced letters dropped from every term."""
    drop = set(sliced)
    inputs = tuple("".join(c for c in t if c not in drop) for t in es.inputs)
    in_shapes = [tuple(d for c, d in zip(t, s) if c not in drop) for t, s in zip(es.inputs, shapes)]
    return EinsumSpec(inputs, es.output), in_shapes


def sliced_costs(
    es: EinsumSpec, shapes: list[tuple[int, ...]], sizes: dict[str, int], path, sliced: list[str]
) -> pairwise.PathCosts:
    """FLOPs and per-slice largest intermediate of ``plan_sliced`` (without planning it)."""
    inner_es, inner_shapes = sliced_spec(es, shapes, sliced)
    inner_sizes = {c: d for c, d in sizes.items() if c not in sliced}
    inner = pairwise.path_costs(inner_es, inner_shapes, inner_sizes, path)
    n_slices = math.prod(int(sizes[c]) for c in sliced)
    size = math.prod(int(sizes[c]) for c in es.output)
    return pairwise.PathCosts(
        inner.flops * n_slices + size * (n_slices - 1), inner.largest_intermediate
    )


def plan_sliced(
    es: EinsumSpec,
    shapes: list[tuple[int, ...]],
    sizes: dict[str, int],
    path,
    sliced: list[str],
    out_dtype: str,
    dtypes: list[str] | None = None,
    matmul=None,
    host: bool = False,
) -> pairwise.EinsumPlan:
    """An ``EinsumPlan`` that runs ``es`` slice by slice over the contracted letters ``sliced``.

    ``path`` is a path over ``pairwise.prepared_terms`` of the whole network (slicing removes
    letters, not operands, so it stays valid for every slice); ``matmul`` and ``host`` as in
    ``plan_einsum``.
    """
    if any(c in es.output for c in sliced):
        raise ValueError(f"einsum {es}: sliced indices {sliced} must be contracted ones")
    inner_es, inner_shapes = sliced_spec(es, shapes, sliced)
    inner_sizes = {c: d for c, d in sizes.items() if c not in sliced}
    inner = pairwise.plan_einsum(inner_es, inner_shapes, inner_sizes, path, dtypes, matmul, host)
    counts = [int(sizes[c]) for c in sliced]
    n_slices = math.prod(counts)
    out_shape = tuple(int(sizes[c]) for c in es.output)
    # per operand, per axis: the position of its sliced letter, or None to keep the axis (a
    # broadcast size-1 axis of a sliced letter is indexed at 0)
    where = [
        [(sliced.index(c) if s != 1 else -1) if c in sliced else None for c, s in zip(t, shp)]
        for t, shp in zip(es.inputs, shapes)
    ]
    k_tmp = len(inner.scratch)

    def index(vals):
        return [
            tuple(slice(None) if w is None else (0 if w < 0 else vals[w]) for w in ax)
            for ax in where
        ]

    def run(xp, arrays, out, scratch=None):
        if out is None:
            out = xp.empty(out_shape, out_dtype)
        tmp = scratch[k_tmp].reshape(out_shape) if scratch is not None else None
        inner_scratch = scratch[:k_tmp] if scratch is not None else None
        for n, vals in enumerate(itertools.product(*(range(c) for c in counts))):
            xs = [xp.ascontiguousarray(x[ix]) for x, ix in zip(arrays, index(vals))]
            if n == 0:
                target = out
            else:
                target = tmp if tmp is not None else xp.empty(out_shape, out_dtype)
            res = inner.run(xp, xs, target, inner_scratch)
            if res is not target:
                target[...] = res
            if n:
                xp.add(out, target, out=out)
        return out

    size = math.prod(out_shape)
    return replace(
        inner,
        run=run,
        flops=inner.flops * n_slices + size * (n_slices - 1),
        description=f"{inner.description} sliced over {''.join(sliced)} ({n_slices} slices)",
        scratch=list(inner.scratch) + [(out_shape, out_dtype)],
        copied=inner.copied * n_slices,
    )
