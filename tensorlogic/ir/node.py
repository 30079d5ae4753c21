"""Node records: the frozen description of one operation, and the checks of their parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..errors import ShapeError
from . import ops

Dim = int | str


@dataclass(frozen=True)
class Node:
    """One operation: kind, op name, ordered inputs, result shape and dtype, name, op arguments."""

    id: int
    kind: str
    op: str | None
    inputs: tuple[int, ...]
    shape: tuple[Dim, ...]
    dtype: str
    name: str
    args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def label(self) -> str:
        """Short human-readable description, e.g. ``einsum[ij,jk->ik]``."""
        if self.kind == ops.EINSUM:
            return f"einsum[{self.args['spec']}]"
        return f"{self.kind}:{self.op}" if self.op else self.kind


def freeze(value: Any) -> Any:
    """Lists to tuples and dicts to read-only mappings, recursively (node args stay immutable)."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    return value


def check_dim(d: Any, where: str) -> Dim:
    """A dimension as stored: a non-negative int or a symbol name."""
    if isinstance(d, (bool, np.bool_)):
        raise ShapeError(f"{where}: invalid dimension {d!r}")
    if isinstance(d, (int, np.integer)):
        if d < 0:
            raise ShapeError(f"{where}: negative dimension {int(d)}")
        return int(d)
    if isinstance(d, str) and d.isidentifier():
        return d
    raise ShapeError(f"{where}: dimension {d!r} must be a non-negative int, None or a symbol name")
