"""Op kinds and the one table of elementwise ops.

Each elementwise op has one row: its arity, its numpy implementation (writing into ``out``), its
numba expression, its CUDA C expression, and its FLOPs per element. Code generators render fused
groups from these rows; nothing else spells out what an op computes.

Expressions are Python format strings over the operand names ``{x}`` (unary) or ``{a}``/``{b}``
(binary); ``{T}`` is the C scalar type in CUDA C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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

NODE_KINDS = (
    INPUT, CONSTANT, PARAMETER, EINSUM, UNARY, BINARY, WHERE, REDUCE, ROWOP, TRANSPOSE, RESHAPE,
    CAST, FUSED, ATTENTION,
)


@dataclass(frozen=True)
class ElementwiseOp:
    """One row of the elementwise op table."""

    name: str
    arity: int
    numpy: Callable[..., object]  # numpy(*args, out=out) writes into out
    numba: str
    cuda: str
    flops: int
    commutative: bool = False
    # numpy(x, out=x) is correct: the input is not read after out is first written
    alias_safe: bool = True


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


def _pow(a, b, out):
    try:
        return np.power(a, b, out=out)
    except ValueError as exc:  # numpy refuses integers to negative integer powers
        raise DTypeError(f"pow: {exc} (integer base {a.dtype}, exponent {b.dtype}); cast the "
                         "base to a float dtype") from None


def _step(x, out):
    return np.greater(x, 0, out=out)


def _one_minus(x, out):
    return np.subtract(1, x, out=out)


def _cmp(ufunc):
    def run(a, b, out):
        return ufunc(a, b, out=out)

    return run


def _unary(ufunc):
    def run(x, out):
        return ufunc(x, out=out)

    return run


def _binary(ufunc):
    def run(a, b, out):
        return ufunc(a, b, out=out)

    return run


_GELU_C = "(({T})0.5*{x}*(({T})1+tanh(({T})0.7978845608028654*({x}+({T})0.044715*{x}*{x}*{x}))))"
_GELU_NB = "(0.5*{x}*(1.0+math.tanh(0.7978845608028654*({x}+0.044715*{x}*{x}*{x}))))"

ELEMENTWISE: dict[str, ElementwiseOp] = {
    op.name: op
    for op in [
        # unary
        ElementwiseOp("neg", 1, _unary(np.negative), "(-{x})", "(-{x})", 1),
        ElementwiseOp("abs", 1, _unary(np.abs), "abs({x})", "fabs({x})", 1),
        ElementwiseOp("exp", 1, _unary(np.exp), "math.exp({x})", "exp({x})", 8),
        ElementwiseOp("log", 1, _unary(np.log), "math.log({x})", "log({x})", 8),
        ElementwiseOp("sqrt", 1, _unary(np.sqrt), "math.sqrt({x})", "sqrt({x})", 4),
        ElementwiseOp("square", 1, _unary(np.square), "({x}*{x})", "({x}*{x})", 1),
        ElementwiseOp("reciprocal", 1, _unary(np.reciprocal), "(1.0/{x})", "(({T})1/{x})", 1),
        ElementwiseOp("relu", 1, _relu, "max({x}, 0.0)", "fmax({x}, ({T})0)", 1),
        ElementwiseOp(
            "sigmoid", 1, _sigmoid, "(0.5*math.tanh(0.5*{x})+0.5)",
            "(({T})0.5*tanh(({T})0.5*{x})+({T})0.5)", 10,
        ),
        ElementwiseOp("tanh", 1, _unary(np.tanh), "math.tanh({x})", "tanh({x})", 10),
        ElementwiseOp(
            "softplus", 1, _softplus, "(max({x}, 0.0)+math.log1p(math.exp(-abs({x}))))",
            "(fmax({x}, ({T})0)+log1p(exp(-fabs({x}))))", 20,
        ),
        ElementwiseOp("gelu", 1, _gelu, _GELU_NB, _GELU_C, 18, alias_safe=False),
        ElementwiseOp("step", 1, _step, "(1.0 if {x} > 0 else 0.0)",
                      "({x} > ({T})0 ? ({T})1 : ({T})0)", 1),
        ElementwiseOp("one_minus", 1, _one_minus, "(1.0-{x})", "(({T})1-{x})", 1),
        # binary
        ElementwiseOp("add", 2, _binary(np.add), "({a}+{b})", "({a}+{b})", 1, True),
        ElementwiseOp("sub", 2, _binary(np.subtract), "({a}-{b})", "({a}-{b})", 1),
        ElementwiseOp("mul", 2, _binary(np.multiply), "({a}*{b})", "({a}*{b})", 1, True),
        ElementwiseOp("div", 2, _binary(np.divide), "({a}/{b})", "({a}/{b})", 1),
        ElementwiseOp("pow", 2, _pow, "({a}**{b})", "pow({a}, {b})", 20),
        ElementwiseOp("maximum", 2, _binary(np.maximum), "max({a}, {b})",
                      "fmax({a}, {b})", 1, True),
        ElementwiseOp("minimum", 2, _binary(np.minimum), "min({a}, {b})",
                      "fmin({a}, {b})", 1, True),
        ElementwiseOp("gt", 2, _cmp(np.greater), "(1.0 if {a} > {b} else 0.0)",
                      "({a} > {b} ? ({T})1 : ({T})0)", 1),
        ElementwiseOp("ge", 2, _cmp(np.greater_equal), "(1.0 if {a} >= {b} else 0.0)",
                      "({a} >= {b} ? ({T})1 : ({T})0)", 1),
        ElementwiseOp("lt", 2, _cmp(np.less), "(1.0 if {a} < {b} else 0.0)",
                      "({a} < {b} ? ({T})1 : ({T})0)", 1),
        ElementwiseOp("le", 2, _cmp(np.less_equal), "(1.0 if {a} <= {b} else 0.0)",
                      "({a} <= {b} ? ({T})1 : ({T})0)", 1),
        ElementwiseOp("eq", 2, _cmp(np.equal), "(1.0 if {a} == {b} else 0.0)",
                      "({a} == {b} ? ({T})1 : ({T})0)", 1, True),
        ElementwiseOp("ne", 2, _cmp(np.not_equal), "(1.0 if {a} != {b} else 0.0)",
                      "({a} != {b} ? ({T})1 : ({T})0)", 1, True),
    ]
}

# How each elementwise op is typed (dtypes.elementwise_result): (numpy ufunc, mode). "loop":
# the output of numpy's loop for that ufunc (exp of int8 -> float16, abs of complex -> float,
# div of ints -> float64); "same": the promoted operand dtype (comparisons give 1/0 in it, so a
# mask multiplies without a cast; the ufunc still decides which dtypes are accepted); an
# "-ordered" mode refuses complex. A dtype numpy has no loop for raises DTypeError.
DTYPE: dict[str, tuple[str, str]] = {
    "neg": ("negative", "loop"), "abs": ("absolute", "loop"), "exp": ("exp", "loop"),
    "log": ("log", "loop"), "sqrt": ("sqrt", "loop"), "square": ("square", "loop"),
    "reciprocal": ("reciprocal", "loop"), "relu": ("maximum", "same-ordered"),
    "sigmoid": ("tanh", "loop"), "tanh": ("tanh", "loop"), "softplus": ("logaddexp", "loop"),
    "gelu": ("tanh", "loop"), "step": ("greater", "same-ordered"),
    "one_minus": ("subtract", "loop"),
    "add": ("add", "loop"), "sub": ("subtract", "loop"), "mul": ("multiply", "loop"),
    "div": ("divide", "loop"), "pow": ("power", "loop"),
    "maximum": ("maximum", "loop-ordered"), "minimum": ("minimum", "loop-ordered"),
    "gt": ("greater", "same-ordered"), "ge": ("greater_equal", "same-ordered"),
    "lt": ("less", "same-ordered"), "le": ("less_equal", "same-ordered"),
    "eq": ("equal", "same"), "ne": ("not_equal", "same"),
}

UNARY_OPS = tuple(n for n, op in ELEMENTWISE.items() if op.arity == 1)
BINARY_OPS = tuple(n for n, op in ELEMENTWISE.items() if op.arity == 2)



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


REDUCTION_TABLE: dict[str, Reduction] = {r.name: r for r in [
    Reduction("sum", "add", 0.0, "sum"),
    Reduction("mean", "add", 0.0, "mean", mean=True),
    Reduction("max", "max", float("-inf"), "max"),
    Reduction("min", "min", float("inf"), "min"),
    Reduction("prod", "mul", 1.0, "prod"),
    Reduction("logsumexp", None, float("-inf"), None, flops=10),
]}
REDUCTIONS = tuple(REDUCTION_TABLE)
# reductions that one combine computes (every code generator renders these from the table)
COMBINED_REDUCTIONS = tuple(n for n, r in REDUCTION_TABLE.items() if r.combine is not None)

# row ops over one axis and their FLOPs per element (max or mean, an exp or a square, a sum, a
# divide)
ROW_OP_FLOPS: dict[str, int] = {"softmax": 10, "log_softmax": 10, "layer_norm": 10}
ROW_OPS = tuple(ROW_OP_FLOPS)
# layer_norm: (x - mean) / sqrt(var + eps) over one axis, biased variance; eps is a node argument
LAYER_NORM_EPS = 1e-5

# The PTX column of the op table: one instruction sequence per op, shared by float32 and float64.
# Placeholders: {d} the result, {x} (unary) or {a}/{b} (binary) the operands, {T} the PTX float
# type (f32/f64), {t0}.. fresh value registers, {p0}.. fresh predicates, {c:V} the immediate V in
# the type's hex form. A line "@name d, args" expands a math macro (exp, log, tanh, pow) that the
# PTX emitter implements per type. Every sequence writes {d} last, so {d} never aliases an operand.
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
    "sigmoid": ("mul.{T} {t0}, {x}, {c:0.5};", "@tanh {t1}, {t0};",
                "fma.rn.{T} {d}, {t1}, {c:0.5}, {c:0.5};"),
    "tanh": ("@tanh {d}, {x};",),
    "softplus": ("abs.{T} {t0}, {x};", "neg.{T} {t0}, {t0};", "@exp {t1}, {t0};",
                 "add.{T} {t1}, {t1}, {c:1};", "@log {t2}, {t1};", "max.{T} {t3}, {x}, {c:0};",
                 "add.{T} {d}, {t3}, {t2};"),
    "gelu": ("mul.{T} {t0}, {x}, {x};", "fma.rn.{T} {t0}, {t0}, {c:0.044715}, {c:1};",
             "mul.{T} {t0}, {t0}, {x};", "mul.{T} {t0}, {t0}, {c:0.7978845608028654};",
             "@tanh {t1}, {t0};", "add.{T} {t1}, {t1}, {c:1};", "mul.{T} {t1}, {t1}, {x};",
             "mul.{T} {d}, {t1}, {c:0.5};"),
    "step": ("setp.gt.{T} {p0}, {x}, {c:0};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "one_minus": ("sub.{T} {d}, {c:1}, {x};",),
    "add": ("add.{T} {d}, {a}, {b};",),
    "sub": ("sub.{T} {d}, {a}, {b};",),
    "mul": ("mul.{T} {d}, {a}, {b};",),
    "div": ("div.rn.{T} {d}, {a}, {b};",),
    "pow": ("@pow {d}, {a}, {b};",),
    # PTX max/min drop a NaN operand; numpy propagates it, so a NaN in either operand wins
    "maximum": ("max.{T} {t0}, {a}, {b};", "setp.nan.{T} {p0}, {a}, {b};",
                "add.{T} {t1}, {a}, {b};", "selp.{T} {d}, {t1}, {t0}, {p0};"),
    "minimum": ("min.{T} {t0}, {a}, {b};", "setp.nan.{T} {p0}, {a}, {b};",
                "add.{T} {t1}, {a}, {b};", "selp.{T} {d}, {t1}, {t0}, {p0};"),
    "gt": ("setp.gt.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "ge": ("setp.ge.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "lt": ("setp.lt.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "le": ("setp.le.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    "eq": ("setp.eq.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
    # unordered: NaN != anything is true, as in numpy
    "ne": ("setp.neu.{T} {p0}, {a}, {b};", "selp.{T} {d}, {c:1}, {c:0}, {p0};"),
}

# The VJP column of the op table (used by tensorlogic.autodiff): for each elementwise op, the
# partial derivative of the result with respect to each operand, as an expression over the
# operands ({x}, or {a} and {b}), the result {y}, numbers, + - * / and calls of the ops above
# (and where). The cotangent is multiplied by it (its complex conjugate, as torch does for
# complex numbers). "0" marks an op that is piecewise constant: no gradient flows through it.
# relu and step take the derivative 0 at 0, maximum/minimum share a tie equally (as torch).
_GELU_T = "tanh(0.7978845608028654 * x * (1 + 0.044715 * (x * x)))"  # as in the forward
VJP: dict[str, tuple[str, ...]] = {
    "neg": ("-1",), "abs": ("step(x) - step(-x)",), "exp": ("y",), "log": ("reciprocal(x)",),
    "sqrt": ("0.5 / y",), "square": ("2 * x",), "reciprocal": ("-(y * y)",),
    "relu": ("step(y)",), "sigmoid": ("y * one_minus(y)",), "tanh": ("one_minus(y * y)",),
    "softplus": ("sigmoid(x)",),
    "gelu": (f"0.5 * (1 + {_GELU_T}) + 0.3989422804014327 * x * one_minus({_GELU_T} * "
             f"{_GELU_T}) * (1 + 0.134145 * (x * x))",),
    "step": ("0",), "one_minus": ("-1",),
    "add": ("1", "1"), "sub": ("1", "-1"), "mul": ("b", "a"),
    "div": ("1 / b", "-(y / b)"),  # 1 / b, not reciprocal: b may be an integer tensor
    # torch: no gradient to the exponent where the base is 0 and the exponent >= 0
    "pow": ("b * pow(a, b - 1)", "where(eq(a, 0) * ge(b, 0), 0, y * log(a))"),
    "maximum": ("gt(a, b) + 0.5 * eq(a, b)", "lt(a, b) + 0.5 * eq(a, b)"),
    "minimum": ("lt(a, b) + 0.5 * eq(a, b)", "gt(a, b) + 0.5 * eq(a, b)"),
    "gt": ("0", "0"), "ge": ("0", "0"), "lt": ("0", "0"), "le": ("0", "0"), "eq": ("0", "0"),
    "ne": ("0", "0"),
}
