"""Kernel specs: what a generated GPU kernel computes, independent of PTX or CUDA C.

A ``KernelSpec`` holds an elementwise program (instructions of the op table over the kernel's
inputs), an optional tail (a reduction or a row op), a row op's elementwise epilogue (applied to
each result before the store; its inputs are read only then), and the layout of the iteration
space as groups of dimensions with each input's element strides. Both code generators (``ptx``
and ``cuda_c``) render the same spec, so the two paths compute the same function.

Families:
  ``ew``   elementwise over one group (the whole space); output written at the linear index.
  ``row``  a block of threads per output row: groups (O, R); reduce or row op over R.
  ``col``  a thread per output point: groups (O, R, I); reduce or row op over R, serial loop.
  ``split`` stage one of a multi-block reduction of few long rows: groups (O, R); ``splits``
           blocks per row each reduce a slice into a partial (compute dtype); a ``row``/``col``
           kernel over the (O, splits) partials finishes it (see ``finish_program``).

A ``row`` kernel whose row fits (``row_layout``) holds the row's values in registers: one read of
the inputs and one write of the output, with 16-byte vector accesses where the layout allows; a
warp per row up to 32 elements per lane, a block per row beyond. Longer rows loop over the row
once per pass.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...errors import BackendError
from ...ir import ops
from ...ir.fused import FusedBody, FusedOp

# The type the arithmetic of each storage dtype runs in. 16-bit floats compute in float32 and
# round at the store; integers narrower than 32 bits and bool compute in 32 bits (the types warp
# shuffles take) and wrap (or, for bool, test nonzero) at the store: for the ops the integer
# kernels run (``cuda_c.INT_OPS``: ring operations, comparisons, selections) that is the value
# numpy's loop of the narrow type gives.
COMPUTE = {
    "float16": "float32",
    "bfloat16": "float32",
    "float32": "float32",
    "float64": "float64",
    "bool": "int32",
    "int8": "int32",
    "int16": "int32",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint32",
    "uint16": "uint32",
    "uint32": "uint32",
    "uint64": "uint64",
    "complex64": "complex64",
    "complex128": "complex128",
}
ITEMSIZE = {d: 2 if d == "bfloat16" else np.dtype(d).itemsize for d in COMPUTE}
HALF = ("float16", "bfloat16")  # stored in 16 bits, computed in float32, rounded at the store
# the dtypes the PTX emitter renders (every other dtype is rendered as CUDA C)
PTX_DTYPES = ("float16", "bfloat16", "float32", "float64")

# Below this many elements per row a block per row wastes threads: use a thread per row.
ROW_FAMILY_MIN = 64
# Register-held rows: at most this many values per lane with a warp per row (blocks of 128
# threads), half as many with a block per row (up to 1024 threads: 64 registers a thread).
ROW_REG_MAX = {
    "float32": 32,
    "float64": 16,
    "int32": 32,
    "int64": 16,
    "uint32": 32,
    "uint64": 16,
    "complex64": 16,
    "complex128": 8,
}
# Reductions a ``split`` kernel can stage (combine partials with the same operation).
SPLIT_TAILS = ("sum", "mean", "max", "min", "prod")
SPLIT_THREADS = 256
SPLIT_SLICE = 2048  # at least this many elements per block of a split reduction
SPLIT_BLOCKS = 2048  # at most this many blocks for all rows together
SPLIT_MIN = 8  # split only when a row gets at least this many blocks


@dataclass(frozen=True)
class Dim:
    """One dimension of a group: its size and each input's element stride along it."""

    size: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class KernelSpec:
    """Everything a code generator needs to render one kernel."""

    family: str  # "ew" | "row" | "col"
    dtype: str  # output storage dtype
    in_dtypes: tuple[str, ...]
    instrs: tuple[FusedOp, ...]
    result: tuple  # ref of the program's value: ("in", k) or ("tmp", j)
    tail: str | None  # None, a reduction name or a row op name
    groups: tuple[tuple[Dim, ...], ...]  # ew: (all,), row: (O, R), col: (O, R, I)
    sizes: tuple[int, ...]  # total size of each group
    order: tuple[int, ...] = ()  # the space's axes in group order (C order over the groups)
    splits: int = 1  # split family: blocks per row
    eps: float | None = None  # a layer_norm tail's epsilon (None for every other tail)
    epilogue: tuple[FusedOp, ...] = ()  # row-op tails: per stored element, over ("tail", 0)
    # the dtype the arithmetic runs in when it is not the output's (a comparison computes in
    # its operands' dtype and stores bool); "" for the output's ``COMPUTE``
    calc: str = ""

    def prologue_inputs(self) -> frozenset[int]:
        """Inputs the program (and the tail) read; the others only the epilogue reads."""
        used = {v for ins in self.instrs for kind, v in ins.args if kind == "in"}
        if self.result[0] == "in":
            used.add(self.result[1])
        return frozenset(used)

    def epilogue_inputs(self) -> frozenset[int]:
        """Inputs the epilogue reads."""
        return frozenset(v for ins in self.epilogue for kind, v in ins.args if kind == "in")

    @property
    def compute(self) -> str:
        """The dtype the arithmetic runs in (16-bit floats compute in float32)."""
        return self.calc or COMPUTE[self.dtype]

    @property
    def n_inputs(self) -> int:
        """Number of input pointers."""
        return len(self.in_dtypes)

    @property
    def total(self) -> int:
        """Points in the iteration space."""
        return math.prod(self.sizes)

    @property
    def wide(self) -> bool:
        """True when indices need 64 bits."""
        return self.total >= 2**31 - 2**26

    def key(self) -> str:
        """A short stable hash that names the kernel."""
        return hashlib.sha1(repr(self).encode()).hexdigest()[:12]

    def input_mode(self, k: int) -> str:
        """ "full" (offset = linear index), "scalar" (offset 0) or "strided" for input k."""
        dims = [d for g in self.groups for d in g]
        if all(d.strides[k] == 0 for d in dims):
            return "scalar"
        expect = 1
        for d in reversed(dims):
            if d.strides[k] != expect and d.size != 1:
                return "strided"
            expect *= d.size
        return "full"


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array."""
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def broadcast_strides(
    shape: Sequence[int], strides: Sequence[int], space: Sequence[int]
) -> tuple[int, ...]:
    """Strides of an input (right-aligned numpy broadcasting) over the iteration space."""
    off = len(space) - len(shape)
    out = []
    for j in range(len(space)):
        k = j - off
        if k < 0 or shape[k] == 1:
            out.append(0)
        else:
            out.append(int(strides[k]))
    return tuple(out)


def _collapse(dims: list[Dim]) -> tuple[Dim, ...]:
    """Drop size-1 dims and merge neighbours that every input walks contiguously."""
    dims = [d for d in dims if d.size != 1]
    out: list[Dim] = []
    for d in dims:
        if out:
            prev = out[-1]
            if all(ps == s * d.size for ps, s in zip(prev.strides, d.strides)):
                out[-1] = Dim(prev.size * d.size, d.strides)
                continue
        out.append(d)
    return tuple(out)


def _group(
    space: Sequence[int], axes: Sequence[int], in_strides: list[tuple[int, ...]]
) -> tuple[Dim, ...]:
    return _collapse([Dim(space[a], tuple(s[a] for s in in_strides)) for a in axes])


@dataclass(frozen=True)
class Program:
    """A node's computation before layout: instructions, result ref, tail and tail axes."""

    instrs: tuple[FusedOp, ...]
    result: tuple
    space: tuple[int, ...]
    tail: str | None = None
    axes: tuple[int, ...] = ()
    eps: float = ops.LAYER_NORM_EPS  # read only by a layer_norm tail
    epilogue: tuple[FusedOp, ...] = ()  # row-op tails only


