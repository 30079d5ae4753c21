"""Render a fused program over a Layout to the source text of one numba kernel.

The kernel is ``kernel(out, a0, a1, ..., d0, d1, ...)``: ``out`` and the inputs are viewed in
the layout's collapsed shapes, ``d*`` are the collapsed sizes. Every elementwise op comes from the
op table (``ops.ELEMENTWISE[op].numba``); float literals in those expressions and program
constants become module-level constants of the compute dtype, so float32 kernels stay float32
(a bare ``0.5`` would promote the whole expression to float64 and halve the vector width).

Loop shapes:
- elementwise, rank 1: blocks of ``BLOCK`` elements, ``prange`` over blocks;
- elementwise, rank >= 2: ``prange`` over the flattened outer dims, a contiguous inner loop;
- reduction with kept dims: ``prange`` over kept elements, loops over the reduced dims;
- full reduction: per-block (or per-row) partials in parallel, combined serially;
- row op: ``prange`` over rows; max, exp-and-sum, scale passes (the max over order-preserving
  integer keys of the values, which vectorizes); with the axis last, through 1-d row views, and
  a computed program is stored in ``out`` by the first pass while a plain input is re-read; an
  epilogue program runs on each value in the last pass, before it is stored.
The serial variant is the same text with ``range`` and ``parallel=False``.

The module text is also the disk-cache key, so it names everything the compiled object depends
on: the jit options (``JIT_OPTIONS``, read by ``numba_cache.load``), the explicit signature (a
comment; ``KernelSource.signature`` is the numba object) and, when fast math functions are used,
the digest of ``numba_fastmath`` (whose functions the module imports rather than embeds, so a
module is ~30 lines and a process compiles each fast function once, not once per kernel).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numba
from numba.core import types as nbtypes

from ...errors import BackendError
from ...ir import ops
from ...ir.fused import FusedOp
from . import fastmath as numba_fastmath
from .layout import Layout

BLOCK = 4096  # elements per parallel block of a flat loop: big enough to amortize scheduling
# fastmath flags with fast_math on: reassociation lets LLVM vectorize reductions; no nnan/ninf,
# so NaN and inf still propagate as in numpy.
FAST_FLAGS = '{"reassoc", "contract", "nsz", "arcp"}'
_FLOAT_LIT = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][+-]?\d+)?)")

# Ops whose op-table numba expression, computed per instruction and converted back to the
# kernel's dtype (``np.int8(a * b)`` wraps around like numpy's int8 loop), is exactly numpy's
# op for integer, bool and complex kernels whose operands all have the kernel's dtype. Others
# (integer reciprocal and pow, complex ordering, ops that change the dtype) keep numpy's loops.
EXACT_OPS: dict[str, frozenset[str]] = {
    "iu": frozenset(
        {
            "neg",
            "abs",
            "square",
            "relu",
            "step",
            "one_minus",
            "add",
            "sub",
            "mul",
            "maximum",
            "minimum",
            "gt",
            "ge",
            "lt",
            "le",
            "eq",
            "ne",
            "where",
        }
    ),
    "b": frozenset(
        {
            "abs",
            "relu",
            "step",
            "add",
            "mul",
            "maximum",
            "minimum",
            "gt",
            "ge",
            "lt",
            "le",
            "eq",
            "ne",
            "where",
        }
    ),
    "c": frozenset(
        {
            "neg",
            "exp",
            "log",
            "sqrt",
            "square",
            "reciprocal",
            "tanh",
            "add",
            "sub",
            "mul",
            "div",
            "eq",
            "ne",
            "where",
        }
    ),
}
# the reductions ``render`` writes (every row op is rendered: three tuned, others from their
# row programs)
RENDERED_REDUCTIONS = (*ops.COMBINED_REDUCTIONS, "logsumexp")
# reductions a generated kernel computes exactly for integer, bool and complex inputs
EXACT_REDUCTIONS = frozenset({"sum", "prod", "max", "min", "mean"})
_REAL = ("float32", "float64")


def _kind(dtype: str) -> str:
    k = np.dtype(dtype).kind
    return "iu" if k in "iu" else k


def generates(instrs, tail, epilogue, dtype: str, in_dtypes: list[str]) -> bool:
    """Whether ``render`` makes an exact kernel for this program and these dtypes."""
    if tail is not None and tail not in ops.ROW_OPS and tail not in RENDERED_REDUCTIONS:
        return False  # a reduction without a numba rendering: numpy runs its row program
    # inputs read only as where's condition (compared with zero) may be of any real dtype
    # (a comparison's bool mask)
    conds = {
        v
        for ins in (*instrs, *epilogue)
        for j, (kind, v) in enumerate(ins.args)
        if kind == "in" and j in ops.ELEMENTWISE[ins.op].own_dtype
    } - {
        v
        for ins in (*instrs, *epilogue)
        for j, (kind, v) in enumerate(ins.args)
        if kind == "in" and j not in ops.ELEMENTWISE[ins.op].own_dtype
    }
    if dtype in _REAL and all(
        d in _REAL or (k in conds and np.dtype(d).kind in "biu") for k, d in enumerate(in_dtypes)
    ):
        return True  # the float kernels (fast math and all)
    if (
        dtype == "bool"
        and tail is None
        and not epilogue
        and len(instrs) == 1
        and instrs[0].op in ops.COMPARISONS
        and len(set(in_dtypes)) == 1
        and in_dtypes[0] in _REAL
    ):
        return True  # a comparison of floats, stored as numpy's bool
    if epilogue or any(np.dtype(d).kind == "f" and d not in _REAL for d in (dtype, *in_dtypes)):
        return False  # no float16 in numba
    if tail is not None:
        # a lone reduction over an integer, bool or complex input (its numpy result dtype)
        return not instrs and tail in EXACT_REDUCTIONS and np.dtype(in_dtypes[0]).kind in "biuc"
    allowed = EXACT_OPS.get(_kind(dtype), frozenset())
    for ins in instrs:
        if ins.op not in allowed:
            return False
        for j, (kind, v) in enumerate(ins.args):
            if (
                kind == "in"
                and in_dtypes[v] != dtype
                and j not in ops.ELEMENTWISE[ins.op].own_dtype
            ):
                return False
    return True


def _np(dtype: str) -> str:
    """numpy's scalar type name for a dtype in generated source."""
    return "bool_" if dtype == "bool" else dtype


