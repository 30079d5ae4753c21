"""The numpy/BLAS backend (the reference every other backend is tested against) and the host
pieces the numba backend builds on: blocked fused kernels, the helper thread pool, BLAS thread
coordination and the blocked attention kernel."""

from . import backend  # noqa: F401  (registers "numpy")
from .backend import NumpyBackend

__all__ = ["NumpyBackend"]
