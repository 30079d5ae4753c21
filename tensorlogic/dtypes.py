"""Supported dtypes, the one promotion table, and the result dtype of every op.

Everything follows numpy (2.x, NEP 50): tensors promote like ``np.result_type`` of arrays; a
Python scalar met by a tensor is *weak* (``int8 + 2`` stays int8, ``int8 * 2.0`` is float64,
``float32 + 2j`` is complex64); an op's result dtype is the output of the numpy loop that
computes it (``exp`` of int8 is float16, ``sum`` of int8 is int64), and an op numpy has no loop
for raises DTypeError when the graph is built.

Adding a dtype (e.g. bfloat16 through ml_dtypes) is local to this module:
1. append its name to ``DTYPES`` (``np.dtype(name)`` must resolve it: import ml_dtypes here);
2. if numpy's own promotion does not know a pair with it, add the pair to ``EXTRA_PROMOTIONS``
   (e.g. ``("bfloat16", "float16"): "float32"``); the table is symmetric, one order suffices;
3. if numpy has no ufunc loop for it but the op should run, compute in a wider dtype by adding
   it to ``COMPUTE_IN`` (e.g. ``"bfloat16": "float32"``: ops resolve as float32, then the
   result is rounded back where the op keeps the input dtype).
Backends declare which of these dtypes they run; nothing else lists dtypes.
"""

from __future__ import annotations

import functools
import warnings
from typing import Sequence

import ml_dtypes
import numpy as np

from .errors import DTypeError

# The dtypes of the IR, narrowest first within each kind.
DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
SUPPORTED = DTYPES
# bfloat16 (ml_dtypes) has numpy kind 'V'; it is a float everywhere here
FLOATS: tuple[str, ...] = tuple(d for d in DTYPES if np.dtype(d).kind == "f" or d == "bfloat16")
# 16-bit floats: stored in 16 bits, computed and summed in float32, each result rounded once
HALF: tuple[str, ...] = ("float16", "bfloat16")
bfloat16 = np.dtype(ml_dtypes.bfloat16)
COMPLEX: tuple[str, ...] = tuple(d for d in DTYPES if np.dtype(d).kind == "c")

# Promotions numpy does not know (dtypes from extension packages); symmetric. bfloat16 sits
# where float16 sits (numpy's rules: ints it holds exactly keep it, wider ints widen it), and
# with float16 gives float32, as JAX places it (neither holds the other).
EXTRA_PROMOTIONS: dict[tuple[str, str], str] = {
    ("bfloat16", "float16"): "float32",
    ("bfloat16", "int16"): "float32",
    ("bfloat16", "uint16"): "float32",
    ("bfloat16", "int32"): "float64",
    ("bfloat16", "uint32"): "float64",
    ("bfloat16", "int64"): "float64",
    ("bfloat16", "uint64"): "float64",
}
# Dtypes numpy has no arithmetic loops for: ops resolve in this wider dtype.
COMPUTE_IN: dict[str, str] = {}


def _build_table() -> dict[tuple[str, str], str]:
    table: dict[tuple[str, str], str] = {}
    for a in DTYPES:
        for b in DTYPES:
            try:
                table[a, b] = np.promote_types(a, b).name
            except TypeError:
                continue
    for (a, b), r in EXTRA_PROMOTIONS.items():
        table[a, b] = table[b, a] = r
    return table


# The one promotion table: (dtype, dtype) -> result dtype, for every pair of DTYPES.
PROMOTION: dict[tuple[str, str], str] = _build_table()


def kind(dtype: str) -> str:
    """numpy's kind letter: 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'c' complex."""
    return "f" if dtype == "bfloat16" else np.dtype(dtype).kind


def is_float(dtype: object) -> bool:
    """Whether an array dtype is one of the floating dtypes (bfloat16 included, whose numpy
    kind is 'V')."""
    try:
        return np.dtype(dtype).name in FLOATS  # type: ignore[arg-type]
    except TypeError:
        return False


