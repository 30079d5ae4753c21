"""The CuPy backend: cuBLAS contractions, generated PTX / CUDA C kernels, device memory pool."""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import cupy
import numpy as np
from cupy.cuda import driver

from ... import dtypes
from ...errors import GraphError, InputError
from ...ir import ops
from ...ir.fused import FusedBody
from .. import epilogue, kernels as generic, widen
from ..base import Backend, Capabilities, PreparedKernel
from ..inputs import plain_host_array, strided_copy_bytes
from . import cublas, cublaslt, cuda_c, launch, pdl, ptx
from .cache import KernelCache
from .compiler import KernelCompiler
from .graphs import CAPTURE_GATE, PlanRunner
from .routing import compute_dtype, kernel_path, ptx_renders
from .spec import ITEMSIZE, finish_program, make_spec, program_of

GENERATED_KINDS = (*ops.ELEMENTWISE_KINDS, ops.REDUCE, ops.ROWOP, ops.FUSED, ops.CAST)
_launch = driver.launchKernel
_pdl_state = pdl.state
_current_stream = cupy.cuda.get_current_stream


class _Launcher:
    """One compiled kernel with fixed launch geometry: ``launcher(pointers, stream)``.

    Launches through ``cuLaunchKernel`` with a parameter block built once (pointer values are
    written into it per call), which costs a fraction of CuPy's generic argument handling.
    """

    def __init__(self, fn, n_args: int, grid: int, block: int, with_pdl: bool = False) -> None:
        self.fn = fn  # keeps the module loaded
        self.f = fn.ptr
        self.grid, self.block = grid, block
        self.vals = (ctypes.c_uint64 * n_args)()
        base = ctypes.addressof(self.vals)
        self.params = (ctypes.c_void_p * n_args)(*(base + 8 * k for k in range(n_args)))
        self.pptr = ctypes.addressof(self.params)
        self.lock = threading.Lock()  # the block is shared: one launch at a time fills it
        # the kernel opens with griddepcontrol.wait: captured launches may use PDL
        self.pdl = pdl.PdlLaunch(self.f, grid, block) if with_pdl else None

    def __call__(self, ptrs: list[int], stream: int) -> None:
        with self.lock:
            self.vals[:] = ptrs
            _launch(self.f, self.grid, 1, 1, self.block, 1, 1, 0, stream, self.pptr, 0)


class _SpecKernel:
    """A spec's compiled scalar (and vector) variants: ``run(out, args)`` on the current stream.

    A split spec also holds the kernel that reduces its partials."""

    def __init__(self, backend: "CupyBackend", spec, name: str, codegen: str) -> None:
        self.spec = spec
        comp, sms, arch = backend.compiler, backend.sm_count, int(backend.arch)
        n_args = spec.n_inputs + 1
        # the CUDA C path vectorizes float32/float64 row and split kernels only
        vec_ok = codegen == "ptx" or cuda_c.vectorizes(spec)
        var = launch.variants(spec, sms, backend.pdl, vector=vec_ok)
        fns = []
        for v in var:
            nm = name + ("_v" if v.vector else "")
            if codegen == "ptx":
                src = ptx.emit(spec, nm, arch, vector=v.vector, pdl=v.pdl)
            else:
                src = cuda_c.render(spec, nm, vector=v.vector, pdl=v.pdl)
            fns.append(comp.function(src, nm, codegen))
            if not v.vector:
                self.source = src
        self.scalar = _Launcher(fns[0], n_args, var[0].grid, var[0].block, backend.pdl)
        self.vector = (
            _Launcher(fns[1], n_args, var[1].grid, var[1].block, backend.pdl)
            if len(var) > 1
            else None
        )
        # pointers that a vector variant reads or writes 16 bytes at a time: 0 is the output
        if spec.family == "ew":
            self.aligned = [0] + [k + 1 for k in ptx.vector_inputs(spec)]
        else:
            gr = spec.groups[1]
            self.aligned = [k + 1 for k in range(spec.n_inputs) if gr and gr[0].strides[k] == 1]
            if spec.family == "row" and spec.tail in ops.ROW_OPS:
                self.aligned.append(0)
        self.finish = None
        if spec.family == "split":
            n_o, s = spec.sizes[0], spec.splits
            fspec = make_spec(
                finish_program(spec), spec.dtype, [(n_o, s)], [spec.compute], [(s, 1)]
            )
            self.finish = _SpecKernel(backend, fspec, name + "_f", codegen)
            self.partials = (n_o * s,)

    def run(self, out, args) -> None:
        """Launch on the current stream (out and args are CuPy arrays of the spec's layout)."""
        # the hot path of every generated step: kept flat (no helper calls) on purpose
        ptrs = [out.data.ptr]
        for a in args:
            ptrs.append(a.data.ptr)
        if self.finish is not None:
            part = cupy.empty(self.partials, self.spec.compute)
            ptrs[0] = part.data.ptr
        lau = self.vector
        if lau is not None:
            for k in self.aligned:
                if ptrs[k] % 16:
                    lau = self.scalar
                    break
        else:
            lau = self.scalar
        with lau.lock:
            lau.vals[:] = ptrs
            if lau.pdl is not None and _pdl_state.active:  # captured into a graph with PDL
                lau.pdl(_current_stream().ptr, lau.pptr)
            else:
                _launch(
                    lau.f, lau.grid, 1, 1, lau.block, 1, 1, 0, _current_stream().ptr, lau.pptr, 0
                )
        if self.finish is not None:
            self.finish.run(out, [part])