def program_of(node, in_nodes) -> Program:
    """The program an elementwise, REDUCE, ROWOP, CAST or FUSED node computes."""
    kind = node.kind
    shape = tuple(int(d) for d in node.shape)
    if kind == ops.CAST:  # no instruction: load, convert to the compute type, round at the store
        return Program((), ("in", 0), shape)
    if kind in ops.ELEMENTWISE_KINDS:
        ins = tuple(("in", k) for k in range(len(in_nodes)))
        return Program((FusedOp(node.op, ins),), ("tmp", 0), shape)
    if kind == ops.REDUCE:
        space = tuple(int(d) for d in in_nodes[0].shape)
        return Program((), ("in", 0), space, node.op, tuple(node.args["axes"]))
    if kind == ops.ROWOP:
        space = tuple(int(d) for d in in_nodes[0].shape)
        return Program(
            (),
            ("in", 0),
            space,
            node.op,
            (int(node.args["axis"]),),
            float(node.args.get("eps", ops.LAYER_NORM_EPS)),
        )
    if kind == ops.FUSED:
        body = FusedBody.from_args(node.args["body"])
        body.validate(len(in_nodes), f"node {node.name!r}")
        return Program(
            body.instrs,
            body.result,
            tuple(body.space),
            body.tail,
            tuple(body.axes),
            body.eps,
            body.epilogue,
        )
    raise BackendError(f"node {node.name!r}: no generated kernel for node kind {kind!r}")