def normalize(dtype: object, where: str = "") -> str:
    """Return the canonical name of a supported dtype, or raise DTypeError."""
    if dtype is None:  # numpy reads None as float64; a missing dtype is an error here
        raise DTypeError(f"{where}dtype None is not a dtype; expected one of {SUPPORTED}")
    try:
        name = np.dtype(dtype).name  # type: ignore[arg-type]
    except TypeError as exc:
        raise DTypeError(f"{where}unknown dtype {dtype!r}; expected one of {SUPPORTED}") from exc
    if name not in SUPPORTED:
        raise DTypeError(f"{where}unsupported dtype {name!r}; expected one of {SUPPORTED}")
    return name


def promote(*dtypes: str) -> str:
    """Result dtype of combining tensors of these dtypes (numpy's ``result_type`` of arrays)."""
    result = dtypes[0]
    for d in dtypes[1:]:
        result = PROMOTION[result, d]
    return result


def scalar_dtype(value: object, like: str | None = None, where: str = "") -> str:
    """The dtype a Python scalar takes next to a tensor of dtype ``like`` (NEP 50: weak).

    Without ``like`` (nothing to be weak against) it takes numpy's default for its type, as
    ``np.asarray(value)`` does. A numpy scalar or 0-d array keeps its own dtype (it is strong).
    """
    if isinstance(value, (np.generic, np.ndarray)):
        return normalize(value.dtype, where)
    if not isinstance(value, (bool, int, float, complex)):
        raise DTypeError(f"{where}expected a number, got {type(value).__name__}")
    if like is None:
        return normalize(np.asarray(value).dtype, where)
    k = kind(like)
    if isinstance(value, bool):
        return like
    if isinstance(value, int):
        return "int64" if k == "b" else like
    if isinstance(value, float):
        return "float64" if k in "biu" else like
    # complex: the complex dtype of the tensor's precision (float16/32 -> complex64)
    if k == "c":
        return like
    if k == "f":
        return promote(like, "complex64")
    return "complex128"


def scalar_array(value: object, dtype: str, where: str = "") -> np.ndarray:
    """``value`` as a 0-d array of ``dtype``; an int that does not fit raises DTypeError
    (NEP 50)."""
    if isinstance(value, int) and not isinstance(value, bool) and kind(dtype) in "iu":
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise DTypeError(
                f"{where}Python integer {value} is out of bounds for {dtype} "
                f"[{info.min}, {info.max}]; use a wider tensor dtype or np.{dtype}(...) to wrap"
            )
    with np.errstate(over="ignore"):
        arr = np.array(value, dtype=dtype)
    if isinstance(value, (float, complex)) and np.isfinite(value) and not np.all(np.isfinite(arr)):
        raise DTypeError(
            f"{where}Python number {value!r} overflows {dtype} (values overflow "
            f"{dtype}); use a wider tensor dtype"
        )
    return arr


def accumulation(dtype: str) -> str:
    """Dtype used for sums over many floats: 16-bit floats accumulate in float32."""
    return "float32" if dtype in HALF else dtype


def compute(dtype: str) -> str:
    """Dtype the arithmetic of a result of ``dtype`` runs in (16-bit floats: float32)."""
    return "float32" if dtype in HALF else dtype


def eps(dtype: str) -> float:
    """Machine epsilon of a float or complex dtype (0 for exact integer and bool dtypes)."""
    if kind(dtype) in "biu":
        return 0.0
    return float(ml_dtypes.finfo(dtype).eps)


def _compute(dtype: str) -> str:
    return COMPUTE_IN.get(dtype, dtype)


class _NoLoop(Exception):
    """Internal: an op is not defined for a dtype (the argument says why)."""


def _checked(what: str, rule, dts: Sequence[str], where: str) -> str:
    """``rule(*dts)``, or DTypeError naming the op, the dtypes, why, and the dtypes it takes."""
    try:
        return rule(*dts)
    except _NoLoop as exc:
        works = []
        for d in DTYPES:
            try:
                rule(*([d] * len(dts)))
                works.append(d)
            except _NoLoop:
                pass
        raise DTypeError(
            f"{where}{what} is not defined for {', '.join(dts)} ({exc.args[0]}); "
            f"it takes {', '.join(works) or 'no dtype'}"
        ) from None


