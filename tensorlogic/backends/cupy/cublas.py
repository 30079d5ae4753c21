"""Contractions on cuBLAS called directly, so that CUDA-graph capture can record them (needs CuPy).

CuPy's cuBLAS wrappers refuse to run while a stream is being captured; cuBLAS itself supports
stream capture once the caller gives each handle/stream pair its own workspace (then nothing is
allocated while capturing). This module loads the libcublas that CuPy itself loaded, keeps one
handle per thread pointed at the current CuPy stream with a workspace per stream, and runs the
contraction engine's matrix products as strided-batched GEMMs. Operands already laid out as
(batched) row- or column-major matrices go to cuBLAS as they are (a transposed operand is a
transpose flag, not a copy, unlike ``cupy.matmul``); anything else falls back to ``cupy.matmul``.

complex64 and complex128 products run as ``cublasCgemmStridedBatched`` /
``cublasZgemmStridedBatched``; integer and bool products, which cuBLAS has no exact GEMM for,
take CuPy's integer matmul kernels (exact, wrapping around as numpy's).

float16 and bfloat16 products run as ``cublasGemmStridedBatchedEx`` with float32 accumulation
(``CUBLAS_COMPUTE_32F``: tensor cores, one rounding of each result); float32 products with
``tf32=True`` use ``CUBLAS_COMPUTE_32F_FAST_TF32`` (operands rounded to TF32 on the tensor cores,
float32 accumulation), as torch's ``set_float32_matmul_precision("high")``.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import cupy

from ...errors import BackendError

WORKSPACE_BYTES = 32 << 20  # cuBLAS asks for up to 32 MiB on Hopper for its fastest kernels
_OP_N, _OP_T = 0, 1
# cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h)
_CUDA_R = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_GEMM_DEFAULT = -1


def _find_library() -> ctypes.CDLL | None:
    """The libcublas CuPy uses (read off the process's mapped files once CuPy has loaded it),
    else the one CUDA's path finder names, else one on the loader's path."""
    paths: list[str] = []
    try:
        cupy.cuda.device.get_cublas_handle()  # makes CuPy load its libcublas
        with open("/proc/self/maps") as f:
            paths = sorted(
                {ln.split()[-1] for ln in f if "libcublas.so" in ln and "libcublasLt" not in ln}
            )
    except Exception:  # noqa: BLE001 - no /proc or CuPy's cuBLAS unusable: try the others
        pass
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        paths.append(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:  # noqa: BLE001 - no path finder (optional)
        pass
    for name in paths + ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class Cublas:
    """Strided-batched GEMMs on the current CuPy stream through a per-thread cuBLAS handle."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        self._create = lib.cublasCreate_v2
        self._create.argtypes = [ctypes.POINTER(vp)]
        self._set_stream = lib.cublasSetStream_v2
        self._set_stream.argtypes = [vp, vp]
        self._set_workspace = lib.cublasSetWorkspace_v2
        self._set_workspace.argtypes = [vp, vp, ctypes.c_size_t]
        gemm_args = [vp, i, i, i, i, i, vp, vp, i, ll, vp, i, ll, vp, vp, i, ll, i]
        self._gemm = {}
        # complex GEMMs take alpha and beta as (real, imaginary) pairs; the transpose flag is
        # a plain transpose (CUBLAS_OP_T), never the conjugate, as an einsum needs
        c64, c128 = ctypes.c_float * 2, ctypes.c_double * 2
        for dtype, fname, ctype in (
            ("float32", "cublasSgemmStridedBatched", ctypes.c_float),
            ("float64", "cublasDgemmStridedBatched", ctypes.c_double),
            ("complex64", "cublasCgemmStridedBatched", c64),
            ("complex128", "cublasZgemmStridedBatched", c128),
        ):
            fn = getattr(lib, fname)
            fn.argtypes, fn.restype = gemm_args, ctypes.c_int
            one, zero = (
                (ctype(1.0, 0.0), ctype(0.0, 0.0)) if dtype[0] == "c" else (ctype(1.0), ctype(0.0))
            )
            self._gemm[dtype] = (fn, one, zero, ctypes.addressof(one), ctypes.addressof(zero))
        for fn in (self._create, self._set_stream, self._set_workspace):
            fn.restype = ctypes.c_int
        # the mixed-precision entry point: 16-bit storage (and TF32) with float32 accumulation
        self._gemm_ex = lib.cublasGemmStridedBatchedEx
        self._gemm_ex.argtypes = [
            vp,
            i,
            i,
            i,
            i,
            i,
            vp,
            vp,
            i,
            i,
            ll,
            vp,
            i,
            i,
            ll,
            vp,
            vp,
            i,
            i,
            ll,
            i,
            i,
            i,
        ]
        self._gemm_ex.restype = ctypes.c_int
        self._one32, self._zero32 = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._local = threading.local()
        self._workspaces: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()

    def _handle(self) -> int:
        """This thread's handle, pointed at the current stream (with that stream's workspace)."""
        loc = self._local
        h = getattr(loc, "handle", None)
        if h is None:
            hv = ctypes.c_void_p()
            _check(self._create(ctypes.byref(hv)), "cublasCreate")
            h = loc.handle = hv.value
            loc.stream = None
        stream = cupy.cuda.get_current_stream().ptr
        if loc.stream != stream:
            key = (h, stream)
            with self._lock:
                ws = self._workspaces.get(key)
                if ws is None:
                    ws = self._workspaces[key] = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
            # cublasSetStream resets the workspace to the library's default: set ours after it
            _check(self._set_stream(h, stream), "cublasSetStream")
            _check(self._set_workspace(h, ws.data.ptr, WORKSPACE_BYTES), "cublasSetWorkspace")
            loc.stream = stream
        return h

    def matmul(self, a, b, out=None, tf32: bool = False):
        """``cupy.matmul(a, b, out=out)`` for 2-D or equally batched 3-D operands; ``tf32``
        lets float32 products run on the tensor cores in TF32."""
        call = self._plan(a, b, out)
        if call is None and a.dtype == b.dtype and a.dtype.name in _HALF_NAMES:
            return self._half_fallback(a, b, out)
        if call is None:
            return cupy.matmul(a, b, out=out)
        c, args = call
        name = c.dtype.name
        if name in _HALF_NAMES or (tf32 and name == "float32"):
            self._gemm_ex_call(args, name, tf32)
            return c
        fn = self._gemm[name][0]
        _check(fn(self._handle(), *args), "cublas<t>gemmStridedBatched")
        return c

    def _half_fallback(self, a, b, out):
        """A 16-bit product cuBLAS can't take as laid out: contiguous copies (and a fresh result
        when ``out`` can't be written directly), so it still accumulates in float32."""
        a2, b2 = cupy.ascontiguousarray(a), cupy.ascontiguousarray(b)
        call = self._plan(a2, b2, None)
        if call is None:  # empty operands or shapes no GEMM takes: widen, as host backends do
            res = cupy.matmul(a2.astype(cupy.float32), b2.astype(cupy.float32)).astype(a.dtype)
        else:
            res, args = call
            self._gemm_ex_call(args, res.dtype.name, False)
        if out is None:
            return res
        out[...] = res
        return out

    def _gemm_ex_call(self, args, name: str, tf32: bool) -> None:
        """The same GEMM through cublasGemmStridedBatchedEx, float32 accumulation."""
        (
            opa,
            opb,
            n,
            m,
            k,
            _one,
            b_ptr,
            ldb,
            stride_b,
            a_ptr,
            lda,
            stride_a,
            _zero,
            c_ptr,
            ldc,
            stride_c,
            nb,
        ) = args
        dt = _CUDA_R[name]
        compute = _COMPUTE_32F_FAST_TF32 if name == "float32" else _COMPUTE_32F
        _check(
            self._gemm_ex(
                self._handle(),
                opa,
                opb,
                n,
                m,
                k,
                ctypes.addressof(self._one32),
                b_ptr,
                dt,
                ldb,
                stride_b,
                a_ptr,
                dt,
                lda,
                stride_a,
                ctypes.addressof(self._zero32),
                c_ptr,
                dt,
                ldc,
                stride_c,
                nb,
                compute,
                _GEMM_DEFAULT,
            ),
            "cublasGemmStridedBatchedEx",
        )

    def _plan(self, a, b, out):
        """(result, GEMM arguments after the handle), or None when cuBLAS can't take it as is."""
        dt = a.dtype
        if (
            dt != b.dtype
            or (dt.name not in self._gemm and dt.name not in _HALF_NAMES)
            or a.ndim != b.ndim
            or a.ndim not in (2, 3)
        ):
            return None
        if a.ndim == 3:
            nb = a.shape[0]
            if b.shape[0] != nb:
                return None
        else:
            nb = 1
        m, k = a.shape[-2:]
        k2, n = b.shape[-2:]
        if k != k2 or m == 0 or n == 0 or k == 0 or nb == 0:
            return None
        size = dt.itemsize
        sa = [s // size for s in a.strides]
        sb = [s // size for s in b.strides]
        # C^T = B^T A^T in cuBLAS's column-major view of row-major C
        opa = _cublas_op(k, n, sb[-2], sb[-1])
        opb = _cublas_op(m, k, sa[-2], sa[-1])
        if opa is None or opb is None:
            return None
        shape = (nb, m, n) if a.ndim == 3 else (m, n)
        if out is None:
            c = cupy.empty(shape, dt)
        else:
            if out.shape != shape or out.dtype != dt or not out.flags.c_contiguous:
                return None
            if _overlaps(out, a) or _overlaps(out, b):
                return None
            c = out
        stride_a = sa[0] if a.ndim == 3 else 0
        stride_b = sb[0] if a.ndim == 3 else 0
        _fn, _one, _zero, one, zero = self._gemm.get(dt.name, self._gemm["float32"])
        args = (
            opa[0],
            opb[0],
            n,
            m,
            k,
            one,
            b.data.ptr,
            opa[1],
            stride_b,
            a.data.ptr,
            opb[1],
            stride_a,
            zero,
            c.data.ptr,
            n,
            m * n,
            nb,
        )
        return c, args


_HALF_NAMES = ("float16", "bfloat16")


def _cublas_op(r: int, c: int, s0: int, s1: int) -> tuple[int, int] | None:
    """(op, ld) such that op(X in column-major with ld) is X^T for an r x c row-major-indexed
    operand with element strides (s0, s1); None when X is neither row- nor column-major."""
    if c == 1 or s1 == 1:
        ld = s0 if r > 1 else c
        if ld >= max(1, c):
            return _OP_N, ld
    if r == 1 or s0 == 1:
        ld = s1 if c > 1 else r
        if ld >= max(1, r):
            return _OP_T, ld
    return None


def _extent(x) -> tuple[int, int]:
    lo = hi = x.data.ptr
    for d, s in zip(x.shape, x.strides):
        if s < 0:
            lo += (d - 1) * s
        else:
            hi += (d - 1) * s
    return lo, hi + x.itemsize


def _overlaps(x, y) -> bool:
    xl, xh = _extent(x)
    yl, yh = _extent(y)
    return xl < yh and yl < xh


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BackendError(f"{what} failed with cuBLAS status {status}")


_instance: Cublas | None = None
_loaded = False


def get() -> Cublas | None:
    """The process's direct cuBLAS caller, or None when libcublas can't be loaded."""
    global _instance, _loaded
    if not _loaded:
        lib = _find_library()
        try:
            _instance = Cublas(lib) if lib is not None else None
        except AttributeError:  # a libcublas without the entry points we need
            _instance = None
        _loaded = True
    return _instance


class CublasXp:
    """The array module the contraction engine runs on: CuPy, with matmul on direct cuBLAS
    (``tf32``: float32 products on the tensor cores in TF32)."""

    def __init__(self, blas: Cublas, tf32: bool = False) -> None:
        self.blas = blas
        self.tf32 = tf32
        if tf32:
            self.matmul = lambda a, b, out=None: blas.matmul(a, b, out=out, tf32=True)
        else:
            self.matmul = blas.matmul

    def __getattr__(self, name: str):
        return getattr(cupy, name)