def make_spec(
    prog: Program,
    out_dtype: str,
    in_shapes: Sequence[Sequence[int]],
    in_dtypes: Sequence[str],
    in_strides: Sequence[Sequence[int]],
    compute: str = "",
) -> KernelSpec:
    """Lay a program out over its space; ``in_strides`` are each input's element strides;
    ``compute``: the dtype the arithmetic runs in, where it is not the output's ``COMPUTE``."""
    for dt in (out_dtype, *in_dtypes):
        if dt not in COMPUTE:
            raise BackendError(f"generated kernels do not support dtype {dt!r}")
    calc = COMPUTE[compute] if compute else ""
    space = prog.space
    bst = [broadcast_strides(s, st, space) for s, st in zip(in_shapes, in_strides)]
    rank = len(space)
    common = dict(
        dtype=out_dtype,
        in_dtypes=tuple(in_dtypes),
        instrs=prog.instrs,
        result=prog.result,
        tail=prog.tail,
        eps=float(prog.eps) if ops.takes_eps(prog.tail) else None,
        epilogue=tuple(prog.epilogue),
        calc="" if calc == COMPUTE[out_dtype] else calc,
    )
    if prog.epilogue and prog.tail not in ops.ROW_OPS:
        raise BackendError(f"an epilogue needs a row-op tail, got {prog.tail!r}")
    if prog.tail is None:
        groups = (_group(space, range(rank), bst),)
        return KernelSpec(
            "ew", groups=groups, sizes=(math.prod(space),), order=tuple(range(rank)), **common
        )
    axes = sorted(a % rank for a in prog.axes) if rank else []
    red = [a for a in axes if space[a] != 1]
    kept = [a for a in range(rank) if a not in axes]
    # (O, R, I) when the reduced axes are one block of the space, else kept axes then reduced axes
    if (
        red
        and red == list(range(red[0], red[-1] + 1))
        and prog.tail in ops.REDUCTIONS + ops.ROW_OPS
    ):
        outer = [a for a in range(rank) if a < red[0] and a in kept]
        inner = [a for a in range(rank) if a > red[-1] and a in kept]
    else:
        if prog.tail in ops.ROW_OPS and len(axes) == 1:
            outer = [a for a in range(rank) if a < axes[0]]
            inner = [a for a in range(rank) if a > axes[0]]
        else:
            outer, inner = kept, []
        red = axes
    go, gr, gi = (_group(space, g, bst) for g in (outer, red, inner))
    n_o, n_r, n_i = (math.prod(d.size for d in g) for g in (go, gr, gi))
    order = tuple(outer) + tuple(red) + tuple(inner)
    splits = split_count(prog.tail, n_o, n_r) if n_i == 1 else 1
    if splits > 1:
        return KernelSpec(
            "split", groups=(go, gr), sizes=(n_o, n_r), order=order, splits=splits, **common
        )
    if n_i == 1 and n_r >= ROW_FAMILY_MIN:
        return KernelSpec("row", groups=(go, gr), sizes=(n_o, n_r), order=order, **common)
    return KernelSpec("col", groups=(go, gr, gi), sizes=(n_o, n_r, n_i), order=order, **common)


