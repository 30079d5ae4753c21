"""The CuPy backend: cuBLAS contractions, generated PTX / CUDA C kernels, device memory pool."""

from __future__ import annotations

import math
from typing import Any

import cupy
import numpy as np

from ...errors import GraphError, InputError
from ...ir import ops
from .. import kernels as generic
from . import cuda_c, ptx
from .cache import KernelCache
from .compiler import KernelCompiler
from .graphs import PlanRunner
from .spec import ITEMSIZE, make_spec, program_of, row_block

GENERATED_KINDS = (ops.UNARY, ops.BINARY, ops.WHERE, ops.REDUCE, ops.ROWOP, ops.FUSED)
CODEGEN_PATHS = ("ptx", "cuda")
_EW_BLOCK = 256


class GeneratedKernel:
    """``kernel(inputs, out)`` for one node, rendered per input layout and compiled once.

    The layout (byte strides of every input) picks a compiled variant; a plan sees one layout
    per step, so after the first call a launch is a dict lookup and a driver call.
    """

    def __init__(self, backend: "CupyBackend", node, in_nodes, codegen: str) -> None:
        self.backend = backend
        self.node = node
        self.prog = program_of(node, in_nodes)
        self.codegen = codegen
        self.out_dtype = node.dtype
        self.in_dtypes = [n.dtype for n in in_nodes]
        self.in_shapes = [tuple(int(d) for d in n.shape) for n in in_nodes]
        self.variants: dict[tuple, Any] = {}
        self.spec = None
        self.source = ""
        # the contiguous layout is what a plan passes almost always: build it now
        self._build(tuple(tuple(s * ITEMSIZE[dt] for s in _cstrides(shape))
                          for shape, dt in zip(self.in_shapes, self.in_dtypes)))

    def _build(self, sig: tuple) -> Any:
        strides = [tuple(b // ITEMSIZE[dt] for b in st) for st, dt in zip(sig, self.in_dtypes)]
        spec = make_spec(self.prog, self.out_dtype, self.in_shapes, self.in_dtypes, strides)
        name = f"tl_{spec.family}_{spec.key()}"
        comp = self.backend.compiler
        sms = self.backend.sm_count
        if self.codegen == "ptx":
            src = ptx.emit(spec, name, int(self.backend.arch))
            fn = comp.function(src, name, "ptx")
            vfn = None
            w = ptx.vector_width(spec)
            if w:
                vsrc = ptx.emit(spec, name + "_v", int(self.backend.arch), vector=True)
                vfn = comp.function(vsrc, name + "_v", "ptx")
        else:
            src = cuda_c.render(spec, name)
            fn = comp.function(src, name, "cuda")
            vfn, w = None, 0
        if self.spec is None:
            self.spec, self.source = spec, src
        if spec.family == "ew":
            work = spec.total
            block = _EW_BLOCK
            grid = max(1, min(math.ceil(work / block), sms * 32))
            vgrid = max(1, min(math.ceil(work / max(w, 1) / block), sms * 32))
            full = [k for k in range(spec.n_inputs) if spec.input_mode(k) == "full"]
        elif spec.family == "row":
            block = row_block(spec.sizes[1])
            grid = max(1, min(spec.sizes[0], sms * 32))
            vgrid, full = grid, []
        else:
            block = _EW_BLOCK
            grid = max(1, min(math.ceil(spec.sizes[0] * spec.sizes[2] / block), sms * 32))
            vgrid, full = grid, []
        empty = spec.total == 0 or math.prod(int(d) for d in self.node.shape) == 0

        def launch(args, out):
            if empty:
                return out
            if vfn is not None and out.data.ptr % 16 == 0 and all(
                    args[k].data.ptr % 16 == 0 for k in full):
                vfn((vgrid,), (block,), (out, *args))
            else:
                fn((grid,), (block,), (out, *args))
            return out

        self.variants[sig] = launch
        return launch

    def __call__(self, args: list, out):
        sig = tuple(a.strides for a in args)
        launch = self.variants.get(sig)
        if launch is None:
            launch = self._build(sig)
        return launch(args, out)


def _cstrides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


class CupyBackend:
    """Runs plans on the current CUDA device through CuPy."""

    name = "cupy"
    xp = cupy

    def __init__(self, cache_dir=None) -> None:
        dev = cupy.cuda.Device()
        self.device_id = dev.id
        self.arch = str(dev.compute_capability)
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        self.device_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.sm_count = int(props["multiProcessorCount"])
        self.cache = KernelCache(cache_dir)
        self.compiler = KernelCompiler(self.cache, self.arch)
        self.codegen = "ptx"
        self.cuda_graph: Any = "auto"

    # plan options ---------------------------------------------------------------
    def with_options(self, options: dict) -> "CupyBackend":
        """A view of this backend with a plan's options (codegen path, CUDA graphs)."""
        codegen = options.get("codegen", "ptx")
        if codegen not in CODEGEN_PATHS:
            raise GraphError(f"codegen must be one of {CODEGEN_PATHS}, got {codegen!r}")
        graph = options.get("cuda_graph", "auto")
        if graph not in ("auto", True, False):
            raise GraphError(f"cuda_graph must be 'auto', True or False, got {graph!r}")
        if codegen == self.codegen and graph == self.cuda_graph:
            return self
        view = object.__new__(CupyBackend)
        view.__dict__.update(self.__dict__)
        view.codegen, view.cuda_graph = codegen, graph
        return view

    def prepare(self, step, node, in_nodes, graph):
        """Kernel for a step: cuBLAS for einsums, a generated kernel for elementwise groups,
        reductions and row ops, CuPy's own operations for layout changes and casts."""
        if node.kind == ops.EINSUM:
            return generic.einsum_kernel(cupy, node, in_nodes)
        if node.kind in GENERATED_KINDS:
            return GeneratedKernel(self, node, in_nodes, self.codegen)
        return generic.make_kernel(cupy, node, in_nodes, step.args.get("_is_output", False))

    def plan_runner(self, plan) -> PlanRunner:
        """The executor of a concrete plan: CUDA graph replay or stream launches."""
        return PlanRunner(self, plan, self.cuda_graph)

    # memory -----------------------------------------------------------------------
    def empty(self, shape, dtype):  # noqa: D102
        return cupy.empty(shape, dtype)

    def alloc_bytes(self, n):  # noqa: D102
        return cupy.empty(max(int(n), 1), dtype=np.uint8)

    def view_bytes(self, raw, shape, dtype):  # noqa: D102
        n = math.prod(shape) * np.dtype(dtype).itemsize
        return raw[:n].view(dtype).reshape(shape)

    def copy(self, x, out=None):  # noqa: D102
        if out is None:
            return cupy.array(x, copy=True)
        out[...] = x
        return out

    # inputs ----------------------------------------------------------------------
    def is_array(self, x) -> bool:  # noqa: D102
        return isinstance(x, cupy.ndarray)

    def check_input(self, x: Any, name: str):
        """Accept CuPy arrays, numpy arrays and anything with ``__dlpack__``, of a float dtype."""
        if isinstance(x, np.generic):
            x = np.asarray(x)
        if not isinstance(x, (cupy.ndarray, np.ndarray)):
            if hasattr(x, "__dlpack__"):
                try:
                    x = cupy.from_dlpack(x)
                except Exception as exc:  # noqa: BLE001 - a foreign array we cannot take
                    raise InputError(f"input {name!r}: cannot import {type(x).__name__} through "
                                     f"DLPack onto the GPU: {exc}") from exc
            else:
                raise InputError(
                    f"input {name!r}: expected a CuPy or numpy array (or one with __dlpack__), "
                    f"got {type(x).__name__}")
        if x.dtype.kind != "f":
            raise InputError(f"input {name!r}: dtype {x.dtype} is not a float dtype")
        return x

    def to_device(self, x):
        """numpy arrays are copied in; CuPy arrays are used as they are (made contiguous if not)."""
        if isinstance(x, np.ndarray):
            return cupy.asarray(x)
        if not x.flags.c_contiguous:
            return cupy.ascontiguousarray(x)
        return x

    def to_host(self, x):  # noqa: D102
        return cupy.asnumpy(x)

    def all_finite(self, x) -> bool:  # noqa: D102
        return bool(cupy.isfinite(cupy.asarray(x)).all())

    def synchronize(self) -> None:  # noqa: D102
        cupy.cuda.Device(self.device_id).synchronize()

    def free_memory(self) -> int:
        """Free device memory in bytes, counting blocks CuPy's pool holds but does not use."""
        free, _total = cupy.cuda.runtime.memGetInfo()
        pool = cupy.get_default_memory_pool()
        return int(free + pool.free_bytes())

    # profiler hooks -----------------------------------------------------------------
    def event(self):
        """Record a CUDA event on the current stream and return it."""
        ev = cupy.cuda.Event()
        ev.record()
        return ev

    def event_seconds(self, start, end) -> float:
        """Seconds between two events from ``event()`` (waits for ``end``)."""
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / 1e3
