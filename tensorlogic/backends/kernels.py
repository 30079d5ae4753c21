"""Kernels for every node kind, written once against numpy's API.

``make_kernel(xp, node, in_nodes, copy)`` returns ``kernel(inputs, out)``. ``xp`` is the array
module (numpy, or CuPy, whose arrays accept the same ufuncs with ``out=``).

Each maker returns a ``PreparedKernel`` (backends.base) whose fields the compiler reads:

- ``scratch``: (shape, dtype) temporaries. The executor appends one arena buffer per entry to
  the kernel's inputs, so ``inputs[len(node.inputs) + j]`` is scratch buffer j. Every kernel
  here also runs without them (it then allocates), so a wrapper that drops them stays correct.
- ``inplace``: positions of inputs that ``out`` may alias exactly (same shape and dtype) with the
  kernel still correct; the memory planner may then let the output overwrite such an input when
  it dies at this step.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import BackendError
from ..ir import ops, pairwise, sliced, spec as einspec
from ..ir.evaluate import row_program
from .base import PreparedKernel


def einsum_kernel(xp, node, in_nodes, matmul=None) -> PreparedKernel:
    """Kernel for an einsum node; it carries its FLOPs, scratch and (for 3+ operands) its path.

    ``matmul(A, B, out)`` replaces ``xp.matmul`` for its products (``pairwise.plan_einsum``).
    """
    shapes = [tuple(n.shape) for n in in_nodes]
    es = einspec.parse(node.args["spec"], [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    # operands of a narrower dtype are widened first (into scratch buffers), so their own
    # diagonals and sums are computed in the result's precision, as numpy.einsum does
    widen = [n.dtype != node.dtype for n in in_nodes]
    dts = [node.dtype if w else n.dtype for n, w in zip(in_nodes, widen)]
    if node.args.get("path_slices"):
        plan = sliced.plan_sliced(
            es,
            shapes,
            sizes,
            node.args["path_strategy"],
            list(node.args["path_slices"]),
            node.dtype,
            dts,
            matmul,
            host=xp is np,
        )
    else:
        plan = pairwise.plan_einsum(
            es, shapes, sizes, node.args.get("path_strategy"), dts, matmul, host=xp is np
        )
    run = plan.run
    n = len(in_nodes)
    k_plan = len(plan.scratch)
    wide = [(j, shapes[j]) for j in range(n) if widen[j]]

    if any(widen):

        def kernel(args, out):
            given = len(args) > n
            ops_ = list(args[:n])
            for w, (j, _shape) in enumerate(wide):
                if given:
                    buf = args[n + k_plan + w]
                    xp.copyto(buf, ops_[j])
                    ops_[j] = buf
                else:
                    ops_[j] = ops_[j].astype(node.dtype)
            return run(xp, ops_, out, args[n : n + k_plan] if given else None)
    elif plan.scratch:

        def kernel(args, out):
            return run(xp, args, out, args[n:] if len(args) > n else None)
    else:

        def kernel(args, out):
            return run(xp, args, out)

    # impl: the contraction plan (its GEMMs, whether it sums outside matmul) for backends that
    # choose a precision path by it
    return PreparedKernel(
        kernel,
        flops=plan.flops,
        info=path_note(node, plan) if len(in_nodes) > 2 else "",
        scratch=tuple(plan.scratch) + tuple((shape, node.dtype) for _, shape in wide),
        impl=plan,
    )


def path_note(node, plan) -> str:
    """What print(plan) shows about a contraction path: pairs, strategy, largest intermediate."""
    info = node.args.get("path_info")
    if not info:
        return f"path={plan.path}"
    slice_note = (
        f", sliced over {info['slices']} ({info['n_slices']} slices, per slice)"
        if info.get("slices")
        else ""
    )
    return (
        f"path={[tuple(p) for p in plan.path]} ({info['strategy']}, "
        f"largest intermediate {plan.largest_intermediate} elements{slice_note})"
    )


def _arg(xp, a: list, k: int, shape: tuple, dtype: str):
    """Input k, or a fresh array when the caller passed no scratch buffers."""
    return a[k] if len(a) > k else xp.empty(shape, dtype)


def _keep_shape(shape: tuple, axes: tuple[int, ...]) -> tuple:
    return tuple(1 if k in axes else d for k, d in enumerate(shape))


# what a reduction over zero elements gives, as numpy defines it (mean: nan, without numpy's
# "Mean of empty slice" warning); max and min have none and are refused by shape inference
EMPTY_REDUCTION = {"sum": 0.0, "mean": float("nan"), "prod": 1.0, "logsumexp": float("-inf")}


def empty_reduction_kernel(op: str, shape: tuple, axes: tuple[int, ...]) -> PreparedKernel | None:
    """A kernel filling ``out`` with the value of ``op`` over zero elements, when the reduced
    axes of ``shape`` hold none; else None."""
    if op not in EMPTY_REDUCTION or math.prod(int(shape[a]) for a in axes) != 0:
        return None
    value = EMPTY_REDUCTION[op]

    def fill(a, out):
        out[...] = value
        return out

    return PreparedKernel(fill, info=f"[{op} over an empty axis]")


def _logsumexp(xp, x, axes, keepdims, out):
    """logsumexp of x over axes into out (allocating its temporaries)."""
    k = _logsumexp_kernel(
        xp, tuple(x.shape), x.dtype.name, tuple(a % x.ndim for a in axes), keepdims
    )
    return k([x], out)


def _softmax(xp, x, axis, out):
    """softmax of x along axis into out (out may be x)."""
    return _softmax_kernel(xp, tuple(x.shape), x.dtype.name, axis % x.ndim, False)([x], out)


def _log_softmax(xp, x, axis, out):
    """log_softmax of x along axis into out (out may be x)."""
    return _softmax_kernel(xp, tuple(x.shape), x.dtype.name, axis % x.ndim, True)([x], out)


def _layer_norm(xp, x, axis, eps, out):
    """layer_norm of x along axis into out (out may be x; allocates its temporaries)."""
    return _layer_norm_kernel(xp, tuple(x.shape), x.dtype.name, axis % x.ndim, eps)([x], out)


def _layer_norm_kernel(xp, x_shape, dtype, axis, eps) -> PreparedKernel:
    """(x - mean) / sqrt(var + eps) along axis; the variance is the mean of squared deviations
    (two passes over the centred values, as numpy's var computes it)."""
    kd = _keep_shape(x_shape, (axis % len(x_shape),))

    def layer_norm(a, out):
        m = _arg(xp, a, 1, kd, dtype)
        t = _arg(xp, a, 2, x_shape, dtype)
        a[0].mean(axis=axis, keepdims=True, out=m)
        xp.subtract(a[0], m, out=out)
        xp.multiply(out, out, out=t)
        t.mean(axis=axis, keepdims=True, out=m)
        xp.add(m, eps, out=m)
        xp.sqrt(m, out=m)
        return xp.divide(out, m, out=out)

    # the input is read only before (or where) out is first written
    return PreparedKernel(layer_norm, scratch=((kd, dtype), (tuple(x_shape), dtype)), inplace=(0,))


def _logsumexp_kernel(xp, x_shape, dtype, axes, keepdims) -> PreparedKernel:
    kd = _keep_shape(x_shape, axes)

    def kernel(a, out):
        x = a[0]
        t = _arg(xp, a, 1, x_shape, dtype)
        m = _arg(xp, a, 2, kd, dtype)
        fin = _arg(xp, a, 3, kd, "bool")
        x.max(axis=axes, keepdims=True, out=m)
        # rows that are all -inf (or hold inf/nan) are shifted by 0 so the result is -inf/inf/nan
        xp.isfinite(m, out=fin)
        xp.logical_not(fin, out=fin)
        xp.copyto(m, 0, where=fin)
        xp.subtract(x, m, out=t)
        xp.exp(t, out=t)
        # a contiguous out reshapes to a view; a strided one (a caller's block) gets a temporary
        s = out.reshape(kd) if out.flags.c_contiguous else xp.empty(kd, dtype)
        t.sum(axis=axes, keepdims=True, out=s)
        xp.log(s, out=s)
        xp.add(s, m, out=s)
        if not out.flags.c_contiguous:
            out[...] = s.reshape(out.shape)
        return out

    return PreparedKernel(kernel, scratch=((tuple(x_shape), dtype), (kd, dtype), (kd, "bool")))


def _softmax_kernel(xp, x_shape, dtype, axis, log: bool) -> PreparedKernel:
    kd = _keep_shape(x_shape, (axis,))

    def softmax(a, out):
        m = _arg(xp, a, 1, kd, dtype)
        a[0].max(axis=axis, keepdims=True, out=m)
        xp.subtract(a[0], m, out=out)
        xp.exp(out, out=out)
        out.sum(axis=axis, keepdims=True, out=m)
        return xp.divide(out, m, out=out)

    def log_softmax(a, out):
        m = _arg(xp, a, 1, kd, dtype)
        t = _arg(xp, a, 2, x_shape, dtype)
        a[0].max(axis=axis, keepdims=True, out=m)
        xp.subtract(a[0], m, out=out)
        xp.exp(out, out=t)
        t.sum(axis=axis, keepdims=True, out=m)
        xp.log(m, out=m)
        return xp.subtract(out, m, out=out)

    # the input is read only before out is first written
    return PreparedKernel(
        log_softmax if log else softmax,
        scratch=((kd, dtype),) + (((tuple(x_shape), dtype),) if log else ()),
        inplace=(0,),
    )


# row ops with a kernel of their own here (reductions: those with a numpy function, and
# logsumexp); any other row op or reduction of the table runs its row program
TUNED_ROW_OPS = ("softmax", "log_softmax", "layer_norm")


def program_kernel(
    op: str, axes: tuple[int, ...], keepdims: bool, eps: float = 0.0
) -> PreparedKernel:
    """A host kernel of any row op or reduction: its row program (``ops.ROW_PROGRAMS``) with
    the op table's numpy functions (temporaries allocated per call)."""

    def run(a, out):
        r = row_program(op, a[0].astype(out.dtype, copy=False), axes, eps)
        out[...] = r if keepdims else r.reshape(out.shape)
        return out

    return PreparedKernel(run)


_XP_COMBINE = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}


