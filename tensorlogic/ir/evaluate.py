"""Evaluate one node on numpy arrays: the graph's meaning, with no backend involved.

Every node kind (fused nodes included) is computed with textbook numpy in the node's dtype,
from the op table's numpy column for elementwise ops. The optimizer folds constants with it
(the IR and the optimizer import nothing from the backends), and a backend may use it as the
simplest correct kernel of a step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import attention as attn_ir
from . import ops
from . import spec as einspec
from .fused import FusedBody, FusedOp


def _elementwise(op: str, args: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
    # numpy's own loop for the operands' dtypes, written into the result dtype (as the numpy
    # backend runs it: int / int -> float64, abs of complex -> float, comparisons -> bool); a
    # unary op that changes the dtype (gelu of int8 -> float16) runs on its converted input,
    # so composite ops do not start in the input's integer loops
    args = [np.asarray(a) for a in args]
    if len(args) == 1 and op != "abs" and args[0].dtype != dtype:
        args = [args[0].astype(dtype)]
    out = np.empty(np.broadcast_shapes(*(a.shape for a in args)), dtype)
    return ops.ELEMENTWISE[op].numpy(*args, out=out)


def _reduce(
    op: str, x: np.ndarray, axes: tuple[int, ...], keepdims: bool, dtype: np.dtype
) -> np.ndarray:
    if ops.REDUCTION_TABLE[op].combine is None:  # logsumexp: its row program
        r = row_program(op, x.astype(dtype, copy=False), axes)
        return r if keepdims else np.squeeze(r, axis=axes)
    shape = (
        tuple(1 if k in axes else d for k, d in enumerate(x.shape))
        if keepdims
        else tuple(d for k, d in enumerate(x.shape) if k not in axes)
    )
    out = np.empty(shape, dtype)
    return getattr(np, ops.REDUCTION_TABLE[op].numpy)(x, axis=axes, keepdims=keepdims, out=out)


def _cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if x.dtype.kind == "c" and dtype.kind != "c":
        x = x.real  # a complex-to-real cast keeps the real part
    return x.astype(dtype, copy=False)


# the ufunc of each combine of the reduction table (max and min propagate NaN, like the table's)
_COMBINE_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def row_program(name: str, x: np.ndarray, axes: tuple[int, ...], eps: float = 0.0) -> np.ndarray:
    """The row program of a row op or reduction (``ops.ROW_PROGRAMS``) over ``axes`` of ``x``,
    computed in x's dtype with the op table's numpy functions: the row op's result (x's shape)
    or the reduction's (``axes`` kept as size 1)."""
    return run_row_program(ops.ROW_PROGRAMS[name], {"x": x}, axes, eps, name)


def row_grad(name: str, xs: Sequence[np.ndarray], axis: int, eps: float = 0.0) -> np.ndarray:
    """The backward row program of row op ``name`` (``ops.ROW_GRAD_PROGRAMS``) over ``axis``
    of its operands ``xs`` (named by ``ops.ROW_GRAD_OPERANDS``), computed in float32 at least
    (16-bit floats widen, as their forward row ops do)."""
    work = np.promote_types(xs[0].dtype, np.float32)
    env = {n: x.astype(work, copy=False) for n, x in zip(ops.ROW_GRAD_OPERANDS[name], xs)}
    axes = (axis % max(xs[0].ndim, 1),)
    r = run_row_program(ops.ROW_GRAD_PROGRAMS[name], env, axes, eps, f"{name} backward")
    return r.astype(xs[0].dtype, copy=False)


def run_row_program(
    program: Sequence[ops.RowStep],
    rows: Mapping[str, np.ndarray],
    axes: tuple[int, ...],
    eps: float,
    what: str,
) -> np.ndarray:
    """A row program over named operand arrays of one shape and dtype (see ``ops.RowStep``)."""
    first = next(iter(rows.values()))
    dtype, shape = first.dtype, first.shape
    n = max(math.prod(shape[a] for a in axes), 1)
    env: dict[str, Any] = {**rows, "inv_n": dtype.type(1.0 / n), "eps": dtype.type(eps)}

    def value(e):
        if isinstance(e, str):
            return env[e]
        if isinstance(e, (int, float)):
            return np.asarray(e, dtype)
        op, *args = e
        return _elementwise(op, [np.asarray(value(a)) for a in args], dtype)

    for st in program:
        if st.kind == "reduce":
            combine = _COMBINE_UFUNC[ops.REDUCTION_TABLE[st.combine].combine]
            env[st.name] = combine.reduce(value(st.expr), axis=axes, keepdims=True)
        elif st.kind in ("let", "map"):
            env[st.name] = value(st.expr)
        else:  # write (a row of the operands' shape) or result (one value per row)
            v = np.asarray(value(st.expr))
            return np.array(np.broadcast_to(v, shape) if st.kind == "write" else v, dtype)
    raise ValueError(f"row program {what!r} has no write or result step")


