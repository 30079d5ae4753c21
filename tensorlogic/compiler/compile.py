"""compile(): graph -> optimized graph -> schedule -> memory plan -> kernels -> CompiledPlan."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from ..backends import get_backend
from ..backends import kernels as generic_kernels
from ..errors import GraphError, MemoryBudgetError, TensorLogicError
from ..ir import ops
from ..ir.graph import EinsumGraph
from ..optimizer import optimize
from . import hooks
from .memory import plan_memory
from .plan import CompiledPlan, ConcretePlan, Step
from .schedule import make_buffers, needed_nodes

_CACHE_SIZE = 128
_cache: OrderedDict[tuple, CompiledPlan] = OrderedDict()
_cache_lock = threading.Lock()


def _step_flops(node, in_nodes) -> int:
    n = math.prod(node.shape)
    if node.kind == ops.REDUCE:
        m = math.prod(in_nodes[0].shape)
        return m * (10 if node.op == "logsumexp" else 1)
    if node.kind == ops.ROWOP:
        return 10 * n
    if node.kind == ops.FUSED:
        return int(node.args.get("flops", 0))
    return generic_kernels.elementwise_flops(node, n)


def _build(plan: CompiledPlan, binding: dict[str, int]) -> ConcretePlan:
    graph = plan.graph.bind(binding) if binding else plan.graph
    t0 = time.perf_counter()
    optimized, report = optimize(graph, plan.opt_level, plan.options)
    order = needed_nodes(optimized)
    nodes = {nid: optimized.node(nid) for nid in order}
    bufs = make_buffers(optimized, order)
    backend = plan.backend
    # a backend may take plan options (the cupy backend: codegen path, CUDA graphs)
    if hasattr(backend, "with_options"):
        backend = backend.with_options(plan.options)
    steps: list[Step] = []
    kernels = []
    for nid in order:
        node = nodes[nid]
        if node.kind in (ops.INPUT, ops.CONSTANT):
            continue
        in_nodes = [nodes[i] for i in node.inputs]
        b = bufs[nid]
        is_view = b.view_of is not None
        args = {"_is_output": b.role == "output", "_view": is_view,
                "_options": plan.options}  # backends read their compile options here
        nbytes = 0 if is_view else b.nbytes + sum(bufs[i].nbytes for i in node.inputs)
        step = Step(len(steps), nid, node.name, node.kind, node.op, node.label,
                    tuple(bufs[i].id for i in node.inputs), b.id, tuple(node.shape), node.dtype,
                    _step_flops(node, in_nodes), int(nbytes), args)
        with hooks.timed("codegen", f"prepare {node.name}", backend=backend.name, kind=node.kind):
            kernel = backend.prepare(step, node, in_nodes, optimized)
        # kernels may report what only they know: einsum FLOPs along the chosen path, the path
        if hasattr(kernel, "flops") or hasattr(kernel, "info"):
            step = replace(step, flops=int(getattr(kernel, "flops", step.flops)),
                           info=getattr(kernel, "info", ""))
        kernels.append(kernel)
        steps.append(step)
    buffers = tuple(bufs[nid] for nid in order)
    memory = plan_memory(list(buffers), [(s.inputs, s.output) for s in steps])
    constants = {bufs[nid].id: backend.to_device(optimized.constants[nid])
                 for nid in order if nodes[nid].kind == ops.CONSTANT}
    cp = ConcretePlan(
        graph=optimized, steps=tuple(steps), buffers=buffers, memory=memory,
        kernels=tuple(kernels),
        input_ids={name: bufs[nid].id for name, nid in optimized.inputs.items() if nid in bufs},
        output_ids={name: bufs[nid].id for name, nid in optimized.outputs.items()},
        constants=constants, backend=backend, binding=dict(binding), optimizer_report=report,
    )
    if hasattr(backend, "plan_runner"):
        cp.runner = backend.plan_runner(cp)
    hooks.compile_event("compile", "build plan", t0, time.perf_counter() - t0,
                        steps=len(steps), binding=dict(binding))
    limit = plan.options.get("memory_limit")
    if limit is not None:
        need = memory.peak_bytes + sum(b.nbytes for b in buffers if b.role == "output")
        if need > limit:
            raise MemoryBudgetError(
                f"plan needs {need} bytes (intermediates {memory.peak_bytes} + outputs) but "
                f"memory_limit is {limit} bytes"
            )
    return cp


def compile(graph: EinsumGraph, backend: str = "auto", opt_level: int = 2, *,
            memory_limit: int | None = None, cache: bool = True, **options: Any) -> CompiledPlan:
    """Compile a graph into a plan for ``backend`` at ``opt_level`` (0-3).

    Plans are cached by the graph's content hash, backend, opt level and options; graphs with
    symbolic dimensions are specialized per concrete binding on first call.
    """
    if not isinstance(graph, EinsumGraph):
        raise GraphError(f"compile() expects an EinsumGraph, got {type(graph).__name__}")
    if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
        raise GraphError(f"opt_level must be an int from 0 to 3, got {opt_level!r}")
    if memory_limit is not None and (not isinstance(memory_limit, int) or memory_limit <= 0):
        raise GraphError(f"memory_limit must be a positive number of bytes, got {memory_limit!r}")
    graph.validate()
    be = get_backend(backend)
    opts = dict(options, memory_limit=memory_limit)
    key = (graph.fingerprint(), be.name, opt_level, tuple(sorted((k, repr(v)) for k, v in opts.items())))
    if cache:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
                hooks.compile_event("cache", "plan cache hit", time.perf_counter(), 0.0)
                return hit
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
