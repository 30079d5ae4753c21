"""The attention op: ``softmax(scale * q @ k^T + mask, causal) @ v`` as one graph node.

Layout (the canonical form every backend implements): ``q`` is ``(*batch, Sq, D)``, ``k`` is
``(*batch, Sk, D)``, ``v`` is ``(*batch, Sk, Dv)``, the result ``(*batch, Sq, Dv)``; the batch
axes (batch, heads, ...) are equal in all three. An optional additive ``mask`` broadcasts (numpy
rules) against the scores ``(*batch, Sq, Sk)``. ``causal=True`` lets query ``i`` see keys
``j <= i`` only (top-left aligned, as torch's ``is_causal``); it needs no mask tensor. Rows whose
every key is masked give NaN, as the softmax of an all ``-inf`` row does.

The optimizer's ``attention`` pass brings other einsum layouts (head axes anywhere) to this form
with transposes, so one kernel per backend serves them all.

Memory layout (the optional argument ``layout``): four axis positions ``(jq, jk, jv, jo)``, where
the sequence axis of q, k, v and the result sits. A tensor with its sequence axis at ``j`` holds
``(*batch[:j], S, *batch[j:], D)``: with ``j = 1`` and batch ``(B, H)`` that is ``(B, S, H, D)``,
the layout a head-splitting projection writes as one plain GEMM (the ``attention_layout`` pass
sets it). Absent, every position is ``rank - 2``: the canonical layout above. The head dim stays
last; the mask is always in the scores' canonical layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DTypeError, GraphError, ShapeError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
ARGS = ("scale", "causal", "layout")
REQUIRED = ("scale", "causal")
ROLES = ("q", "k", "v", "out")


def default_scale(head_dim: Any) -> float:
    """``1 / sqrt(D)``, torch's default scale, for a concrete head dimension."""
    if not isinstance(head_dim, int):
        raise ShapeError(
            f"attention: the default scale 1/sqrt(D) needs a concrete head "
            f"dimension, got the symbol {head_dim!r}; pass scale= explicitly"
        )
    return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0


def check_args(args: Mapping[str, Any], where: str) -> tuple[float, bool]:
    """(scale, causal) from a node's arguments, validated."""
    unknown = set(args) - set(ARGS)
    if unknown:
        raise GraphError(
            f"{where}: unknown attention argument(s) {sorted(unknown)}; expected {list(ARGS)}"
        )
    if any(a not in args for a in REQUIRED):
        raise GraphError(f"{where}: attention needs the arguments 'scale' and 'causal'")
    scale, causal = args["scale"], args["causal"]
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not math.isfinite(float(scale))
    ):
        raise GraphError(f"{where}: attention scale must be a finite real number, got {scale!r}")
    if not isinstance(causal, bool):
        raise GraphError(f"{where}: attention causal must be True or False, got {causal!r}")
    lay = args.get("layout")
    if lay is not None and (
        not isinstance(lay, (list, tuple))
        or len(lay) != len(ROLES)
        or not all(isinstance(j, int) and not isinstance(j, bool) and j >= 0 for j in lay)
    ):
        raise GraphError(
            f"{where}: attention layout must be four non-negative axis positions "
            f"(sequence axis of q, k, v, out), got {lay!r}"
        )
    return float(scale), causal


def layout_of(args: Mapping[str, Any], rank: int, where: str = "attention") -> tuple[int, ...]:
    """The sequence-axis positions ``(jq, jk, jv, jo)`` of a node of tensors of ``rank``
    (``rank - 2`` each where the node has no layout argument)."""
    lay = args.get("layout")
    if lay is None:
        return (rank - 2,) * len(ROLES)
    lay = tuple(int(j) for j in lay)
    for nm, j in zip(ROLES, lay):
        if j > rank - 2:
            raise ShapeError(
                f"{where}: attention layout puts the sequence axis of {nm} at {j}; a tensor of "
                f"rank {rank} has it at most at {rank - 2} (the head dim is last)"
            )
    return lay


def is_canonical(args: Mapping[str, Any], rank: int) -> bool:
    """True when every tensor of the node is in the canonical ``(*batch, S, D)`` layout."""
    return layout_of(args, rank) == (rank - 2,) * len(ROLES)


def to_canonical_perm(rank: int, j: int) -> list[int]:
    """The transpose that brings a tensor with its sequence axis at ``j`` to ``(*batch, S, D)``."""
    rest = [a for a in range(rank - 1) if a != j]
    return rest + [j, rank - 1]


