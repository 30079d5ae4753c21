"""The numba backend: every elementwise, reduction, row-op and fused step is one generated kernel.

Each step is rendered from the op table to numba source (``numba_codegen``), written to a
content-addressed module in the disk cache (``numba_cache``) and compiled there for one explicit
signature when the plan is compiled (a second process loads the object instead, without type
inference); contractions run on BLAS exactly like the numpy backend. Kernels write into the
plan's buffers.

Plan options read here (``tl.compile(g, backend="numba", **options)``):
- ``fast_math`` (default True): vectorizable exp/log/tanh/log1p (float32 within 2 ulp, float64
  within 4 ulp; see ``numba_fastmath``) and LLVM reassociation so reductions vectorize;
  NaN/inf still propagate. ``fast_math=False`` uses libm and strict evaluation order.
- ``parallel_threshold`` (default ``PARALLEL_THRESHOLD`` elements): steps whose iteration space is
  smaller run a serial kernel, because a parallel region costs microseconds to start.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ... import dtypes
from ...errors import BackendError
from ...ir import ops
from ...ir.fused import FusedBody, FusedOp
from .. import widen
from ..base import Capabilities, PreparedKernel
from ..inputs import strided_copy_bytes
from ..numpy.backend import NumpyBackend
from . import cache as numba_cache, rowgrad, threads as numba_threads
from .codegen import generates, render
from .layout import make_layout

# Below this many points a serial kernel wins. With OpenMP workers that sleep between kernels
# (the passive wait policy, see config.gomp_environment) a parallel kernel pays a wake-up of
# 50-80 us on the 2-vCPU test machine. Measured (float32, 2 threads, 3 runs, serial vs parallel
# kernel): the 5-input chain wins from 512K points (176 vs 127-162 us), a 1-input scale from 2M
# (1M: 93-101 vs 117-125 us; 2M: 260-280 vs 154-190 us). 512K takes the chain's gain and costs a
# light kernel between 512K and 2M at most ~30 us.
PARALLEL_THRESHOLD = 1 << 19
# With more threads a parallel kernel saves more of the serial time while its launch costs about
# the same (43 us to wake 16 passive OpenMP threads on a 16-core host), so the default threshold
# shrinks as ``PARALLEL_THRESHOLD * 2 / threads``, down to this: on 16 cores a serial bias+ReLU
# over 256 x 1024 points took 245 us, a quarter of a 256 x 1024 x 1024 GEMM beside it.
MIN_PARALLEL_THRESHOLD = 1 << 16


def default_parallel_threshold(threads: int) -> int:
    """Points from which a generated kernel runs in parallel on ``threads`` threads."""
    return max(MIN_PARALLEL_THRESHOLD, PARALLEL_THRESHOLD * 2 // max(threads, 1))


def _body_of(node, in_nodes) -> FusedBody | None:
    """The node as a fused program, or None if it is not a generated-kernel kind."""
    kind = node.kind
    shape = tuple(node.shape)
    ins = tuple(("in", k) for k in range(len(in_nodes)))
    if kind in ops.ELEMENTWISE_KINDS:
        return FusedBody((FusedOp(node.op, ins),), shape)
    if kind == ops.REDUCE:
        return FusedBody(
            (),
            tuple(in_nodes[0].shape),
            node.op,
            tuple(node.args["axes"]),
            bool(node.args.get("keepdims")),
        )
    if kind == ops.ROWOP:
        return FusedBody(
            (),
            shape,
            node.op,
            (int(node.args["axis"]),),
            eps=float(node.args.get("eps", ops.LAYER_NORM_EPS)),
        )
    if kind == ops.FUSED:
        return FusedBody.from_args(node.args["body"])
    return None


def _alias_safe(
    body: FusedBody,
    space: tuple[int, ...],
    in_shapes: list[tuple[int, ...]],
    dtype: str,
    in_dtypes: list[str] | None,
) -> tuple[int, ...]:
    """Input positions the output may overwrite: in a purely elementwise body (no tail) each
    point reads its inputs at its own index before storing, so an input of the output's exact
    shape and dtype may be the output's memory. The memory planner then writes such a step
    over a dying input, e.g. bias + ReLU over the GEMM result it reads: on the 16-core host
    that step took 28-30 us in place against 137-140 us into a buffer of its own (MLP
    256x1024; results/probe_elementwise_16core.json). Only parallel kernels offer this: a
    serial kernel whose output is its input fails LLVM's runtime overlap check and runs its
    scalar loop (bias + GELU over 256 x 1024 on 2 vCPUs: 0.56 ms into its own buffer, 16 ms in
    place), while the parallel kernels stay vectorized either way (0.58 vs 0.55 ms)."""
    if body.tail is not None:
        return ()
    dts = in_dtypes or [dtype] * len(in_shapes)
    return tuple(
        k
        for k, (s, dt) in enumerate(zip(in_shapes, dts))
        if tuple(int(d) for d in s) == space and dt == dtype
    )


def _contiguous(a: Any, shape: tuple[int, ...]) -> np.ndarray:
    # kernels are compiled for C-contiguous aligned arrays: a user slice, a transposed view or an
    # unaligned buffer costs one copy here (read-only arrays are accepted as they are)
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = np.array(a, order="C")
    return a.reshape(shape)


def _call(fn: Any, out: np.ndarray, oshape: tuple[int, ...], ins: list, dims: tuple) -> None:
    if out.flags.aligned:  # the plan checked that out= arrays are C-contiguous
        fn(out.reshape(oshape), *ins, *dims)
    else:  # an unaligned out= buffer from the caller: compute aligned, then copy into it
        tmp = np.empty(oshape, out.dtype)
        fn(tmp, *ins, *dims)
        out[...] = tmp.reshape(out.shape)


def _attention_kernel(node, in_nodes, fast: bool):
    """The shared blocked host kernel, its softmax passes as one generated loop (fast_math)."""
    from ..numpy.attention import attention_kernel, compute_dtype
    from .attention import exp_rows

    if not fast:  # libm exp in strict order: the numpy passes are that already
        return attention_kernel(node, in_nodes)
    return attention_kernel(node, in_nodes, exp_rows(compute_dtype(node.dtype)))


class NumbaBackend(NumpyBackend):
    """Generated, parallel numba kernels; memory and input handling are the numpy backend's."""

    # kernels copy strided inputs (``_contiguous``); memory_limit counts those copies
    input_copy_bytes = staticmethod(strided_copy_bytes)

    name = "numba"
    capabilities = Capabilities(
        native_array=np.ndarray,
        dtypes=frozenset(dtypes.SUPPORTED),
        own_runner=True,
        options=frozenset({"fast_math", "parallel_threshold", "threads"}),
    )

    #: compile options ``fast_math`` and ``parallel_threshold`` of the plan (``with_options``)
    fast_math: bool = True
    parallel_threshold: int = PARALLEL_THRESHOLD

    def __init__(self) -> None:
        numba_threads.configure()

    def _settings(self, options) -> dict:
        threshold = options.get("parallel_threshold")
        return {
            **super()._settings(options),
            "fast_math": bool(options.get("fast_math", True)),
            "parallel_threshold": (
                default_parallel_threshold(numba_threads.thread_count())
                if threshold is None
                else int(threshold)
            ),
        }

    def prepare(self, step, node, in_nodes, graph) -> PreparedKernel:
        """A generated kernel for elementwise/reduction/row-op/fused steps; BLAS for einsum."""
        if widen.needs_widening(node, in_nodes):  # 16-bit floats: the float32 kernel, widened
            return widen.widened(
                np, lambda n, ins: self.prepare(step, n, ins, graph), node, in_nodes
            )
        if node.kind == ops.EINSUM:  # BLAS, split over the helper threads in the "pool" mode
            return self.einsum_kernel(node, in_nodes, self.thread_mode)
        if node.kind == ops.ATTENTION:
            return _attention_kernel(node, in_nodes, self.fast_math)
        if node.kind == ops.ROWGRAD and node.dtype in rowgrad.DTYPES:
            return rowgrad.row_grad_kernel(node, self.fast_math, self.parallel_threshold)
        body = _body_of(node, in_nodes)
        dts = [n.dtype for n in in_nodes]
        if body is None or not generates(body.instrs, body.tail, body.epilogue, node.dtype, dts):
            # layout ops, casts and the integer/complex ops numba would compute
            # differently from numpy (see numba_codegen.EXACT_OPS) run numpy's kernels
            return NumpyBackend.prepare(self, step, node, in_nodes, graph)
        fast, threshold = self.fast_math, self.parallel_threshold
        if body.instrs or body.epilogue:  # lone REDUCE/ROWOP nodes: tails over their input
            body.validate(len(in_nodes), f"node {node.name!r}")
        try:
            return self.kernel_for(
                body,
                [tuple(n.shape) for n in in_nodes],
                node.dtype,
                fast,
                threshold,
                node.name,
                dts,
            )
        except (MemoryError, RecursionError):
            # compiling ran out of memory or stack (fusion bounds kernels, but a hand-made
            # fused node may be huge): numpy's kernel computes the same without compiling
            return NumpyBackend.prepare(self, step, node, in_nodes, graph)

    def _epilogue_activations(self) -> tuple:
        """GELU too, with ``fast_math``: the blocks compute it through the fast exp, as the
        fused kernels do."""
        return (None, "relu", "gelu") if self.fast_math else (None, "relu")

    def kernel_for(
        self,
        body: FusedBody,
        in_shapes: list[tuple[int, ...]],
        dtype: str,
        fast: bool = True,
        threshold: int = PARALLEL_THRESHOLD,
        where: str = "kernel",
        in_dtypes: list[str] | None = None,
    ):
        """``kernel(inputs, out)`` for a fused program over inputs of ``in_shapes``.

        ``in_dtypes`` default to ``dtype``. The kernel is compiled (or loaded from the disk
        cache) here, for exactly these dtypes and ranks, so its first call does no typing.
        """
        space = tuple(int(d) for d in body.space)
        if any(isinstance(d, str) for s in in_shapes for d in s):
            raise BackendError(f"node {where!r}: symbolic shape reached the numba backend")
        lay = make_layout(space, in_shapes, body.tail, tuple(body.axes))
        parallel = math.prod(space) >= threshold
        src = render(
            body.instrs,
            len(in_shapes),
            lay,
            body.tail,
            dtype,
            fast,
            parallel,
            in_dtypes,
            body.eps,
            body.epilogue,
        )
        fn = numba_cache.load(src.text, src.name, src.signature)
        views = [lay.input_shape(k) for k in range(len(in_shapes))]
        oshape = lay.output_shape()
        dims = lay.dims
        lock = numba_threads.launch_lock

        if parallel:

            def kernel(args, out):
                ins = [_contiguous(a, s) for a, s in zip(args, views)]
                with lock():
                    _call(fn, out, oshape, ins, dims)
                return out
        else:

            def kernel(args, out):
                _call(fn, out, oshape, [_contiguous(a, s) for a, s in zip(args, views)], dims)
                return out

        info = f"numba {'parallel' if parallel else 'serial'}{' fast' if fast else ''}"
        return PreparedKernel(
            kernel,
            info=info,
            source=src.text,
            impl=fn,
            threads=numba_threads.thread_count() if parallel else 1,
            inplace=_alias_safe(body, space, in_shapes, dtype, in_dtypes) if parallel else (),
        )
