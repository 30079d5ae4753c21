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
from ..ir import infer, ops, pairwise, sliced, spec as einspec
from ..ir.evaluate import empty_row_value
from .base import PreparedKernel
from .numpy.rows import RowKernel


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


def empty_reduction_kernel(op: str, shape: tuple, axes: tuple[int, ...]) -> PreparedKernel | None:
    """A kernel filling ``out`` with the value of ``op`` over zero elements (its row program's
    value there: sum 0, mean nan, logsumexp -inf), when the reduced axes of ``shape`` hold
    none; else None. max and min have none and are refused by shape inference."""
    if math.prod(int(shape[a]) for a in axes) != 0 or op in infer.NO_IDENTITY:
        return None
    value = empty_row_value(op)

    def fill(a, out):
        out[...] = value
        return out

    return PreparedKernel(fill, info=f"[{op} over an empty axis]")


def row_kernel(
    xp, op: str, x_shape: tuple, dtype: str, axes: tuple[int, ...], eps: float = 0.0
) -> PreparedKernel:
    """The kernel of a row op, or of a reduction without a numpy function (logsumexp), from its
    row program (``ops.ROW_PROGRAMS``, rendered by ``numpy.rows``); ``out`` has the input's
    shape (a row op) or the reduction's, with or without the kept axes."""
    rk = RowKernel(op, dtype, axes, eps, xp)
    scratch = rk.scratch(x_shape)
    n = len(scratch)
    step = rk.step_function(x_shape)
    # the plan's call: x in the kernel's dtype, the arena's scratch, out in the shape the
    # program writes (a reduction's with its kept axes)
    n_args, dt, x_shape = n + 1, rk.dtype, tuple(x_shape)
    out_shape = x_shape if op in ops.ROW_OPS else rk.kept_shape(x_shape)

    def kernel(a, out):
        x = a[0]
        if (
            step is not None
            and len(a) == n_args
            and x.dtype == dt
            and x.shape == x_shape
            and out.shape == out_shape
        ):
            step(a, out)
            return out
        return rk(a[0], out, a[1 : 1 + n] if len(a) > 1 else None)

    # a row op writes out only once its input is no longer read (numpy.rows)
    return PreparedKernel(kernel, scratch=scratch, inplace=(0,) if op in ops.ROW_OPS else ())


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
        if ops.REDUCTION_TABLE[op].numpy is None:
            return row_kernel(xp, op, tuple(in_nodes[0].shape), node.dtype, axes)
        red = getattr(xp, ops.REDUCTION_TABLE[op].numpy)
        return PreparedKernel(lambda a, out: red(a[0], axis=axes, keepdims=kd, out=out))
    if kind == ops.ROWGRAD:
        return row_grad_kernel(xp, node)
    if kind == ops.ROWOP:
        shape_in = tuple(in_nodes[0].shape)
        axis = int(node.args["axis"]) % max(len(shape_in), 1)
        eps = float(node.args.get("eps", 0.0))
        return row_kernel(xp, op, shape_in, node.dtype, (axis,), eps)
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
