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
    body = FusedBody(
        tuple(FusedOp(op, tuple(args)) for op, args in instrs),
        tuple(space),
        tail,
        tuple(axes),
        keepdims,
    )
    if out_shape is None:
        out_shape = _tail_shape(space, tail, axes, keepdims)
    nid = g.add_node(
        ops.FUSED,
        "fused",
        [x.id for x in xs],
        {"body": body.to_args(), "flops": math.prod(space)},
        shape=out_shape,
        dtype=dtype,
    )
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


def every_kind_graph(dtype):
    """One graph with every single-node kernel kind: elementwise, where, reductions, row ops."""
    g = tl.EinsumGraph()
    a = g.input("a", (6, 10), dtype)
    b = g.input("b", (10,), dtype)
    g.output(g.sigmoid(a * b + 0.5) - g.tanh(a), "y")
    g.output(g.where(a > 0, a, b), "w")
    g.output(g.sum(g.exp(a), axis=1), "s")
    g.output(g.mean(a, axis=0, keepdims=True), "mean")
    g.output(g.max(a), "max")
    g.output(g.min(a, axis=1), "min")
    g.output(g.prod(a, axis=0), "prod")
    g.output(g.logsumexp(a, axis=1), "lse")
    g.output(g.softmax(a, axis=-1), "sm")
    g.output(g.log_softmax(a, axis=0), "lsm")
    return g


def every_kind_inputs(rng, dtype):
    """Fresh inputs for ``every_kind_graph``."""
    return {
        "a": rng.uniform(-2, 2, (6, 10)).astype(dtype),
        "b": rng.uniform(-2, 2, 10).astype(dtype),
    }


# the plan options every_kind_graph is compiled with per dtype (float32: all kernels parallel,
# float64: serial), shared with the warm-process test so it finds their objects cached
EVERY_KIND_OPTIONS = {"float32": {"parallel_threshold": 0}, "float64": {}}


def libm_graph():
    """exp, log and softmax with fast math off (libm calls in the compiled objects)."""
    g = tl.EinsumGraph()
    x = g.input("x", (9, 11), "float64")
    g.output(g.log(g.exp(x) + 1.0), "y")
    g.output(g.softmax(x), "sm")
    return g
