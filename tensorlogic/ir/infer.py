"""Shape and dtype inference for every node kind.

A dimension is an ``int`` or a symbol name (``str``) that a plan binds to a size when it is called.
Every function raises a TensorLogicError subclass naming the node and the offending shapes.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from .. import dtypes
from ..errors import GraphError, ShapeError
from . import attention, ops, spec as einspec

Dim = int | str
Shape = tuple[Dim, ...]


def broadcast(shapes: Sequence[Shape], where: str) -> Shape:
    """numpy broadcasting over shapes whose dims may be symbols."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for k in range(rank):
        dim: Dim = 1
        for s in shapes:
            j = k - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1 or d == dim:
                continue
            if dim == 1:
                dim = d
            else:
                shown = ", ".join(str(tuple(s)) for s in shapes)
                raise ShapeError(
                    f"{where}: shapes {shown} cannot be broadcast together (dimension {k} from the "
                    f"left of the result: {dim} vs {d}); expected equal sizes or 1"
                )
        out.append(dim)
    return tuple(out)


def normalize_axes(axes, rank: int, where: str) -> tuple[int, ...]:
    """Axes as sorted non-negative ints; None means all axes."""
    if axes is None:
        return tuple(range(rank))
    if not isinstance(axes, (tuple, list)):
        axes = (axes,)  # one axis; a non-integer is reported below
    result = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, (bool, np.bool_)):
            raise GraphError(f"{where}: axis {a!r} is not an integer")
        a = int(a)
        if not -rank <= a < rank:
            raise ShapeError(f"{where}: axis {a} is out of range for a tensor of rank {rank}")
        result.append(a % rank)
    if len(set(result)) != len(result):
        raise GraphError(f"{where}: repeated axis in {tuple(axes)}")
    return tuple(sorted(result))


def _product(shape: Sequence[Dim]) -> tuple[int, Counter]:
    n, syms = 1, Counter()
    for d in shape:
        if isinstance(d, str):
            syms[d] += 1
        else:
            n *= d
    return n, syms


