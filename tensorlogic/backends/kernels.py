"""Kernels for every node kind, written once against numpy's API.

``make_kernel(xp, node, in_nodes, graph, is_output)`` returns ``kernel(inputs, out)``. ``xp`` is
the array module (numpy, or CuPy, whose arrays accept the same ufuncs with ``out=``).
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import BackendError
from ..ir import ops, spec as einspec
from . import contract

Kernel = Callable[[list, Any], Any]


def einsum_kernel(xp, node, in_nodes) -> Kernel:
    """Kernel for an einsum node; it carries its FLOPs and (for 3+ operands) its path."""
    shapes = [tuple(n.shape) for n in in_nodes]
    es = einspec.parse(node.args["spec"], [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    plan = contract.plan_einsum(es, shapes, sizes, node.args.get("path_strategy"))
    run = plan.run
    # operands of a narrower dtype are widened first, so their own diagonals and sums are
    # computed in the result's precision, as numpy.einsum does
    widen = [n.dtype != node.dtype for n in in_nodes]

    if any(widen):
        def kernel(args, out):
            args = [a.astype(node.dtype) if w else a for a, w in zip(args, widen)]
            return run(xp, args, out)
    else:
        def kernel(args, out):
            return run(xp, args, out)

    kernel.flops = plan.flops
    kernel.info = path_note(node, plan) if len(in_nodes) > 2 else ""
    return kernel


def path_note(node, plan) -> str:
    """What print(plan) shows about a contraction path: pairs, strategy, largest intermediate."""
    info = node.args.get("path_info")
    if not info:
        return f"path={plan.path}"
    return (f"path={[tuple(p) for p in plan.path]} ({info['strategy']}, "
            f"largest intermediate {plan.largest_intermediate} elements)")


def _logsumexp(xp, x, axes, keepdims, out):
    m = x.max(axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    s = xp.exp(x - m).sum(axis=axes, keepdims=True)
    r = xp.log(s) + m
    out[...] = r if keepdims else r.reshape(out.shape)
    return out


def _softmax(xp, x, axis, out):
    m = x.max(axis=axis, keepdims=True)
    xp.subtract(x, m, out=out)
    xp.exp(out, out=out)
    s = out.sum(axis=axis, keepdims=True)
    return xp.divide(out, s, out=out)


def _log_softmax(xp, x, axis, out):
    m = x.max(axis=axis, keepdims=True)
    xp.subtract(x, m, out=out)
    s = xp.log(xp.exp(out).sum(axis=axis, keepdims=True))
    return xp.subtract(out, s, out=out)


def make_kernel(xp, node, in_nodes, is_output: bool) -> Kernel:
    """Kernel for one non-einsum, non-fused node."""
    kind, op = node.kind, node.op
    if kind in (ops.UNARY, ops.BINARY):
        fn = ops.ELEMENTWISE[op].numpy
        if kind == ops.UNARY:
            return lambda a, out: fn(a[0], out=out)
        return lambda a, out: fn(a[0], a[1], out=out)
    if kind == ops.WHERE:
        def where(a, out):
            xp.copyto(out, a[2])
            xp.copyto(out, a[1], where=a[0] != 0)
            return out
        return where
    if kind == ops.REDUCE:
        axes = tuple(node.args["axes"])
        kd = bool(node.args.get("keepdims"))
        if op == "logsumexp":
            return lambda a, out: _logsumexp(xp, a[0], axes, kd, out)
        red = {"sum": xp.sum, "mean": xp.mean, "max": xp.max, "min": xp.min, "prod": xp.prod}[op]
        return lambda a, out: red(a[0], axis=axes, keepdims=kd, out=out)
    if kind == ops.ROWOP:
        axis = node.args["axis"]
        row = _softmax if op == "softmax" else _log_softmax
        return lambda a, out: row(xp, a[0], axis, out)
    if kind == ops.TRANSPOSE:
        perm = tuple(node.args["perm"])
        if is_output:
            def transpose_copy(a, out):
                out[...] = a[0].transpose(perm)
                return out
            return transpose_copy
        return lambda a, out: a[0].transpose(perm)
    if kind == ops.RESHAPE:
        shape = tuple(node.shape)
        if is_output:
            def reshape_copy(a, out):
                out[...] = a[0].reshape(shape)
                return out
            return reshape_copy
        return lambda a, out: a[0].reshape(shape)
    if kind == ops.CAST:
        def cast(a, out):
            out[...] = a[0]
            return out
        return cast
    raise BackendError(f"node {node.name!r}: no kernel for node kind {kind!r}")


def elementwise_flops(node, n_elements: int) -> int:
    """FLOPs of a non-einsum node."""
    if node.kind in (ops.UNARY, ops.BINARY):
        return ops.ELEMENTWISE[node.op].flops * n_elements
    if node.kind == ops.WHERE:
        return n_elements
    return 0