def row_block(n_r: int) -> int:
    """Threads per block of the row family: about four elements per thread, 32 to 1024."""
    b = 32
    while b < 1024 and b * 4 < n_r:
        b *= 2
    return b


def split_count(tail: str | None, n_o: int, n_r: int) -> int:
    """Blocks per row for a multi-block reduction of few long rows (1: no split)."""
    if tail not in SPLIT_TAILS or n_o == 0:
        return 1
    s = min(-(-n_r // SPLIT_SLICE), max(1, SPLIT_BLOCKS // n_o))
    return s if s >= SPLIT_MIN else 1


def finish_program(spec: KernelSpec) -> Program:
    """The program that reduces a split kernel's (O, splits) partials to the final result."""
    n_o, n_r = spec.sizes
    if spec.tail == "mean":  # partials are sums: scale their sum by 1/n
        return Program(
            (FusedOp("mul", (("in", 0), ("const", 1.0 / n_r))),),
            ("tmp", 0),
            (n_o, spec.splits),
            "sum",
            (1,),
        )
    return Program((), ("in", 0), (n_o, spec.splits), spec.tail, (1,))


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class RowLayout:
    """How a register-held row kernel covers a row.

    ``threads`` lanes per row (32: a warp per row, ``rows`` rows per block), ``width`` elements
    per vector access, ``chunks`` vector accesses per lane: lane t holds chunks j*threads + t.
    """

    threads: int
    rows: int
    width: int
    chunks: int

    @property
    def block(self) -> int:
        """Threads per block."""
        return self.threads * self.rows


def row_width(spec: KernelSpec) -> int:
    """Elements per 16-byte access along a row, or 1 when some operand or the output can't."""
    if spec.family not in ("row", "split"):
        return 1
    size = ITEMSIZE[spec.dtype]
    if any(ITEMSIZE[dt] != size for dt in spec.in_dtypes):
        return 1
    w = 16 // size
    go, gr = spec.groups
    n_r = spec.sizes[1]
    if n_r % w or len(gr) > 1:
        return 1
    for k in range(spec.n_inputs):
        st = gr[0].strides[k] if gr else 0
        if st not in (0, 1):
            return 1
        if st == 1 and any(d.strides[k] % w for d in go):
            return 1
    return w


def row_layout(spec: KernelSpec, width: int) -> RowLayout | None:
    """The register-held layout of a row kernel with ``width``, or None if the row is too long."""
    n_r = spec.sizes[1]
    cap = ROW_REG_MAX[spec.compute]
    total = -(-n_r // width)  # chunks in a row
    chunks = -(-total // 32)
    if chunks <= 8 and chunks * width <= cap:
        return RowLayout(32, 4, width, chunks)
    # about 4 chunks a thread; more threads where that would hold more than cap // 2 values
    # (16-bit rows: 8 values a chunk)
    need = max(-(-total // 4), -(-total * width // (cap // 2)))
    threads = min(1024, max(64, _pow2_at_least(need)))
    chunks = -(-total // threads)
    if chunks * width > cap // 2:
        return None
    return RowLayout(threads, 1, width, chunks)
