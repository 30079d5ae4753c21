"""compile(): graph -> optimized graph -> schedule -> memory plan -> kernels -> CompiledPlan."""

from __future__ import annotations

import gc
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from ..backends import get_backend
from ..backends.base import PreparedKernel, as_prepared
from ..backends.constants import register as register_constants
from .. import dtypes
from ..errors import BackendError, DTypeError, GraphError
from ..ir import cost, ops
from ..ir.graph import EinsumGraph
from ..options import CompileOptions
from ..optimizer import optimize, precision
from ..runtime import hooks
from .hoist import hoist
from .remat import rematerialize
from .memory import plan_memory
from .plan import CompiledPlan, ConcretePlan, Step, check_budget
from .schedule import Buffer, make_buffers, needed_nodes

_CACHE_SIZE = 128
_cache: OrderedDict[tuple, CompiledPlan] = OrderedDict()
_cache_lock = threading.Lock()


# steps whose kernel may write over an input (when the kernel says which inputs it can alias)
_INPLACE_KINDS = (*ops.ELEMENTWISE_KINDS, ops.ROWOP, ops.FUSED)


def _scratch_buffers(kernel: PreparedKernel, node, first_id: int) -> list[Buffer]:
    """Buffers for the temporaries a kernel declares in ``PreparedKernel.scratch``."""
    out = []
    for j, spec in enumerate(kernel.scratch):
        try:
            shape, dtype = spec
            shape = tuple(int(d) for d in shape)
            dtype = np.dtype(dtype).name
        except (TypeError, ValueError) as exc:
            raise BackendError(
                f"node {node.name!r}: kernel scratch entry {j} is {spec!r}; expected "
                "(shape tuple, dtype)"
            ) from exc
        if any(d < 0 for d in shape):
            raise BackendError(f"node {node.name!r}: kernel scratch entry {j} has shape {shape}")
        out.append(
            Buffer(first_id + j, node.id, f"{node.name}:scratch{j}", shape, dtype, "scratch")
        )
    return out


def _inplace_positions(kernel: PreparedKernel, node) -> tuple[int, ...]:
    if node.kind not in _INPLACE_KINDS:
        return ()
    return tuple(int(p) for p in kernel.inplace if 0 <= int(p) < len(node.inputs))


def _build(plan: CompiledPlan, binding: dict[str, int]) -> ConcretePlan:
    if plan.opt_level == 3:
        from .autotune import autotune

        return autotune(plan, binding, _build_variant)
    return _build_variant(plan, binding, plan.opt_level, plan.options, plan.backend)


def _build_variant(
    plan: CompiledPlan,
    binding: dict[str, int],
    opt_level: int,
    options: CompileOptions,
    backend: Any,
) -> ConcretePlan:
    """The concrete plan of ``plan``'s graph at ``opt_level`` with ``options`` on ``backend``."""
    # compiling allocates many small objects that all stay alive, so CPython's cyclic collector
    # only adds pauses here (a 1000-node graph: 75-97 ms with it, 74-83 ms without)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build_plan(plan.graph, binding, opt_level, options, backend)
    finally:
        if collecting:
            gc.enable()


def check_dtypes(graph: EinsumGraph, backend) -> None:
    """Raise DTypeError naming the first node whose dtype the backend does not run."""
    runs = backend.capabilities.dtypes
    if all(d in runs for d in dtypes.SUPPORTED):  # the CPU backends: nothing to look at
        return
    declared = [d for d in dtypes.SUPPORTED if d in runs]
    for nid in graph.live_nodes():
        node = graph.node(nid)
        if node.dtype not in declared:
            raise DTypeError(
                f"node {node.name!r} ({node.label}) has dtype {node.dtype}, which the "
                f"{backend.name} backend does not run; it runs {', '.join(declared)} (the numpy "
                f"and numba backends run every dtype: {', '.join(dtypes.SUPPORTED)})"
            )


def _check_dtype_names(value: Any, option: str) -> None:
    """A tuple-valued option naming dtypes names only known ones."""
    if isinstance(value, tuple):
        bad = [n for n in value if n not in dtypes.SUPPORTED]
        if bad:
            raise GraphError(
                f"compile option {option} names unknown dtypes {bad}; expected "
                f"names from {list(dtypes.SUPPORTED)}"
            )


