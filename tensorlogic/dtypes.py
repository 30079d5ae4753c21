"""Supported dtypes, promotion and accumulation dtypes.

bfloat16 comes from ``ml_dtypes`` (the package JAX uses): importing it registers the dtype with
numpy, so ``np.dtype("bfloat16")`` works everywhere after this module is imported.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import DTypeError

SUPPORTED: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
# 16-bit floats: stored in 16 bits, computed and summed in float32, each result rounded once
HALF: tuple[str, ...] = ("float16", "bfloat16")
bfloat16 = np.dtype(ml_dtypes.bfloat16)


def normalize(dtype: object, where: str = "") -> str:
    """Return the canonical name of a supported dtype, or raise DTypeError."""
    try:
        name = np.dtype(dtype).name  # type: ignore[arg-type]
    except TypeError as exc:
        raise DTypeError(f"{where}unknown dtype {dtype!r}; expected one of {SUPPORTED}") from exc
    if name not in SUPPORTED:
        raise DTypeError(f"{where}unsupported dtype {name!r}; expected one of {SUPPORTED}")
    return name


def is_float(dtype: object) -> bool:
    """Whether an array dtype is one of the supported floating dtypes (bfloat16 included, whose
    numpy kind is 'V')."""
    try:
        return np.dtype(dtype).name in SUPPORTED  # type: ignore[arg-type]
    except TypeError:
        return False


def promote(*dtypes: str) -> str:
    """Result dtype of combining tensors of these dtypes (numpy rules among floats).

    bfloat16 sits where JAX puts it: with float16 it gives float32 (neither holds the other),
    with a wider float the wider one.
    """
    names = set(dtypes)
    if "bfloat16" in names and "float16" in names:
        names -= {"bfloat16", "float16"}
        names.add("float32")
    return np.result_type(*sorted(names)).name


def accumulation(dtype: str) -> str:
    """Dtype used for sums over many elements: 16-bit floats accumulate in float32."""
    return "float32" if dtype in HALF else dtype


def compute(dtype: str) -> str:
    """Dtype the arithmetic of a result of ``dtype`` runs in (16-bit floats: float32)."""
    return "float32" if dtype in HALF else dtype


def eps(dtype: str) -> float:
    """Machine epsilon of a dtype."""
    return float(ml_dtypes.finfo(dtype).eps)