def canonical_shape(shape: Sequence, j: int) -> tuple:
    """``shape`` (sequence axis at ``j``) in the canonical layout."""
    return tuple(shape[a] for a in to_canonical_perm(len(shape), j))


def laid_out_shape(shape: Sequence, j: int) -> tuple:
    """A canonical ``shape`` with its sequence axis moved to ``j``."""
    s = tuple(shape)
    return (*s[:j], s[-2], *s[j:-2], s[-1])


def canonical_views(xs: Sequence[Any], args: Mapping[str, Any]) -> list[Any]:
    """q, k, v (numpy or CuPy arrays in the node's layout) as canonical views; the mask as is."""
    rank = len(xs[0].shape)
    lay = layout_of(args, rank)
    views = [
        x if j == rank - 2 else x.transpose(to_canonical_perm(rank, j)) for x, j in zip(xs[:3], lay)
    ]
    return views + list(xs[3:])


def laid_out(result: Any, args: Mapping[str, Any]) -> Any:
    """A canonical result as a view in the node's layout."""
    rank = len(result.shape)
    j = layout_of(args, rank)[3]
    if j == rank - 2:
        return result
    return result.transpose([int(a) for a in np.argsort(to_canonical_perm(rank, j))])


def out_view(out: Any, args: Mapping[str, Any]) -> Any:
    """The result array (in the node's layout) as a canonical view."""
    rank = len(out.shape)
    j = layout_of(args, rank)[3]
    return out if j == rank - 2 else out.transpose(to_canonical_perm(rank, j))


def infer(
    shapes: Sequence[tuple], dts: Sequence[str], args: Mapping[str, Any], where: str
) -> tuple[tuple, str]:
    """(shape, dtype) of an attention node over inputs q, k, v[, mask]."""
    check_args(args, where)
    if len(shapes) not in (3, 4):
        raise GraphError(
            f"{where}: attention takes q, k, v and an optional mask, got {len(shapes)} inputs"
        )
    names = ("q", "k", "v", "mask")
    for nm, dt in zip(names, dts):
        if dt not in FLOAT_DTYPES:
            raise DTypeError(f"{where}: attention {nm} has dtype {dt}; expected a float dtype")
    if len(set(dts)) != 1:
        shown = ", ".join(f"{nm} {dt}" for nm, dt in zip(names, dts))
        raise DTypeError(f"{where}: attention inputs must share one dtype, got {shown}; cast them")
    q, k, v = (tuple(s) for s in shapes[:3])
    for nm, s in (("q", q), ("k", k), ("v", v)):
        if len(s) < 2:
            raise ShapeError(
                f"{where}: attention {nm} has shape {s}; expected (*batch, S, D), rank >= 2"
            )
    lay = None
    if args.get("layout") is not None:
        if not (len(q) == len(k) == len(v)):
            raise ShapeError(
                f"{where}: attention q {q}, k {k}, v {v} with a layout must share their rank"
            )
        lay = layout_of(args, len(q), where)
        q, k, v = (canonical_shape(s, j) for s, j in zip((q, k, v), lay))
    if not (len(q) == len(k) == len(v)) or q[:-2] != k[:-2] or q[:-2] != v[:-2]:
        raise ShapeError(
            f"{where}: attention q {q}, k {k}, v {v} must share their batch axes "
            "(all but the last two)"
        )
    if q[-1] != k[-1]:
        raise ShapeError(
            f"{where}: attention q {q} and k {k} must share the head dimension "
            f"(last axis): {q[-1]} vs {k[-1]}"
        )
    if k[-2] != v[-2]:
        raise ShapeError(
            f"{where}: attention k {k} and v {v} must have the same number of keys "
            f"(axis -2): {k[-2]} vs {v[-2]}"
        )
    if k[-2] == 0:
        raise ShapeError(f"{where}: attention over zero keys (k {k}) has no softmax")
    if len(shapes) == 4:
        scores = (*q[:-1], k[-2])
        m = tuple(shapes[3])
        if len(m) > len(scores) or any(
            dm != 1 and dm != ds for dm, ds in zip(m[::-1], scores[::-1])
        ):
            raise ShapeError(
                f"{where}: attention mask of shape {m} does not broadcast to the "
                f"scores {scores}; expected each axis equal or 1"
            )
    out = (*q[:-1], v[-1])
    return (out if lay is None else laid_out_shape(out, lay[3])), dts[0]
