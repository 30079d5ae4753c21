"""The numpy/BLAS backend: the reference every other backend is tested against."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..dtypes import SUPPORTED
from ..errors import BackendError, InputError
from ..ir import ops
from . import kernels, widen
from .base import Backend, Capabilities, PreparedKernel, register_backend


class NumpyBackend(Backend):
    """Runs steps with numpy ufuncs (``out=``) and BLAS matmuls."""

    name = "numpy"
    xp = np
    # C-contiguous numpy inputs of the declared shape and dtype skip the checks (CompiledPlan);
    # every IR dtype runs here
    capabilities = Capabilities(native_array=np.ndarray, dtypes=frozenset(SUPPORTED))

    def prepare(self, step, node, in_nodes, graph) -> PreparedKernel:
        """Kernel for a step; einsum steps get their contraction path here, once."""
        if widen.needs_widening(node, in_nodes):  # 16-bit floats compute in float32
            return widen.widened(np, lambda n, ins: self.prepare(step, n, ins, graph),
                                 node, in_nodes)
        if node.kind == ops.EINSUM:
            return kernels.einsum_kernel(np, node, in_nodes)
        if node.kind == ops.FUSED:
            from .fused_numpy import fused_kernel

            return fused_kernel(node, in_nodes, threads=not self._calls_blas(graph))
        # a step that is not a view writes its result into ``out`` (outputs, strided reshapes)
        return kernels.make_kernel(np, node, in_nodes, not step.view)

    def _calls_blas(self, graph) -> bool:
        """Whether a plan of ``graph`` makes BLAS calls (an einsum of two or more operands).

        OpenBLAS's workers spin for about 0.1 s after each call; a fused kernel's helper thread
        then fights them for the second core, and measured slower than one thread (MLP block:
        +4%). Such plans keep their fused kernels on the calling thread.
        """
        memo = self._blas_memo
        if memo is not None and memo[0] is graph:
            return memo[1]
        uses = any(n.kind == ops.EINSUM and len(n.inputs) >= 2 for n in graph)
        self._blas_memo = (graph, uses)
        return uses

    _blas_memo: tuple | None = None

    # memory -------------------------------------------------------------
    def empty(self, shape, dtype):  # noqa: D102
        return np.empty(shape, dtype)

    def alloc_bytes(self, n):  # noqa: D102
        from ..runtime.pool import host_bytes

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
        """Accept numpy arrays (and numpy scalars) of a supported dtype."""
        if isinstance(x, np.generic):
            x = np.asarray(x)
        if not isinstance(x, np.ndarray):
            raise InputError(
                f"input {name!r}: expected a numpy array, got {type(x).__name__}; "
                "wrap it with np.asarray(..., dtype=...)"
            )
        if x.dtype.name not in SUPPORTED:
            raise InputError(f"input {name!r}: dtype {x.dtype} is not supported; expected one "
                             f"of {SUPPORTED}")
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
