"""Small graph-building helpers the VJP rules share: broadcasting a cotangent back to an
operand's shape, expanding one to a node's shape, dtype fix-ups and complex conjugates.

Every helper builds ordinary nodes (sum, reshape, where, cast, ...), so a backward graph is
optimized and compiled like any other.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np

from .. import dtypes
from ..ir.graph import EinsumGraph, Tensor

# graph -> {(value, dtype): node id}: one constant node per number and dtype, so a backward
# graph does not hold one constant per use of 0.5 (fewer nodes to build, optimize and plan)
_SCALARS: "weakref.WeakKeyDictionary[EinsumGraph, dict]" = weakref.WeakKeyDictionary()


def scalar(g: EinsumGraph, value: float, dtype: str) -> Tensor:
    """A scalar constant of ``dtype``, shared by every use in ``g``. Its dtype is the one a
    Python number next to a tensor of ``dtype`` takes (NEP 50), so results are typed alike."""
    cache = _SCALARS.setdefault(g, {})
    key = (float(value), dtype)
    nid = cache.get(key)
    if nid is None or nid not in g:
        nid = g.constant(np.asarray(value, dtype=dtypes.normalize(dtype))).id
        cache[key] = nid
    return g.tensor(nid)


def is_complex(dtype: str) -> bool:
    """Whether ``dtype`` is complex64/complex128."""
    return dtypes.kind(dtype) == "c"


def inexact(dtype: str) -> bool:
    """Whether a tensor of ``dtype`` carries a gradient (floats and complex numbers)."""
    return dtypes.kind(dtype) in "fc"


def real_dtype(dtype: str) -> str:
    """The real dtype of a complex one (complex64 -> float32)."""
    return {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)


def conj(g: EinsumGraph, t: Tensor) -> Tensor:
    """The complex conjugate ``2 Re(t) - t`` (the op table has no conj); real ``t`` as it is."""
    if not is_complex(t.dtype):
        return t
    re = g.cast(g.cast(t, real_dtype(t.dtype)), t.dtype)
    return g.binary("sub", g.binary("add", re, re), t)


def cast_to(g: EinsumGraph, t: Tensor, dtype: str) -> Tensor:
    """``t`` in ``dtype`` (complex to real keeps the real part, torch's rule for the gradient of
    a real tensor used in complex arithmetic)."""
    return t if t.dtype == dtype else g.cast(t, dtype)


def expand(g: EinsumGraph, t: Tensor, like: Tensor) -> Tensor:
    """``t`` (broadcastable to ``like``) broadcast to ``like``'s shape, in ``t``'s dtype.

    The op table has no broadcast op, and a symbolic dimension rules out a constant of ones, so
    this is ``where(1, t, like)``: ``like`` gives only the shape, its values are never chosen.
    """
    if tuple(t.shape) == tuple(like.shape):
        return t
    return cast_to(g, g.where(scalar(g, 1.0, t.dtype), t, like), t.dtype)


def unbroadcast(g: EinsumGraph, t: Tensor, shape: Sequence) -> Tensor:
    """Sum ``t`` down to ``shape``, which broadcast to ``t``'s shape in the forward op."""
    shape = tuple(shape)
    lead = len(t.shape) - len(shape)
    inner = [lead + k for k, d in enumerate(shape) if d == 1 and t.shape[lead + k] != 1]
    if inner:
        t = g.sum(t, axis=tuple(range(lead)) + tuple(inner), keepdims=True)
    elif lead:  # only leading axes: one sum drops them
        return g.sum(t, axis=tuple(range(lead)))
    if tuple(t.shape) != shape:
        t = g.reshape(t, list(shape))
    return t


def keepdims(g: EinsumGraph, t: Tensor, in_shape: Sequence, axes: Sequence[int]) -> Tensor:
    """``t``, the result of a reduction of ``in_shape`` over ``axes`` without keepdims,
    reshaped to the keepdims shape (1 on every reduced axis)."""
    target = [1 if k in axes else d for k, d in enumerate(in_shape)]
    if list(t.shape) == target:
        return t
    if t.node.kind == "constant" and not any(isinstance(d, str) for d in target):
        # the loss's seed: reshaped here rather than by a node the optimizer must fold
        return g.constant(g.constants[t.id].reshape(target))
    return g.reshape(t, target)


def count(g: EinsumGraph, x: Tensor, axes: Sequence[int]) -> Tensor | float:
    """How many elements of ``x`` one reduction over ``axes`` takes: a number, or (with a
    symbolic dimension among the axes) a tensor counted at run time."""
    n = 1
    for a in axes:
        d = x.shape[a]
        if isinstance(d, str):
            one = scalar(g, 1.0, x.dtype)
            ones = g.where(one, one, x)
            return g.sum(ones, axis=tuple(axes), keepdims=True)
        n *= d
    return float(n)