def row_grad_kernel(xp, node) -> PreparedKernel:
    """A row op's backward (``ops.ROW_GRAD_PROGRAMS``) with the array module's operations, in
    float32 at least (16-bit operands widen): one array operation per step of the program."""
    op, axis = node.op, int(node.args["axis"])
    names = ops.ROW_GRAD_OPERANDS[op]
    eps = float(node.args.get("eps", 0.0))
    work = np.promote_types(node.dtype, np.float32)
    axes = (axis % max(len(node.shape), 1),)
    n = max(math.prod(node.shape[a] for a in axes), 1)

    def run(a, out):
        env = {k: x.astype(work, copy=False) for k, x in zip(names, a)}
        env["inv_n"], env["eps"] = work.type(1.0 / n), work.type(eps)

        def value(e):
            if isinstance(e, str):
                return env[e]
            if isinstance(e, (int, float)):
                return work.type(e)
            name, *args = e
            return ops.ELEMENTWISE[name].numpy(*(value(v) for v in args), out=None)

        for st in ops.ROW_GRAD_PROGRAMS[op]:
            if st.kind == "reduce":
                red = getattr(xp, _XP_COMBINE[ops.REDUCTION_TABLE[st.combine].combine])
                env[st.name] = red(value(st.expr), axis=axes, keepdims=True)
            elif st.kind in ("let", "map"):
                env[st.name] = value(st.expr)
            else:
                out[...] = value(st.expr)
                return out
        raise BackendError(f"the {op} backward row program has no write step")

    return PreparedKernel(run)


