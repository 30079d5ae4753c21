"""In-place elementwise update kernels for optimizers, made by the backends' fused machinery.

An update is a small elementwise program over a parameter-shaped tensor and a few 0-d scalars
(the learning rate and others that change between steps); it is written as a ``FusedBody`` (the
format every backend renders: numpy blocked ufuncs, a generated numba loop, generated CUDA) and
compiled once per (program, shape, dtype, backend). Its result overwrites input 0 (the parameter
or a state tensor): directly where the backend's kernel declares that it may alias that input,
else through one scratch array and a copy.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from ..ir import ops
from ..ir.fused import FusedBody, FusedOp

Ref = tuple[str, Any]


class Program:
    """A tiny builder of fused instructions: ``p.op("mul", a, b)`` returns a ref to the result.

    Inputs are ``("in", k)``; Python numbers become ``("const", value)``.
    """

    def __init__(self) -> None:
        self.instrs: list[FusedOp] = []

    @staticmethod
    def input(k: int) -> Ref:
        """Input ``k`` of the kernel."""
        return ("in", k)

    def op(self, name: str, *args: Ref | float) -> Ref:
        """Append ``name(*args)`` (an op of the elementwise table)."""
        refs = tuple(a if isinstance(a, tuple) else ("const", float(a)) for a in args)
        self.instrs.append(FusedOp(name, refs))
        return ("tmp", len(self.instrs) - 1)

    def body(self, shape: tuple[int, ...]) -> FusedBody:
        """The fused body over ``shape`` (the last instruction is the result)."""
        return FusedBody(tuple(self.instrs), tuple(shape))


class UpdateKernel:
    """``run(target, *others)``: ``target[...] = program(target, *others)`` on one backend.

    ``scalars`` of the inputs are 0-d (values that change between steps, passed as arrays so
    the kernel is compiled once); the others have the target's shape and dtype.
    """

    def __init__(
        self,
        program: Program,
        shape: tuple[int, ...],
        dtype: str,
        n_inputs: int,
        scalars: Sequence[int],
        backend: Any,
    ) -> None:
        from ..compiler.compile import compile as compile_graph
        from ..ir.graph import EinsumGraph

        self.shape, self.dtype = tuple(shape), dtype
        g = EinsumGraph()
        ids = [
            g.input(f"u{k}", () if k in scalars else self.shape, dtype).id for k in range(n_inputs)
        ]
        body = program.body(self.shape)
        nid = g.add_node(
            ops.FUSED, None, ids, {"body": body.to_args()}, shape=self.shape, dtype=dtype
        )
        g.output(g.tensor(nid), name="out")
        # O0: the one hand-made fused node is the plan's only step
        plan = compile_graph(g, backend=backend.name, opt_level=0)
        if plan.backend is not backend:  # another device of the same kind
            plan = plan.on_backend(backend)
        cp = plan.concrete
        (step,), (kernel,) = cp.steps, cp.kernels
        self.backend = plan.backend
        self._fn = kernel.fn
        self._scratch = [
            self.backend.empty(cp.buffers[b].shape, cp.buffers[b].dtype) for b in step.scratch
        ]
        self.in_place = 0 in kernel.inplace
        self._tmp = None if self.in_place else self.backend.empty(self.shape, dtype)
        self._lock = threading.Lock()  # the scratch arrays are this kernel's own
        self.source = kernel.source

    def run(self, target: Any, *others: Any) -> None:
        """Overwrite ``target`` with the program's value (``target`` is input 0)."""
        with self._lock:
            out = target if self.in_place else self._tmp
            self._fn([target, *others, *self._scratch], out)
            if out is not target:
                self.backend.copy(out, target)


_KERNELS: dict[tuple, UpdateKernel] = {}
_KERNELS_LOCK = threading.Lock()


def update_kernel(
    key: tuple,
    build: Any,
    shape: tuple[int, ...],
    dtype: str,
    n_inputs: int,
    scalars: Sequence[int],
    backend: Any,
) -> UpdateKernel:
    """The cached kernel for ``key`` (the program's identity and hyperparameters) on this shape,
    dtype and backend; ``build()`` returns its Program on first use."""
    full = (key, tuple(shape), dtype, backend.name, id(backend))
    with _KERNELS_LOCK:
        k = _KERNELS.get(full)
    if k is None:
        k = UpdateKernel(build(), shape, dtype, n_inputs, scalars, backend)
        with _KERNELS_LOCK:
            _KERNELS[full] = k
    return k


def scalar(backend: Any, value: float, dtype: str) -> Any:
    """A 0-d backend array holding ``value`` in ``dtype``."""
    return backend.to_device(np.asarray(value, dtype=np.dtype(dtype)))


__all__ = ["Program", "UpdateKernel", "scalar", "update_kernel"]