@dataclass(frozen=True)
class KernelSource:
    """Generated module text, the name of its kernel function and its numba signature."""

    text: str
    name: str
    signature: object


def kernel_signature(dtype: str, out_ndim: int, in_dtypes: list[str], rank: int) -> object:
    """``void(out, a0.., d0..)``: C-contiguous arrays (inputs read-only), int64 sizes."""
    arr = nbtypes.Array
    ins = [arr(numba.from_dtype(np.dtype(d)), rank, "C", readonly=True) for d in in_dtypes]
    out = arr(numba.from_dtype(np.dtype(dtype)), out_ndim, "C")
    return nbtypes.void(out, *ins, *([nbtypes.int64] * rank))


class _Consts:
    """Module-level typed constants, deduplicated by value."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.names: dict[float, str] = {}

    def __call__(self, value: float) -> str:
        v = float(value)
        key = v if v == v else "nan"
        if key not in self.names:
            self.names[key] = f"_c{len(self.names)}"
        return self.names[key]

    def lines(self) -> list[str]:
        out = []
        for v, name in self.names.items():
            lit = (
                "np.nan"
                if v == "nan"
                else repr(v)
                if np.isfinite(v)
                else ("np.inf" if v > 0 else "-np.inf")
            )
            out.append(f"{name} = np.{_np(self.dtype)}({lit})")
        return out


def _op_expr(op: str, args: list[str], consts: _Consts, fast: bool, dtype: str) -> str:
    row = ops.ELEMENTWISE[op]
    names = dict(zip(row.operands, args))
    expr = _FLOAT_LIT.sub(lambda m: consts(float(m.group(1))), row.numba)
    expr = _math_names(expr, fast, dtype)
    if np.dtype(dtype).kind == "c":
        expr = re.sub(r"\bmath\.", "cmath.", expr)
    if dtype not in _REAL:
        # numba computes small integers in int64 and complex64 math in complex128: convert each
        # value back so it wraps and rounds as numpy's loop of this dtype does
        expr = f"np.{_np(dtype)}({expr})"
    return expr.format(**names)


def _math_names(expr: str, fast: bool, dtype: str) -> str:
    if fast and dtype in ("float32", "float64"):
        sfx = "f32" if dtype == "float32" else "f64"
        expr = re.sub(r"\bmath\.exp\(", f"_exp_{sfx}(", expr)
        expr = re.sub(r"\bmath\.log\(", f"_log_{sfx}(", expr)
        expr = re.sub(r"\bmath\.log1p\(", f"_log1p_{sfx}(", expr)
        expr = re.sub(r"\bmath\.tanh\(", f"_tanh_{sfx}(", expr)
    return expr


class _Body:
    """Straight-line code for one point of the space, from the fused program."""

    def __init__(
        self,
        instrs: tuple[FusedOp, ...],
        n_inputs: int,
        consts: _Consts,
        fast: bool,
        dtype: str,
        stem: str = "t",
        epilogue: bool = False,
    ) -> None:
        self.instrs = instrs
        self.n_inputs = n_inputs
        self.consts = consts
        self.fast = fast
        self.dtype = dtype
        self.stem = stem  # temporaries are named stem0, stem1, ...
        self.epilogue = epilogue  # an epilogue reads ("tail", 0); it is never empty

    def used_inputs(self) -> list[int]:
        if not self.instrs:
            return [] if self.epilogue else [0]
        used = sorted({v for ins in self.instrs for kind, v in ins.args if kind == "in"})
        return used

    def lines(self, load: dict[int, str], tail: str = "") -> tuple[list[str], str]:
        """Statements computing the value, and the name holding it; ``load[k]`` reads input k,
        ``tail`` names the row op's value (epilogues)."""
        if not self.instrs:
            return [], load[0]
        out = []
        for j, ins in enumerate(self.instrs):
            args = []
            for kind, v in ins.args:
                if kind == "in":
                    args.append(load[v])
                elif kind == "tmp":
                    args.append(f"{self.stem}{v}")
                elif kind == "tail":
                    args.append(tail)
                else:
                    args.append(self.consts(v))
            expr = _op_expr(ins.op, args, self.consts, self.fast, self.dtype)
            out.append(f"{self.stem}{j} = {expr}")
        return out, f"{self.stem}{len(self.instrs) - 1}"


