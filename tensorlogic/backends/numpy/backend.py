"""The numpy/BLAS backend: the reference every other backend is tested against."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...dtypes import SUPPORTED
from ...errors import BackendError, InputError
from ...ir import ops, pair_layout
from ...ir.fused import FusedBody, FusedOp
from .. import epilogue, gemm_numba, kernels, widen
from ..base import Backend, Capabilities, PlanRunner, PreparedKernel, register_backend
from ..inputs import plain_host_array
from . import host_pool, threads as cpu_threads
from . import fused  # read per call: its size threshold is a tunable module constant

_FLOATS = ("float32", "float64")


class _AsFused:
    """A lone elementwise or row-op node seen as a one-op fused node (name, dtype, body)."""

    def __init__(self, node, body: FusedBody) -> None:
        self.name, self.dtype, self.args = node.name, node.dtype, {"body": body.to_args()}


def single_op_body(node, in_nodes) -> FusedBody | None:
    """A lone elementwise or row-op node as a fused program (None for other kinds)."""
    ins = tuple(("in", k) for k in range(len(in_nodes)))
    if node.kind in ops.ELEMENTWISE_KINDS:
        return FusedBody((FusedOp(node.op, ins),), tuple(node.shape))
    if node.kind == ops.ROWOP:
        return FusedBody(
            (),
            tuple(node.shape),
            node.op,
            (int(node.args["axis"]),),
            eps=float(node.args.get("eps", ops.LAYER_NORM_EPS)),
        )
    return None


def calls_blas(steps) -> bool:
    """Whether a plan of these steps makes BLAS calls (an einsum of two or more operands)."""
    return any(s.kind == ops.EINSUM and len(s.inputs) >= 2 for s in steps)


class PoolRunner(PlanRunner):
    """Runs a plan's steps with BLAS on one thread (the "pool" thread mode, ``cpu_threads``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.settings = cpu_threads.plan_settings()

    def __call__(self, plan, inputs, out):
        with cpu_threads.pool_call(self.settings):
            return plan.run_steps(inputs, out)

    def __str__(self) -> str:
        return cpu_threads.describe(self.mode)


class BlasBoundRunner(PlanRunner):
    """Runs a "pool"-mode plan of unbatched GEMMs alone (``cpu_threads.blas_bound``) with each
    product one call on BLAS's own threads."""

    def __init__(self) -> None:
        self.settings = cpu_threads.plan_settings(blas_own=True)

    def __call__(self, plan, inputs, out):
        with cpu_threads.blas_own_threads(self.settings):
            return plan.run_steps(inputs, out)

    def __str__(self) -> str:
        return cpu_threads.describe("pool", blas_own=True)


def step_gemms(plan) -> list:
    """Per computing step of a plan: the (batch, m, n, k) of its GEMMs, None for a step that is
    no contraction (or whose kernel does not say)."""
    found = []
    for step, kernel in zip(plan.steps, plan.kernels):
        if step.view:
            continue
        gemms = getattr(kernel.impl, "gemms", None) if step.kind == ops.EINSUM else None
        found.append(None if gemms is None else list(gemms))
    return found


# a contraction's bias (+ ReLU, GELU on numba, or + residual) consumer runs in its GEMM blocks
FUSE_EPILOGUES = True
EPILOGUE_DTYPES = ("float32", "float64")


def _epilogue_kernel(pair: epilogue.Epilogue, flops: int, info: str) -> PreparedKernel:
    """The step of a contraction and its bias (+ activation or residual) consumer: GEMM
    blocks that each finish their tile (``cpu_threads.matmul_epilogue``)."""
    m, n, k = pair.m, pair.n, pair.k
    x_t, w_t, act = pair.x_transposed, pair.w_transposed, pair.activation

    def kernel(args, out):
        x, w, bias = args[0], args[1], args[2]
        a = x.reshape(k, m).T if x_t else x.reshape(m, k)
        res = args[3].reshape(m, n) if pair.residual else None
        # plan buffers are C-contiguous: the blocks write the result in place; a strided
        # output gets it through a buffer
        strided = not out.flags.c_contiguous
        o = np.empty((m, n), out.dtype) if strided else out.reshape(m, n)
        cpu_threads.matmul_epilogue(a, w.T if w_t else w, o, bias.reshape(n), res, act)
        if strided:
            out[...] = o.reshape(out.shape)
        return out

    split = pair.gemm_flops >= cpu_threads.MIN_SPLIT_FLOPS
    threads = cpu_threads.split_parts() if split else 1
    return PreparedKernel(kernel, flops=flops, threads=threads, info=info)


