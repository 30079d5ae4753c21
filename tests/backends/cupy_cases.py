"""Kernel cases shared by the CPU codegen tests and the GPU tests: every op, dtype and family."""

from __future__ import annotations

from tensorlogic.backends.cupy import spec as S
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedOp

DTYPES = ("float32", "float64")
# (space, reduced axes) per family: row (block per row), col (thread per point), mixed axes
# plus a scalar register row (999 is no multiple of 4) and few long rows (split reductions; the
# row ops fall back to the multi-pass row kernel)
TAIL_LAYOUTS = (
    ((64, 1000), (1,)),
    ((300, 5, 7), (1,)),
    ((40, 30, 20), (0, 2)),
    ((17, 300), (0,)),
    ((50, 999), (1,)),
    ((4, 50000), (1,)),
)


# gelu(x + bias): a bias broadcast over leading axes, read with vector loads along the rows
BIAS_GELU = S.Program(
    (FusedOp("add", (("in", 0), ("in", 1))), FusedOp("gelu", (("tmp", 0),))),
    ("tmp", 1),
    (4, 64, 256),
)


def contiguous_spec(
    prog: S.Program, dtype: str, shapes, in_dtypes=None, compute: str = ""
) -> S.KernelSpec:
    """A spec over C-contiguous inputs (``compute``: see ``spec.make_spec``)."""
    in_dtypes = in_dtypes or [dtype] * len(shapes)
    strides = [S.contiguous_strides(s) for s in shapes]
    return S.make_spec(prog, dtype, shapes, in_dtypes, strides, compute)


def op_program(op: str, space) -> S.Program:
    """One elementwise op over fresh inputs."""
    n = ops.ELEMENTWISE[op].arity
    return S.Program((FusedOp(op, tuple(("in", k) for k in range(n))),), ("tmp", 0), tuple(space))


# a row op's epilogue: tail * gamma (per position along the row) + residual (full), then a
# literal shift; gamma's shape keeps only the row axis
EPILOGUE = (
    FusedOp("mul", (("tail", 0), ("in", 1))),
    FusedOp("add", (("tmp", 0), ("in", 2))),
    FusedOp("sub", (("tmp", 1), ("const", 0.125))),
)


def epilogue_program(tail: str, space, axis: int, prologue: bool = True) -> S.Program:
    """A row op over ``tanh(in0)`` (or ``in0`` itself) followed by ``EPILOGUE``."""
    instrs = (FusedOp("tanh", (("in", 0),)),) if prologue else ()
    result = ("tmp", 0) if prologue else ("in", 0)
    return S.Program(instrs, result, tuple(space), tail, (axis,), epilogue=EPILOGUE)


def epilogue_shapes(space, axis: int) -> list[tuple[int, ...]]:
    """Input shapes of ``epilogue_program``: x, gamma (the row axis only), residual."""
    gamma = tuple(d if k == axis else 1 for k, d in enumerate(space))
    return [tuple(space), gamma, tuple(space)]


def epilogue_cases():
    """(name, spec) of every row op x dtype x layout with an epilogue (row: register-held with
    and without vector access, multi-pass; col), plus empty prologues."""
    cases = []
    for dt in DTYPES:
        for tail in ops.ROW_OPS:
            # plus a block of 1024 threads per register-held row, and a row of 64 (warp per row)
            for j, (space, axes) in enumerate(
                TAIL_LAYOUTS + (((6, 16384), (1,)), ((16384, 64), (1,)))
            ):
                if len(axes) > 1:
                    continue
                prog = epilogue_program(tail, space, axes[0])
                cases.append(
                    (
                        f"{tail}_epi_{j}_{dt}",
                        contiguous_spec(prog, dt, epilogue_shapes(space, axes[0])),
                    )
                )
            prog = epilogue_program(tail, (64, 1024), 1, prologue=False)
            cases.append(
                (f"{tail}_epi_bare_{dt}", contiguous_spec(prog, dt, epilogue_shapes((64, 1024), 1)))
            )
    return cases