def _index(lay: Layout, k: int, idx: list[str]) -> str:
    parts = [i if f else "0" for i, f in zip(idx, lay.full[k])]
    return ", ".join(parts)


def _unravel(vars_: list[str], sizes: list[str], flat: str, ind: str) -> list[str]:
    """Statements splitting ``flat`` into ``vars_`` (C order over ``sizes``)."""
    if len(vars_) == 1:
        return [f"{ind}{vars_[0]} = {flat}"]
    # every name is assigned once: numba's parfor pass rejects a prange body that reassigns a
    # variable derived from the loop index ("Overwrite of parallel loop index")
    lines = []
    r = flat
    for j, (v, s) in enumerate(zip(reversed(vars_[1:]), reversed(sizes[1:]))):
        lines.append(f"{ind}{v} = {r} % {s}")
        lines.append(f"{ind}_r{j} = {r} // {s}")
        r = f"_r{j}"
    lines.append(f"{ind}{vars_[0]} = {r}")
    return lines


# the reductions of the table, rendered: a partial's start value and how one value joins it
_INIT = {
    n: repr(r.identity).replace("inf", "np.inf")
    for n, r in ops.REDUCTION_TABLE.items()
    if r.combine
}
_COMBINE = {
    "add": "{a} = {a} + {b}",
    "mul": "{a} = {a} * {b}",
    "max": "{a} = max({a}, {b})",
    "min": "{a} = min({a}, {b})",
}