def _build_plan(
    graph: EinsumGraph,
    binding: dict[str, int],
    opt_level: int,
    options: CompileOptions,
    backend: Any,
) -> ConcretePlan:
    graph = graph.bind(binding) if binding else graph
    if graph.parameters:  # the plan binds parameters like inputs, from its own store
        graph = graph.with_parameters_as_inputs()
    t0 = time.perf_counter()
    graph = precision.apply_policy(graph, options["precision"])
    optimized, report = optimize(graph, opt_level, options)
    order = needed_nodes(optimized)
    if options["recompute"]:
        optimized, order, _ = rematerialize(optimized, order)
    order = hoist(optimized, order)
    nodes = {nid: optimized.node(nid) for nid in order}
    bufs = make_buffers(optimized, order)
    # a backend may build kernels differently per plan (the cupy backend: codegen, CUDA graphs)
    backend = backend.with_options(options)
    steps: list[Step] = []
    kernels = []
    scratch: list[Buffer] = []
    inplace_ok: dict[int, tuple[int, ...]] = {}

    def add_step(nid: int) -> None:
        node = nodes[nid]
        in_nodes = [nodes[i] for i in node.inputs]
        b = bufs[nid]
        is_view = b.view_of is not None
        args = {"_is_output": b.role == "output", "_view": is_view}
        nbytes = 0 if is_view else b.nbytes + sum(bufs[i].nbytes for i in node.inputs)
        step = Step(
            len(steps),
            nid,
            node.name,
            node.kind,
            node.op,
            node.label,
            tuple(bufs[i].id for i in node.inputs),
            b.id,
            tuple(node.shape),
            node.dtype,
            cost.node_flops(node, in_nodes),
            int(nbytes),
            args,
        )
        if hooks.active() is None:  # no observer: skip the timing context (a few us a step)
            kernel = backend.prepare(step, node, in_nodes, optimized)
        else:
            with hooks.timed(
                "codegen", f"prepare {node.name}", backend=backend.name, kind=node.kind
            ):
                kernel = backend.prepare(step, node, in_nodes, optimized)
        kernel = as_prepared(kernel, f"node {node.name!r}")
        extra = _scratch_buffers(kernel, node, len(order) + len(scratch))
        scratch.extend(extra)
        # kernels may report what only they know: einsum FLOPs along the chosen path, the path
        changes = {}
        if kernel.flops is not None and kernel.flops != step.flops:
            changes["flops"] = int(kernel.flops)
        if kernel.bytes is not None and kernel.bytes != step.bytes:
            changes["bytes"] = int(kernel.bytes)
        if kernel.info:
            changes["info"] = kernel.info
        if kernel.threads:
            changes["threads"] = int(kernel.threads)
        if extra:
            changes["scratch"] = tuple(b.id for b in extra)
        if changes:
            step = step.evolve(changes)
        positions = _inplace_positions(kernel, node)
        if positions:
            inplace_ok[step.index] = positions
        kernels.append(kernel)
        steps.append(step)

    def add_pair(nid: int, pair: Any) -> bool:
        """One step for a contraction and its consumer, if the backend prepares its kernel."""
        node, gemm = nodes[nid], nodes[pair.gemm]
        b = bufs[nid]
        args = {"_is_output": b.role == "output", "_view": False}
        flops = cost.node_flops(gemm, [nodes[i] for i in gemm.inputs])
        flops += cost.node_flops(node, [nodes[i] for i in node.inputs])
        step = Step(
            len(steps),
            nid,
            node.name,
            ops.EINSUM,
            None,
            f"{gemm.label}+{node.label}",
            tuple(bufs[i].id for i in pair.inputs),
            b.id,
            tuple(node.shape),
            node.dtype,
            int(flops),
            int(b.nbytes + sum(bufs[i].nbytes for i in pair.inputs)),
            args,
        )
        with hooks.timed("codegen", f"prepare {node.name}", backend=backend.name, kind="epilogue"):
            kernel = backend.prepare_epilogue(step, pair, optimized)
        if kernel is None:
            return False
        kernel = as_prepared(kernel, f"node {node.name!r}")
        kernels.append(kernel)
        changes: dict[str, Any] = {"info": kernel.info} if kernel.info else {}
        if kernel.flops is not None:  # the contraction's share, which node_flops leaves out
            changes["flops"] = int(kernel.flops)
        if kernel.threads:
            changes["threads"] = int(kernel.threads)
        steps.append(step.evolve(changes) if changes else step)
        return True

    # contractions the backend runs together with their only consumer (cuBLASLt epilogues,
    # GEMM-block epilogues on the CPU): a fusion, so from O2 (O0 and O1 run nodes as written)
    views = frozenset(nid for nid, b in bufs.items() if b.view_of is not None)
    pairs = backend.epilogue_pairs(optimized, order, views) if opt_level >= 2 else {}
    folded = {p.gemm for p in pairs.values()}
    for nid in order:
        if nodes[nid].kind in (ops.INPUT, ops.CONSTANT) or nid in folded:
            continue
        pair = pairs.get(nid)
        if pair is not None:
            if add_pair(nid, pair):
                continue
            add_step(pair.gemm)  # no fused kernel after all: both steps, the product first
        add_step(nid)
    buffers = tuple(bufs[nid] for nid in order) + tuple(scratch)
    memory = plan_memory(
        buffers,
        [(s.inputs, s.output, s.scratch) for s in steps],
        inplace_ok,
        reuse=options["reuse_memory"],
    )
    cp = ConcretePlan(
        graph=optimized,
        steps=tuple(steps),
        buffers=buffers,
        memory=memory,
        kernels=tuple(kernels),
        input_ids={name: bufs[nid].id for name, nid in optimized.inputs.items() if nid in bufs},
        output_ids={name: bufs[nid].id for name, nid in optimized.outputs.items()},
        constants={},
        backend=backend,
        binding=dict(binding),
        optimizer_report=report,
        pooled=options["pool"],
    )
    # the budget is checked before anything is allocated (constants moved, arenas built)
    limit = options["memory_limit"]
    if limit is not None:
        check_budget(cp, limit, "memory_limit")
    else:
        avail = backend.free_memory()
        if avail is not None:
            check_budget(cp, int(avail), f"the free memory of the {backend.name} device")
    cp.constants.update(
        {
            bufs[nid].id: backend.to_device(optimized.constants[nid])
            for nid in order
            if nodes[nid].kind == ops.CONSTANT
        }
    )
    register_constants(cp.constants.values())  # kernels may prepare them once (packed GEMMs)
    if backend.capabilities.own_runner:
        cp.runner = backend.plan_runner(cp)
    hooks.compile_event(
        "compile",
        "build plan",
        t0,
        time.perf_counter() - t0,
        steps=len(steps),
        binding=dict(binding),
    )
    return cp


