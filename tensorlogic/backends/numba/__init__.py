"""The numba backend: kernels rendered from the op table to numba source, compiled and cached on
disk. Nothing here is imported until the backend is first used (numba takes a second to load).
Importing the package sets numba's vector width first (``vector_width``), while numba has
compiled nothing yet."""

from . import vector_width

vector_width.configure()
