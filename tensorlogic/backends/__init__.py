"""Backends: the protocol, the registry, and the built-in backends."""

from .base import available_backends, get_backend, register_backend, registered_backends
from . import numpy_backend  # noqa: F401  (registers "numpy")
from . import cupy as _cupy  # noqa: F401  (registers "cupy"; imports CuPy only when used)

__all__ = ["available_backends", "get_backend", "register_backend", "registered_backends"]