@functools.lru_cache(maxsize=None)
def ufunc_result(ufunc: str, dtypes: tuple[str, ...]) -> str:
    """Output dtype of numpy's loop for ``np.<ufunc>`` on operands of ``dtypes``.

    Raises TypeError when numpy has no loop for them.
    """
    fn = getattr(np, ufunc)
    ins = tuple(np.dtype(_compute(d)) for d in dtypes)
    if len(ins) < fn.nin:
        ins = ins + ins[-1:] * (fn.nin - len(ins))
    return fn.resolve_dtypes(ins + (None,) * fn.nout)[-1].name


def _elementwise_rule(rule: tuple[str, str]):
    ufunc, mode = rule

    def result(*dts: str) -> str:
        if mode == "select":  # the first operand only selects (any dtype)
            return promote(*dts[1:])
        promoted = promote(*dts)
        if mode.endswith("ordered") and kind(promoted) == "c":
            raise _NoLoop(
                "complex numbers have no order; compare abs() or the real part "
                "(a cast to a float dtype)"
            )
        try:
            # numpy runs a binary op on tensors of mixed dtypes in the promoted dtype's loop
            res = ufunc_result(ufunc, (promoted,) * len(dts))
        except TypeError:
            raise _NoLoop(f"numpy has no {ufunc} loop for it") from None
        return promoted if mode.startswith("same") else res

    return result


def elementwise_result(
    op: str, rule: tuple[str, str], dtypes: Sequence[str], where: str = ""
) -> str:
    """Result dtype of elementwise ``op`` whose dtype rule is ``(ufunc, mode)`` (see ops.DTYPE).

    ``mode`` is "loop" (the output of numpy's loop for ``ufunc``: bool for comparisons) or
    "same" (the promoted operand dtype: relu, and step's 1/0; the ufunc still decides which
    dtypes are taken);
    an "-ordered" suffix refuses complex operands (numpy orders complex numbers
    lexicographically, which no other backend does).
    """
    return _checked(op, _elementwise_rule(rule), tuple(dtypes), where)


def _reduction_rule(op: str):
    def result(dtype: str) -> str:
        if op in ("max", "min") and kind(dtype) == "c":
            raise _NoLoop("complex numbers have no order")
        if op == "logsumexp":
            if kind(dtype) == "c":
                raise _NoLoop("numpy has no logaddexp loop for complex")
            return ufunc_result("exp", (dtype,))
        return _numpy_reduction(op, dtype)

    return result


@functools.lru_cache(maxsize=None)
def _numpy_reduction(op: str, dtype: str) -> str:
    # cached: numpy's answer never changes, and graph builders ask it for every reduction node
    sample = np.ones(1, _compute(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(np, op)(sample).dtype.name


def reduction_result(op: str, dtype: str, where: str = "") -> str:
    """Result dtype of a reduction, as numpy's ``np.<op>`` of an array of ``dtype`` (sum of int8
    is int64, mean of ints is float64; logsumexp is float like ``exp``)."""
    return _checked(op, _reduction_rule(op), (dtype,), where)


def _rowop_rule(dtype: str) -> str:
    if kind(dtype) == "c":
        raise _NoLoop("it needs a real dtype for its row max and variance")
    return ufunc_result("exp", (dtype,))


def rowop_result(op: str, dtype: str, where: str = "") -> str:
    """Result dtype of softmax/log_softmax/layer_norm: float like ``exp`` (int8 -> float16)."""
    return _checked(op, _rowop_rule, (dtype,), where)


def einsum_result(dtypes: Sequence[str]) -> str:
    """Result dtype of an einsum: the operands promoted (numpy.einsum; no sum widening)."""
    return promote(*dtypes)