def compile(
    graph: EinsumGraph,
    backend: str = "auto",
    opt_level: int = 2,
    *,
    memory_limit: int | None = None,
    cache: bool = True,
    **options: Any,
) -> CompiledPlan:
    """Compile a graph into a plan for ``backend`` at ``opt_level`` (0-3).

    Plans are cached by the graph's content hash, backend, opt level and options; graphs with
    symbolic dimensions are specialized per concrete binding on first call. ``options`` are
    checked against ``tensorlogic.options.OPTIONS``: an unknown name or a value of the wrong
    kind raises GraphError; an option of another backend is accepted and ignored (listed by
    ``print(plan)``).

    Memory options: ``memory_limit`` (bytes one call may need: planned peak of intermediates
    plus outputs; without it the backend's free memory is the limit) raises MemoryBudgetError
    before anything is allocated; ``pool=False`` builds fresh buffers on every call instead of
    reusing pooled arenas; ``reuse_memory=False`` gives every intermediate its own memory.

    Precision options: ``precision="bf16"`` (or ``"fp16"``) computes a float32 graph in that
    16-bit dtype with float32 inputs and outputs (see ``optimizer.precision``);
    ``matmul_precision="tf32"`` lets GPU float32 contractions use TF32 tensor cores (default
    ``"highest"``: exact float32; CPU backends accept it and stay exact).

    CPU threads: ``threads`` ("pool", the default, or "blas"; ``backends/numpy/threads.py``).
    O3 autotunes (``compiler/autotune.py``): ``autotune_budget`` (seconds per plan, default
    10), ``autotune_cache``, ``autotune_timer``, ``autotune_backends``; ``skip_passes`` leaves
    optimizer passes out at any level.
    """
    if not isinstance(graph, EinsumGraph):
        raise GraphError(f"compile() expects an EinsumGraph, got {type(graph).__name__}")
    if type(opt_level) is not int or not 0 <= opt_level <= 3:
        raise GraphError(f"opt_level must be an int from 0 to 3, got {opt_level!r}")
    if type(cache) is not bool:
        raise GraphError(f"cache must be True or False, got {cache!r}")
    be = get_backend(backend)
    if opt_level == 3 and options.get("autotune_backends") is None:
        from .autotune import candidate_backends

        options = {**options, "autotune_backends": candidate_backends(backend, be)}
    fused = be.capabilities.fused_attention
    if "fuse_attention" not in options and fused is not None:
        # the backend's measured choice: attention is fused only in the dtypes where its kernel
        # beats the written-out form (on the GPU: the tensor-core dtypes against cuBLAS)
        options = {**options, "fuse_attention": tuple(sorted(fused))}
    strided = be.capabilities.attention_layouts
    if "attention_layout" not in options and strided:
        # the dtypes whose attention kernel reads the projections' layouts in place
        options = {**options, "attention_layout": tuple(sorted(strided))}
    # checked before the graph: a typo in an option fails fast and never reaches the cache key
    opts = CompileOptions.resolve(
        {**options, "memory_limit": memory_limit}, be.name, be.capabilities.options
    )
    _check_dtype_names(opts["fuse_attention"], "fuse_attention")
    _check_dtype_names(opts["attention_layout"], "attention_layout")
    graph.validate()
    check_dtypes(graph, be)
    if cache:
        key = (graph.fingerprint(), be.name, opt_level, opts.key)
        with _cache_lock:
            hit = _cache.get(key)
            # a backend registered again under the same name is another backend
            if hit is not None and hit.backend is be:
                _cache.move_to_end(key)
                hooks.compile_event("cache", "plan cache hit", time.perf_counter(), 0.0)
                # a plan with parameters is shared only in its kernels: each caller gets its
                # own parameter store, filled from the graph it passed
                return hit.fork(graph) if graph.parameters else hit
        hooks.compile_event("cache", "plan cache miss", time.perf_counter(), 0.0)
    # the plan keeps its own copy so later edits to the user's graph cannot change it
    plan = CompiledPlan(graph.copy(), be, opt_level, opts, _build)
    if cache:
        with _cache_lock:
            _cache[key] = plan
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    return plan


def clear_cache() -> None:
    """Forget every cached plan."""
    with _cache_lock:
        _cache.clear()


__all__ = ["compile", "clear_cache"]
