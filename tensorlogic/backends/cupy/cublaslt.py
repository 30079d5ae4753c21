"""A GEMM with a fused bias / activation / residual epilogue through cuBLASLt (needs CuPy).

CuPy exposes no cuBLASLt API, so this module binds the few entry points it needs with ctypes
from the libcublasLt that libcublas itself loads (the one CuPy uses). One ``LtEpilogueKernel``
per plan step holds its descriptors and the algorithm cuBLASLt's heuristic chose for the
step's fixed shapes, so a call is one ``cublasLtMatmul`` on the current stream, with a
workspace per stream, which CUDA-graph capture records like any other launch.

The layout follows ``cublas.py``: a row-major result ``D = X @ W`` (m x n) is cuBLAS's
column-major ``D^T = W^T X^T`` (n x m), so the bias is a vector along cuBLAS's rows.
"""

from __future__ import annotations

import ctypes
import threading

import cupy

from ...errors import BackendError
from . import cublas
from ..epilogue import Epilogue

_CUDA_R = cublas._CUDA_R
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = cublas._COMPUTE_32F, cublas._COMPUTE_32F_FAST_TF32
# cublasLtMatmulDescAttributes_t / cublasLtMatmulPreferenceAttributes_t values (cublasLt.h)
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # A, B, C, D bytes (cuBLASLt assumes 256 unless told)
# plan buffers sit 64 bytes apart in the arena, a user's input may be a slice: algorithms are
# chosen for 16-byte operands, and a call with a less aligned one takes the fallback
ALIGN = 16
_HEURISTIC_BYTES = 96  # cublasLtMatmulHeuristicResult_t: algo (64), workspaceSize, state, waves, 4
_ALGO_BYTES = 64


def _find_library() -> ctypes.CDLL | None:
    """The libcublasLt mapped next to CuPy's libcublas, else one on the loader's path."""
    paths: list[str] = []
    try:
        cupy.cuda.device.get_cublas_handle()  # makes CuPy load libcublas (and its libcublasLt)
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "libcublasLt.so" in ln})
    except Exception:  # noqa: BLE001 - no /proc or CuPy's cuBLAS unusable: try the others
        pass
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        paths.append(load_nvidia_dynamic_lib("cublasLt").abs_path)
    except Exception:  # noqa: BLE001 - no path finder (optional)
        pass
    for name in paths + ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class CublasLt:
    """The cuBLASLt entry points, one handle per device, workspaces per stream."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        u64, i64 = ctypes.c_uint64, ctypes.c_int64

        def fn(name, args):
            f = getattr(lib, name)
            f.argtypes, f.restype = args, ctypes.c_int
            return f

        self.create = fn("cublasLtCreate", [ctypes.POINTER(vp)])
        self.desc_create = fn("cublasLtMatmulDescCreate", [ctypes.POINTER(vp), i, i])
        self.desc_set = fn("cublasLtMatmulDescSetAttribute", [vp, i, vp, sz])
        self.layout_create = fn(
            "cublasLtMatrixLayoutCreate", [ctypes.POINTER(vp), i, u64, u64, i64]
        )
        self.pref_create = fn("cublasLtMatmulPreferenceCreate", [ctypes.POINTER(vp)])
        self.pref_set = fn("cublasLtMatmulPreferenceSetAttribute", [vp, i, vp, sz])
        self.heuristic = fn(
            "cublasLtMatmulAlgoGetHeuristic",
            [vp, vp, vp, vp, vp, vp, vp, i, vp, ctypes.POINTER(i)],
        )
        self.desc_destroy = fn("cublasLtMatmulDescDestroy", [vp])
        self.layout_destroy = fn("cublasLtMatrixLayoutDestroy", [vp])
        self.pref_destroy = fn("cublasLtMatmulPreferenceDestroy", [vp])
        self.matmul = fn(
            "cublasLtMatmul",
            [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp],
        )
        self._handles: dict[int, int] = {}
        self._workspaces: dict[tuple[int, int], object] = {}
        self._lock = threading.Lock()

    def handle(self) -> int:
        """The current device's handle (cuBLASLt handles are not tied to a stream)."""
        dev = cupy.cuda.Device().id
        h = self._handles.get(dev)
        if h is None:
            with self._lock:
                h = self._handles.get(dev)
                if h is None:
                    hv = ctypes.c_void_p()
                    _check(self.create(ctypes.byref(hv)), "cublasLtCreate")
                    h = self._handles[dev] = hv.value
        return h

    def workspace(self, stream: int) -> int:
        """The device pointer of ``stream``'s workspace on the current device (made on the
        stream's first call: a plan's warm-up call, before any capture). Keyed by device too:
        every device's legacy default stream is pointer 0."""
        key = (cupy.cuda.Device().id, stream)
        ws = self._workspaces.get(key)
        if ws is None:
            with self._lock:
                ws = self._workspaces.get(key)
                if ws is None:
                    ws = self._workspaces[key] = cupy.empty(
                        cublas.WORKSPACE_BYTES, dtype=cupy.uint8
                    )
        return ws.data.ptr