def _init(op: str, acc_t: str) -> str:
    """The identity of ``op`` as a scalar of ``acc_t`` in source form."""
    k = np.dtype(acc_t).kind
    if op in ("max", "min") and k in "biu":
        if k == "b":
            return f"np.bool_({op == 'min'})"
        info = np.iinfo(acc_t)
        return f"np.{acc_t}({info.min if op == 'max' else info.max})"
    return f"np.{_np(acc_t)}({_INIT[op]})"


def _combine(op: str, acc: str, v: str) -> str:
    return _COMBINE[ops.REDUCTION_TABLE[op].combine].format(a=acc, b=v)


def render(
    instrs: tuple[FusedOp, ...],
    n_inputs: int,
    lay: Layout,
    tail: str | None,
    dtype: str,
    fast: bool,
    parallel: bool,
    in_dtypes: list[str] | None = None,
    eps: float = 1e-5,
    epilogue: tuple[FusedOp, ...] = (),
) -> KernelSource:
    """Source of one module holding the kernel for this program, layout and options.

    ``in_dtypes`` are the inputs' dtypes (default: all ``dtype``); ``eps`` is a layer_norm
    tail's epsilon (a literal of the source, so kernels of different eps are different texts);
    ``epilogue`` is a row-op tail's elementwise epilogue (applied to each value before it is
    stored).
    """
    if not generates(instrs, tail, epilogue, dtype, list(in_dtypes or [dtype] * n_inputs)):
        raise BackendError(
            f"numba kernels do not compute this program exactly in {dtype} (inputs {in_dtypes})"
        )
    consts = _Consts(dtype)
    body = _Body(instrs, n_inputs, consts, fast, dtype)
    epi = _Body(epilogue, n_inputs, consts, fast, dtype, "e", True) if epilogue else None
    # float sums accumulate in float64 (rank-1 blocks in the compute dtype first: see
    # partial_pass); integer sums in their (numpy) result dtype, wrapping as numpy's do
    acc_dt = {"f": "float64", "c": "complex128"}.get(np.dtype(dtype).kind, dtype)
    R = lay.rank
    idx = [f"i{d}" for d in range(R)]
    dnames = [f"d{d}" for d in range(R)]
    rng = "prange" if parallel else "range"
    # inputs broadcast over every dim are loaded once, before the loops
    used = body.used_inputs()
    epi_used = epi.used_inputs() if epi is not None else []
    hoisted = {k for k in set(used) | set(epi_used) if not any(lay.full[k])}
    head = [f"    s{k} = a{k}[{', '.join(['0'] * R)}]" for k in sorted(hoisted)]

    def loads(ind: str, block: bool | str) -> tuple[list[str], dict[int, str]]:
        names, ls = {}, []
        for k in used:
            if k in hoisted:
                names[k] = f"s{k}"
            elif block == "row":  # a row op over the last dim: the row views made by row_views
                if lay.full[k][-1]:
                    ls.append(f"{ind}x{k} = r{k}[{idx[-1]}]")
                    names[k] = f"x{k}"
                else:
                    names[k] = f"q{k}"
            elif block:  # rank 1, inside a block: the block's view of the input
                ls.append(f"{ind}x{k} = v{k}[j]")
                names[k] = f"x{k}"
            else:
                ls.append(f"{ind}x{k} = a{k}[{_index(lay, k, idx)}]")
                names[k] = f"x{k}"
        return ls, names

    def value(ind: str, block: bool | str = False) -> tuple[list[str], str]:
        """Statements computing the program's value at the current point; ``block``: the point
        is ``j`` of the per-block views ``v{k}`` made by ``views`` (rank-1 block loops)."""
        ls, names = loads(ind, block)
        bl, v = body.lines(names)
        return ls + [ind + b for b in bl], v

    def finish(ind: str, v: str) -> tuple[list[str], str]:
        """Statements applying the epilogue (if any) to the row op's value ``v`` at the current
        point, and the name of the value to store."""
        if epi is None:
            return [], v
        ls = [f"{ind}_y = {v}"]
        names = {}
        for k in epi_used:
            if k in hoisted:
                names[k] = f"s{k}"
            else:
                ls.append(f"{ind}y{k} = a{k}[{_index(lay, k, idx)}]")
                names[k] = f"y{k}"
        el, e = epi.lines(names, "_y")
        return ls + [ind + line for line in el], e

    def views(ind: str) -> list[str]:
        # Rank-1 block loops index per-block slices from 0: LLVM then knows every index is
        # non-negative and drops numba's negative-index wraparound, which otherwise turns each
        # load into an AVX-512 gather (measured: 3.6x slower on the 5-input chain at 16M).
        return [f"{ind}v{k} = a{k}[lo:hi]" for k in used if k not in hoisted]

    def row_views(ind: str) -> list[str]:
        # A row op whose axis is the last dim walks each row through 1-d views of the row (or
        # a per-row scalar for inputs broadcast along it) and of the output row: measured 1.3x
        # faster than indexing the 2-d arrays in every pass (4096x1024 float32 softmax, 1 thread)
        lead = idx[:-1]
        ls = []
        for k in used:
            if k in hoisted:
                continue
            at = _index(lay, k, lead)
            if lay.full[k][-1]:
                ls.append(f"{ind}r{k} = a{k}[{at}]" if lead else f"{ind}r{k} = a{k}")
            else:
                ls.append(f"{ind}q{k} = a{k}[{at + ', ' if lead else ''}0]")
        ls.append(f"{ind}w = out[{', '.join(lead)}]" if lead else f"{ind}w = out")
        return ls

    lines: list[str] = []
    if tail is None:
        lines += _elementwise(R, idx, dnames, rng, value, views)
    elif tail in ("layer_norm", "softmax", "log_softmax"):
        rows = _Rows(lay, idx, dnames, rng, value, row_views, bool(instrs))
        if tail == "layer_norm":
            lines += _layer_norm(rows, dtype, float(eps), finish)
        else:
            lines += _rowop(rows, tail, dtype, fast, finish)
    elif tail in ops.ROW_OPS:
        rows = _Rows(lay, idx, dnames, rng, value, row_views, bool(instrs))
        lines += _program_rows(rows, tail, dtype, fast, consts, float(eps), finish)
    else:
        lines += _reduce(lay, tail, idx, dnames, rng, value, acc_dt, dtype, fast, consts, views)
    args = ["out"] + [f"a{k}" for k in range(n_inputs)] + dnames
    flags = FAST_FLAGS if fast else "False"
    name = "kernel"
    sig = kernel_signature(dtype, len(lay.output_shape()), list(in_dtypes or [dtype] * n_inputs), R)
    code = "\n".join(lines)
    fast_names = [n for n in numba_fastmath.NAMES if f"_{n}(" in code]
    imports = ["import math", "import numpy as np", "from numba import prange"]
    if "cmath." in code:
        imports.insert(0, "import cmath")
    if fast_names:
        imports += [
            f"# numba_fastmath {numba_fastmath.SOURCE_DIGEST}",
            "from tensorlogic.backends.numba.fastmath import "
            + ", ".join(f"{n} as _{n}" for n in fast_names),
        ]
    jit = (
        f"JIT_OPTIONS = dict(parallel={parallel}, fastmath={flags}, error_model='numpy', "
        "nogil=True)"
    )
    text = (
        "\n".join(
            [
                "# generated by tensorlogic.backends.numba.codegen; content-addressed, do not edit",
                f"# signature: {sig}",
                *imports,
                *consts.lines(),
                jit,
                "",
                "",
                f"def {name}({', '.join(args)}):",
            ]
            + head
            + lines
        )
        + "\n"
    )
    return KernelSource(text, name, sig)