class GeneratedKernel:
    """``kernel(inputs, out)`` for one node, rendered per input layout and compiled once.

    The layout (byte strides of every input) picks a compiled variant; a plan sees one layout
    per step, so after the first call a launch is a dict lookup and a driver call.
    """

    def __init__(self, backend: "CupyBackend", node, in_nodes, codegen: str) -> None:
        self.backend = backend
        self.node = node
        self.prog = program_of(node, in_nodes)
        self.out_dtype = node.dtype
        self.in_dtypes = [n.dtype for n in in_nodes]
        self.compute = compute_dtype(node, in_nodes)
        # PTX renders the float kernels; CUDA C every dtype (kernel_path)
        self.codegen = codegen if ptx_renders(node, in_nodes, self.compute) else "cuda"
        self.in_shapes = [tuple(int(d) for d in n.shape) for n in in_nodes]
        self.variants: dict[tuple, Any] = {}
        self.spec = None
        self.source = ""
        self.empty = math.prod(int(d) for d in node.shape) == 0
        # the contiguous layout is what a plan passes almost always: build it now
        self._contig = tuple(
            tuple(s * ITEMSIZE[dt] for s in _cstrides(shape))
            for shape, dt in zip(self.in_shapes, self.in_dtypes)
        )
        self._main = self._build(self._contig)

    def _build(self, sig: tuple) -> Any:
        strides = [tuple(b // ITEMSIZE[dt] for b in st) for st, dt in zip(sig, self.in_dtypes)]
        spec = make_spec(
            self.prog, self.out_dtype, self.in_shapes, self.in_dtypes, strides, self.compute
        )
        sk = _SpecKernel(self.backend, spec, f"tl_{spec.family}_{spec.key()}", self.codegen)
        if self.spec is None:
            self.spec, self.source = spec, sk.source
        run = None if self.empty or spec.total == 0 else sk.run
        self.variants[sig] = run
        return run

    @property
    def direct_run(self):
        """``run(out, args)`` of the contiguous layout's compiled variant (None: nothing to
        launch, a zero-size result, or a split reduction, whose partials need the general path)."""
        run = self._main
        if run is None or run.__self__.finish is not None:
            return None
        return run

    def __call__(self, args: list, out):
        sig = tuple([a.strides for a in args])
        run = self._main if sig == self._contig else self.variants.get(sig, False)
        if run is False:
            run = self._build(sig)
        if run is not None:
            run(out, args)
        return out


def _cstrides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


# attention is fused by default where its kernel beat the written-out form (cuBLAS GEMMs and a
# softmax kernel) on an H100: the 16-bit tensor-core dtypes, 1.5-4.2x alone (bench_attention)
# and 1.5x / 2.0x in the bf16 encoder block at S=1024 / 4096 (bench_gpu_models); float32 since
# it runs on the tensor cores too (3xTF32, attention_tf32; the exact FFMA kernel had measured
# 0.63-1.12x of the written-out form)
FUSED_ATTENTION = frozenset({"bfloat16", "float16", "float32"})
# a contraction's bias (+ GELU / ReLU, or + residual) consumer runs as its cuBLASLt epilogue
FUSE_EPILOGUES = True


class CupyBackend(Backend):
    """Runs plans on the current CUDA device through CuPy."""

    name = "cupy"
    xp = cupy
    # C-contiguous CuPy inputs skip conversion (CompiledPlan); dtypes: every IR dtype. Floats
    # run on PTX or CUDA C kernels and cuBLAS; integers and bool on CUDA C kernels (wrapping as
    # numpy) and CuPy's exact integer matmul; complex on CUDA C kernels and cuBLAS's complex
    # GEMMs; what no kernel computes as numpy does runs on CuPy's loops (kernel_path)
    capabilities = Capabilities(
        device=True,
        events=True,
        own_runner=True,
        options=frozenset({"codegen", "cuda_graph", "pdl"}),
        dtypes=frozenset(dtypes.SUPPORTED),
        native_array=cupy.ndarray,
        multi_device=True,
        fused_attention=FUSED_ATTENTION,
        attention_layouts=FUSED_ATTENTION,
    )

    def __init__(self, cache_dir=None) -> None:
        dev = cupy.cuda.Device()
        self.device_id = dev.id
        self.arch = str(dev.compute_capability)
        if int(self.arch) < 80:  # no mma.sync tensor-core attention kernel before Ampere
            self.capabilities = replace(
                self.capabilities, fused_attention=frozenset(), attention_layouts=frozenset()
            )
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        self.device_name = (
            props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        )
        self.sm_count = int(props["multiProcessorCount"])
        self.cache = KernelCache(cache_dir)
        self.compiler = KernelCompiler(self.cache, self.arch)
        self.codegen = "ptx"
        self.cuda_graph: Any = "auto"
        self.pdl = False  # programmatic dependent launch inside captured graphs (sm 90+)
        self.tf32 = False  # float32 contractions on the tensor cores in TF32 (matmul_precision)
        # contractions call cuBLAS directly (capturable in CUDA graphs); CuPy's matmul otherwise
        blas = cublas.get()
        self.blas_xp = cublas.CublasXp(blas) if blas is not None else cupy

    # several devices (pipeline/devices.py) --------------------------------------
    _per_device: dict = {}

    def device_count(self) -> int:
        """Number of GPUs this process can see."""
        return int(cupy.cuda.runtime.getDeviceCount())

    def on_device(self, device_id: int) -> "CupyBackend":
        """The backend instance for GPU ``device_id`` (kernels load per device, so each has its
        own), with this one's plan-independent settings; made once per device."""
        if device_id == self.device_id:
            return self
        inst = CupyBackend._per_device.get(device_id)
        if inst is None:
            with cupy.cuda.Device(device_id):
                inst = CupyBackend(self.cache.root)
            inst = CupyBackend._per_device.setdefault(device_id, inst)
        return inst

    def use_device(self):
        """A context in which this backend's GPU is the current device."""
        return cupy.cuda.Device(self.device_id)

    def transfers(self):
        """Pinned staging and streams for one lane of batches on this GPU (call it with the
        device current)."""
        from .transfers import CupyTransfers

        return CupyTransfers(self.device_id)

    # plan options ---------------------------------------------------------------
    def with_options(self, options: Mapping[str, Any]) -> "CupyBackend":
        """A view of this backend with a plan's options (codegen path, CUDA graphs).

        The values were checked by ``CompileOptions`` (tensorlogic.options); what only the
        device can tell (PDL needs sm 90) is checked here.
        """
        codegen = options.get("codegen", "ptx")
        graph = options.get("cuda_graph", "auto")
        use_pdl = options.get("pdl", False)
        precision = options.get("matmul_precision", "highest")
        if use_pdl and int(self.arch) < 90:
            raise GraphError(
                f"pdl=True needs compute capability 9.0 or later; this device "
                f"({self.device_name}) has {self.arch[:-1]}.{self.arch[-1]}"
            )
        tf32 = precision == "tf32"
        if (
            codegen == self.codegen
            and graph == self.cuda_graph
            and use_pdl == self.pdl
            and tf32 == self.tf32
        ):
            return self
        view = object.__new__(CupyBackend)
        view.__dict__.update(self.__dict__)
        view.codegen, view.cuda_graph, view.pdl, view.tf32 = codegen, graph, use_pdl, tf32
        blas = cublas.get()
        if blas is not None and tf32 != self.tf32:  # otherwise the view shares the GEMM path
            view.blas_xp = cublas.CublasXp(blas, tf32=tf32)
        return view

    def prepare(self, step, node, in_nodes, graph):
        """Kernel for a step: cuBLAS for einsums, a generated kernel for elementwise groups,
        reductions and row ops, CuPy's own operations for layout changes and casts."""
        if node.kind == ops.EINSUM:
            return self._einsum(node, in_nodes)
        if node.kind == ops.ROWGRAD:
            from .rowgrad_c import RowGradKernel

            rk = RowGradKernel(self, node)
            return PreparedKernel(rk, source=rk.source, impl=rk, info=rk.info, scratch=rk.scratch)
        empty = _empty_reduction(node, in_nodes)
        if empty is not None:  # nothing to reduce: the table's value, no generated kernel
            return empty  # out[...] = value works on a device array as on a host one
        if node.kind in GENERATED_KINDS:
            path = kernel_path(node, in_nodes, self.codegen)
            if path is None:  # CuPy's loops (numpy's semantics and result dtypes)
                kernel = generic.make_kernel(cupy, node, in_nodes, not step.view)
                return replace(kernel, info=kernel.info or "cupy")
            gk = GeneratedKernel(self, node, in_nodes, path)
            return PreparedKernel(gk, source=gk.source, impl=gk)
        if node.kind == ops.ATTENTION:
            from .attention_gpu import AttentionKernel

            ak = AttentionKernel(self, node, in_nodes)
            return PreparedKernel(ak, flops=ak.flops, info=ak.info, source=ak.source, impl=ak)
        return generic.make_kernel(cupy, node, in_nodes, not step.view)

    def epilogue_pairs(self, graph, order, views):
        """Contractions whose bias (+ GELU / ReLU, or + residual) consumer runs as a cuBLASLt
        epilogue (``epilogue.find``); none without libcublasLt."""
        if not FUSE_EPILOGUES or cublaslt.get() is None:
            return {}
        return epilogue.find(graph, order, views)

    def prepare_epilogue(self, step, pair, graph):
        """One cuBLASLt call for a contraction and its epilogue; None (two steps) where
        cuBLASLt offers no algorithm for the shape."""
        lt = cublaslt.get()
        if lt is None:
            return None
        kernel = cublaslt.LtEpilogueKernel(lt, pair, step.dtype, self.tf32)
        if not kernel.available:
            return None
        info = pair.describe(graph.node(pair.gemm).name)
        return PreparedKernel(kernel, flops=pair.gemm_flops + step.flops, info=info, impl=kernel)

    def _einsum(self, node, in_nodes):
        """cuBLAS for contractions. 16-bit einsums whose sums all happen inside GEMMs run as
        they are (tensor cores, float32 accumulation); one with other sums (an operand's own
        sums or diagonals), or mixing dtypes, is widened to float32 and its result rounded once."""
        xp = self.blas_xp
        kernel = generic.einsum_kernel(xp, node, in_nodes)
        if not widen.needs_widening(node, in_nodes):
            return kernel
        if not kernel.impl.sums_outside_matmul and all(n.dtype == node.dtype for n in in_nodes):
            return kernel
        return widen.widened(cupy, lambda n, ins: generic.einsum_kernel(xp, n, ins), node, in_nodes)

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
        x = plain_host_array(x, name)
        if not isinstance(x, (cupy.ndarray, np.ndarray)):
            if hasattr(x, "__dlpack__"):
                try:
                    x = cupy.from_dlpack(x)
                except Exception as exc:  # noqa: BLE001 - a foreign array we cannot take
                    raise InputError(
                        f"input {name!r}: cannot import {type(x).__name__} through "
                        f"DLPack onto the GPU: {exc}"
                    ) from exc
            else:
                raise InputError(
                    f"input {name!r}: expected a CuPy or numpy array (or one with __dlpack__), "
                    f"got {type(x).__name__}"
                )
        if x.dtype.name not in self.capabilities.dtypes:
            raise InputError(
                f"input {name!r}: dtype {x.dtype} is not supported by the cupy "
                f"backend; expected one of {sorted(self.capabilities.dtypes)}"
            )
        return x

    # strided inputs (a broadcast view stands for its full size) are copied contiguous onto the
    # device; memory_limit counts those copies
    input_copy_bytes = staticmethod(strided_copy_bytes)

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
        with CAPTURE_GATE:  # not while another thread captures a plan
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


def _empty_reduction(node, in_nodes) -> PreparedKernel | None:
    """The fill kernel of a reduction (alone or as a fused group's tail) whose reduced axes
    hold no elements (``kernels.empty_reduction_kernel``), else None."""
    if node.kind == ops.REDUCE:
        shape, axes = tuple(in_nodes[0].shape), tuple(node.args["axes"])
        return generic.empty_reduction_kernel(node.op, shape, axes)
    if node.kind == ops.FUSED:
        body = FusedBody.from_args(node.args["body"])
        if body.tail in ops.REDUCTIONS:
            space = tuple(int(d) for d in body.space)
            return generic.empty_reduction_kernel(body.tail, space, tuple(body.axes))
    return None
