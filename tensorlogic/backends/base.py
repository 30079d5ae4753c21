"""The Backend protocol and the backend registry.

A backend prepares one kernel per plan step and runs it into preallocated buffers; it also owns
allocation, host/device transfers and synchronization. ``register_backend(name, factory)`` adds
one; the factory raises BackendError when the backend cannot run on this machine.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

from .. import config
from ..errors import BackendError

# Preference order for backend="auto": fastest available first.
AUTO_ORDER = ("cupy", "numba", "numpy")


class Backend(Protocol):
    """What the compiler and executor need from a backend."""

    name: str

    def prepare(
        self, step: Any, node: Any, in_nodes: list, graph: Any
    ) -> Callable[[list, Any], Any]:
        """Return ``kernel(inputs, out) -> result`` for one step.

        Optional kernel attributes the memory planner reads (a kernel without them works):
        ``scratch``, a list of (shape, dtype) temporaries that the executor passes from the
        plan's arena after the step's inputs; ``inplace``, the input positions ``out`` may alias
        exactly with the kernel still correct (elementwise, row-op and fused steps only).
        """

    def empty(self, shape: tuple, dtype: str) -> Any:
        """A new uninitialized array."""

    def alloc_bytes(self, n: int) -> Any:
        """A raw byte buffer of n bytes for the tensor pool."""

    def view_bytes(self, raw: Any, shape: tuple, dtype: str) -> Any:
        """A typed array over the start of a raw byte buffer."""

    def check_input(self, x: Any, name: str) -> Any:
        """Validate the type of a user input; raise InputError if it is not an array."""

    def to_device(self, x: Any) -> Any:
        """Move a validated input to the backend's memory (no copy when already there)."""

    def to_host(self, x: Any) -> Any:
        """A numpy copy of a backend array."""


_factories: dict[str, Callable[[], Backend]] = {}
_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def register_backend(name: str, factory: Callable[[], Backend], *, replace: bool = False) -> None:
    """Register a backend factory under ``name``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise BackendError(f"backend name must be an identifier, got {name!r}")
    with _lock:
        if name in _factories and not replace:
            raise BackendError(f"a backend named {name!r} is already registered")
        _factories[name] = factory
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
            inst = _factories[name]()  # may raise BackendError: not available here
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