def _elementwise(R, idx, dnames, rng, value, views) -> list[str]:
    if R == 1:
        v_lines, v = value("            ", block=True)
        return [
            f"    nb = (d0 + {BLOCK - 1}) // {BLOCK}",
            f"    for b in {rng}(nb):",
            f"        lo = b * {BLOCK}",
            f"        hi = min(lo + {BLOCK}, d0)",
            "        vo = out[lo:hi]",
            *views("        "),
            "        for j in range(hi - lo):",
            *v_lines,
            f"            vo[j] = {v}",
        ]
    outer = " * ".join(dnames[:-1])
    v_lines, v = value("            ")
    return [
        f"    for o in {rng}({outer}):",
        *_unravel(idx[:-1], dnames[:-1], "o", "        "),
        f"        for {idx[-1]} in range({dnames[-1]}):",
        *v_lines,
        f"            out[{', '.join(idx)}] = {v}",
    ]


def _exp(dtype, fast, x) -> str:
    return _math_names(f"math.exp({x})", fast, dtype)


def _log(dtype, fast, x) -> str:
    return _math_names(f"math.log({x})", fast, dtype)


def _reduce(lay, op, idx, dnames, rng, value, acc_dt, dtype, fast, consts, views) -> list[str]:
    kept = [d for d, r in enumerate(lay.roles) if r == "k"]
    red = [d for d, r in enumerate(lay.roles) if r == "r"]
    acc_t = acc_dt if op in ("sum", "mean", "logsumexp") else dtype
    lse = op == "logsumexp"
    # the mean's divisor comes from the run-time sizes, so the text does not depend on them
    count = " * ".join(dnames[d] for d in red) or "1"

    def passes(ind: str, acc: str) -> list[str]:
        """Loops over the reduced dims (given the kept/outer indices) accumulating into acc."""
        lines = []
        depth = ind
        for d in red:
            lines.append(f"{depth}for {idx[d]} in range({dnames[d]}):")
            depth += "    "
        vl, v = value(depth)
        return lines, depth, vl, v

    def reduction(ind: str, tgt: str) -> list[str]:
        """Statements leaving the final reduced value of one output element in ``tgt``."""
        loops, depth, vl, v = passes(ind, "acc")
        if not lse:
            out = [f"{ind}acc = {_init(op, acc_t)}", *loops, *vl, depth + _combine(op, "acc", v)]
            fin = "acc"
            if op == "mean":
                fin = f"acc / ({count})"
            return out + [f"{ind}{tgt} = {fin}"]
        # logsumexp: max pass, then a sum of exp(v - max) pass
        out = [
            f"{ind}m = np.{dtype}(-np.inf)",
            *loops,
            *vl,
            f"{depth}m = max(m, {v})",
            f"{ind}m = m if (m - m) == 0 else np.{dtype}(0.0)",
        ]
        loops2, depth2, vl2, v2 = passes(ind, "s")
        out += [
            f"{ind}s = np.{acc_t}(0.0)",
            *loops2,
            *vl2,
            f"{depth2}s = s + {_exp(dtype, fast, f'{v2} - m')}",
            f"{ind}{tgt} = {_log(acc_t, fast, 's')} + m",
        ]
        return out

    if kept:
        # prange over output elements; each walks its reduced dims
        n = " * ".join(dnames[d] for d in kept)
        return [
            f"    for o in {rng}({n}):",
            *_unravel([idx[d] for d in kept], [dnames[d] for d in kept], "o", "        "),
            *reduction("        ", "out[o]"),
        ]
    # full reduction: partials over blocks (rank 1) or outer rows, combined serially
    if lay.rank == 1:
        head = [f"    nb = (d0 + {BLOCK - 1}) // {BLOCK}"]
        loop = [
            f"        lo = b * {BLOCK}",
            f"        hi = min(lo + {BLOCK}, d0)",
            *views("        "),
        ]
        inner = "        for j in range(hi - lo):"
        rows = "nb"
    else:
        rows = " * ".join(dnames[:-1])
        head = [f"    nb = {rows}"]
        loop = _unravel(idx[:-1], dnames[:-1], "b", "        ")
        inner = f"        for {idx[-1]} in range({dnames[-1]}):"
    vl, v = value("            ", block=lay.rank == 1)

    def partial_pass(init, comb, part_t, what) -> list[str]:
        # a BLOCK-long block sums in the compute dtype when reassociation is allowed: LLVM
        # splits it over many vector partial sums (each adds BLOCK/64 terms or fewer), and the
        # blocks combine in float64; converting every element to float64 instead costs ~2x in
        # cache. Rows of rank >= 2 layouts have no length bound, so they keep float64.
        blk_t = dtype if (fast and lay.rank == 1 and part_t == "float64") else part_t
        start = _init(init, blk_t) if init in _INIT else f"np.{blk_t}({init})"
        return [
            f"    part = np.empty(nb, np.{_np(part_t)})",
            f"    for b in {rng}(nb):",
            *loop,
            f"        acc = {start}",
            inner,
            *vl,
            "            " + comb(what(v)),
            "        part[b] = acc",
        ]

    if not lse:
        lines = head + partial_pass(op, lambda x: _combine(op, "acc", x), acc_t, lambda x: x)
        lines += [
            f"    acc = {_init(op, acc_t)}",
            "    for b in range(nb):",
            "        " + _combine(op, "acc", "part[b]"),
        ]
        fin = f"acc / ({count})" if op == "mean" else "acc"
        return lines + [f"    out[0] = {fin}"]
    lines = head + partial_pass("-np.inf", lambda x: f"acc = max(acc, {x})", dtype, lambda x: x)
    lines += [
        f"    m = np.{dtype}(-np.inf)",
        "    for b in range(nb):",
        "        m = max(m, part[b])",
        f"    m = m if (m - m) == 0 else np.{dtype}(0.0)",
    ]
    lines += partial_pass(
        "0.0", lambda x: f"acc = acc + {x}", acc_t, lambda x: _exp(dtype, fast, f"{x} - m")
    )
    lines += [
        f"    s = np.{acc_t}(0.0)",
        "    for b in range(nb):",
        "        s = s + part[b]",
        f"    out[0] = {_log(acc_t, fast, 's')} + m",
    ]
    return lines