def empty_row_value(name: str) -> float:
    """A reduction's value over zero elements, from its row program: each reduce step gives
    its combine's identity, and 1 / the row length is inf (sum 0, mean nan, logsumexp -inf)."""
    env: dict[str, Any] = {"inv_n": np.float64(np.inf), "eps": np.float64(0.0)}

    def value(e):
        if isinstance(e, str):
            return env[e]
        if isinstance(e, (int, float)):
            return np.float64(e)
        op, *args = e
        return _elementwise(op, [np.asarray(value(a)) for a in args], np.dtype(np.float64))

    with np.errstate(all="ignore"):
        for st in ops.ROW_PROGRAMS[name]:
            if st.kind == "reduce":
                env[st.name] = np.float64(ops.REDUCTION_TABLE[st.combine].identity)
            elif st.kind == "let":
                env[st.name] = value(st.expr)
            elif st.kind == "result":
                return float(value(st.expr))
    raise ValueError(f"row program {name!r} has no result step")


def _rowop(op: str, x: np.ndarray, axis: int, eps: float) -> np.ndarray:
    return row_program(op, x, (axis % max(x.ndim, 1),), eps)


def _attention(xs: Sequence[np.ndarray], scale: float, causal: bool, dtype: np.dtype) -> np.ndarray:
    """softmax(scale q k^T + mask) v, computed in float32 at least (16-bit floats widen)."""
    work = np.promote_types(dtype, np.float32)
    q, k, v = (x.astype(work, copy=False) for x in xs[:3])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * work.type(scale)
    if len(xs) == 4:
        s = s + xs[3].astype(work, copy=False)
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None], -np.inf, s).astype(work)
    return np.matmul(_rowop("softmax", s, -1, 0.0), v)


def _program(
    instrs: tuple[FusedOp, ...],
    xs: Sequence[np.ndarray],
    dtype: np.dtype,
    tail: np.ndarray | None = None,
) -> np.ndarray | None:
    vals: list[np.ndarray] = []
    for ins in instrs:
        args = []
        for kind, v in ins.args:
            if kind == "in":
                args.append(xs[v])
            elif kind == "tmp":
                args.append(vals[v])
            elif kind == "tail":
                args.append(tail)
            else:  # a constant
                args.append(np.asarray(v, dtype))
        vals.append(_elementwise(ins.op, args, dtype))
    return vals[-1] if vals else None


def _fused(node: Any, xs: Sequence[np.ndarray]) -> np.ndarray:
    body = FusedBody.from_args(node.args["body"])
    dtype = np.dtype(node.dtype)
    v = _program(body.instrs, xs, dtype)
    if v is None:  # an empty prologue: the row op reads input 0
        v = xs[0].astype(dtype)
    v = np.broadcast_to(v, body.space)
    if body.tail in ops.REDUCTIONS:
        axes = tuple(a % len(body.space) for a in body.axes)
        v = _reduce(body.tail, v, axes, body.keepdims, dtype)
    elif body.tail in ops.ROW_OPS:
        v = _rowop(body.tail, v, body.axes[0], body.eps)
        if body.epilogue:
            v = _program(body.epilogue, xs, dtype, tail=v)
    return v


def evaluate_node(
    node: Any, xs: Sequence[np.ndarray], binding: Mapping[str, int] | None = None
) -> np.ndarray:
    """The value of ``node`` (not an input or constant) from its operands ``xs``.

    Returns a new array of the node's shape and dtype (a transpose or reshape may return a view
    of an operand). ``binding`` gives the sizes of symbolic dimensions in reshape targets.
    """
    kind, op, a = node.kind, node.op, node.args
    dtype = np.dtype(node.dtype)
    with np.errstate(all="ignore"):
        if kind == ops.EINSUM:
            r = einspec.np_einsum(
                a["spec"], *(x.astype(dtype, copy=False) for x in xs), optimize=True
            )
        elif kind in ops.ELEMENTWISE_KINDS:
            r = _elementwise(op, xs, dtype)
        elif kind == ops.REDUCE:
            axes = tuple(k % max(xs[0].ndim, 1) for k in a["axes"])
            r = _reduce(op, xs[0], axes, bool(a.get("keepdims")), dtype)
        elif kind == ops.ROWOP:
            r = _rowop(op, xs[0], int(a["axis"]), float(a.get("eps", ops.LAYER_NORM_EPS)))
        elif kind == ops.ROWGRAD:
            r = row_grad(op, xs, int(a["axis"]), float(a.get("eps", 0.0)))
        elif kind == ops.TRANSPOSE:
            r = np.transpose(xs[0], tuple(a["perm"]))
        elif kind == ops.RESHAPE:
            binding = binding or {}
            r = np.reshape(
                xs[0], tuple(binding.get(d, d) if isinstance(d, str) else d for d in a["shape"])
            )
        elif kind == ops.CAST:
            r = _cast(xs[0], dtype)
        elif kind == ops.FUSED:
            r = _fused(node, xs)
        elif kind == ops.ATTENTION:
            r = _attention(
                attn_ir.canonical_views(xs, a), float(a["scale"]), bool(a["causal"]), dtype
            )
            r = attn_ir.laid_out(r, a)
        else:
            raise ValueError(f"node {node.name!r}: no evaluation rule for node kind {kind!r}")
    r = _cast(np.asarray(r), dtype)
    shape = tuple(binding.get(d, d) if binding and isinstance(d, str) else d for d in node.shape)
    return r.reshape(shape) if r.shape != shape else r


__all__ = ["evaluate_node"]
