"""The numpy kernel for FUSED nodes: in-place ufuncs over cache-sized blocks.

The iteration space is cut into blocks along its leading axes (whole trailing axes stay in a
block, so a reduction or row op over them finishes inside the block). Each instruction of the
fused body runs as one ufunc over the block, writing into a small set of block-sized registers
that are reused as soon as a value dies (in place over a dying operand where the op allows), so
intermediates stay in cache and each input and the output cross main memory once.

A row-op tail's epilogue runs on each block right after the row op, over the block of the
output that holds the row op's result, so it too costs no extra pass over memory.

Each block performs exactly the ufunc calls the unfused plan would make on that part of the
array, so results match the unfused numpy backend element for element.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ir import ops
from ...ir.fused import FusedBody
from .. import kernels
from ..base import PreparedKernel
from . import host_pool
from .rows import RowKernel

# Bytes per register block. A block's registers and operands stay in the L2/L3 caches; larger
# blocks mean fewer ufunc calls (measured on the 16M 14-op chain, 2 threads: 256 KB 27 ms,
# 1 MB 20 ms, 2 MB 19.5 ms, 4 MB 20 ms).
BLOCK_BYTES = 1024 * 1024

# Iteration spaces from this many points up spread their blocks over threads (host_pool);
# below it, waking a helper costs more than it saves. Blocks of a parallel kernel are at least
# MIN_PARALLEL_BLOCK bytes. (Measured with a 5-op chain, 2 cores: see RESULTS.md, optimizer.)
PARALLEL_MIN_ELEMENTS = 1 << 18
MIN_PARALLEL_BLOCK = 256 * 1024


def _allocate(instrs: tuple, final_to_out: bool) -> tuple[list[int], int]:
    """Register of every instruction (-1: the output block) and the number of registers."""
    n = len(instrs)
    last_use = list(range(n))
    for j, ins in enumerate(instrs):
        for kind, v in ins.args:
            if kind == "tmp":
                last_use[v] = j
    reg = [0] * n
    free: list[int] = []
    n_regs = 0
    for j, ins in enumerate(instrs):
        dying = [v for kind, v in ins.args if kind == "tmp" and last_use[v] == j]
        if j == n - 1 and final_to_out:
            reg[j] = -1
        elif ops.ELEMENTWISE[ins.op].alias_safe and dying:
            reg[j] = reg[dying[0]]  # in place over an operand that dies here
            dying = dying[1:]
        elif free:
            reg[j] = free.pop()
        else:
            reg[j] = n_regs
            n_regs += 1
        for v in dying:
            if reg[v] >= 0 and reg[v] != reg[j] and reg[v] not in free:
                free.append(reg[v])
    return reg, n_regs


def _block_axis(space: tuple[int, ...], kept: int, block: int) -> tuple[int, int]:
    """(axis to cut, rows per block) so a block holds at most ``block`` elements where it can."""
    for a in range(kept):
        inner = math.prod(space[a + 1 :])
        if inner <= block:
            return a, max(1, block // max(inner, 1))
    return kept - 1, 1


def fused_kernel(
    node: Any, in_nodes: list, block_bytes: int | None = None, threads: bool = True
) -> PreparedKernel:
    """Kernel ``kernel(inputs, out)`` for a FUSED node on numpy arrays.

    ``threads=False`` keeps every block on the calling thread (plans that also call BLAS).
    """
    body = FusedBody.from_args(node.args["body"])
    body.validate(len(in_nodes), f"fused node {node.name!r}")
    space = tuple(int(d) for d in body.space)
    if body.tail in ops.REDUCTIONS:
        empty = kernels.empty_reduction_kernel(body.tail, space, tuple(body.axes))
        if empty is not None:
            return empty
    r = len(space)
    dtype = np.dtype(node.dtype)
    tail = body.tail
    # a row op's axis and every axis after it stay whole in a block; nax counts from the end,
    # so it names the same axis in a block of lower rank
    rax = body.axes[0] % r if tail in ops.ROW_OPS else r - 1
    nax = rax - r
    n_tail = 0 if tail is None else (len(body.axes) if tail in ops.REDUCTIONS else r - rax)
    kept = r - n_tail
    final_to_out = tail is None or tail in ops.ROW_OPS
    reg, n_regs = _allocate(body.instrs, final_to_out)
    if not final_to_out:
        result_reg = reg[-1]
    block = max(1, (block_bytes or BLOCK_BYTES) // dtype.itemsize)

    def compile_program(instrs, regs_of) -> list:
        """(ufunc, operand specs, destination register) per instruction; operand kinds:
        0 input, 1 register, 2 literal, 3 the output block (the row op's result)."""
        prog = []
        for j, ins in enumerate(instrs):
            fn = ops.ELEMENTWISE[ins.op].numpy
            spec = tuple(
                (0, v)
                if kind == "in"
                else (1, regs_of[v])
                if kind == "tmp"
                else (3, 0)
                if kind == "tail"
                else (2, v)
                for kind, v in ins.args
            )
            prog.append((fn, spec, regs_of[j]))
        return prog

    program = compile_program(body.instrs, reg)
    epilogue = []
    if body.epilogue:
        last = body.epilogue[-1]
        # the last epilogue value may go straight to the output block unless it reads the row
        # op's result there after it started writing (where, or an op that is not alias-safe)
        safe = ops.ELEMENTWISE[last.op].alias_safe or all(kind != "tail" for kind, _ in last.args)
        ereg, e_regs = _allocate(body.epilogue, safe)
        epilogue = compile_program(body.epilogue, ereg)
        epi_copy = None if safe else ereg[-1]
        n_regs = max(n_regs, e_regs)  # the prologue's registers are dead by then

    # per input: its dims padded to the space's rank, and which axes it broadcasts along
    in_dims = [(1,) * (r - len(n.shape)) + tuple(int(d) for d in n.shape) for n in in_nodes]

    total = math.prod(space)
    # blocks run on several threads when there is enough work to pay for waking them; then a
    # mid-sized space is cut finer, so that every thread gets at least two blocks
    helpers = host_pool.helper_count() if threads and total >= PARALLEL_MIN_ELEMENTS else 0
    if helpers and block_bytes is None:
        block = min(block, max(MIN_PARALLEL_BLOCK // dtype.itemsize, total // (2 * (helpers + 1))))
    single = kept <= 0 or total <= block
    if not single:
        axis, rows = _block_axis(space, kept, block)
    red_axes = tuple(range(-n_tail, 0))

    # a row op, or a reduction without a numpy function, runs its row program over each block
    # (the kernel the unfused node runs; axes counted from the end name them in any block)
    rows_k = None
    if tail in ops.ROW_OPS or (tail is not None and ops.REDUCTION_TABLE[tail].numpy is None):
        rows_k = RowKernel(tail, dtype, (nax,) if tail in ops.ROW_OPS else red_axes, body.eps)

    def execute(prog: list, ins: list, regs: list, out_block) -> None:
        for fn, spec, dest in prog:
            args = [
                ins[v] if k == 0 else regs[v] if k == 1 else out_block if k == 3 else v
                for k, v in spec
            ]
            fn(*args, out=out_block if dest < 0 else regs[dest])

    def run_block(ins: list, regs: list, out_block, tail_bufs: list):
        execute(program, ins, regs, out_block)
        if tail is None:
            if not final_to_out:
                out_block[...] = regs[result_reg]
            return
        if tail in ops.ROW_OPS:
            x = out_block if body.instrs else ins[0]  # an empty prologue: input 0 itself
            rows_k(x, out_block, tail_bufs)
            if epilogue:
                execute(epilogue, ins, regs, out_block)
                if epi_copy is not None:
                    out_block[...] = regs[epi_copy]
            return
        x = regs[result_reg]
        if rows_k is not None:
            rows_k(x, out_block, tail_bufs)
        else:
            red = getattr(np, ops.REDUCTION_TABLE[tail].numpy)
            red(x, axis=red_axes, out=out_block)

    n_in = len(in_nodes)
    # registers come from the plan's arena (kernel.scratch) when the executor passes them
    n_elems = total if single else rows * math.prod(space[axis + 1 :])

    # the row program's buffers for the largest block, as flat arrays (a shorter last block
    # takes their starts)
    tail_scratch = (
        [
            ((math.prod(shp),), dt)
            for shp, dt in rows_k.scratch(space if single else (rows, *space[axis + 1 :]))
        ]
        if rows_k is not None
        else []
    )
    per_worker = n_regs + len(tail_scratch)

    if single:
        blocks: list = []
        workers = 1
    else:
        # the blocks, as index tuples into every input and the output, built once
        blocks = []
        for lead in np.ndindex(*space[:axis]):
            for start in range(0, space[axis], rows):
                stop = min(start + rows, space[axis])
                ins_idx = tuple(
                    tuple(0 if d[k] == 1 else lead[k] for k in range(axis))
                    + ((slice(None) if d[axis] == 1 else slice(start, stop)),)
                    for d in in_dims
                )
                blocks.append((ins_idx, lead + (slice(start, stop),), stop - start))
        workers = min(1 + helpers, len(blocks))
    chunk_shape = () if single else (rows, *space[axis + 1 :])

    def kernel(arrays: list, out):
        xs = [a.reshape(d) for a, d in zip(arrays, in_dims)]
        if len(arrays) > n_in:
            scratch = arrays[n_in:]
        else:
            scratch = [np.empty(shp, dtype) for shp, _ in scratch_specs]
        out_view = out.reshape(space if tail is None or tail in ops.ROW_OPS else space[:kept])
        if single:
            regs = [b.reshape(space) for b in scratch[:n_regs]]
            run_block(xs, regs, out_view, scratch[n_regs:per_worker])
            return out

        def work(i: int, worker: int) -> None:
            ins_idx, out_idx, n_rows = blocks[i]
            mine = scratch[worker * per_worker : (worker + 1) * per_worker]
            if n_rows == rows:
                regs = [b.reshape(chunk_shape) for b in mine[:n_regs]]
            else:
                shp = (n_rows, *space[axis + 1 :])
                regs = [b[: math.prod(shp)].reshape(shp) for b in mine[:n_regs]]
            run_block(
                [x[idx] for x, idx in zip(xs, ins_idx)], regs, out_view[out_idx], mine[n_regs:]
            )

        host_pool.run_blocks(work, len(blocks), workers - 1)
        return out

    # one set of registers (and tail scratch) per thread that runs blocks
    scratch_specs = tuple(([((n_elems,), dtype.name)] * n_regs + tail_scratch) * workers)
    # each block of the output is written after that block of every input was read, so the
    # output may overwrite an input of the full iteration space, unless the last instruction
    # reads its operands after it started writing (an op that is not alias-safe). An epilogue
    # reads its inputs after the row op wrote the block: those inputs may not alias the output.
    last = body.instrs[-1] if body.instrs else None
    inplace: tuple[int, ...] = ()
    if final_to_out and (last is None or ops.ELEMENTWISE[last.op].alias_safe):
        late = body.epilogue_inputs()
        inplace = tuple(
            k
            for k, d in enumerate(in_dims)
            if d == space and k not in late and np.dtype(in_nodes[k].dtype) == dtype
        )
    return PreparedKernel(
        kernel, scratch=scratch_specs, inplace=inplace, info=describe(body), threads=workers
    )


def describe(body: FusedBody) -> str:
    """A short text of a fused body for print(plan): its ops, its tail and its epilogue."""
    text = ",".join(i.op for i in body.instrs)
    epi = " -> " + ",".join(i.op for i in body.epilogue) if body.epilogue else ""
    return f"[{text}{' -> ' + body.tail if body.tail else ''}{epi}]"