class _Rows:
    """How a row-op kernel walks its rows: the loop header and where each pass reads and writes.

    With the axis last (the common case) each row is walked through 1-d views (``row_views``);
    otherwise through full indices of the (strided) axis. ``stored`` says whether the first
    pass stores the program's values in the output row for the later passes (a fused program)
    or the later passes read the input again (a lone input: a second read of a row in L1 is
    cheaper than a store of it, measured 1.2x on the 4096x1024 softmax).
    """

    def __init__(self, lay, idx, dnames, rng, value, row_views, computed: bool) -> None:
        lines_dims = [d for d, r in enumerate(lay.roles) if r != "a"]
        (self.ax,) = [d for d, r in enumerate(lay.roles) if r == "a"]
        self.row = self.ax == lay.rank - 1
        n = " * ".join(dnames[d] for d in lines_dims) or "1"
        unr = (
            _unravel([idx[d] for d in lines_dims], [dnames[d] for d in lines_dims], "o", "        ")
            if lines_dims
            else []
        )
        self.head = [
            f"    for o in {rng}({n}):",
            *unr,
            *(row_views("        ") if self.row else []),
        ]
        self.i = idx[self.ax]
        self.k = dnames[self.ax]
        self.out = f"w[{self.i}]" if self.row else f"out[{', '.join(idx)}]"
        self.value = value
        self.stored = computed or not self.row

    def loop(self) -> str:
        """The loop over the row's elements."""
        return f"        for {self.i} in range({self.k}):"

    def first(self) -> tuple[list[str], str]:
        """First pass: statements and the name of the value (stored when ``stored``)."""
        vl, v = self.value("            ", "row" if self.row else False)
        if self.stored:
            return vl + [f"            {self.out} = {v}"], self.out
        return vl, v

    def again(self) -> tuple[list[str], str]:
        """A later pass: statements and the name of the value (the stored one or a reload)."""
        if self.stored:
            return [], self.out
        return self.value("            ", "row")


