"""Op kinds and the one table of ops.

Each elementwise op has one row: its arity, its numpy implementation (writing into ``out``), its
numba expression, its CUDA C expression, its PTX sequence (``PTX``) and its FLOPs per element.
Code generators render fused groups from these rows; nothing else spells out what an op
computes. The arity decides the node kind (``KIND_OF_ARITY``): unary, binary, or the
three-operand ``where``. Each reduction is a row of ``REDUCTION_TABLE`` (combine, identity,
FLOPs), and each reduction and row op is a short program of passes over a row
(``ROW_PROGRAMS``) written with those ops, which the code generators render.

Expressions are Python format strings over the operand names of the arity (``OPERANDS``: ``{x}``
unary, ``{a}``/``{b}`` binary, ``{cond}``/``{a}``/``{b}`` for three operands); ``{T}`` is the C
scalar type in CUDA C.

Adding an op (tests/ir/test_op_table_extension.py does each of these on a copy of the table
and runs the result, fused and unfused, on every backend):

- an elementwise op: a row of ``ELEMENTWISE`` (numpy function, numba and CUDA C expressions,
  FLOPs, alias safety), its ``DTYPE`` rule, its ``PTX`` sequence and its ``VJP`` partials; the
  graph builds it with ``g.elementwise(name, *operands)``. Tests: its independent formula in
  ``tensorlogic.testing.reference``.
- a row op: its program in ``ROW_PROGRAMS`` (steps over one row, see ``RowStep``; ``eps`` in an
  expression makes the op take an epsilon) and its FLOPs per element in ``ROW_OP_FLOPS``; the
  graph builds it with ``g.rowop(name, x, axis)``. Every code generator renders the program:
  numpy (``backends/numpy/rows.py``), numba (``backends/numba/codegen.py``), CUDA C and PTX.
  Its independent reference goes in ``tensorlogic.testing.reference._rowop``; its gradient,
  where it has one, is a rule of ``tensorlogic.autodiff``.
- a reduction: a row of ``REDUCTION_TABLE`` (a combine and identity when one combine computes
  it, else ``combine=None``) and its program in ``ROW_PROGRAMS`` (reduce steps, lets, and a
  ``result``); ``g.reduce(name, x, axis)`` builds it, and its value over an empty axis comes
  from the program (each reduce step's identity). Its reference goes in
  ``tensorlogic.testing.reference._reduce``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import DTypeError

# Node kinds of the graph.
INPUT = "input"
CONSTANT = "constant"
PARAMETER = "parameter"  # a learned leaf: a value the plan holds and training updates in place
EINSUM = "einsum"
UNARY = "unary"
BINARY = "binary"
WHERE = "where"
REDUCE = "reduce"
ROWOP = "rowop"  # softmax / log_softmax / layer_norm over one axis
TRANSPOSE = "transpose"
RESHAPE = "reshape"
CAST = "cast"
FUSED = "fused"  # made by the optimizer's fusion pass
ATTENTION = "attention"  # softmax(scale * q k^T + mask) v in one node (see ir/attention.py)
# the backward of a row op (made by tl.grad): a row program over several operands (the forward's
# result or input and the cotangent), one node, one pass per reduction (ROW_GRAD_PROGRAMS)
ROWGRAD = "rowgrad"

NODE_KINDS = (
    INPUT,
    CONSTANT,
    PARAMETER,
    EINSUM,
    UNARY,
    BINARY,
    WHERE,
    REDUCE,
    ROWOP,
    TRANSPOSE,
    RESHAPE,
    CAST,
    FUSED,
    ATTENTION,
    ROWGRAD,
)


@dataclass(frozen=True)
class ElementwiseOp:
    """One row of the elementwise op table."""

    name: str
    arity: int
    numpy: Callable[..., object]  # numpy(*args, out=out) writes into out (a ufunc where one is)
    numba: str
    cuda: str
    flops: int
    commutative: bool = False
    # numpy(x, out=x) is correct: the input is not read after out is first written
    alias_safe: bool = True
    # operands read in their own dtype, never converted to the op's (where's condition is only
    # compared with zero)
    own_dtype: tuple[int, ...] = ()

    @property
    def operands(self) -> tuple[str, ...]:
        """The operand names of the expression templates, in argument order."""
        return OPERANDS[self.arity]


# operand names of the expression templates by arity
OPERANDS: dict[int, tuple[str, ...]] = {1: ("x",), 2: ("a", "b"), 3: ("cond", "a", "b")}


_SQRT_2_OVER_PI = 0.7978845608028654


def _relu(x, out):
    # a zero of x's own dtype: a Python 0 would make bool inputs compute in int64
    return np.maximum(x, x.dtype.type(0), out=out)


def _sigmoid(x, out):
    # tanh form never overflows: sigmoid(x) = 0.5 * tanh(x / 2) + 0.5
    np.multiply(x, 0.5, out=out)
    np.tanh(out, out=out)
    np.multiply(out, 0.5, out=out)
    return np.add(out, 0.5, out=out)


def _softplus(x, out):
    return np.logaddexp(x, 0, out=out)


def _gelu(x, out):
    # tanh approximation (PyTorch's approximate="tanh"), computed in out without temporaries;
    # x is read after out is written, so out must not alias x (alias_safe=False)
    np.multiply(x, x, out=out)
    np.multiply(out, 0.044715 * _SQRT_2_OVER_PI, out=out)
    np.add(out, _SQRT_2_OVER_PI, out=out)
    np.multiply(out, x, out=out)
    np.tanh(out, out=out)
    np.add(out, 1.0, out=out)
    np.multiply(out, x, out=out)
    return np.multiply(out, 0.5, out=out)


def _gelu_grad(x, out):
    # the derivative of the tanh-approximate gelu: 0.5 (1 + t) + 0.5 x (1 - t^2) u', with
    # t = tanh(u), u = c (x + 0.044715 x^3), u' = c (1 + 0.134145 x^2)
    if np.ndim(x) == 0:  # numpy scalars: no in-place steps
        x2 = x * x
        t = np.tanh((x2 * (0.044715 * _SQRT_2_OVER_PI) + _SQRT_2_OVER_PI) * x)
        slope = (x2 * (0.134145 * 0.5 * _SQRT_2_OVER_PI) + 0.5 * _SQRT_2_OVER_PI) * x
        np.copyto(out, 0.5 * (1 + t) + slope * (1 - t * t))
        return out
    x2 = np.multiply(x, x)
    t = np.multiply(x2, 0.044715 * _SQRT_2_OVER_PI)
    t += _SQRT_2_OVER_PI
    t *= x
    np.tanh(t, out=t)
    slope = np.multiply(x2, 0.134145 * 0.5 * _SQRT_2_OVER_PI, out=x2)
    slope += 0.5 * _SQRT_2_OVER_PI
    slope *= x  # x's last read: out may alias it from here on
    np.multiply(t, t, out=out)
    np.subtract(1, out, out=out)
    out *= slope
    t += 1
    t *= 0.5
    out += t
    return out


def _pow(a, b, out):
    try:
        return np.power(a, b, out=out)
    except ValueError as exc:  # numpy refuses integers to negative integer powers
        raise DTypeError(
            f"pow: {exc} (integer base {a.dtype}, exponent {b.dtype}); cast the "
            "base to a float dtype"
        ) from None


def _step(x, out):
    return np.greater(x, 0, out=out)


def _one_minus(x, out):
    return np.subtract(1, x, out=out)


def _where(cond, a, b, out):
    # b everywhere, then a where cond is nonzero. The mask is taken before out is written, and
    # an out that is ``a`` itself only receives b: out may alias any operand exactly
    mask = np.not_equal(cond, 0)
    if np.may_share_memory(out, a):
        np.copyto(out, b, where=np.logical_not(mask))
    else:
        np.copyto(out, b)
        np.copyto(out, a, where=mask)
    return out


_GELU_C = "(({T})0.5*{x}*(({T})1+tanh(({T})0.7978845608028654*({x}+({T})0.044715*{x}*{x}*{x}))))"
# numba: the same function as x * sigmoid(2u) = x / (1 + exp(-2u)), u = c (x + 0.044715 x^3):
# one exp and one division instead of tanh's two branches, so a fast-math kernel runs ~35%
# faster (1M float32 on 2 vCPUs: 1.25 vs 1.95 ms serial), and it has no cancellation in
# 1 + tanh(u) for negative x (relative error 2e-6 there against 7e-2 for the tanh form);
# exp(-2u) overflowing to inf gives -0.0 for very negative x, as the tanh form does
_GELU_NB = "({x}/(1.0+math.exp(-1.5957691216057308*({x}+0.044715*{x}*{x}*{x}))))"
_GELU_T_NB = "math.tanh(0.7978845608028654*({x}+0.044715*{x}*{x}*{x}))"
_GELU_GRAD_NB = (
    f"(0.5*(1.0+{_GELU_T_NB})+0.3989422804014327*{{x}}*(1.0-{_GELU_T_NB}*{_GELU_T_NB})"
    "*(1.0+0.134145*{x}*{x}))"
)
_GELU_T_C = "tanh(({T})0.7978845608028654*({x}+({T})0.044715*{x}*{x}*{x}))"
_GELU_GRAD_C = (
    f"(({{T}})0.5*(({{T}})1+{_GELU_T_C})+({{T}})0.3989422804014327*{{x}}*(({{T}})1-{_GELU_T_C}"
    f"*{_GELU_T_C})*(({{T}})1+({{T}})0.134145*{{x}}*{{x}}))"
)

ELEMENTWISE: dict[str, ElementwiseOp] = {
    op.name: op
    for op in [
        # unary
        ElementwiseOp("neg", 1, np.negative, "(-{x})", "(-{x})", 1),
        ElementwiseOp("abs", 1, np.abs, "abs({x})", "fabs({x})", 1),
        ElementwiseOp("exp", 1, np.exp, "math.exp({x})", "exp({x})", 8),
        ElementwiseOp("log", 1, np.log, "math.log({x})", "log({x})", 8),
        ElementwiseOp("sqrt", 1, np.sqrt, "math.sqrt({x})", "sqrt({x})", 4),
        ElementwiseOp("square", 1, np.square, "({x}*{x})", "({x}*{x})", 1),
        ElementwiseOp("reciprocal", 1, np.reciprocal, "(1.0/{x})", "(({T})1/{x})", 1),
        ElementwiseOp("relu", 1, _relu, "max({x}, 0.0)", "fmax({x}, ({T})0)", 1),
        ElementwiseOp(
            "sigmoid",
            1,
            _sigmoid,
            # numba: 1 / (1 + exp(-x)), one exp and a division, 1.7x faster than the tanh
            # form in a fast-math kernel and free of its cancellation for negative x (relative
            # error 1e-7 against 1.3 in float32); exp(-x) = inf gives 0 as the limit
            "(1.0/(1.0+math.exp(-{x})))",
            "(({T})0.5*tanh(({T})0.5*{x})+({T})0.5)",
            10,
        ),
        ElementwiseOp("tanh", 1, np.tanh, "math.tanh({x})", "tanh({x})", 10),
        ElementwiseOp(
            "softplus",
            1,
            _softplus,
            "(max({x}, 0.0)+math.log1p(math.exp(-abs({x}))))",
            "(fmax({x}, ({T})0)+log1p(exp(-fabs({x}))))",
            20,
        ),
        ElementwiseOp("gelu", 1, _gelu, _GELU_NB, _GELU_C, 18, alias_safe=False),
        # gelu's derivative, one op so a gradient graph holds one node per gelu, not twenty
        ElementwiseOp("gelu_grad", 1, _gelu_grad, _GELU_GRAD_NB, _GELU_GRAD_C, 24),
        ElementwiseOp(
            "step", 1, _step, "(1.0 if {x} > 0 else 0.0)", "({x} > ({T})0 ? ({T})1 : ({T})0)", 1
        ),
        ElementwiseOp("one_minus", 1, _one_minus, "(1.0-{x})", "(({T})1-{x})", 1),
        # binary
        ElementwiseOp("add", 2, np.add, "({a}+{b})", "({a}+{b})", 1, True),
        ElementwiseOp("sub", 2, np.subtract, "({a}-{b})", "({a}-{b})", 1),
        ElementwiseOp("mul", 2, np.multiply, "({a}*{b})", "({a}*{b})", 1, True),
        ElementwiseOp("div", 2, np.divide, "({a}/{b})", "({a}/{b})", 1),
        ElementwiseOp("pow", 2, _pow, "({a}**{b})", "pow({a}, {b})", 20),
        ElementwiseOp("maximum", 2, np.maximum, "max({a}, {b})", "fmax({a}, {b})", 1, True),
        ElementwiseOp("minimum", 2, np.minimum, "min({a}, {b})", "fmin({a}, {b})", 1, True),
        ElementwiseOp(
            "gt",
            2,
            np.greater,
            "(1.0 if {a} > {b} else 0.0)",
            "({a} > {b} ? ({T})1 : ({T})0)",
            1,
        ),
        ElementwiseOp(
            "ge",
            2,
            np.greater_equal,
            "(1.0 if {a} >= {b} else 0.0)",
            "({a} >= {b} ? ({T})1 : ({T})0)",
            1,
        ),
        ElementwiseOp(
            "lt",
            2,
            np.less,
            "(1.0 if {a} < {b} else 0.0)",
            "({a} < {b} ? ({T})1 : ({T})0)",
            1,
        ),
        ElementwiseOp(
            "le",
            2,
            np.less_equal,
            "(1.0 if {a} <= {b} else 0.0)",
            "({a} <= {b} ? ({T})1 : ({T})0)",
            1,
        ),
        ElementwiseOp(
            "eq",
            2,
            np.equal,
            "(1.0 if {a} == {b} else 0.0)",
            "({a} == {b} ? ({T})1 : ({T})0)",
            1,
            True,
        ),
        ElementwiseOp(
            "ne",
            2,
            np.not_equal,
            "(1.0 if {a} != {b} else 0.0)",
            "({a} != {b} ? ({T})1 : ({T})0)",
            1,
            True,
        ),
        # three operands: a where cond is nonzero, else b
        ElementwiseOp(
            "where",
            3,
            _where,
            "({a} if {cond} != 0.0 else {b})",
            "({cond} != ({T})0 ? {a} : {b})",
            1,
            own_dtype=(0,),
        ),
    ]
}

# Ops that a generated kernel computes exactly for integer dtypes, one element at a time in
# the stored type (as numpy's loop does): ring operations wrap, comparisons and selections are
# exact. Integer reciprocal and pow, and ops that change the dtype, keep numpy's (or CuPy's)
# loops. Read by the numba and CUDA C generators.
INTEGER_EXACT = frozenset(
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
)

# The CUDA C column for integer and bool compute types, where the float expression would go
# through double (fabs, fmax) and lose the low bits of 64-bit integers.
CUDA_INT: dict[str, str] = {
    "abs": "({x} < ({T})0 ? ({T})(-{x}) : {x})",
    "relu": "({x} > ({T})0 ? {x} : ({T})0)",
    "maximum": "({a} > {b} ? {a} : {b})",
    "minimum": "({a} < {b} ? {a} : {b})",
}

# How each elementwise op is typed (dtypes.elementwise_result): (numpy ufunc, mode). "loop":
# the output of numpy's loop for that ufunc (exp of int8 -> float16, abs of complex -> float,
# div of ints -> float64, comparisons -> bool); "same": the promoted operand dtype (relu and
# step give their values, 1/0 for step, in it; the ufunc still decides which dtypes are
# accepted); an "-ordered" mode refuses complex; "select": the promoted dtype of every operand
# but the first (where's condition, of any dtype). A dtype numpy has no loop for raises
# DTypeError.
DTYPE: dict[str, tuple[str, str]] = {
    "neg": ("negative", "loop"),
    "abs": ("absolute", "loop"),
    "exp": ("exp", "loop"),
    "log": ("log", "loop"),
    "sqrt": ("sqrt", "loop"),
    "square": ("square", "loop"),
    "reciprocal": ("reciprocal", "loop"),
    "relu": ("maximum", "same-ordered"),
    "sigmoid": ("tanh", "loop"),
    "tanh": ("tanh", "loop"),
    "softplus": ("logaddexp", "loop"),
    "gelu": ("tanh", "loop"),
    "gelu_grad": ("tanh", "loop"),
    "step": ("greater", "same-ordered"),
    "one_minus": ("subtract", "loop"),
    "add": ("add", "loop"),
    "sub": ("subtract", "loop"),
    "mul": ("multiply", "loop"),
    "div": ("divide", "loop"),
    "pow": ("power", "loop"),
    "maximum": ("maximum", "loop-ordered"),
    "minimum": ("minimum", "loop-ordered"),
    "gt": ("greater", "loop-ordered"),
    "ge": ("greater_equal", "loop-ordered"),
    "lt": ("less", "loop-ordered"),
    "le": ("less_equal", "loop-ordered"),
    "eq": ("equal", "loop"),
    "ne": ("not_equal", "loop"),
    "where": ("", "select"),
}

# the comparisons: numpy's result is bool, computed in the operands' promoted dtype
COMPARISONS = ("gt", "ge", "lt", "le", "eq", "ne")
UNARY_OPS = tuple(n for n, op in ELEMENTWISE.items() if op.arity == 1)
BINARY_OPS = tuple(n for n, op in ELEMENTWISE.items() if op.arity == 2)
TERNARY_OPS = tuple(n for n, op in ELEMENTWISE.items() if op.arity == 3)
# the node kind of an elementwise op of each arity, and the elementwise kinds
KIND_OF_ARITY: dict[int, str] = {1: UNARY, 2: BINARY, 3: WHERE}
ELEMENTWISE_KINDS = tuple(KIND_OF_ARITY.values())
OPS_OF_KIND: dict[str, tuple[str, ...]] = {UNARY: UNARY_OPS, BINARY: BINARY_OPS, WHERE: TERNARY_OPS}
# the op a node of a kind with a single op takes when none is named (graphs saved before
# ``where`` was a row of the table name none)
DEFAULT_OP: dict[str, str] = {k: v[0] for k, v in OPS_OF_KIND.items() if len(v) == 1}


@dataclass(frozen=True)
class Reduction:
    """One row of the reduction table.

    ``combine`` is how two partial results merge ("add", "mul", "max", "min"; max and min
    propagate NaN like numpy), ``identity`` the start value of a partial, ``numpy`` the name of
    the array-module function that computes it, ``flops`` the FLOPs per input element. A mean is
    a sum divided by the count. logsumexp has no single combine: it is a max pass, then a sum of
    exp(x - max), then a log.
    """

    name: str
    combine: str | None
    identity: float
    numpy: str | None
    flops: int = 1
    mean: bool = False


REDUCTION_TABLE: dict[str, Reduction] = {
    r.name: r
    for r in [
        Reduction("sum", "add", 0.0, "sum"),
        Reduction("mean", "add", 0.0, "mean", mean=True),
        Reduction("max", "max", float("-inf"), "max"),
        Reduction("min", "min", float("inf"), "min"),
        Reduction("prod", "mul", 1.0, "prod"),
        Reduction("logsumexp", None, float("-inf"), None, flops=10),
    ]
}
REDUCTIONS = tuple(REDUCTION_TABLE)
# reductions that one combine computes (every code generator renders these from the table)
COMBINED_REDUCTIONS = tuple(n for n, r in REDUCTION_TABLE.items() if r.combine is not None)

# row ops over one axis and their FLOPs per element (max or mean, an exp or a square, a sum, a
# divide)
ROW_OP_FLOPS: dict[str, int] = {"softmax": 10, "log_softmax": 10, "layer_norm": 10}
ROW_OPS = tuple(ROW_OP_FLOPS)
# layer_norm: (x - mean) / sqrt(var + eps) over one axis, biased variance; eps is a node argument
LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class RowStep:
    """One step of a row program: what a row op or reduction computes over one row.

    ``kind`` is "reduce" (``name`` = the ``combine`` reduction of ``expr`` over the row), "let"
    (``name`` = a scalar of earlier scalars), "map" (``name`` = ``expr`` at every element: a
    code generator may hold it or recompute it where it is used), "write" (each element of the
    result row is ``expr``) or "result" (the reduction's one value is ``expr``).

    Expressions are a name (``x``: the row's element; an earlier step's name; ``inv_n``: 1 / the
    row length; ``eps``: the node's epsilon), a number, or ``(op, *args)`` with ``op`` an
    elementwise op of the table, so every code generator renders them with its elementwise
    renderer.
    """

    kind: str
    name: str
    expr: Any
    combine: str = ""  # reduce: a REDUCTION_TABLE row with a combine (its combine and identity)


_NEG_INF = float("-inf")


def _shifted_exp(shift) -> tuple[RowStep, ...]:
    """The row max ``m``, the shift ``ms`` (``shift``: the max, or 0 where it would make a NaN),
    the map ``e = exp(x - ms)`` and its row sum ``s``."""
    return (
        RowStep("reduce", "m", "x", "max"),
        RowStep("let", "ms", shift),
        RowStep("map", "e", ("exp", ("sub", "x", "ms"))),
        RowStep("reduce", "s", "e", "sum"),
    )


# softmax and log_softmax: a row of -inf shifts by 0 (exp gives 0, not NaN; its result is NaN as
# numpy's); logsumexp: a max that is not finite shifts by 0 (m - m is 0 only for finite m), so a
# row of -inf gives -inf and a row holding +inf gives +inf
_SOFTMAX_SHIFT = _shifted_exp(("where", ("eq", "m", _NEG_INF), 0.0, "m"))
_LSE_SHIFT = _shifted_exp(("where", ("eq", ("sub", "m", "m"), 0.0), "m", 0.0))

ROW_PROGRAMS: dict[str, tuple[RowStep, ...]] = {
    **{
        r.name: (
            RowStep("reduce", "r", "x", r.name),
            RowStep("result", "", ("mul", "r", "inv_n") if r.mean else "r"),
        )
        for r in REDUCTION_TABLE.values()
        if r.combine is not None
    },
    "logsumexp": _LSE_SHIFT + (RowStep("result", "", ("add", ("log", "s"), "ms")),),
    "softmax": _SOFTMAX_SHIFT
    + (RowStep("let", "inv", ("reciprocal", "s")), RowStep("write", "", ("mul", "e", "inv"))),
    "log_softmax": _SOFTMAX_SHIFT
    + (RowStep("let", "sh", ("add", ("log", "s"), "ms")), RowStep("write", "", ("sub", "x", "sh"))),
    # biased variance, as PyTorch's LayerNorm
    "layer_norm": (
        RowStep("reduce", "s", "x", "sum"),
        RowStep("let", "mu", ("mul", "s", "inv_n")),
        RowStep("map", "c", ("sub", "x", "mu")),
        RowStep("reduce", "q", ("square", "c"), "sum"),
        RowStep("let", "rstd", ("reciprocal", ("sqrt", ("add", ("mul", "q", "inv_n"), "eps")))),
        RowStep("write", "", ("mul", "c", "rstd")),
    ),
}


# elementwise ops whose result is NaN whenever an operand is NaN (in numpy and every renderer)
NAN_STRICT = frozenset(
    {"neg", "add", "sub", "mul", "div", "exp", "log", "sqrt", "square", "reciprocal"}
)


def _carries_nan(e, target, defs: Mapping[str, Any]) -> bool:
    """Whether ``e`` is NaN wherever ``target`` (a name or an expression) is: it reads
    ``target`` through NaN-strict ops only (``defs``: the maps and lets it may read by name)."""
    if e == target:
        return True
    if isinstance(e, str):
        return e in defs and _carries_nan(defs[e], target, defs)
    if isinstance(e, tuple):
        return e[0] in NAN_STRICT and any(_carries_nan(a, target, defs) for a in e[1:])
    return False


def nan_carried(program: Sequence[RowStep], i: int) -> bool:
    """Whether a NaN in reduce step ``i``'s expression at any element makes the whole result
    NaN whatever value step ``i`` computes: a later sum or product reads that expression
    through NaN-strict ops, and every write or result reads that sum the same way.

    Then a row max may ignore NaN (a code generator renders a plain max, which vectorizes,
    instead of one that tests every element): softmax's exp(x - m) carries a NaN of x into its
    sum, and the sum into every output, as numpy's NaN maximum would.
    """
    defs = {st.name: st.expr for st in program if st.kind in ("map", "let")}
    target = program[i].expr
    outs = [st.expr for st in program if st.kind in ("write", "result")]
    return bool(outs) and any(
        st.kind == "reduce"
        and REDUCTION_TABLE[st.combine].combine in ("add", "mul")
        and _carries_nan(st.expr, target, defs)
        and all(_carries_nan(o, st.name, defs) for o in outs)
        for st in program[i + 1 :]
    )


# The backward of each row op as one row program over named operands (``ROW_GRAD_OPERANDS``:
# the node's inputs in order, ``g`` the cotangent row), so the gradient of a softmax or a layer
# norm is one kernel, not a chain of reductions and elementwise nodes. Same step language as
# ``ROW_PROGRAMS``; a program may read every operand at every element.
ROW_GRAD_OPERANDS: dict[str, tuple[str, ...]] = {
    "softmax": ("y", "g"),  # y: the softmax result
    "log_softmax": ("y", "g"),  # y: the log_softmax result
    "layer_norm": ("x", "g"),  # x: the layer norm's input (mean and rstd recomputed)
}
ROW_GRAD_PROGRAMS: dict[str, tuple[RowStep, ...]] = {
    # dx = y * (g - sum(g * y))
    "softmax": (
        RowStep("reduce", "s", ("mul", "g", "y"), "sum"),
        RowStep("write", "", ("mul", "y", ("sub", "g", "s"))),
    ),
    # dx = g - exp(y) * sum(g)
    "log_softmax": (
        RowStep("reduce", "s", "g", "sum"),
        RowStep("write", "", ("sub", "g", ("mul", ("exp", "y"), "s"))),
    ),
    # yh = (x - mean) * rstd: dx = rstd * (g - mean(g) - yh * mean(g * yh))
    "layer_norm": (
        RowStep("reduce", "sx", "x", "sum"),
        RowStep("let", "mu", ("mul", "sx", "inv_n")),
        RowStep("map", "c", ("sub", "x", "mu")),
        RowStep("reduce", "q", ("square", "c"), "sum"),
        RowStep("let", "rstd", ("reciprocal", ("sqrt", ("add", ("mul", "q", "inv_n"), "eps")))),
        RowStep("map", "yh", ("mul", "c", "rstd")),
        RowStep("reduce", "sg", "g", "sum"),
        RowStep("reduce", "sgy", ("mul", "g", "yh"), "sum"),
        RowStep("let", "mg", ("mul", "sg", "inv_n")),
        RowStep("let", "mgy", ("mul", "sgy", "inv_n")),
        RowStep("write", "", ("mul", "rstd", ("sub", ("sub", "g", "mg"), ("mul", "yh", "mgy")))),
    ),
}
# FLOPs per element of each backward row program (its elementwise ops and reductions)
ROW_GRAD_FLOPS: dict[str, int] = {"softmax": 4, "log_softmax": 12, "layer_norm": 14}


def _names(e) -> set[str]:
    if isinstance(e, str):
        return {e}
    if isinstance(e, tuple):
        return set().union(*(_names(a) for a in e[1:]))
    return set()


def takes_eps(name: str) -> bool:
    """Whether a row op or reduction reads an epsilon (a node argument ``eps``)."""
    return any("eps" in _names(st.expr) for st in ROW_PROGRAMS.get(name, ()))


def row_grad_takes_eps(name: str) -> bool:
    """Whether the backward row program of ``name`` reads an epsilon."""
    return any("eps" in _names(st.expr) for st in ROW_GRAD_PROGRAMS.get(name, ()))


# The PTX column of the op table: one instruction sequence per op, shared by float32 and float64.
# Placeholders: {d} the result, {x} (unary) or {a}/{b} (binary) the operands, {T} the PTX float
# type (f32/f64), {t0}.. fresh value registers, {p0}.. fresh predicates, {c:V} the immediate V in
# the type's hex form. A line "@name d, args" expands a math macro (exp, log, tanh, pow) that the
# PTX emitter implements per type. Every sequence writes {d} last, so {d} never aliases an operand.
# Operand names as in ``OPERANDS``.
PTX: dict[str, tuple[str, ...]] = {
    "neg": ("neg.{T} {d}, {x};",),
    "abs": ("abs.{T} {d}, {x};",),
    "exp": ("@exp {d}, {x};",),
    "log": ("@log {d}, {x};",),
    "sqrt": ("sqrt.rn.{T} {d}, {x};",),
    "square": ("mul.{T} {d}, {x}, {x};",),
    "reciprocal": ("rcp.rn.{T} {d}, {x};",),
    # x <= 0 -> 0, else x: a NaN input stays NaN, as with np.maximum
    "relu": ("setp.le.{T} {p0}, {x}, {c:0};", "selp.{T} {d}, {c:0}, {x}, {p0};"),
    "sigmoid": (
        "mul.{T} {t0}, {x}, {c:0.5};",
        "@tanh {t1}, {t0};",
        "fma.rn.{T} {d}, {t1}, {c:0.5}, {c:0.5};",
    ),
    "tanh": ("@tanh {d}, {x};",),
    "softplus": (
        "abs.{T} {t0}, {x};",
        "neg.{T} {t0}, {t0};",
        "@exp {t1}, {t0};",
        "add.{T} {t1}, {t1}, {c:1};",
        "@log {t2}, {t1};",
        "max.{T} {t3}, {x}, {c:0};",
        "add.{T} {d}, {t3}, {t2};",
    ),
    "gelu": (
        "mul.{T} {t0}, {x}, {x};",
        "fma.rn.{T} {t0}, {t0}, {c:0.044715}, {c:1};",
        "mul.{T} {t0}, {t0}, {x};",
        "mul.{T} {t0}, {t0}, {c:0.7978845608028654};",
        "@tanh {t1}, {t0};",
        "add.{T} {t1}, {t1}, {c:1};",
        "mul.{T} {t1}, {t1}, {x};",
        "mul.{T} {d}, {t1}, {c:0.5};",
    ),
    "gelu_grad": (
        "mul.{T} {t0}, {x}, {x};",
        "fma.rn.{T} {t1}, {t0}, {c:0.044715}, {c:1};",
        "mul.{T} {t1}, {t1}, {x};",
        "mul.{T} {t1}, {t1}, {c:0.7978845608028654};",
        "@tanh {t2}, {t1};",
        "mul.{T} {t3}, {t2}, {t2};",
        "sub.{T} {t3}, {c:1}, {t3};",
        "fma.rn.{T} {t0}, {t0}, {c:0.134145}, {c:1};",
        "mul.{T} {t0}, {t0}, {x};",
        "mul.{T} {t0}, {t0}, {c:0.3989422804014327};",
        "mul.{T} {t0}, {t0}, {t3};",
        "add.{T} {t2}, {t2}, {c:1};",
        "fma.rn.{T} {d}, {t2}, {c:0.5}, {t0};",
    ),
    "step": ("setp.gt.{T} {p0}, {x}, {c:0};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "one_minus": ("sub.{T} {d}, {c:1}, {x};",),
    "add": ("add.{T} {d}, {a}, {b};",),
    "sub": ("sub.{T} {d}, {a}, {b};",),
    "mul": ("mul.{T} {d}, {a}, {b};",),
    "div": ("div.rn.{T} {d}, {a}, {b};",),
    "pow": ("@pow {d}, {a}, {b};",),
    # PTX max/min drop a NaN operand; numpy propagates it, so a NaN in either operand wins
    "maximum": (
        "max.{T} {t0}, {a}, {b};",
        "setp.nan.{T} {p0}, {a}, {b};",
        "add.{T} {t1}, {a}, {b};",
        "selp.{T} {d}, {t1}, {t0}, {p0};",
    ),
    "minimum": (
        "min.{T} {t0}, {a}, {b};",
        "setp.nan.{T} {p0}, {a}, {b};",
        "add.{T} {t1}, {a}, {b};",
        "selp.{T} {d}, {t1}, {t0}, {p0};",
    ),
    "gt": ("setp.gt.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "ge": ("setp.ge.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "lt": ("setp.lt.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "le": ("setp.le.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "eq": ("setp.eq.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    # unordered: NaN != anything is true, as in numpy
    "ne": ("setp.neu.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    # a NaN condition is nonzero (unordered !=), as in numpy
    "where": ("setp.neu.{T} {p0}, {cond}, {c:0};", "selp.{T} {d}, {a}, {b}, {p0};"),
}

# The VJP column of the op table (used by tensorlogic.autodiff): for each elementwise op, the
# partial derivative of the result with respect to each operand, as an expression over the
# operands ({x}, or {a} and {b}), the result {y}, numbers, + - * / and calls of the ops above
# (and where). The cotangent is multiplied by it (its complex conjugate, as torch does for
# complex numbers). "0" marks an op that is piecewise constant: no gradient flows through it.
# relu and step take the derivative 0 at 0, maximum/minimum share a tie equally (as torch).
_GELU_T = "tanh(0.7978845608028654 * x * (1 + 0.044715 * (x * x)))"  # as in the forward
_GELU_U1 = "(0.7978845608028654 * (1 + 0.134145 * (x * x)))"  # d/dx of tanh's argument
VJP: dict[str, tuple[str, ...]] = {
    "neg": ("-1",),
    "abs": ("step(x) - step(-x)",),
    "exp": ("y",),
    "log": ("reciprocal(x)",),
    "sqrt": ("0.5 / y",),
    "square": ("2 * x",),
    "reciprocal": ("-(y * y)",),
    "relu": ("step(y)",),
    "sigmoid": ("y * one_minus(y)",),
    "tanh": ("one_minus(y * y)",),
    "softplus": ("sigmoid(x)",),
    "gelu": ("gelu_grad(x)",),
    # the second derivative: (1 - t^2) (u' - x t u'^2 + 0.5 x u''), u'' = 6 c 0.044715 x
    "gelu_grad": (
        f"one_minus({_GELU_T} * {_GELU_T}) * ({_GELU_U1} - x * {_GELU_T} * {_GELU_U1} * "
        f"{_GELU_U1} + 0.10703222440890038 * (x * x))",
    ),
    "step": ("0",),
    "one_minus": ("-1",),
    "add": ("1", "1"),
    "sub": ("1", "-1"),
    "mul": ("b", "a"),
    "div": ("1 / b", "-(y / b)"),  # 1 / b, not reciprocal: b may be an integer tensor
    # torch: no gradient to the exponent where the base is 0 and the exponent >= 0
    "pow": ("b * pow(a, b - 1)", "where(eq(a, 0) * ge(b, 0), 0, y * log(a))"),
    "maximum": ("gt(a, b) + 0.5 * eq(a, b)", "lt(a, b) + 0.5 * eq(a, b)"),
    "minimum": ("lt(a, b) + 0.5 * eq(a, b)", "gt(a, b) + 0.5 * eq(a, b)"),
    "gt": ("0", "0"),
    "ge": ("0", "0"),
    "lt": ("0", "0"),
    "le": ("0", "0"),
    "eq": ("0", "0"),
    "ne": ("0", "0"),
    # where(c, a, b): none to the condition; the rule (autodiff.rules.where) selects the
    # cotangent with a where of its own rather than multiplying, so an inf cotangent on the
    # branch not taken gives 0, not NaN (as torch)
    "where": ("0", "ne(c, 0)", "eq(c, 0)"),
}
