"""Programmatic dependent launch (compute capability 9.0+): ``cuLaunchKernelEx`` with the
programmatic-stream-serialization attribute, through ctypes (CuPy does not wrap it).

A kernel launched this way may start before the kernel ahead of it in the stream has finished;
it must resolve the dependency itself, and generated kernels do: their first instruction is
``griddepcontrol.wait``, which returns once every prerequisite grid has completed and its
memory is visible (a no-op for a kernel launched without the attribute). A kernel may also run
``griddepcontrol.launch_dependents`` to let the next grid be scheduled before it ends. Captured
into a CUDA graph, such launches become programmatic edges between kernel nodes.

The driver's structs (cuda.h): ``CUlaunchAttribute`` is an int id, 4 bytes of padding and a
64-byte value union; ``CUlaunchConfig`` is six grid/block dims, the dynamic shared memory size,
the stream, the attribute array and its length.
"""

from __future__ import annotations

import ctypes
import threading

from ...errors import BackendError

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("i", ctypes.c_int), ("align", ctypes.c_uint64)]


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


_driver = None


def _launch_kernel_ex():
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuLaunchKernelEx
        except (OSError, AttributeError) as exc:
            raise BackendError(
                f"programmatic dependent launch needs cuLaunchKernelEx from "
                f"the CUDA driver (12.0 or later): {exc}"
            ) from exc
        fn.argtypes = [
            ctypes.POINTER(LaunchConfig),
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        fn.restype = ctypes.c_int
        _driver = fn
    return _driver


class PdlLaunch:
    """A prebuilt ``cuLaunchKernelEx`` call of one function and geometry with the PDL
    attribute: ``launch(stream_ptr, params_ptr)``."""

    def __init__(self, func_ptr: int, grid: int, block: int) -> None:
        self.fn = _launch_kernel_ex()
        self.func = ctypes.c_void_p(func_ptr)
        self.attr = LaunchAttribute()
        self.attr.id = PROGRAMMATIC_STREAM_SERIALIZATION
        self.attr.value.i = 1
        self.cfg = LaunchConfig(grid, 1, 1, block, 1, 1, 0, None, ctypes.pointer(self.attr), 1)
        self.cfg_ref = ctypes.byref(self.cfg)

    def __call__(self, stream: int, params: int) -> None:
        self.cfg.hStream = stream
        rc = self.fn(self.cfg_ref, self.func, params, None)
        if rc:
            raise BackendError(f"cuLaunchKernelEx failed (CUresult {rc})")


class _State(threading.local):
    active = False  # this thread is capturing a plan whose kernels launch with PDL


state = _State()