def _rowop(rows: _Rows, op, dtype, fast, finish) -> list[str]:
    sfx = "f32" if dtype == "float32" else "f64"
    w = rows.out
    fl, fv = rows.first()
    lines = [
        *rows.head,
        # the row max as an integer max over order-preserving keys, so the pass vectorizes; a
        # NaN in the row still makes the whole row NaN through exp(v - m)
        f"        mk = _key_{sfx}(np.{dtype}(-np.inf))",
        rows.loop(),
        *fl,
        f"            mk = max(mk, _key_{sfx}({fv}))",
        f"        m = _unkey_{sfx}(mk)",
        # the sum of exp(v - m) in the compute dtype: its terms are in [0, 1] with one 1, so no
        # cancellation, and with reassociation LLVM keeps many vector partial sums (float64
        # accumulation costs a conversion per element: measured 17% of a 1024-wide softmax)
        f"        s = np.{dtype}(0.0)",
        rows.loop(),
    ]
    al, av = rows.again()
    if op == "softmax":
        fl, fv = finish("            ", f"{w} * inv")
        lines += [
            *al,
            f"            e = {_exp(dtype, fast, f'{av} - m')}",
            f"            {w} = e",
            "            s = s + e",
            f"        inv = np.{dtype}(1.0 / s)",
            rows.loop(),
            *fl,
            f"            {w} = {fv}",
        ]
    else:
        bl, bv = rows.again()
        fl, fv = finish("            ", f"{bv} - ls")
        lines += [
            *al,
            f"            s = s + {_exp(dtype, fast, f'{av} - m')}",
            f"        ls = m + np.{dtype}({_log('float64', fast, 's')})",
            rows.loop(),
            *bl,
            *fl,
            f"            {w} = {fv}",
        ]
    return lines