class LtEpilogueKernel:
    """``kernel(inputs, out)`` for one GEMM + epilogue step (inputs: x, w, bias[, residual])."""

    def __init__(self, lt: CublasLt, epi: Epilogue, dtype: str, tf32: bool) -> None:
        self.lt, self.epi = lt, epi
        dt = _CUDA_R[dtype]
        compute = _COMPUTE_32F_FAST_TF32 if (tf32 and dtype == "float32") else _COMPUTE_32F
        m, n, k = epi.m, epi.n, epi.k
        self._keep: list = []  # ctypes values whose addresses the descriptors hold
        desc = ctypes.c_void_p()
        _check(lt.desc_create(ctypes.byref(desc), compute, _CUDA_R["float32"]), "MatmulDescCreate")
        self.desc = desc.value
        # cuBLAS's A is W (n x k column-major when W is (k, n) row-major), its B is X
        self._set(_DESC_TRANSA, ctypes.c_int(1 if epi.w_transposed else 0))
        self._set(_DESC_TRANSB, ctypes.c_int(1 if epi.x_transposed else 0))
        self._set(_DESC_EPILOGUE, ctypes.c_int(epi.code))
        self._bias = ctypes.c_void_p(0)  # the pointer is set per call (arena offsets vary)
        a_shape = (k, n, k) if epi.w_transposed else (n, k, n)
        b_shape = (m, k, m) if epi.x_transposed else (k, m, k)
        self.a_layout = self._layout(dt, *a_shape)
        self.b_layout = self._layout(dt, *b_shape)
        self.d_layout = self._layout(dt, n, m, n)
        self.alpha = ctypes.c_float(1.0)
        self.beta = ctypes.c_float(1.0 if epi.residual else 0.0)
        self.algo = self._pick_algo()
        self.gemms = [(1, m, n, k)]  # (batch, m, n, k), as the contraction engine reports
        self.lock = threading.Lock()  # the bias pointer lives in the shared descriptor

    def _set(self, attr: int, value) -> None:
        self._keep.append(value)
        _check(
            self.lt.desc_set(self.desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
            "MatmulDescSetAttribute",
        )

    def _layout(self, dt: int, rows: int, cols: int, ld: int) -> int:
        lay = ctypes.c_void_p()
        _check(self.lt.layout_create(ctypes.byref(lay), dt, rows, cols, ld), "MatrixLayoutCreate")
        return lay.value

    def _pick_algo(self):
        """The heuristic's first algorithm for this shape (None: cuBLASLt has none)."""
        lt = self.lt
        # the bias pointer's alignment steers the heuristic (no pointer is dereferenced)
        self._bias.value = ALIGN
        self._set(_DESC_BIAS_POINTER, self._bias)
        pref = ctypes.c_void_p()
        _check(lt.pref_create(ctypes.byref(pref)), "MatmulPreferenceCreate")
        ws = ctypes.c_uint64(cublas.WORKSPACE_BYTES)
        self._keep.append(ws)
        _check(
            lt.pref_set(pref.value, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8),
            "MatmulPreferenceSetAttribute",
        )
        align = ctypes.c_uint32(ALIGN)
        self._keep.append(align)
        for attr in _PREF_MIN_ALIGNMENT:
            _check(lt.pref_set(pref.value, attr, ctypes.byref(align), 4), "PreferenceSetAttribute")
        result = (ctypes.c_uint8 * _HEURISTIC_BYTES)()
        count = ctypes.c_int(0)
        d = self.d_layout
        status = lt.heuristic(
            lt.handle(),
            self.desc,
            self.a_layout,
            self.b_layout,
            d,
            d,
            pref.value,
            1,
            ctypes.addressof(result),
            ctypes.byref(count),
        )
        lt.pref_destroy(pref.value)
        if status != 0 or count.value < 1:
            return None
        algo = (ctypes.c_uint8 * _ALGO_BYTES)()
        ctypes.memmove(algo, result, _ALGO_BYTES)
        return algo

    def __del__(self) -> None:
        try:  # descriptors are host objects: freed with the plan that holds the kernel
            self.lt.desc_destroy(self.desc)
            for lay in (self.a_layout, self.b_layout, self.d_layout):
                self.lt.layout_destroy(lay)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to free into
            pass

    @property
    def available(self) -> bool:
        """Whether cuBLASLt offered an algorithm for this step."""
        return self.algo is not None

    def __call__(self, args: list, out):
        x, w, bias = args[0], args[1], args[2]
        c = args[3] if self.epi.residual else out
        lt = self.lt
        if (x.data.ptr | w.data.ptr | bias.data.ptr | c.data.ptr | out.data.ptr) % ALIGN:
            return self._unaligned(x, w, bias, c, out)
        stream = cupy.cuda.get_current_stream().ptr
        with self.lock:
            self._bias.value = bias.data.ptr
            _check(
                lt.desc_set(
                    self.desc,
                    _DESC_BIAS_POINTER,
                    ctypes.byref(self._bias),
                    ctypes.sizeof(self._bias),
                ),
                "MatmulDescSetAttribute",
            )
            _check(
                lt.matmul(
                    lt.handle(),
                    self.desc,
                    ctypes.addressof(self.alpha),
                    w.data.ptr,
                    self.a_layout,
                    x.data.ptr,
                    self.b_layout,
                    ctypes.addressof(self.beta),
                    c.data.ptr,
                    self.d_layout,
                    out.data.ptr,
                    self.d_layout,
                    ctypes.addressof(self.algo),
                    lt.workspace(stream),
                    cublas.WORKSPACE_BYTES,
                    stream,
                ),
                "cublasLtMatmul",
            )
        return out

    def _unaligned(self, x, w, bias, c, out):
        """The same result from CuPy operations in float32 (an operand cuBLASLt's chosen
        algorithm can't read: a user's input sliced off a 16-byte boundary)."""
        e, f32 = self.epi, cupy.float32
        xm = x.reshape(e.k, e.m).T if e.x_transposed else x.reshape(e.m, e.k)
        wm = w.reshape(e.n, e.k).T if e.w_transposed else w.reshape(e.k, e.n)
        y = cupy.matmul(xm.astype(f32), wm.astype(f32)) + bias.reshape(1, e.n).astype(f32)
        if e.residual:
            y += c.reshape(e.m, e.n).astype(f32)
        if e.activation == "relu":
            y = cupy.maximum(y, 0)
        elif e.activation == "gelu":  # the tanh form, as cuBLASLt's GELU epilogue
            y = 0.5 * y * (1 + cupy.tanh(0.7978845608028654 * (y + 0.044715 * y**3)))
        out[...] = y.reshape(out.shape).astype(out.dtype)
        return out


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BackendError(f"cuBLASLt {what} failed with status {status}")


_instance: CublasLt | None = None
_loaded = False


def get() -> CublasLt | None:
    """The process's cuBLASLt binding, or None when libcublasLt can't be loaded."""
    global _instance, _loaded
    if not _loaded:
        lib = _find_library()
        try:
            _instance = CublasLt(lib) if lib is not None else None
        except AttributeError:  # a libcublasLt without the entry points we need
            _instance = None
        _loaded = True
    return _instance