class NumpyBackend(Backend):
    """Runs steps with numpy ufuncs (``out=``) and BLAS matmuls."""

    name = "numpy"
    xp = np
    # C-contiguous numpy inputs of the declared shape and dtype skip the checks (CompiledPlan);
    # every IR dtype runs here; the runner of a "pool"-mode plan limits BLAS to one thread
    # around each call
    capabilities = Capabilities(
        native_array=np.ndarray,
        dtypes=frozenset(SUPPORTED),
        own_runner=True,
        options=frozenset({"threads"}),
    )
    #: the plan's thread mode (compile option ``threads``, see ``threads.py``)
    thread_mode: str = cpu_threads.DEFAULT_MODE

    def with_options(self, options: Mapping[str, Any]) -> NumpyBackend:
        """This backend, or a view of it holding what a plan's compile options set
        (``_settings``) where they differ from its own."""
        settings = self._settings(options)
        if all(getattr(self, k) == v for k, v in settings.items()):  # its own attributes
            return self
        view = copy.copy(self)
        view.__dict__.update(settings)
        return view

    def _settings(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The backend's attributes that a plan's options set."""
        return {"thread_mode": cpu_threads.check_mode(options.get("threads"))}

    def epilogue_pairs(self, graph, order, views):
        """Contractions whose bias (+ activation, or + residual) consumer runs inside the
        GEMM's blocks (``epilogue.find``), each block finishing its tile while it is in cache:
        in the "pool" thread mode, where products are split over numba's loop; not for
        matrix-vector products, which run as GEMV blocks (no GEMM packing). The activations
        are ``_epilogue_activations``: ReLU here (exact, as numpy's ``maximum``)."""
        if not FUSE_EPILOGUES or self.thread_mode != "pool" or not gemm_numba.available():
            return {}
        pairs = epilogue.find(graph, order, views, EPILOGUE_DTYPES)
        acts = self._epilogue_activations()
        return {c: p for c, p in pairs.items() if min(p.m, p.n) > 1 and p.activation in acts}

    def _epilogue_activations(self) -> tuple:
        return (None, "relu")

    def prepare_epilogue(self, step, pair, graph):
        """One step for a contraction and its epilogue (``_epilogue_kernel``)."""
        info = pair.describe(graph.node(pair.gemm).name, "GEMM-block")
        return _epilogue_kernel(pair, pair.gemm_flops + step.flops, info)

    def prepare(self, step, node, in_nodes, graph) -> PreparedKernel:
        """Kernel for a step; einsum steps get their contraction path here, once.

        In the "pool" thread mode (default) GEMMs are split over the helper threads and every
        large elementwise, row-op and fused step runs its blocks on them too; in the "blas"
        mode GEMMs use BLAS's threads and, in plans that call BLAS, the other steps stay on the
        calling thread (BLAS's spinning workers would fight them for the cores).
        """
        if widen.needs_widening(node, in_nodes):  # 16-bit floats compute in float32
            return widen.widened(
                np, lambda n, ins: self.prepare(step, n, ins, graph), node, in_nodes
            )
        mode = self.thread_mode
        if node.kind == ops.EINSUM:
            return self.einsum_kernel(node, in_nodes, mode)
        kernel = self._host_kernel(step, node, in_nodes, graph, mode)
        # plain ufunc kernels run on the calling thread
        return kernel if kernel.threads else kernel.with_threads(1)

    def _host_kernel(self, step, node, in_nodes, graph, mode: str) -> PreparedKernel:
        threads = mode == "pool" or not self._calls_blas(graph)
        if node.kind == ops.FUSED:
            return fused.fused_kernel(node, in_nodes, threads=threads)
        # a large lone float step runs as a one-op fused kernel: the same ufunc calls per
        # block, spread over the threads (the size test first: most steps are small)
        if (
            threads
            and math.prod(node.shape) >= fused.PARALLEL_MIN_ELEMENTS
            and node.dtype in _FLOATS
            and all(n.dtype in _FLOATS for n in in_nodes)
        ):
            body = single_op_body(node, in_nodes)
            if body is not None:
                return fused.fused_kernel(_AsFused(node, body), in_nodes, threads=True)
        # a step that is not a view writes its result into ``out`` (outputs, strided reshapes)
        return kernels.make_kernel(np, node, in_nodes, not step.view)

    @staticmethod
    def einsum_kernel(node, in_nodes, mode: str) -> PreparedKernel:
        """An einsum kernel whose products run as the thread mode says."""
        mm = cpu_threads.parallel_matmul if mode == "pool" else cpu_threads.blas_mode_matmul()
        # layouts are timed while planning (``pair_layout``): with BLAS threaded as calls run
        timing = cpu_threads.single_threaded_blas if mode == "pool" else contextlib.nullcontext
        token = pair_layout.TIMING_CONTEXT.set(timing)
        try:
            kernel = kernels.einsum_kernel(np, node, in_nodes, mm)
        finally:
            pair_layout.TIMING_CONTEXT.reset(token)
        if mode == "pool":
            split = (kernel.flops or 0) >= cpu_threads.MIN_SPLIT_FLOPS
            return kernel.with_threads(host_pool.helper_count() + 1 if split else 1)
        return kernel.with_threads(cpu_threads.blas_threads())

    def plan_runner(self, plan) -> PlanRunner | None:
        """A runner that limits BLAS to one thread around the call ("pool" mode plans that
        call BLAS), or one that keeps BLAS's threads for a plan of unbatched GEMMs alone
        (``cpu_threads.blas_bound``); None keeps the plain step loop."""
        if not plan.steps or not calls_blas(plan.steps):
            return None
        mode = self.thread_mode
        if mode != "pool":
            return None
        return BlasBoundRunner() if cpu_threads.blas_bound(step_gemms(plan)) else PoolRunner(mode)

    def _calls_blas(self, graph) -> bool:
        """Whether a plan of ``graph`` makes BLAS calls (an einsum of two or more operands).

        OpenBLAS's workers spin for about 0.1 s after each call; in the "blas" thread mode a
        fused kernel's helper thread then fights them for the second core, and measured slower
        than one thread (MLP block: +4%), so such plans keep those kernels on the calling thread.
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
        from ...runtime.pool import host_bytes

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
        x = plain_host_array(x, name)
        if not isinstance(x, np.ndarray):
            raise InputError(
                f"input {name!r}: expected a numpy array, got {type(x).__name__}; "
                "wrap it with np.asarray(..., dtype=...)"
            )
        if x.dtype.name not in SUPPORTED:
            raise InputError(
                f"input {name!r}: dtype {x.dtype} is not supported; expected one of {SUPPORTED}"
            )
        return x

    def adam_one_pass(self, arrays: tuple) -> Any:
        """``fn(p, g, m, v, constants)``: Adam's update of these host arrays in one pass over
        memory (``host_adam.one_pass``), or None where they do not allow it."""
        from ..host_adam import one_pass

        return one_pass(self, arrays)

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