def _program_rows(rows: _Rows, name: str, dtype, fast, consts, eps: float, finish) -> list[str]:
    """A row op from its row program (``ops.ROW_PROGRAMS``) in the kernel's dtype: one pass
    over the row per reduce (maps recomputed where they are used), then the write pass."""
    scal: dict[str, str] = {}
    maps: dict[str, object] = {}

    def expr(e, x: str | None) -> str:
        if isinstance(e, str):
            if e in scal:
                return scal[e]
            if e == "inv_n":
                return f"np.{dtype}(1.0 / {rows.k})"
            if e == "eps":
                return consts(eps)
            if x is None:
                raise BackendError(f"row program {name}: {e!r} is not a scalar here")
            return x if e == "x" else f"({expr(maps[e], x)})"
        if isinstance(e, (int, float)):
            return consts(float(e))
        op, *args = e
        return _op_expr(op, [expr(a, x) for a in args], consts, fast, dtype)

    lines = [*rows.head]
    first = True
    for st in ops.ROW_PROGRAMS[name]:
        if st.kind in ("reduce", "write"):
            vl, v = rows.first() if first else rows.again()
            first = False
        if st.kind == "reduce":
            acc = scal[st.name] = f"p_{st.name}"
            lines += [
                f"        {acc} = {_init(st.combine, dtype)}",
                rows.loop(),
                *vl,
                "            " + _combine(st.combine, acc, expr(st.expr, v)),
            ]
        elif st.kind == "let":
            lines.append(f"        p_{st.name} = {expr(st.expr, None)}")
            scal[st.name] = f"p_{st.name}"
        elif st.kind == "map":
            maps[st.name] = st.expr
        elif st.kind == "write":
            fl, fv = finish("            ", expr(st.expr, v))
            lines += [rows.loop(), *vl, *fl, f"            {rows.out} = {fv}"]
        else:
            raise BackendError(f"row program {name}: a row op ends in a write, not {st.kind}")
    return lines


def _layer_norm(rows: _Rows, dtype, eps: float, finish) -> list[str]:
    """One row per (parallel) iteration: the program's values (stored in the output row when
    they are computed) accumulate their float64 sum; a second pass sums squared deviations; a
    third writes (v - mean) * rstd."""
    k = rows.k
    fl, fv = rows.first()
    al, av = rows.again()
    bl, bv = rows.again()
    el, ev = finish("            ", f"np.{dtype}(({bv} - mu) * rstd)")
    return [
        *rows.head,
        "        s = np.float64(0.0)",
        rows.loop(),
        *fl,
        f"            s = s + {fv}",
        f"        mu = s / {k}",
        "        q = np.float64(0.0)",
        rows.loop(),
        *al,
        f"            c = {av} - mu",
        "            q = q + c * c",
        f"        rstd = 1.0 / math.sqrt(q / {k} + {float(eps)!r})",
        rows.loop(),
        *bl,
        *el,
        f"            {rows.out} = {ev}",
    ]
