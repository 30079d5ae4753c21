"""Backends: the protocol, the registry, and the built-in backends."""

from .base import available_backends, get_backend, register_backend, registered_backends
from . import numpy_backend  # noqa: F401  (registers "numpy")
from . import numba_backend  # noqa: F401  (registers "numba")

__all__ = ["available_backends", "get_backend", "register_backend", "registered_backends"]
