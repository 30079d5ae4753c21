"""CompiledPlan: the plan as data (steps, buffers, memory plan) plus prepared kernels.

A ``CompiledPlan`` is what ``tl.compile`` returns. Graphs with symbolic dimensions get one
``ConcretePlan`` per binding of their symbols, built on first use and cached; a fully concrete
graph is specialized at compile time.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from ..backends.base import PlanRunner, PreparedKernel
from ..backends.inputs import check_out_array, check_out_overlap
from ..errors import DTypeError, GraphError, InputError, MemoryBudgetError, ShapeError
from ..ir.graph import EinsumGraph
from ..options import CompileOptions
from ..runtime import fperrors, hooks
from ..runtime.pool import Arena, TensorPool
from ..runtime.steps import run_program
from ..runtime.units import format_bytes
from .memory import MemoryPlan
from .schedule import Buffer


@dataclass(frozen=True)
class Step:
    """One kernel launch: a node's computation from input buffers into an output buffer."""

    index: int
    node_id: int
    name: str
    kind: str
    op: str | None
    label: str
    inputs: tuple[int, ...]
    output: int
    shape: tuple[int, ...]
    dtype: str
    flops: int
    bytes: int
    args: Mapping[str, Any] = field(default_factory=dict)
    info: str = ""  # backend notes, e.g. the contraction path
    scratch: tuple[int, ...] = ()  # arena buffers passed after the inputs (kernel.scratch)
    threads: int = 0  # host threads the kernel runs on (PreparedKernel.threads; 0: not known)

    @property
    def view(self) -> bool:
        """True when the step returns a view and owns no memory."""
        return bool(self.args.get("_view"))

    def evolve(self, changes: Mapping[str, Any]) -> "Step":
        """This step with ``changes`` (field -> value), unchecked: the compiler makes one per
        step of a plan, and ``dataclasses.replace`` runs the frozen ``__init__`` again (several
        times the cost)."""
        new = object.__new__(Step)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