def reshape_target(shape: Shape, newshape: Sequence[Dim], where: str) -> Shape:
    """Resolve a reshape's target (one -1 allowed) against an input shape with symbols."""
    if sum(1 for d in newshape if d == -1) > 1:
        raise ShapeError(f"{where}: reshape target {tuple(newshape)} has more than one -1")
    for d in newshape:
        if not (isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= -1)):
            raise ShapeError(f"{where}: invalid reshape dimension {d!r} in {tuple(newshape)}")
    n_in, s_in = _product(shape)
    known = [d for d in newshape if d != -1]
    n_new, s_new = _product(known)
    if -1 in newshape:
        rest = s_in - s_new
        if (
            s_new - s_in
            or (n_new == 0 or n_in % n_new)
            or len(rest) > 1
            or (rest and n_in // n_new != 1)
        ):
            raise ShapeError(
                f"{where}: cannot reshape {tuple(shape)} into "
                f"{tuple(newshape)}; the -1 does not resolve"
            )
        fill: Dim = next(iter(rest)) if rest else n_in // n_new
        return tuple(fill if d == -1 else d for d in newshape)
    if n_in != n_new or s_in != s_new:
        raise ShapeError(
            f"{where}: cannot reshape {tuple(shape)} into {tuple(newshape)}; sizes differ"
        )
    return tuple(newshape)


# reductions and row ops with no value over an empty axis (numpy has no identity for max/min);
# sum, mean, prod and logsumexp follow numpy there (0, nan, 1, -inf)
NO_IDENTITY = ("max", "min", "softmax", "log_softmax")


def _refuse_empty(op: str, shape: Shape, axes: Sequence[int], where: str) -> None:
    """Symbolic sizes are checked again when the plan binds them (at call time)."""
    empty = [a for a in axes if shape[a] == 0]
    if empty:
        raise ShapeError(
            f"{where}: {op} over axis {empty[0]} of shape {tuple(shape)}, which is "
            f"empty; {op} has no value over zero elements (expected a size >= 1)"
        )


def _known_ops(kind: str) -> tuple[str, ...] | None:
    """The ops of the table a node kind takes (read at call time: the table is the source)."""
    if kind == ops.REDUCE:
        return ops.REDUCTIONS
    if kind == ops.ROWOP:
        return ops.ROW_OPS
    if kind == ops.ROWGRAD:
        return tuple(ops.ROW_GRAD_PROGRAMS)
    return ops.OPS_OF_KIND.get(kind)


_OP_WORD = {
    ops.UNARY: "unary op",
    ops.BINARY: "binary op",
    ops.WHERE: "three-operand op",
    ops.REDUCE: "reduction",
    ops.ROWOP: "row op",
    ops.ROWGRAD: "row op backward",
}


def _rowgrad(op: str, shapes: list, dts: list, args: Mapping, where: str) -> tuple[Shape, str]:
    """A row op's backward: operands of one shape and one float dtype; the result is both."""
    names = ops.ROW_GRAD_OPERANDS[op]
    if len(shapes) != len(names):
        raise GraphError(
            f"{where}: the {op} backward takes {len(names)} inputs ({', '.join(names)}), "
            f"got {len(shapes)}"
        )
    if any(s != shapes[0] for s in shapes) or any(d != dts[0] for d in dts):
        raise ShapeError(
            f"{where}: the {op} backward needs operands of one shape and dtype, got "
            f"{[(tuple(s), d) for s, d in zip(shapes, dts)]}"
        )
    if dtypes.kind(dts[0]) != "f":
        raise GraphError(f"{where}: the {op} backward needs a float dtype, got {dts[0]}")
    normalize_axes(args["axis"], len(shapes[0]), where)
    if ops.row_grad_takes_eps(op):
        if "eps" not in args:
            raise GraphError(f"{where}: the {op} backward needs an 'eps' argument")
        check_eps(args["eps"], where)
    elif "eps" in args:
        raise GraphError(f"{where}: the {op} backward takes no 'eps' argument")
    return shapes[0], dts[0]


def infer(
    kind: str, op: str | None, inputs: Sequence, args: Mapping, where: str
) -> tuple[Shape, str]:
    """Return (shape, dtype) of a node given its input nodes (objects with shape and dtype)."""
    shapes = [tuple(n.shape) for n in inputs]
    dts = [n.dtype for n in inputs]
    known = _known_ops(kind)
    if known is not None and op not in known:
        # add_node and loaded graphs reach here without the builder methods' checks
        raise GraphError(f"{where}: unknown {_OP_WORD[kind]} {op!r}; expected one of {known}")
    if kind == ops.EINSUM:
        es = einspec.parse(args["spec"], [len(s) for s in shapes])
        for k, (term, s) in enumerate(zip(es.inputs, shapes)):
            for ch in set(term):
                ds = {d for c, d in zip(term, s) if c == ch}
                if len(ds) > 1:
                    raise ShapeError(
                        f"{where}: einsum {args['spec']}: repeated index {ch!r} in operand {k} "
                        f"spans dimensions of different sizes "
                        f"{sorted(map(str, ds))} (shape {s}); expected equal"
                    )
        sizes = einspec.letter_sizes(es, shapes, args["spec"], f"{where}: ")
        return einspec.output_shape(es, sizes), dtypes.einsum_result(dts)
    if kind in ops.ELEMENTWISE_KINDS:
        shape = shapes[0] if len(shapes) == 1 else broadcast(shapes, f"{where} ({op})")
        return shape, dtypes.elementwise_result(op, ops.DTYPE[op], dts, f"{where}: ")
    if kind == ops.REDUCE:
        axes = normalize_axes(args["axes"], len(shapes[0]), where)
        if op in NO_IDENTITY:
            _refuse_empty(op, shapes[0], axes, where)
        if args.get("keepdims"):
            shape = tuple(1 if i in axes else d for i, d in enumerate(shapes[0]))
        else:
            shape = tuple(d for i, d in enumerate(shapes[0]) if i not in axes)
        return shape, dtypes.reduction_result(op, dts[0], f"{where}: ")
    if kind == ops.ROWGRAD:
        return _rowgrad(op, shapes, dts, args, where)
    if kind == ops.ROWOP:
        axes = normalize_axes(args["axis"], len(shapes[0]), where)
        if op in NO_IDENTITY:
            _refuse_empty(op, shapes[0], axes, where)
        if ops.takes_eps(op):
            if "eps" not in args:
                raise GraphError(f"{where}: {op} needs an 'eps' argument")
            check_eps(args["eps"], where)
        elif "eps" in args:
            raise GraphError(f"{where}: {op} takes no 'eps' argument")
        return shapes[0], dtypes.rowop_result(op, dts[0], f"{where}: ")
    if kind == ops.TRANSPOSE:
        perm = tuple(args["perm"])
        if sorted(perm) != list(range(len(shapes[0]))):
            raise ShapeError(
                f"{where}: transpose permutation {perm} is not a permutation of the "
                f"{len(shapes[0])} axes of shape {shapes[0]}"
            )
        return tuple(shapes[0][p] for p in perm), dts[0]
    if kind == ops.RESHAPE:
        return reshape_target(shapes[0], args["shape"], where), dts[0]
    if kind == ops.CAST:
        return shapes[0], dtypes.normalize(args["dtype"], f"{where}: ")
    if kind == ops.ATTENTION:
        return attention.infer(shapes, dts, args, where)
    raise GraphError(f"{where}: unknown node kind {kind!r}")


def check_eps(eps: Any, where: str) -> float:
    """A layer_norm epsilon: a finite, non-negative real number (returned as a float)."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(
        eps, (int, float, np.integer, np.floating)
    ):
        raise GraphError(f"{where}: eps must be a real number, got {type(eps).__name__}")
    value = float(eps)
    if not math.isfinite(value) or value < 0:
        raise GraphError(f"{where}: eps must be finite and >= 0, got {value!r}")
    return value
