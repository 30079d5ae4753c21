"""The backend contract (``Backend``, ``Capabilities``, ``PreparedKernel``) and the registry.

A backend prepares one kernel per plan step and runs it into preallocated buffers; it also owns
allocation, host/device transfers and synchronization. ``Backend`` lists every call the
compiler, the executor, the profiler and the pipeline make; ``Capabilities`` says what a backend
has, so nothing probes for optional members. ``register_backend(name, factory)`` adds one; the
factory raises BackendError when the backend cannot run on this machine.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import config
from ..errors import BackendError

# Preference order for backend="auto": fastest available first.
AUTO_ORDER = ("cupy", "numba", "numpy")

Kernel = Callable[[list, Any], Any]
ScratchSpec = tuple[tuple[int, ...], str]


@dataclass(frozen=True)
class Capabilities:
    """What a backend has, declared once instead of probed.

    Args:
        device: arrays live on an accelerator (inputs are copied in, calls are asynchronous;
            the pipeline stages batches through pinned memory).
        events: ``event()`` / ``event_seconds(start, end)`` time steps on the device, so the
            profiler needs no synchronization per step.
        own_runner: ``plan_runner(plan)`` returns the executor of each concrete plan (e.g.
            CUDA-graph replay) instead of the plain step loop.
        options: the backend-specific compile options it reads (``tensorlogic.options``);
            options of other backends are accepted and ignored.
        dtypes: the dtypes its kernels compute in.
        native_array: inputs of exactly this type, C-contiguous with the declared shape and
            dtype, are taken as they are (no checks, no conversion); None: always checked.
        multi_device: runs on several devices of one process (``device_count``, ``on_device``,
            ``use_device``, ``transfers``), so the pipeline's ``devices=`` can use them.
        fused_attention: the dtypes whose fused attention kernel beats the written-out form,
            the default of the ``fuse_attention`` option; None: the option's own default
            (``'auto'``: fused where the written-out scores would be large).
        attention_layouts: the dtypes whose attention kernel reads q, k, v and writes its
            result in other layouts (``ir/attention.py``) without copies, the default of the
            ``attention_layout`` option (empty: the optimizer keeps the canonical layout).
    """

    device: bool = False
    events: bool = False
    own_runner: bool = False
    options: frozenset[str] = frozenset()
    dtypes: frozenset[str] = frozenset({"float16", "float32", "float64"})
    native_array: type | None = None
    multi_device: bool = False
    fused_attention: frozenset[str] | None = None
    attention_layouts: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PreparedKernel:
    """One step's kernel as the plan stores it: ``fn(inputs, out) -> result`` plus what the
    compiler and memory planner need to know about it.

    Args:
        fn: ``fn(inputs, out)`` writes the step's result into ``out`` (or returns a view) and
            returns it. ``inputs`` are the step's operands followed by one arena buffer per
            ``scratch`` entry.
        flops: FLOPs of one call, when the kernel knows better than the step's estimate
            (a contraction along its chosen path); None keeps the estimate.
        bytes: bytes one call moves, likewise; None keeps the step's estimate.
        scratch: (shape, dtype) of the temporaries the kernel wants from the plan's arena.
        inplace: input positions that ``out`` may alias exactly (same shape and dtype) with
            the kernel still correct; the memory planner may then reuse a dying input.
        info: a note for ``print(plan)`` (the contraction path, the code path).
        source: generated source text, for inspection.
        impl: the backend's own object behind ``fn`` (a numba dispatcher, a CUDA kernel).
        threads: host threads the kernel runs on (the profiler's "runs on 1 of N threads"
            advice reads it); 0: not known or not a host kernel.
    """

    fn: Kernel
    flops: int | None = None
    bytes: int | None = None
    scratch: tuple[ScratchSpec, ...] = ()
    inplace: tuple[int, ...] = ()
    info: str = ""
    source: str = ""
    impl: Any = None
    threads: int = 0

    def with_threads(self, threads: int) -> "PreparedKernel":
        """This kernel on ``threads`` host threads (a copy of its fields: ``dataclasses.replace``
        runs the frozen ``__init__`` again, several times the cost, and a plan of a thousand
        steps makes one per step)."""
        new = object.__new__(PreparedKernel)
        new.__dict__.update(self.__dict__)
        new.__dict__["threads"] = int(threads)
        return new

    def __call__(self, inputs: list, out: Any) -> Any:
        return self.fn(inputs, out)


# attributes that older backends stuck on kernel closures: refused, so none is silently dropped
_CLOSURE_ATTRS = ("scratch", "inplace", "flops", "info")


def as_prepared(kernel: Any, where: str) -> PreparedKernel:
    """``kernel`` as a PreparedKernel: a plain callable (no declarations) is wrapped."""
    if isinstance(kernel, PreparedKernel):
        return kernel
    if not callable(kernel):
        raise BackendError(
            f"{where}: prepare() returned {type(kernel).__name__}; expected a "
            "PreparedKernel or a callable kernel(inputs, out)"
        )
    stuck = [a for a in _CLOSURE_ATTRS if a in getattr(kernel, "__dict__", {})]
    if stuck:
        raise BackendError(
            f"{where}: the kernel carries {stuck} as attributes; return "
            "PreparedKernel(fn, ...) with them as fields instead"
        )
    return PreparedKernel(kernel)


class PlanRunner:
    """The executor a backend with ``capabilities.own_runner`` builds per concrete plan.

    ``runner(plan, inputs, out)`` runs one call (validated backend arrays in, results out);
    ``direct``, when not None, is tried first by ``plan(**inputs)`` with the raw keyword
    inputs and returns None for anything it does not take (the general path then runs).
    """

    direct: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None

    def __call__(self, plan: Any, inputs: Mapping[str, Any], out: Any) -> dict[str, Any]:
        raise NotImplementedError

    def release(self, plan: Any) -> None:
        """Give back what the runner keeps between calls (``plan.release_memory()`` calls it
        before dropping the idle arenas); the next call rebuilds it."""


class Backend:
    """Every call the compiler and runtime make on a backend.

    Subclasses set ``name`` and ``capabilities`` and implement the methods marked "required";
    the others have defaults that fit a host backend without events or a runner of its own.
    """

    name: str = ""
    capabilities: Capabilities = Capabilities()
    #: array module with numpy's API over the backend's arrays (calibration measures with it)
    xp: Any = np

    # kernels ---------------------------------------------------------------------------
    def prepare(self, step: Any, node: Any, in_nodes: list, graph: Any) -> PreparedKernel:
        """Required: the kernel of one plan step (``step``: the plan's Step record; ``node``
        and ``in_nodes``: the optimized graph's node and its operands; ``graph``: that graph)."""
        raise NotImplementedError(f"backend {self.name!r} does not implement prepare()")

    def epilogue_pairs(self, graph: Any, order: list, views: frozenset) -> Mapping[int, Any]:
        """Optional: consumer node id -> a contraction and its elementwise consumer that the
        backend runs as one step (each value has ``gemm``, the folded contraction's node id,
        and ``inputs``, the node ids the step reads); ``views``: node ids whose buffers are
        views. The default folds nothing."""
        return {}

    def prepare_epilogue(self, step: Any, pair: Any, graph: Any) -> PreparedKernel | None:
        """Optional: the kernel of a pair from ``epilogue_pairs`` (None: the plan runs the
        contraction and its consumer as two steps, as without the pair)."""
        return None

    def with_options(self, options: Mapping[str, Any]) -> Backend:
        """The backend to prepare a plan's kernels with, given its compile options (a view of
        this one when an option changes how kernels are built); the default ignores them."""
        return self

    def plan_runner(self, plan: Any) -> PlanRunner | None:
        """With ``capabilities.own_runner``: the executor of one concrete plan (it may fall
        back to ``plan.run_steps``)."""
        return None

    # memory ----------------------------------------------------------------------------
    def empty(self, shape: tuple, dtype: str) -> Any:
        """Required: a new uninitialized array."""
        raise NotImplementedError

    def alloc_bytes(self, n: int) -> Any:
        """Required: a raw byte buffer of n bytes (one plan arena)."""
        raise NotImplementedError

    def view_bytes(self, raw: Any, shape: tuple, dtype: str) -> Any:
        """Required: a typed C-contiguous array over the start of a raw byte buffer."""
        raise NotImplementedError

    def copy(self, x: Any, out: Any = None) -> Any:
        """Required: a copy of ``x`` (into ``out`` when given)."""
        raise NotImplementedError

    def free_memory(self) -> int | None:
        """Bytes free for plans on this backend's device (None: unknown, no budget check)."""
        return None

    def memory_in_use(self) -> int | None:
        """Bytes the backend's allocator holds (a profiler counter; None: unknown)."""
        return None

    # inputs and outputs ----------------------------------------------------------------
    def is_array(self, x: Any) -> bool:
        """Required: whether ``x`` is this backend's array type (``out=`` arrays are checked)."""
        raise NotImplementedError

    def check_input(self, x: Any, name: str) -> Any:
        """Required: validate a user input; raise InputError naming ``name`` if unusable."""
        raise NotImplementedError

    def to_device(self, x: Any) -> Any:
        """Move a validated input to the backend's memory (host backends: as it is)."""
        return x

    def input_copy_bytes(self, x: Any) -> int:
        """Bytes of the private copy the backend makes of a validated input (a strided view
        made contiguous); ``memory_limit`` counts them. The default: none."""
        return 0

    def to_host(self, x: Any) -> Any:
        """A numpy array of a backend array (host backends: as it is)."""
        return x

    def all_finite(self, x: Any) -> bool:
        """Whether an input holds no NaN or inf (``check_finite=True``)."""
        return bool(self.xp.isfinite(x).all())

    # synchronization and timing --------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for the work queued so far (host backends: nothing to wait for)."""

    def event(self) -> Any:
        """With ``capabilities.events``: record a device event on the current stream."""
        raise BackendError(f"backend {self.name!r} records no device events")

    def event_seconds(self, start: Any, end: Any) -> float:
        """With ``capabilities.events``: seconds between two events (waits for ``end``)."""
        raise BackendError(f"backend {self.name!r} records no device events")

    #: the device plans run on, for calibration caches and reports
    device_name: str = "cpu"

    # several devices (with ``capabilities.multi_device``; pipeline/devices.py) --------------
    #: which of the backend's devices this instance runs on
    device_id: int = 0

    def device_count(self) -> int:
        """With ``capabilities.multi_device``: how many devices this process can use."""
        raise BackendError(f"backend {self.name!r} runs on one device")

    def on_device(self, device_id: int) -> Backend:
        """With ``capabilities.multi_device``: this backend's instance for device ``device_id``."""
        raise BackendError(f"backend {self.name!r} runs on one device")

    def use_device(self) -> Any:
        """With ``capabilities.multi_device``: a context making this instance's device current."""
        raise BackendError(f"backend {self.name!r} runs on one device")

    def transfers(self) -> Any:
        """With ``capabilities.multi_device``: the host/device traffic of one lane of batches on
        this device (``new_ticket``, ``is_device_array``, ``on_this_device``, ``upload``,
        ``computing``, ``download``, ``finish``, ``abandon``; see backends/cupy/transfers.py).
        Called with the device current."""
        raise BackendError(f"backend {self.name!r} runs on one device")


_factories: dict[str, Callable[[], Backend]] = {}
_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def register_backend(name: str, factory: Callable[[], Backend], *, replace: bool = False) -> None:
    """Register a backend factory under ``name``; ``factory()`` returns a ``Backend`` (or raises
    BackendError when it cannot run here)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise BackendError(f"backend name must be an identifier, got {name!r}")
    with _lock:
        if name in _factories and not replace:
            raise BackendError(f"a backend named {name!r} is already registered")
        _factories[name] = factory
        _instances.pop(name, None)


def unregister_backend(name: str) -> None:
    """Remove a registered backend (plans compiled for it keep working; the plan cache does not
    hand them out again, since it matches the backend instance)."""
    with _lock:
        if name not in _factories:
            raise BackendError(
                f"no backend named {name!r} is registered; registered: {sorted(_factories)}"
            )
        del _factories[name]
        _instances.pop(name, None)


def registered_backends() -> tuple[str, ...]:
    """Names of all registered backends (available or not)."""
    return tuple(_factories)


def get_backend(name: str) -> Backend:
    """The backend instance for ``name`` ("auto" picks the best available one)."""
    if name == "auto":
        name = config.default_backend()
    if name == "auto":
        for cand in AUTO_ORDER:
            if cand in _factories:
                try:
                    return get_backend(cand)
                except BackendError:
                    continue
        raise BackendError("no backend is available")
    if name not in _factories:
        raise BackendError(
            f"unknown backend {name!r}; registered backends are {sorted(_factories)}"
        )
    with _lock:
        inst = _instances.get(name)
        if inst is None:
            try:
                inst = _factories[name]()  # may raise BackendError: not available here
            except BackendError:
                raise
            except Exception as exc:
                # reported as this backend being unavailable, so that available_backends()
                # and backend="auto" go on with the others
                raise BackendError(
                    f"backend {name!r} failed to start: {type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(inst, Backend):
                raise BackendError(
                    f"the factory of backend {name!r} returned {type(inst).__name__}; it must "
                    "return a tensorlogic.backends.Backend subclass instance"
                )
            _instances[name] = inst
        return inst


def available_backends() -> tuple[str, ...]:
    """Names of the registered backends that can run on this machine."""
    names = []
    for n in _factories:
        try:
            get_backend(n)
        except BackendError:
            continue
        names.append(n)
    return tuple(names)
