"""Supported dtypes, promotion and accumulation dtypes."""

from __future__ import annotations

import numpy as np

from .errors import DTypeError

SUPPORTED: tuple[str, ...] = ("float16", "float32", "float64")


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
    """Result dtype of combining tensors of these dtypes (numpy rules among floats)."""
    return np.result_type(*dtypes).name


def accumulation(dtype: str) -> str:
    """Dtype used for sums over many elements: float16 accumulates in float32."""
    return "float32" if dtype == "float16" else dtype


def eps(dtype: str) -> float:
    """Machine epsilon of a dtype."""
    return float(np.finfo(dtype).eps)