def make_kernel(xp, node, in_nodes, copy: bool) -> PreparedKernel:
    """Kernel for one non-einsum, non-fused node.

    ``copy``: transpose and reshape write into ``out`` instead of returning a view (for outputs
    and for layouts a view cannot express).
    """
    kind, op = node.kind, node.op
    shape = tuple(node.shape)
    if kind in (ops.UNARY, ops.BINARY):
        row = ops.ELEMENTWISE[op]
        fn = row.numpy
        src = in_nodes[0].dtype
        if kind == ops.UNARY and src != node.dtype and op != "abs":
            # a unary op whose result dtype differs (exp of int8 is float16) computes on its
            # input converted to that dtype, as numpy's loop does; composite ops (gelu, sigmoid)
            # would otherwise run their first steps in the input's integer loops
            in_shape = tuple(in_nodes[0].shape)

            def converted(a, out):
                x = _arg(xp, a, 1, in_shape, node.dtype)
                xp.copyto(x, a[0])
                return fn(x, out=out)

            return PreparedKernel(converted, scratch=((in_shape, node.dtype),))
        if kind == ops.UNARY:
            kernel = lambda a, out: fn(a[0], out=out)  # noqa: E731
        else:
            kernel = lambda a, out: fn(a[0], a[1], out=out)  # noqa: E731
        return PreparedKernel(kernel, inplace=tuple(range(row.arity)) if row.alias_safe else ())
    if kind == ops.WHERE:
        # the where row without its numpy function's per-call mask: the mask lives in scratch
        def where(a, out):
            mask = _arg(xp, a, 3, shape, "bool")
            xp.not_equal(a[0], 0, out=mask)  # before out is written: out may alias the condition
            xp.copyto(out, a[2])
            xp.copyto(out, a[1], where=mask)
            return out

        return PreparedKernel(where, scratch=((shape, "bool"),), inplace=(0, 2))
    if kind == ops.REDUCE:
        axes = tuple(node.args["axes"])
        kd = bool(node.args.get("keepdims"))
        empty = empty_reduction_kernel(op, tuple(in_nodes[0].shape), axes)
        if empty is not None:
            return empty
        if op == "logsumexp":
            return _logsumexp_kernel(xp, tuple(in_nodes[0].shape), node.dtype, axes, kd)
        if ops.REDUCTION_TABLE[op].numpy is None:
            return program_kernel(op, axes, kd)
        red = getattr(xp, ops.REDUCTION_TABLE[op].numpy)
        return PreparedKernel(lambda a, out: red(a[0], axis=axes, keepdims=kd, out=out))
    if kind == ops.ROWGRAD:
        return row_grad_kernel(xp, node)
    if kind == ops.ROWOP and op == "layer_norm":
        return _layer_norm_kernel(
            xp, tuple(in_nodes[0].shape), node.dtype, node.args["axis"], float(node.args["eps"])
        )
    if kind == ops.ROWOP and op in TUNED_ROW_OPS:
        return _softmax_kernel(
            xp, tuple(in_nodes[0].shape), node.dtype, node.args["axis"], op == "log_softmax"
        )
    if kind == ops.ROWOP:
        return program_kernel(op, (int(node.args["axis"]),), True, float(node.args.get("eps", 0.0)))
    if kind == ops.TRANSPOSE:
        perm = tuple(node.args["perm"])
        if copy:

            def transpose_copy(a, out):
                xp.copyto(out, a[0].transpose(perm))
                return out

            return PreparedKernel(transpose_copy)
        return PreparedKernel(lambda a, out: a[0].transpose(perm))
    if kind == ops.RESHAPE:
        if copy:

            def reshape_copy(a, out):
                # C-order reshape is a flat-index match: copy through a view of the contiguous out
                xp.copyto(out.reshape(a[0].shape), a[0])
                return out

            return PreparedKernel(reshape_copy)
        return PreparedKernel(lambda a, out: a[0].reshape(shape))
    if kind == ops.ATTENTION:
        from .numpy.attention import attention_kernel

        if xp is not np:
            raise BackendError(f"node {node.name!r}: the host attention kernel needs numpy arrays")
        return attention_kernel(node, in_nodes)
    if kind == ops.CAST:
        if in_nodes[0].dtype.startswith("complex") and not node.dtype.startswith("complex"):

            def cast_real(a, out):  # astype's result, without its ComplexWarning
                out[...] = a[0].real
                return out

            return PreparedKernel(cast_real)

        def cast(a, out):
            out[...] = a[0]
            return out

        return PreparedKernel(cast)
    raise BackendError(f"node {node.name!r}: no kernel for node kind {kind!r}")
