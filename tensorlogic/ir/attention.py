"""The attention op: ``softmax(scale * q @ k^T + mask, causal) @ v`` as one graph node.

Layout (the canonical form every backend implements): ``q`` is ``(*batch, Sq, D)``, ``k`` is
``(*batch, Sk, D)``, ``v`` is ``(*batch, Sk, Dv)``, the result ``(*batch, Sq, Dv)``; the batch
axes (batch, heads, ...) are equal in all three. An optional additive ``mask`` broadcasts (numpy
rules) against the scores ``(*batch, Sq, Sk)``. ``causal=True`` lets query ``i`` see keys
``j <= i`` only (top-left aligned, as torch's ``is_causal``); it needs no mask tensor. Rows whose
every key is masked give NaN, as the softmax of an all ``-inf`` row does.

The optimizer's ``attention`` pass brings other einsum layouts (head axes anywhere) to this form
with transposes, so one kernel per backend serves them all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DTypeError, GraphError, ShapeError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
ARGS = ("scale", "causal")


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
    if "scale" not in args or "causal" not in args:
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
    return float(scale), causal


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
    return (*q[:-1], v[-1]), dts[0]