def all_cases():
    """(name, spec) for every op x dtype (elementwise) and every tail x dtype x layout."""
    cases = []
    for dt in DTYPES:
        for op, row in ops.ELEMENTWISE.items():
            prog = op_program(op, (1000, 37))
            cases.append((f"ew_{op}_{dt}", contiguous_spec(prog, dt, [(1000, 37)] * row.arity)))
        # broadcasting (strided) operands and a where
        prog = S.Program(
            (
                FusedOp("mul", (("in", 0), ("in", 1))),
                FusedOp("where", (("in", 2), ("tmp", 0), ("const", 1.5))),
            ),
            ("tmp", 1),
            (8, 9, 10),
        )
        cases.append((f"ew_bcast_{dt}", contiguous_spec(prog, dt, [(8, 1, 10), (9, 1), ()])))
        cases.append((f"ew_bias_{dt}", contiguous_spec(BIAS_GELU, dt, [(4, 64, 256), (256,)])))
        for tail in ops.REDUCTIONS + ops.ROW_OPS:
            for j, (space, axes) in enumerate(TAIL_LAYOUTS):
                if tail in ops.ROW_OPS and len(axes) > 1:
                    continue
                prog = S.Program((FusedOp("tanh", (("in", 0),)),), ("tmp", 0), space, tail, axes)
                cases.append((f"{tail}_{j}_{dt}", contiguous_spec(prog, dt, [space])))
    # float16 storage with float32 math
    prog = S.Program((FusedOp("gelu", (("in", 0),)),), ("tmp", 0), (128, 256), "softmax", (1,))
    cases.append(("softmax_f16", contiguous_spec(prog, "float16", [(128, 256)])))
    prog = op_program("add", (1000,))
    cases.append(
        (
            "ew_add_mixed",
            contiguous_spec(prog, "float32", [(1000,), (1000,)], ["float16", "float32"]),
        )
    )
    return cases + half_cases() + epilogue_cases()


def half_cases():
    """bfloat16 storage with float32 math: every op, every tail, epilogues, and the casts
    (the conversions to and from every other dtype, float64 ones included)."""
    cases = []
    for op, row in ops.ELEMENTWISE.items():
        prog = op_program(op, (1000, 37))
        cases.append((f"ew_{op}_bf16", contiguous_spec(prog, "bfloat16", [(1000, 37)] * row.arity)))
    for tail in ops.REDUCTIONS + ops.ROW_OPS:
        for j, (space, axes) in enumerate(TAIL_LAYOUTS):
            if tail in ops.ROW_OPS and len(axes) > 1:
                continue
            prog = S.Program((FusedOp("tanh", (("in", 0),)),), ("tmp", 0), space, tail, axes)
            cases.append((f"{tail}_{j}_bf16", contiguous_spec(prog, "bfloat16", [space])))
        if tail in ops.ROW_OPS:
            prog = epilogue_program(tail, (64, 1024), 1)
            cases.append(
                (
                    f"{tail}_epi_bf16",
                    contiguous_spec(prog, "bfloat16", epilogue_shapes((64, 1024), 1)),
                )
            )
    cases.append(("ew_bias_bf16", contiguous_spec(BIAS_GELU, "bfloat16", [(4, 64, 256), (256,)])))
    cast = S.Program((), ("in", 0), (1000,))
    for src in ("float16", "bfloat16", "float32", "float64"):
        for dst in ("float16", "bfloat16", "float32", "float64"):
            if src != dst and "bfloat16" in (src, dst):
                cases.append((f"cast_{src}_{dst}", contiguous_spec(cast, dst, [(1000,)], [src])))
    return cases


