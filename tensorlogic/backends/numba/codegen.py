"""Render a fused program over a Layout to the source text of one numba kernel.

The kernel is ``kernel(out, a0, a1, ..., d0, d1, ...)``: ``out`` and the inputs are viewed in
the layout's collapsed shapes, ``d*`` are the collapsed sizes. Every elementwise op comes from the
op table (``ops.ELEMENTWISE[op].numba``); float literals in those expressions and program
constants become module-level constants of the compute dtype, so float32 kernels stay float32
(a bare ``0.5`` would promote the whole expression to float64 and halve the vector width).

Loop shapes:
- elementwise, rank 1: blocks of ``BLOCK`` elements, ``prange`` over blocks;
- elementwise, rank >= 2: ``prange`` over the flattened outer dims, a contiguous inner loop;
- reduction with kept dims: ``prange`` over kept elements; per reduce step of the reduction's
  row program (``ops.ROW_PROGRAMS``) a loop over the reduced dims;
- full reduction: per reduce step, per-block (or per-row) partials in parallel, combined
  serially;
- float max and min in every loop shape: over order-preserving integer keys, which vectorize,
  with a guard for NaN unless a later pass carries NaN to every output (``_Keyed``);
- row op: ``prange`` over rows; one pass per reduce step of its row program, then the write
  pass (see ``_program_rows``: an expensive map stored in the output row for later passes);
  with the axis last, through 1-d row views, and a computed program is stored in ``out`` by
  the first pass while a plain input is re-read; an epilogue program runs on each value in
  the last pass, before it is stored.
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
    "iu": ops.INTEGER_EXACT,
    # bool: the integer set less neg, sub, square and one_minus, which numpy refuses for bool
    # or computes in another dtype
    "b": ops.INTEGER_EXACT - {"neg", "square", "one_minus", "sub"},
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
# reductions a generated kernel computes exactly for integer, bool and complex inputs
EXACT_REDUCTIONS = frozenset({"sum", "prod", "max", "min", "mean"})
_REAL = ("float32", "float64")


def _kind(dtype: str) -> str:
    k = np.dtype(dtype).kind
    return "iu" if k in "iu" else k


def generates(instrs, tail, epilogue, dtype: str, in_dtypes: list[str]) -> bool:
    """Whether ``render`` makes an exact kernel for this program and these dtypes."""
    if tail is not None and tail not in ops.ROW_PROGRAMS:
        return False  # an op without a row program: numpy runs it
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
    if fast and dtype in _REAL and _math_names(row.numba, fast, dtype) != row.numba:
        # the fast functions are written per dtype: an operand promoted to float64 (a row
        # program's float64 sum) is converted first
        args = [f"np.{dtype}({a})" for a in args]
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

    def column_views(ind: str) -> list[str]:
        # the current row's columns lo:hi of each input (every one is full along the last dim)
        out = []
        for k in used:
            if k not in hoisted:
                lead = [i if f else "0" for i, f in zip(idx[:-1], lay.full[k][:-1])]
                out.append(f"{ind}v{k} = a{k}[{''.join(x + ', ' for x in lead)}lo:hi]")
        return out

    lines: list[str] = []
    if tail is None:
        lines += _elementwise(R, idx, dnames, rng, value, views)
    elif tail in ops.ROW_OPS:
        rows = _Rows(lay, idx, dnames, rng, value, row_views, bool(instrs))
        lines += _program_rows(rows, tail, dtype, fast, consts, float(eps), finish)
    elif _by_columns(lay, tail, [k for k in used if k not in hoisted]):
        lines += _reduce_columns(
            lay, tail, idx, dnames, rng, value, acc_dt, dtype, fast, consts, column_views
        )
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


def _program_expr(name: str, e, x: str | None, scal: dict, maps: dict, r: _ProgramNames) -> str:
    """A row program's expression in source form; ``x`` names the row's element (None where
    only per-row values may be read)."""
    if isinstance(e, str):
        if e in scal:
            return scal[e]
        if e == "inv_n":
            return r.inv_n
        if e == "eps":
            return r.consts(r.eps)
        if x is None:
            raise BackendError(f"row program {name}: {e!r} is not a per-row value here")
        return x if e == "x" else f"({_program_expr(name, maps[e], x, scal, maps, r)})"
    if isinstance(e, (int, float)):
        return r.consts(float(e))
    op, *args = e
    return _op_expr(
        op, [_program_expr(name, a, x, scal, maps, r) for a in args], r.consts, r.fast, r.dtype
    )


@dataclass
class _ProgramNames:
    """What a row program's expressions read besides its values: the compute dtype, fast
    math, the constants, 1 / the row length (source text) and the epsilon."""

    dtype: str
    fast: bool
    consts: _Consts
    inv_n: str
    eps: float = 0.0


class _Keyed:
    """A float max or min over order-preserving integer keys (``fastmath.key_f32``): an
    integer max vectorizes where a float one that tests for NaN does not (about 1.5x on a
    16M max). Keys put a NaN of sign bit 0 above +inf and one of sign bit 1 below -inf, so a
    guard, the opposite combine of the keys, catches the NaN the combine misses; ``exact=False``
    drops the guard where a later pass carries a NaN into every output anyway
    (``ops.nan_carried``: softmax's exp(x - m))."""

    def __init__(self, combine: str, dtype: str, exact: bool) -> None:
        self.sfx = "f32" if dtype == "float32" else "f64"
        self.key_dtype = "int32" if dtype == "float32" else "int64"  # what key_<sfx> returns
        self.dtype, self.exact = dtype, exact
        self.op, self.guard = ("max", "min") if combine == "max" else ("min", "max")
        self.start = self.key(f"np.{dtype}({'-' if combine == 'max' else ''}np.inf)")

    def key(self, v: str) -> str:
        return f"_key_{self.sfx}({v})"

    def init(self, ind: str, k: str, g: str) -> list[str]:
        return [f"{ind}{k} = {self.start}"] + ([f"{ind}{g} = {k}"] if self.exact else [])

    def join(self, ind: str, k: str, g: str, kk: str, gg: str | None = None) -> list[str]:
        """Key ``kk`` (and guard ``gg``, else ``kk``) into ``k`` and ``g``."""
        lines = [f"{ind}{k} = {self.op}({k}, {kk})"]
        return lines + ([f"{ind}{g} = {self.guard}({g}, {gg or kk})"] if self.exact else [])

    def finish(self, ind: str, acc: str, k: str, g: str) -> str:
        v = f"_unkey_{self.sfx}({k})"
        if not self.exact:
            return f"{ind}{acc} = {v}"
        cmp = ">=" if self.op == "max" else "<="
        return f"{ind}{acc} = {v} if {g} {cmp} {self.start} else np.{self.dtype}(np.nan)"


def _keyed(st, prog, i: int, dtype: str) -> "_Keyed | None":
    """The keyed rendering of reduce step ``i`` when it is a float max or min."""
    comb = ops.REDUCTION_TABLE[st.combine].combine
    if comb not in ("max", "min") or dtype not in _REAL:
        return None
    return _Keyed(comb, dtype, not ops.nan_carried(prog, i))


def _reduce(lay, op, idx, dnames, rng, value, acc_dt, dtype, fast, consts, views) -> list[str]:
    """A reduction from its row program (``ops.ROW_PROGRAMS``): one pass over the reduced
    elements per reduce step (maps recomputed in each), per-row lets between, the result last.
    Sums accumulate in ``acc_dt`` (float64 for floats), other combines in the dtype."""
    kept = [d for d, r in enumerate(lay.roles) if r == "k"]
    red = [d for d, r in enumerate(lay.roles) if r == "r"]
    # the row length comes from the run-time sizes, so the text does not depend on them
    count = " * ".join(dnames[d] for d in red) or "1"
    names = _ProgramNames(dtype, fast, consts, f"(1.0 / ({count}))")
    prog = ops.ROW_PROGRAMS[op]
    scal: dict[str, str] = {}
    maps: dict[str, object] = {}

    def acc_type(st) -> str:
        return acc_dt if ops.REDUCTION_TABLE[st.combine].combine == "add" else dtype

    def per_row(st, ind: str, tgt: str) -> list[str]:
        """A let or the result: one statement."""
        return [f"{ind}{tgt} = {_program_expr(op, st.expr, None, scal, maps, names)}"]

    if kept:
        # prange over output elements; each walks its reduced dims once per reduce step
        n = " * ".join(dnames[d] for d in kept)
        lines = [
            f"    for o in {rng}({n}):",
            *_unravel([idx[d] for d in kept], [dnames[d] for d in kept], "o", "        "),
        ]
        ind = "        "
        for i, st in enumerate(prog):
            if st.kind == "reduce":
                acc = f"p_{st.name}"
                depth = ind
                loops = []
                for d in red:
                    loops.append(f"{depth}for {idx[d]} in range({dnames[d]}):")
                    depth += "    "
                vl, v = value(depth)
                term = _program_expr(op, st.expr, v, scal, maps, names)
                kd = _keyed(st, prog, i, dtype)
                if kd is not None:
                    k, g, kk = f"k_{st.name}", f"g_{st.name}", f"kk_{st.name}"
                    lines += [
                        *kd.init(ind, k, g),
                        *loops,
                        *vl,
                        f"{depth}{kk} = {kd.key(f'np.{dtype}({term})')}",
                        *kd.join(depth, k, g, kk),
                        kd.finish(ind, acc, k, g),
                    ]
                else:
                    lines += [
                        f"{ind}{acc} = {_init(st.combine, acc_type(st))}",
                        *loops,
                        *vl,
                        depth + _combine(st.combine, acc, term),
                    ]
                scal[st.name] = acc
            elif st.kind == "let":
                lines += per_row(st, ind, f"p_{st.name}")
                scal[st.name] = f"p_{st.name}"
            elif st.kind == "map":
                maps[st.name] = st.expr
            else:
                lines += per_row(st, ind, "out[o]")
        return lines
    # full reduction: per reduce step, partials over blocks (rank 1) or outer rows in
    # parallel, combined serially
    if lay.rank == 1:
        head = [f"    nb = (d0 + {BLOCK - 1}) // {BLOCK}"]
        loop = [
            f"        lo = b * {BLOCK}",
            f"        hi = min(lo + {BLOCK}, d0)",
            *views("        "),
        ]
        inner = "        for j in range(hi - lo):"
    else:
        head = [f"    nb = {' * '.join(dnames[:-1])}"]
        loop = _unravel(idx[:-1], dnames[:-1], "b", "        ")
        inner = f"        for {idx[-1]} in range({dnames[-1]}):"
    vl, v = value("            ", block=lay.rank == 1)
    lines = list(head)
    for i, st in enumerate(prog):
        kd = _keyed(st, prog, i, dtype) if st.kind == "reduce" else None
        if kd is not None:
            acc = scal[st.name] = f"p_{st.name}"
            term = _program_expr(op, st.expr, v, scal, maps, names)
            k, g = f"k_{st.name}", f"g_{st.name}"
            lines += [
                f"    part = np.empty(nb, np.{kd.key_dtype})",
                *([f"    partg = np.empty(nb, np.{kd.key_dtype})"] if kd.exact else []),
                f"    for b in {rng}(nb):",
                *loop,
                *kd.init("        ", "kb", "gb"),
                inner,
                *vl,
                f"            kk = {kd.key(f'np.{dtype}({term})')}",
                *kd.join("            ", "kb", "gb", "kk"),
                "        part[b] = kb",
                *(["        partg[b] = gb"] if kd.exact else []),
                *kd.init("    ", k, g),
                "    for b in range(nb):",
                *kd.join("        ", k, g, "part[b]", "partg[b]"),
                kd.finish("    ", acc, k, g),
            ]
        elif st.kind == "reduce":
            part_t = acc_type(st)
            # a BLOCK-long block sums in the compute dtype when reassociation is allowed: LLVM
            # splits it over many vector partial sums (each adds BLOCK/64 terms or fewer), and
            # the blocks combine in float64; converting every element to float64 instead costs
            # ~2x in cache. Rows of rank >= 2 layouts have no length bound, so they keep float64.
            blk_t = dtype if (fast and lay.rank == 1 and part_t == "float64") else part_t
            acc = f"p_{st.name}"
            term = _program_expr(op, st.expr, v, scal, maps, names)
            lines += [
                f"    part = np.empty(nb, np.{_np(part_t)})",
                f"    for b in {rng}(nb):",
                *loop,
                f"        acc = {_init(st.combine, blk_t)}",
                inner,
                *vl,
                "            " + _combine(st.combine, "acc", term),
                "        part[b] = acc",
                f"    {acc} = {_init(st.combine, part_t)}",
                "    for b in range(nb):",
                "        " + _combine(st.combine, acc, "part[b]"),
            ]
            scal[st.name] = acc
        elif st.kind == "let":
            lines += per_row(st, "    ", f"p_{st.name}")
            scal[st.name] = f"p_{st.name}"
        elif st.kind == "map":
            maps[st.name] = st.expr
        else:
            lines += per_row(st, "    ", "out[0]")
    return lines


COLUMNS = 256  # kept elements per task of a column reduction (their partials stay in L1)


def _by_columns(lay, op: str, loaded: list[int]) -> bool:
    """Whether a reduction walks its rows with the kept last dim innermost (``_reduce_columns``):
    the last dim is kept and some dim before it is reduced (a bias gradient: sum over the
    leading axes), every loaded input is full along the last dim, and the row program is one
    reduce step and its result."""
    prog = ops.ROW_PROGRAMS[op]
    return (
        lay.rank >= 2
        and lay.roles[-1] == "k"
        and "r" in lay.roles
        and all(lay.full[k][-1] for k in loaded)
        and [st.kind for st in prog] == ["reduce", "result"]
    )


def _reduce_columns(lay, op, idx, dnames, rng, value, acc_dt, dtype, fast, consts, col_views):
    """A reduction over dims before the kept last dim, walked row by row: a task owns
    ``COLUMNS`` consecutive kept elements (of one combination of the other kept dims) and adds
    each reduced row's slice of them to its partials, a contiguous inner loop that vectorizes.
    The kept-elements-outermost walk of ``_reduce`` would read every input with the row stride
    and accumulate one element at a time (measured 30x slower on a 1024 x 1024 column sum)."""
    last = lay.rank - 1
    kept = [d for d, r in enumerate(lay.roles) if r == "k" and d != last]
    red = [d for d, r in enumerate(lay.roles) if r == "r"]
    count = " * ".join(dnames[d] for d in red)
    names = _ProgramNames(dtype, fast, consts, f"(1.0 / ({count}))")
    reduce_step, result = ops.ROW_PROGRAMS[op]
    part_t = acc_dt if ops.REDUCTION_TABLE[reduce_step.combine].combine == "add" else dtype
    n_outer = " * ".join(dnames[d] for d in kept) or "1"
    lines = [
        f"    nch = ({dnames[last]} + {COLUMNS - 1}) // {COLUMNS}",
        f"    for t in {rng}({n_outer} * nch):",
        "        c = t % nch",
        "        o0 = t // nch",
    ]
    if kept:
        lines += _unravel([idx[d] for d in kept], [dnames[d] for d in kept], "o0", "        ")
    lines += [
        f"        lo = c * {COLUMNS}",
        f"        hi = min(lo + {COLUMNS}, {dnames[last]})",
        f"        acc = np.empty(hi - lo, np.{_np(part_t)})",
        "        for j in range(hi - lo):",
        f"            acc[j] = {_init(reduce_step.combine, part_t)}",
    ]
    depth = "        "
    for d in red:
        lines.append(f"{depth}for {idx[d]} in range({dnames[d]}):")
        depth += "    "
    lines += col_views(depth)
    vl, v = value(depth + "    ", block=True)
    term = _program_expr(op, reduce_step.expr, v, {}, {}, names)
    lines += [
        f"{depth}for j in range(hi - lo):",
        *vl,
        f"{depth}    " + _combine(reduce_step.combine, "acc[j]", term),
    ]
    res = _program_expr(op, result.expr, None, {reduce_step.name: "acc[j]"}, {}, names)
    lines += [
        "        base = o0 * " + dnames[last] + " + lo",
        "        for j in range(hi - lo):",
        f"            out[base + j] = {res}",
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


# elementwise ops whose result is never negative: a row sum of such terms cannot cancel, so
# it accumulates in the compute dtype (with reassociation LLVM keeps many vector partial sums;
# float64 accumulation costs a conversion per element: measured 17% of a 1024-wide softmax);
# any other sum accumulates in float64
_NONNEGATIVE = frozenset({"exp", "square", "abs", "sqrt", "relu", "sigmoid", "softplus", "step"})
# a map costing at least this many FLOPs per element (an exp) that a later pass reads again is
# stored in the output row when that is free; a cheaper one is recomputed (a second read of a
# row in L1 is cheaper than a store of it)
_STORE_FLOPS = 8


def _flops(e) -> int:
    if isinstance(e, tuple):
        return ops.ELEMENTWISE[e[0]].flops + sum(_flops(a) for a in e[1:])
    return 0


def _never_negative(e, maps: dict) -> bool:
    if isinstance(e, str) and e in maps:
        return _never_negative(maps[e], maps)
    return isinstance(e, tuple) and e[0] in _NONNEGATIVE


def _refs(e, maps: dict) -> set[str]:
    """The names an expression reads, through the maps it reads."""
    if isinstance(e, str):
        return {e} | (_refs(maps[e], maps) if e in maps else set())
    if isinstance(e, tuple):
        return set().union(*(_refs(a, maps) for a in e[1:]))
    return set()


def _program_rows(rows: _Rows, name: str, dtype, fast, consts, eps: float, finish) -> list[str]:
    """A row op from its row program (``ops.ROW_PROGRAMS``): one pass over the row per reduce
    step, then the write pass, each re-reading the row (or its stored values).

    Float row maxima run over order-preserving integer keys (an integer max vectorizes; a NaN
    of either sign still makes the maximum NaN); sums of never-negative terms accumulate in
    the compute dtype, others in float64; an expensive map read by several passes is stored in
    the output row by the first (softmax's exp) once the row's input is read for the last time.
    """
    prog = ops.ROW_PROGRAMS[name]
    names = _ProgramNames(dtype, fast, consts, f"(1.0 / {rows.k})", eps)
    scal: dict[str, str] = {}
    maps = {st.name: st.expr for st in prog if st.kind == "map"}
    passes = [i for i, st in enumerate(prog) if st.kind in ("reduce", "write")]
    reads = {i: _refs(prog[i].expr, maps) for i in passes}
    # a map to store: read by several passes, expensive, and the row's input (which a computed
    # program keeps in the output row, and which the output may alias) not read after the pass
    # that first computes it; one at a time
    stored: dict[str, int] = {}
    for m, e in maps.items():
        users = [i for i in passes if m in reads[i]]
        if stored or len(users) < 2 or _flops(e) < _STORE_FLOPS:
            continue
        others = {k: v for k, v in maps.items() if k != m}  # reads of m itself come from out
        if not any("x" in _refs(prog[i].expr, others) for i in passes if i > users[0]):
            stored[m] = users[0]
    lines = [*rows.head]
    first = True
    for i, st in enumerate(prog):
        if st.kind in ("reduce", "write"):
            vl, v = rows.first() if first else rows.again()
            first = False
            pre, local = [], dict(scal)
            for m, at in stored.items():
                if at == i:  # computed here and stored for the later passes
                    e = _program_expr(name, maps[m], v, scal, maps, names)
                    pre += [f"            s_{m} = {e}", f"            {rows.out} = s_{m}"]
                elif at < i:  # read back
                    pre.append(f"            s_{m} = {rows.out}")
                    vl = []  # the input is not read again
                if at <= i:
                    local[m] = f"s_{m}"
            body = _program_expr(name, st.expr, v, local, maps, names)
        if st.kind == "reduce":
            acc = scal[st.name] = f"p_{st.name}"
            comb = ops.REDUCTION_TABLE[st.combine].combine
            kd = _keyed(st, prog, i, dtype)
            if kd is not None:
                k, g, kk = f"k_{st.name}", f"g_{st.name}", f"kk_{st.name}"
                lines += [
                    *kd.init("        ", k, g),
                    rows.loop(),
                    *vl,
                    *pre,
                    f"            {kk} = {kd.key(f'np.{dtype}({body})')}",
                    *kd.join("            ", k, g, kk),
                    kd.finish("        ", acc, k, g),
                ]
                continue
            acc_t = dtype
            if comb == "add" and not _never_negative(st.expr, maps):
                acc_t = {"f": "float64", "c": "complex128"}.get(np.dtype(dtype).kind, dtype)
            lines += [
                f"        {acc} = {_init(st.combine, acc_t)}",
                rows.loop(),
                *vl,
                *pre,
                "            " + _combine(st.combine, acc, body),
            ]
        elif st.kind == "let":
            lines.append(
                f"        p_{st.name} = {_program_expr(name, st.expr, None, scal, maps, names)}"
            )
            scal[st.name] = f"p_{st.name}"
        elif st.kind == "map":
            continue
        elif st.kind == "write":
            fl, fv = finish("            ", f"np.{dtype}({body})")
            lines += [rows.loop(), *vl, *pre, *fl, f"            {rows.out} = {fv}"]
        else:
            raise BackendError(f"row program {name}: a row op ends in a write, not {st.kind}")
    return lines
