"""A row op's backward (``ops.ROW_GRAD_PROGRAMS``) rendered to one CUDA C kernel.

One block per row of C-contiguous (rows, n) operands (the row axis moved last): each reduction
is a strided pass of the block's threads over the row, combined across the block (warp
shuffles, then shared memory); row scalars are computed by every thread; maps are recomputed
where they are used; the write pass stores the result. Elementwise expressions come from the op
table's CUDA C column, so the backward renders from the same table as every generated kernel.
16-bit operands compute in float32 and round once at the store, like the forward kernels.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import BackendError
from ...ir import ops
from .cuda_c import CTYPE, HALF_CONV, HALF_PRELUDE, literal
from .spec import COMPUTE, row_block

# the backward row ops are float-only (their operands are a float result and its cotangent)
DTYPES = ("float16", "bfloat16", "float32", "float64")


def render(name: str, op: str, dtype: str, eps: float, threads: int, prelude: bool = True) -> str:
    """CUDA C source of ``extern "C"`` kernel ``name(out, in0, in1, ..., rows, n)``
    (``prelude``: with the 16-bit conversion helpers its dtype needs)."""
    if dtype not in DTYPES:
        raise BackendError(f"the {op} backward kernel takes {list(DTYPES)}, not {dtype}")
    ct = CTYPE[COMPUTE[dtype]]
    names = ops.ROW_GRAD_OPERANDS[op]
    lines: list[str] = []
    scal: dict[str, str] = {}
    maps: dict[str, object] = {}

    def load(k: int) -> str:
        e = f"in{k}[base + j]"
        if dtype in HALF_CONV:
            return f"{HALF_CONV[dtype][0]}({e})"
        return e

    def expr(e, elem: bool) -> str:
        if isinstance(e, str):
            if e in scal:
                return scal[e]
            if e == "inv_n":
                return f"(({ct})1 / ({ct})n)"
            if e == "eps":
                return literal(eps, ct)
            if not elem:
                raise BackendError(f"the {op} backward: {e!r} is not a row scalar")
            if e in names:
                return load(names.index(e))
            return f"({expr(maps[e], elem)})"
        if isinstance(e, (int, float)):
            return literal(float(e), ct)
        fn, *args = e
        row = ops.ELEMENTWISE[fn]
        return row.cuda.format(T=ct, **dict(zip(row.operands, (expr(a, elem) for a in args))))

    def emit(line: str, depth: int = 1) -> None:
        lines.append("  " * depth + line)

    emit(f"__shared__ {ct} smem[{max(threads // 32, 1)}];")
    emit("const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;")
    emit("for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {")
    emit("const unsigned long long base = row * (unsigned long long)n;", 2)
    for st in ops.ROW_GRAD_PROGRAMS[op]:
        if st.kind == "reduce":
            if ops.REDUCTION_TABLE[st.combine].combine != "add":
                raise BackendError(f"the {op} backward: only sums are rendered, not {st.combine}")
            acc = f"acc_{st.name}"
            emit(f"{ct} {acc} = ({ct})0;", 2)
            emit(f"for (unsigned int j = threadIdx.x; j < n; j += {threads}u) {{", 2)
            emit(f"{acc} += {expr(st.expr, True)};", 3)
            emit("}", 2)
            shfl = f"__shfl_xor_sync(0xffffffffu, {acc}, m)"
            emit(f"for (int m = 16; m > 0; m >>= 1) {acc} += {shfl};", 2)
            if threads > 32:
                emit("__syncthreads();", 2)  # smem is free: every thread read the last sum
                emit(f"if (lane == 0u) smem[warp] = {acc};", 2)
                emit("__syncthreads();", 2)
                emit(f"{acc} = smem[0];", 2)
                emit(f"for (int w = 1; w < {threads // 32}; ++w) {acc} += smem[w];", 2)
            scal[st.name] = acc
        elif st.kind == "let":
            var = f"s_{st.name}"
            emit(f"const {ct} {var} = {expr(st.expr, False)};", 2)
            scal[st.name] = var
        elif st.kind == "map":
            maps[st.name] = st.expr
        elif st.kind == "write":
            v = expr(st.expr, True)
            store = f"{HALF_CONV[dtype][1]}({v})" if dtype in HALF_CONV else v
            emit(f"for (unsigned int j = threadIdx.x; j < n; j += {threads}u) {{", 2)
            emit(f"out[base + j] = {store};", 3)
            emit("}", 2)
        else:
            raise BackendError(f"the {op} backward: a row program ends in a write, not {st.kind}")
    emit("__syncthreads();", 2)  # the next row's sums reuse smem
    emit("}")
    params = [f"{CTYPE[dtype]}* __restrict__ out"]
    params += [f"const {CTYPE[dtype]}* __restrict__ in{k}" for k in range(len(names))]
    params += ["const unsigned long long rows", "const unsigned int n"]
    return "\n".join(
        [
            f"// tensorlogic generated: {op} backward row program, {dtype}",
            HALF_PRELUDE.strip() if prelude and dtype in HALF_CONV else "",
            f'extern "C" __global__ void __launch_bounds__({threads}) {name}(',
            "    " + ", ".join(params) + ") {",
            *lines,
            "}",
            "",
        ]
    )


class RowGradKernel:
    """``kernel(inputs, out)`` of a ROWGRAD node on CuPy arrays. With the row axis not last, the
    operands are moved into scratch buffers of the plan's arena (``scratch``), so a call
    allocates nothing (CUDA graph capture)."""

    def __init__(self, backend, node) -> None:
        shape = tuple(int(d) for d in node.shape)
        self.axis = int(node.args["axis"]) % max(len(shape), 1)
        self.last = self.axis == len(shape) - 1
        self.n = shape[self.axis] if shape else 1
        self.rows = math.prod(shape) // max(self.n, 1)
        self.n_in = len(node.inputs)
        moved = tuple(d for k, d in enumerate(shape) if k != self.axis) + (self.n,)
        # moved operands, then the moved result
        self.scratch = () if self.last else ((moved, node.dtype),) * (self.n_in + 1)
        self.threads = row_block(self.n)
        name = f"tl_rowgrad_{node.op}_{node.dtype}_t{self.threads}"
        eps = float(node.args.get("eps", 0.0))
        if ops.row_grad_takes_eps(node.op):
            name += f"_e{np.float64(eps).view(np.uint64):x}"
        self.source = render(name, node.op, node.dtype, eps, self.threads)
        self.fn = backend.compiler.function(self.source, name, "cuda")
        self.grid = max(1, min(self.rows, 1 << 20))
        self.info = f"CUDA C row backward ({self.threads} threads per row)"

    def __call__(self, args, out):
        import cupy as cp

        if self.rows == 0 or self.n == 0:
            return out
        ins = list(args[: self.n_in])
        if self.last:
            ins = [a if a.flags.c_contiguous else cp.ascontiguousarray(a) for a in ins]
            target = out if out.flags.c_contiguous else cp.empty(out.shape, out.dtype)
        else:
            scr = args[self.n_in :]
            for k, a in enumerate(ins):
                scr[k][...] = cp.moveaxis(a, self.axis, -1)
            ins, target = list(scr[: self.n_in]), scr[self.n_in]
        self.fn(
            (self.grid, 1, 1),
            (self.threads, 1, 1),
            (target, *ins, np.uint64(self.rows), np.uint32(self.n)),
        )
        if target is not out:
            out[...] = target if self.last else cp.moveaxis(target, -1, self.axis)
        return out