def epilogue_reference(
    tail: str, x, gamma, r, axis: int, prologue: bool = True, eps: float = ops.LAYER_NORM_EPS
):
    """``epilogue_program``'s result by plain numpy in float64 (no tensorlogic code)."""
    import numpy as np

    v = np.tanh(x.astype(np.float64)) if prologue else x.astype(np.float64)
    if tail == "layer_norm":
        mu = v.mean(axis=axis, keepdims=True)
        y = (v - mu) / np.sqrt(((v - mu) ** 2).mean(axis=axis, keepdims=True) + eps)
    else:
        z = v - v.max(axis=axis, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=axis, keepdims=True))
        y = np.exp(z - lse) if tail == "softmax" else z - lse
    return y * gamma + r - 0.125


# integer, bool and complex kernels (CUDA C only): every dtype of the IR beyond the floats
EXACT_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "complex64",
    "complex128",
)


def _op_dtypes(op: str, dt: str) -> tuple[str, list[str]] | None:
    """(numpy's result dtype, input dtypes) of ``op`` over ``dt`` operands (where's condition
    a float32), or None where numpy has no loop."""
    from tensorlogic import dtypes
    from tensorlogic.errors import DTypeError

    ins = [dt] * ops.ELEMENTWISE[op].arity
    if op == "where":
        ins[0] = "float32"
    try:
        return dtypes.elementwise_result(op, ops.DTYPE[op], ins), ins
    except DTypeError:
        return None


def dtype_cases():
    """(name, spec) of every op and reduction over every integer, bool and complex dtype that
    numpy has a loop for (result dtypes as numpy's), mixed-dtype operands, comparisons computed
    in their operands' dtype with a bool result, and where over a complex condition. Whether
    the CUDA C renderer takes each is ``cuda_c.generates``'s answer."""
    from tensorlogic import dtypes
    from tensorlogic.errors import DTypeError

    cases = []
    for dt in EXACT_DTYPES:
        for op, row in ops.ELEMENTWISE.items():
            typed = _op_dtypes(op, dt)
            if typed is None:
                continue
            out, ins = typed
            prog = op_program(op, (1000, 37))
            # a comparison computes in its operands' dtype (routing.compute_dtype)
            compute = dtypes.promote(*ins) if op in ops.COMPARISONS else ""
            cases.append(
                (
                    f"ew_{op}_{dt}",
                    contiguous_spec(prog, out, [(1000, 37)] * row.arity, ins, compute),
                )
            )
        for tail in ops.REDUCTIONS + ops.ROW_OPS:
            try:
                out = (
                    dtypes.reduction_result(tail, dt)
                    if tail in ops.REDUCTIONS
                    else dtypes.rowop_result(tail, dt)
                )
            except DTypeError:
                continue
            for j, (space, axes) in enumerate(TAIL_LAYOUTS):
                if tail in ops.ROW_OPS and len(axes) > 1:
                    continue
                prog = S.Program((), ("in", 0), space, tail, axes)
                cases.append((f"{tail}_{j}_{dt}", contiguous_spec(prog, out, [space], [dt])))
    prog = op_program("add", (1000,))
    for a, b in (
        ("int8", "float32"),
        ("uint8", "int8"),
        ("int64", "uint64"),
        ("float32", "complex64"),
        ("bool", "int16"),
        ("float16", "complex64"),
    ):
        out = dtypes.promote(a, b)
        cases.append((f"ew_add_{a}_{b}", contiguous_spec(prog, out, [(1000,), (1000,)], [a, b])))
    for dt in ("float32", "float64", "float16", "int8", "uint64", "bool", "complex128"):
        for op in ops.COMPARISONS:
            if op not in ("eq", "ne") and dt.startswith("complex"):
                continue
            sp = S.make_spec(
                op_program(op, (1000,)), "bool", [(1000,)] * 2, [dt] * 2, [(1,), (1,)], dt
            )
            cases.append((f"cmp_{op}_{dt}", sp))
    where = op_program("where", (1000,))
    cases.append(
        (
            "where_ccond",
            contiguous_spec(where, "int32", [(1000,)] * 3, ["complex64", "int32", "int32"]),
        )
    )
    return cases
