"""The numpy/BLAS backend: the reference every other backend is tested against."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import BackendError, InputError
from ..ir import ops
from . import kernels
from .base import register_backend


class NumpyBackend:
    """Runs steps with numpy ufuncs (``out=``) and BLAS matmuls."""

    name = "numpy"
    xp = np
    native_array = np.ndarray  # C-contiguous inputs of the declared shape skip checks (CompiledPlan)

    def prepare(self, step, node, in_nodes, graph):
        """Kernel for a step; einsum steps get their contraction path here, once."""
        if node.kind == ops.EINSUM:
            return kernels.einsum_kernel(np, node, in_nodes)
        if node.kind == ops.FUSED:
            from .fused_numpy import fused_kernel

            return fused_kernel(node, in_nodes)
        # a step that is not a view writes its result into ``out`` (outputs, strided reshapes)
        return kernels.make_kernel(np, node, in_nodes, not step.view)

    # memory -------------------------------------------------------------
    def empty(self, shape, dtype):  # noqa: D102
        return np.empty(shape, dtype)

    def alloc_bytes(self, n):  # noqa: D102
        from ..compiler.pool import host_bytes

        return host_bytes(n)

    def view_bytes(self, raw, shape, dtype):  # noqa: D102
        n = math.prod(shape) * np.dtype(dtype).itemsize
        return raw[:n].view(dtype).reshape(shape)

    def copy(self, x, out=None):  # noqa: D102
        if out is None:
            return np.array(x, copy=True)
        out[...] = x
        return out

    # inputs --------------------------------------------------------------
    def is_array(self, x) -> bool:  # noqa: D102
        return isinstance(x, np.ndarray)

    def check_input(self, x: Any, name: str):
        """Accept numpy arrays (and numpy scalars) of a float dtype."""
        if isinstance(x, np.generic):
            x = np.asarray(x)
        if not isinstance(x, np.ndarray):
            raise InputError(
                f"input {name!r}: expected a numpy array, got {type(x).__name__}; "
                "wrap it with np.asarray(..., dtype=...)"
            )
        if x.dtype.kind != "f":
            raise InputError(f"input {name!r}: dtype {x.dtype} is not a float dtype")
        return x

    def to_device(self, x):  # noqa: D102
        return x

    def to_host(self, x):  # noqa: D102
        return x

    def all_finite(self, x) -> bool:  # noqa: D102
        return bool(np.isfinite(x).all())

    def synchronize(self) -> None:  # noqa: D102
        return None

    def free_memory(self) -> int | None:
        """Free host memory in bytes (from /proc/meminfo), or None if unknown."""
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None


def _factory() -> NumpyBackend:
    return NumpyBackend()


register_backend("numpy", _factory)

__all__ = ["NumpyBackend", "BackendError"]