@dataclass
class ConcretePlan:
    """A plan for concrete shapes: steps, buffers, memory plan, kernels and a tensor pool."""

    graph: EinsumGraph
    steps: tuple[Step, ...]
    buffers: tuple[Buffer, ...]
    memory: MemoryPlan
    kernels: tuple[PreparedKernel, ...]
    input_ids: dict[str, int]
    output_ids: dict[str, int]
    constants: dict[int, Any]
    backend: Any
    binding: dict[str, int]
    optimizer_report: Any = None
    pooled: bool = True  # keep arenas across calls (False: a fresh arena per call)
    # a backend's own executor (e.g. CUDA-graph replay); None runs the steps one by one
    runner: PlanRunner | None = None
    autotune: Any = None  # the O3 autotuner's report (compiler/autotune.py)
    pool: TensorPool = field(init=False)
    program: list = field(init=False)

    def __post_init__(self) -> None:
        self.pool = TensorPool(self.new_arena, self.memory.peak_bytes, reuse=self.pooled)
        # scratch buffers travel after the inputs, so observers run the same (fn, ins, out) loop
        self.program = [
            (k.fn, s.inputs + s.scratch, s.output) for k, s in zip(self.kernels, self.steps)
        ]
        self.flops = sum(s.flops for s in self.steps)
        self.host = not self.backend.capabilities.device
        # per-call tables, built once (the GPU runner reads them too): where inputs go, which
        # outputs get a fresh array, and which are handed back as copies (inputs or constants)
        self.input_slots = tuple(self.input_ids.items())
        fresh = [
            (name, bid)
            for name, bid in self.output_ids.items()
            if self.buffers[bid].role == "output"
        ]
        self.fresh_outputs = tuple(
            (name, bid, self.buffers[bid].shape, self.buffers[bid].dtype) for name, bid in fresh
        )
        self.result_slots = tuple(
            (name, bid, self.buffers[bid].role == "output") for name, bid in self.output_ids.items()
        )

    @property
    def planned_bytes(self) -> int:
        """Bytes one call needs: the arena (planned peak of intermediates) plus the outputs."""
        return self.memory.peak_bytes + sum(b.nbytes for b in self.buffers if b.role == "output")

    def new_arena(self) -> Arena:
        """A buffer table (constants in place) whose intermediates are typed views into one
        fresh arena of ``memory.peak_bytes``; the pool keeps such tables across calls."""
        env = Arena([None] * len(self.buffers))
        for bid, arr in self.constants.items():
            env[bid] = arr
        if self.memory.offsets:
            raw = self.backend.alloc_bytes(self.memory.peak_bytes)
            for bid, off in self.memory.offsets.items():
                b = self.buffers[bid]
                env[bid] = self.backend.view_bytes(raw[off : off + b.nbytes], b.shape, b.dtype)
        env.seal()
        return env

    def run(self, inputs: Mapping[str, Any], out: Mapping[str, Any] | None) -> dict[str, Any]:
        """Execute on validated backend arrays; returns fresh (or caller-given) outputs."""
        if self.runner is not None:
            return self.runner(self, inputs, out)
        return self.run_steps(inputs, out)

    def run_steps(
        self, inputs: Mapping[str, Any], out: Mapping[str, Any] | None, env: list | None = None
    ) -> dict[str, Any]:
        """Execute step by step (the plain executor that a backend runner may fall back to).

        ``env``: a buffer table to run in (from ``new_arena``) instead of one from the pool.
        """
        pooled = env is None
        if pooled:
            env = self.pool.acquire()
        try:
            for name, bid in self.input_slots:
                env[bid] = inputs[name]
            backend = self.backend
            for name, bid, shape, dtype in self.fresh_outputs:
                arr = out.get(name) if out else None
                if arr is None:
                    arr = env[bid]  # two output names on one buffer share the array
                    if arr is None:
                        arr = backend.empty(shape, dtype)
                env[bid] = arr
            obs = hooks.active()
            hook = None if obs is None else obs.step_hook(self, env)
            # host kernels compute log(0) = -inf and overflow without numpy warnings
            token = fperrors.quiet() if self.host else None
            try:
                run_program(self.program, env, None if hook is None else hook.after_step)
            finally:
                if token is not None:
                    fperrors.restore(token)
                if hook is not None:
                    hook.done()
            results: dict[str, Any] = {}
            for name, bid, fresh in self.result_slots:
                if fresh:
                    results[name] = env[bid]
                else:  # an output that is an input or a constant: hand back a copy
                    arr = out.get(name) if out else None
                    results[name] = backend.copy(env[bid], arr)
            return results
        finally:
            if pooled:
                # drop the references to this call's inputs, outputs and views before reuse
                env.reset()
                self.pool.release(env)

    def table(self) -> str:
        """The steps as a text table with FLOPs and bytes."""
        rows = [("#", "step", "op", "shape", "dtype", "MFLOP", "bytes")]
        for s in self.steps:
            rows.append(
                (
                    str(s.index),
                    s.name,
                    s.label + (f" {s.info}" if s.info else ""),
                    "x".join(map(str, s.shape)) or "scalar",
                    s.dtype,
                    f"{s.flops / 1e6:.3f}",
                    format_bytes(s.bytes),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


class CompiledPlan:
    """A graph compiled for one backend and opt level; call it with inputs to run it.

    ``plan(x=array, ...)`` or ``plan({"x": array})`` returns a dict of output arrays.
    Keyword options: ``out`` (dict of arrays to write outputs into), ``check_finite`` (reject
    NaN/inf inputs), ``to_host`` (return numpy arrays from a device backend).
    """

    # concrete plans kept for graphs with symbolic dims, least recently used dropped first
    max_specializations: int = 16

    def __init__(
        self,
        graph: EinsumGraph,
        backend: Any,
        opt_level: int,
        options: CompileOptions | Mapping[str, Any],
        build: Callable[["CompiledPlan", dict[str, int]], ConcretePlan],
    ) -> None:
        self.graph = graph
        self.backend = backend
        self.opt_level = opt_level
        if not isinstance(options, CompileOptions):
            options = CompileOptions.resolve(options, backend.name)
        self.options: CompileOptions = options
        self._build = build
        self._specs: OrderedDict[tuple, ConcretePlan] = OrderedDict()
        self._last: ConcretePlan | None = None
        self._lock = threading.Lock()
        self._inputs = {name: graph.node(nid) for name, nid in graph.inputs.items()}
        self._param_nodes = {name: graph.node(nid) for name, nid in graph.parameters.items()}
        # the plan's own, mutable parameter values, on the backend (graph values stay as given)
        self._params = {
            name: backend.to_device(np.array(graph.parameter_values[node.id]))
            for name, node in self._param_nodes.items()
        }
        self.symbols = graph.symbols
        if not self.symbols:
            self._last = self.specialize()
        # fast input binding: a backend that names its native array type takes C-contiguous
        # arrays of that type with the declared shapes and dtypes as they are
        native = backend.capabilities.native_array
        self._fast = (
            None
            if native is None or self.symbols
            else (
                native,
                tuple(
                    (name, tuple(node.shape), np.dtype(node.dtype))
                    for name, node in self._inputs.items()
                ),
            )
        )
        # a backend's runner may offer a direct call for ready inputs (the cupy backend, for
        # plans of one kernel): tried first, it returns None for anything it does not take
        runner = self._last.runner if self._last is not None else None
        # a direct call takes exactly the plan's inputs; parameters come from the store
        self._direct = runner.direct if runner is not None and not self._params else None

    def on_backend(self, backend: Any) -> "CompiledPlan":
        """This plan for another instance of its backend (another device of the same kind).

        The copy shares the graph, opt level and options; its kernels and buffers are built on
        ``backend`` when it is first specialized (for a graph without symbols: now), so call
        this with that backend's device current. It starts from this plan's current parameter
        values.
        """
        new = CompiledPlan(self.graph, backend, self.opt_level, self.options, self._build)
        for name, arr in self._params.items():
            new._params[name] = backend.to_device(np.array(self.backend.to_host(arr)))
        return new

    def fork(self, graph: EinsumGraph | None = None) -> "CompiledPlan":
        """This plan with its own parameter store (kernels and specializations are shared),
        filled from ``graph``'s parameter values (by default this plan's graph's)."""
        new = copy.copy(self)
        src = self.graph if graph is None else graph
        new._params = {
            name: self.backend.to_device(np.array(src.parameter_value(name)))
            for name in self._param_nodes
        }
        return new

    # ------------------------------------------------------------------ parameters
    @property
    def parameters(self) -> Mapping[str, Any]:
        """The plan's parameter values by name (backend arrays: numpy, or cupy on the device).

        The arrays are the ones every call reads: writing into them in place (as the
        ``tl.optim`` optimizers do) changes what the next call computes, without recompiling.
        """
        return MappingProxyType(self._params)

    def set_parameters(self, values: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        """Copy new values into parameters (by name), in place.

        Every value is checked before any is written: an unknown name raises InputError, a
        shape that differs from the declared one ShapeError, another dtype DTypeError.
        """
        if values is not None and not isinstance(values, Mapping):
            raise InputError(
                f"set_parameters: expected a dict of name -> array, got {type(values).__name__}"
            )
        given = {**(values or {}), **kwargs}
        checked = {}
        for name, value in given.items():
            node = self._param_nodes.get(name)
            if node is None:
                raise InputError(
                    f"set_parameters: unknown parameter {name!r}; the plan's "
                    f"parameters are {list(self._param_nodes)}"
                )
            checked[name] = self._check_parameter(name, node, value)
        for name, value in checked.items():
            self.backend.copy(value, self._params[name])

    def _check_parameter(self, name: str, node: Any, value: Any) -> Any:
        where = f"parameter {name!r}"
        if not self.backend.is_array(value) and not isinstance(value, np.ndarray):
            raise InputError(
                f"{where}: expected an array of shape {tuple(node.shape)} and dtype "
                f"{node.dtype}, got {type(value).__name__}"
            )
        if tuple(value.shape) != tuple(node.shape):
            raise ShapeError(
                f"{where}: new value has shape {tuple(value.shape)}; expected the "
                f"declared shape {tuple(node.shape)}"
            )
        if np.dtype(value.dtype) != np.dtype(node.dtype):
            raise DTypeError(
                f"{where}: new value has dtype {value.dtype}; expected the declared "
                f"{node.dtype} (convert it with .astype('{node.dtype}'))"
            )
        return self.backend.to_device(value) if isinstance(value, np.ndarray) else value

    def graph_with_parameters(self) -> EinsumGraph:
        """A copy of the plan's graph whose parameters hold the plan's current values (to save
        a trained model, or to compile it elsewhere)."""
        g = self.graph.copy()
        for name, nid in g.parameters.items():
            arr = np.array(self.backend.to_host(self._params[name]))
            arr.setflags(write=False)
            g.parameter_values[nid] = arr
        return g

    # ------------------------------------------------------------------ specialization
    def specialize(self, **sizes: int) -> ConcretePlan:
        """The concrete plan for the given symbol sizes (built once, then cached)."""
        missing = [s for s in self.symbols if s not in sizes]
        if missing:
            raise InputError(f"sizes for symbolic dimension(s) {missing} are needed to specialize")
        for s in self.symbols:  # sizes from arrays are ints already; a user's are checked
            v = sizes[s]
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"size of symbolic dimension {s!r} must be an int >= 0, got {v!r}")
        key = tuple(int(sizes[s]) for s in self.symbols)
        specs = self._specs
        cp = specs.get(key)
        if cp is None:
            with self._lock:
                cp = specs.get(key)
                if cp is None:
                    cp = self._build(self, dict(zip(self.symbols, key)))
                    specs[key] = cp
                    # a bounded LRU: every batch size would otherwise keep its plan and arena
                    while len(specs) > max(1, self.max_specializations):
                        specs.popitem(last=False)
        else:
            try:
                specs.move_to_end(key)
            except KeyError:  # evicted by another thread just now; it is still usable
                pass
        self._last = cp
        return cp

    @property
    def concrete(self) -> ConcretePlan:
        """The concrete plan used last (the only one for a graph without symbols)."""
        if self._last is None:
            raise GraphError(
                f"the graph has symbolic dimensions {list(self.symbols)}; call the plan or use "
                "plan.specialize(...) before asking for its steps"
            )
        return self._last

    @property
    def steps(self) -> tuple[Step, ...]:
        """Ordered steps of the current concrete plan."""
        return self.concrete.steps

    @property
    def memory(self) -> MemoryPlan:
        """Memory plan of the current concrete plan."""
        return self.concrete.memory

    @property
    def optimized_graph(self) -> EinsumGraph:
        """The graph after optimization (for the current binding)."""
        return self.concrete.graph

    @property
    def optimizer_report(self) -> Any:
        """Per-pass timings and statistics of the optimizer."""
        return self.concrete.optimizer_report

    @property
    def input_names(self) -> tuple[str, ...]:
        """Names of the graph inputs."""
        return tuple(self._inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Names of the graph outputs."""
        return tuple(self.graph.outputs)

    # ------------------------------------------------------------------ calling
    def _bind_inputs(self, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
        missing = [n for n in self._inputs if n not in given]
        extra = [n for n in given if n not in self._inputs and n not in self._param_nodes]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing input(s) {missing}")
            if extra:
                parts.append(f"unknown input(s) {extra}")
            raise InputError(f"{'; '.join(parts)}; the plan expects {list(self._inputs)}")
        sizes: dict[str, int] = {}
        origin: dict[str, str] = {}
        arrays: dict[str, Any] = {}
        for name, node in self._inputs.items():
            x = self.backend.check_input(given[name], name)
            shape = tuple(x.shape)
            if x.dtype != np.dtype(node.dtype):
                raise InputError(
                    f"input {name!r}: dtype {x.dtype} but the graph declares {node.dtype}; "
                    f"convert it with .astype('{node.dtype}')"
                )
            if len(shape) != len(node.shape):
                raise InputError(
                    f"input {name!r}: shape {shape} has rank {len(shape)} but the graph declares "
                    f"{tuple(node.shape)} (rank {len(node.shape)})"
                )
            for k, (want, got) in enumerate(zip(node.shape, shape)):
                if isinstance(want, str):
                    if want in sizes and sizes[want] != got:
                        raise InputError(
                            f"input {name!r}: dimension {k} is {got} but symbol {want!r} is "
                            f"already {sizes[want]} from input {origin[want]!r}"
                        )
                    sizes[want], origin[want] = got, name
                elif want != got:
                    raise InputError(
                        f"input {name!r}: shape {shape} but the graph declares {tuple(node.shape)} "
                        f"(dimension {k}: expected {want}, got {got})"
                    )
            arrays[name] = x
        for name, node in self._param_nodes.items():  # a per-call override of a parameter
            if name in given:
                x = self.backend.check_input(given[name], name)
                self._check_parameter(name, node, x)
                arrays[name] = x
        return arrays, sizes

    def __call__(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        out: Mapping[str, Any] | None = None,
        check_finite: bool = False,
        to_host: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        direct = self._direct
        if (
            direct is not None
            and inputs is None
            and not out
            and not check_finite
            and not to_host
            and hooks.active() is None
        ):
            results = direct(kwargs)
            if results is not None:
                return results
        if inputs is not None and not isinstance(inputs, Mapping):
            raise InputError(f"inputs must be a dict of name -> array, got {type(inputs).__name__}")
        arrays = self._fast_inputs(inputs, kwargs)
        fast = arrays is not None  # ready native arrays: no conversion, no copy
        if not fast:
            given = {**(inputs or {}), **kwargs}
            arrays, sizes = self._bind_inputs(given)
        if check_finite:
            for name, x in arrays.items():
                if not self.backend.all_finite(x):
                    raise InputError(f"input {name!r} contains NaN or inf (check_finite=True)")
        if self._params:
            arrays = {**self._params, **arrays}
        cp = self.specialize(**sizes) if self.symbols and not fast else self._last
        if not fast and self.options.get("memory_limit") is not None:
            self._check_input_copies(cp, arrays)
        if out is not None:
            self._check_out(cp, out, arrays)
        obs = hooks.active()
        if obs is None:
            if not fast:
                arrays = {n: self.backend.to_device(x) for n, x in arrays.items()}
            results = cp.run(arrays, out)
            if to_host:
                results = {k: self.backend.to_host(v) for k, v in results.items()}
            return results
        # profiled: report host<->device copies to the profiler
        be = self.backend
        arrays = {n: hooks.transfer(obs, "h2d", n, be.to_device, x) for n, x in arrays.items()}
        results = cp.run(arrays, out)
        if to_host:
            results = {
                k: hooks.transfer(obs, "d2h", k, be.to_host, v, be.synchronize)
                for k, v in results.items()
            }
        return results

    def _fast_inputs(self, inputs: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The given inputs as they are when every one is already a ready native array (see
        __init__)."""
        fast = self._fast
        if fast is None:
            return None
        # the inputs come either as one dict or as keywords (both at once take the slow path)
        given = (
            kwargs if inputs is None else inputs if not kwargs and type(inputs) is dict else None
        )
        if given is None or len(given) != len(fast[1]):
            return None
        native = fast[0]
        for name, shape, dtype in fast[1]:
            x = given.get(name)
            if (
                type(x) is not native
                or x.shape != shape
                or x.dtype != dtype
                or not x.flags.c_contiguous
            ):
                return None
        return given

    def _check_out(self, cp: ConcretePlan, out: Any, inputs: Mapping[str, Any]) -> None:
        if type(out) is not dict and not isinstance(out, Mapping):
            raise InputError(
                f"out must be a dict of output name -> array, got {type(out).__name__}"
            )
        native = self.backend.capabilities.native_array
        for name, arr in out.items():
            if name not in cp.output_ids:
                raise InputError(f"out: unknown output {name!r}; outputs are {list(cp.output_ids)}")
            b = cp.buffers[cp.output_ids[name]]
            if (
                type(arr) is native
                and arr.shape == b.shape
                and arr.dtype == b.dtype
                and arr.flags.c_contiguous
                and getattr(arr.flags, "writeable", True)  # CuPy's flags have no writeable
            ):
                continue  # the common case in one test; the checks below name what is wrong
            if (
                not self.backend.is_array(arr)
                or tuple(arr.shape) != b.shape
                or arr.dtype != np.dtype(b.dtype)
            ):
                raise InputError(
                    f"out[{name!r}]: expected a {self.backend.name} array of shape {b.shape} and "
                    f"dtype {b.dtype}, got {type(arr).__name__} {getattr(arr, 'shape', '')} "
                    f"{getattr(arr, 'dtype', '')}"
                )
            if native is not None:
                check_out_array(arr, name, native)
            if not getattr(arr, "flags", None) or not arr.flags.c_contiguous:
                raise InputError(f"out[{name!r}]: the array must be C-contiguous")
        check_out_overlap(
            out if type(out) is dict else dict(out),
            inputs if type(inputs) is dict else dict(inputs),
        )

    def _check_input_copies(self, cp: ConcretePlan, arrays: Mapping[str, Any]) -> None:
        """Count the private copies a backend makes of strided inputs against memory_limit: a
        broadcast (stride-0) view of a few bytes can stand for gigabytes once copied."""
        limit = self.options["memory_limit"]
        extra = {name: self.backend.input_copy_bytes(x) for name, x in arrays.items()}
        total = sum(extra.values())
        if total and cp.planned_bytes + total > limit:
            worst = max(extra, key=extra.__getitem__)
            raise MemoryBudgetError(
                f"input {worst!r} is not C-contiguous (shape {tuple(arrays[worst].shape)}, "
                f"strides {getattr(arrays[worst], 'strides', '?')}): the {self.backend.name} "
                f"backend copies such inputs, {format_bytes(total)} in all, which with the "
                f"plan's {format_bytes(cp.planned_bytes)} exceeds memory_limit "
                f"({format_bytes(limit)}); pass contiguous arrays or raise memory_limit",
                planned_bytes=cp.planned_bytes + total,
                limit=limit,
            )

    def check_budget(self, limit: int | None) -> None:
        """Raise MemoryBudgetError if the current concrete plan's peak exceeds ``limit`` bytes."""
        if limit is None or self._last is None:
            return
        check_budget(self._last, limit, "the memory limit")

    # ------------------------------------------------------------------ display
    def __str__(self) -> str:
        params = f", parameters={list(self._params)}" if self._params else ""
        head = (
            f"CompiledPlan(backend={self.backend.name}, opt_level={self.opt_level}, "
            f"inputs={list(self._inputs)}{params}, outputs={list(self.graph.outputs)})"
        )
        if self._last is None:
            return head + f"\n  symbolic dims {list(self.symbols)}: not specialized yet"
        cp = self._last
        lines = [head]
        ignored = self.options.describe_ignored(self.backend.name)
        if ignored:
            lines.append(ignored)
        if cp.binding:
            lines.append(f"binding: {cp.binding}")
        lines.append(cp.table())
        lines.append(f"total: {len(cp.steps)} steps, {cp.flops / 1e6:.3f} MFLOP")
        lines.append(str(cp.memory))
        if cp.runner is not None:
            lines.append(str(cp.runner))
        if cp.autotune is not None:
            lines.append(str(cp.autotune))
        if cp.optimizer_report is not None:
            lines.append(str(cp.optimizer_report))
        return "\n".join(lines)

    def release_memory(self) -> None:
        """Free the idle arenas of every concrete plan (they are rebuilt on the next call) and
        drop the cached specializations of a graph with symbolic dims (rebuilt when needed)."""
        with self._lock:
            if self.symbols:
                self._specs.clear()
            for cp in [self._last] if self._last else []:
                if cp.runner is not None:
                    cp.runner.release(cp)
                cp.pool.clear()

    def __repr__(self) -> str:
        return (
            f"<CompiledPlan backend={self.backend.name} opt_level={self.opt_level} "
            f"steps={len(self._last.steps) if self._last else '?'}>"
        )


def check_budget(cp: ConcretePlan, limit: int, what: str) -> None:
    """Raise MemoryBudgetError if one call of ``cp`` needs more than ``limit`` bytes."""
    need = cp.planned_bytes
    if need > limit:
        outs = need - cp.memory.peak_bytes
        raise MemoryBudgetError(
            f"plan needs {need} bytes ({format_bytes(need)}: planned peak of intermediates "
            f"{format_bytes(cp.memory.peak_bytes)}, naive "
            f"{format_bytes(cp.memory.naive_bytes)}, plus outputs "
            f"{format_bytes(outs)}) but {what} is {limit} bytes ({format_bytes(limit)})",
            planned_bytes=need,
            limit=limit,
        )
