"""Backends: the contract, the registry, and the built-in backends."""

from .base import (
    Backend,
    Capabilities,
    PreparedKernel,
    available_backends,
    get_backend,
    register_backend,
    registered_backends,
    unregister_backend,
)
from . import numpy as _numpy  # noqa: F401  (registers "numpy")
from . import cupy as _cupy  # noqa: F401  (registers "cupy"; imports CuPy only when used)


def _numba_factory():
    # numba takes a second to import: load it only when the backend is first used
    from .numba.backend import NumbaBackend

    return NumbaBackend()


register_backend("numba", _numba_factory)

__all__ = [
    "Backend",
    "Capabilities",
    "PreparedKernel",
    "available_backends",
    "get_backend",
    "register_backend",
    "registered_backends",
    "unregister_backend",
]
