"""Helpers shared by the numba backend tests: fused graphs and their unfused numpy references."""

from __future__ import annotations

import math

import numpy as np

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody, FusedOp


def fused_graph(shapes, dtype, instrs, space, tail=None, axes=(), keepdims=False, out_shape=None):
    """A graph with one FUSED node over inputs x0, x1, ... of ``shapes``."""
    g = tl.EinsumGraph()
    xs = [g.input(f"x{k}", s, dtype) for k, s in enumerate(shapes)]
    body = FusedBody(tuple(FusedOp(op, tuple(args)) for op, args in instrs), tuple(space), tail,
                     tuple(axes), keepdims)
    if out_shape is None:
        out_shape = _tail_shape(space, tail, axes, keepdims)
    nid = g.add_node(ops.FUSED, "fused", [x.id for x in xs],
                     {"body": body.to_args(), "flops": math.prod(space)},
                     shape=out_shape, dtype=dtype)
    g.output(g.tensor(nid), "y")
    return g


def _tail_shape(space, tail, axes, keepdims):
    if tail is None or tail in ops.ROW_OPS:
        return tuple(space)
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(space))
    return tuple(n for d, n in enumerate(space) if d not in axes)


def reference(shapes, dtype, instrs, tail=None, axes=(), keepdims=False, inputs=None):
    """The same program as an unfused graph, run on the numpy backend."""
    g = tl.EinsumGraph()
    xs = [g.input(f"x{k}", s, dtype) for k, s in enumerate(shapes)]
    tmps = []

    def ref(r):
        kind, v = r
        if kind == "in":
            return xs[v]
        if kind == "tmp":
            return tmps[v]
        return g.constant(np.asarray(v, dtype))

    for op, args in instrs:
        a = [ref(r) for r in args]
        if op == "where":
            tmps.append(g.where(*a))
        elif ops.ELEMENTWISE[op].arity == 1:
            tmps.append(g.unary(op, a[0]))
        else:
            tmps.append(g.binary(op, a[0], a[1]))
    v = tmps[-1] if tmps else xs[0]
    if tail in ops.ROW_OPS:
        v = g._rowop(tail, v, axes[0], None)
    elif tail is not None:
        v = g.reduce(tail, v, list(axes), keepdims)
    g.output(v, "y")
    return tl.compile(g, backend="numpy", opt_level=0)(**inputs)["y"]


def random_inputs(rng, shapes, dtype, low=-2.0, high=2.0):
    """Fresh uniform inputs (never zeros)."""
    return {f"x{k}": rng.uniform(low, high, s).astype(dtype) for k, s in enumerate(shapes)}


def tol(dtype, n=1):
    """rtol/atol for a dtype and a reduction length (our sums accumulate in float64)."""
    eps = float(np.finfo(dtype).eps)
    s = max(1.0, math.sqrt(n))
    return {"rtol": 64 * eps * s, "atol": 64 * eps * s}
