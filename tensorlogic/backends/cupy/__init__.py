"""The CuPy GPU backend: cuBLAS contractions, generated PTX / CUDA C kernels, CUDA graphs.

The code generators (``spec``, ``ptx``, ``ptx_math``, ``cuda_c``, ``cache``) import without CuPy;
``backend``, ``compiler`` and ``graphs`` need it and load only when the backend is created.
Compile options: ``codegen="ptx"`` (default) or ``"cuda"`` (NVRTC), ``cuda_graph="auto"``
(default), ``True`` or ``False``.
"""

from __future__ import annotations

from ...errors import BackendError
from ..base import register_backend


def _factory():
    try:
        import cupy
    except ImportError as exc:
        raise BackendError(
            "the cupy backend needs CuPy: pip install 'tensorlogic[cuda13]'"
        ) from exc
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDA driver/runtime missing or broken
        raise BackendError(f"the cupy backend found no usable CUDA device: {exc}") from exc
    if n == 0:
        raise BackendError("the cupy backend found no CUDA device")
    from .backend import CupyBackend

    return CupyBackend()


register_backend("cupy", _factory)
