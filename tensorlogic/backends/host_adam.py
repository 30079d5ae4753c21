"""Adam in one pass over memory on the host backends (numpy, numba).

The optimizers' generic update kernels (``optim/kernels.py``) have one output each, so Adam
takes three passes (first moment, second moment, parameter): 40 bytes of memory traffic per
float32 element.
Here each element's gradient, moments and parameter are read once and the three results
written once (28 bytes), and a parameter is one call instead of three. Training steps are
memory bound in the optimizer, so this is most of what Adam costs on a CPU.

numba: a generated-once kernel over flat views, blocks in ``prange`` (serial below
``PARALLEL_MIN``: a parallel region's start costs more than a small parameter's update).
numpy: cache-sized blocks of in-place ufuncs spread over the host pool, as the fused numpy
kernels do. The arithmetic is the three programs' (``optim/adam.py``), in the parameter's
dtype. ``tl.optim.Adam`` reaches this through the backend (``NumpyBackend.adam_one_pass``).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

from ..runtime.memo import build_once

BLOCK = 16384  # numba: elements per block (its four arrays stay in L1/L2 while it is updated)
NUMPY_BLOCK = 65536  # numpy: a block amortizes its 13 ufunc calls, its arrays stay in L2/L3
PARALLEL_MIN = 1 << 16  # elements from which a parameter's blocks run on several threads

# the generated kernels' fast-math flags (numba codegen's FAST_FLAGS): no nnan/ninf
_FAST = {"reassoc", "contract", "nsz", "arcp"}
_lock = threading.Lock()
_numba_kernels: dict[bool, Callable] = {}


def _numba_kernel(parallel: bool) -> Callable:
    return build_once(_numba_kernels, parallel, _lock, lambda: _compile_numba(parallel))


def _compile_numba(parallel: bool) -> Callable:
    import numba

    from .numba import threads as numba_threads

    numba_threads.configure()
    rng = numba.prange if parallel else range

    @numba.njit(parallel=parallel, fastmath=_FAST, nogil=True, cache=False)
    def adam(p, g, m, v, c):
        # c: 1 - b1, b2, 1 - b2, l2, decay factor, step size, sqrt(bias correction 2), eps
        n = p.size
        for b in rng((n + BLOCK - 1) // BLOCK):
            lo = b * BLOCK
            hi = min(lo + BLOCK, n)
            # 0-based views of the block: LLVM sees non-negative indices and vectorizes
            pp, gg, mm, vv = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
            for j in range(hi - lo):
                pj = pp[j]
                d = gg[j]
                if c[3] != 0:  # loop-invariant: LLVM unswitches it (no p * 0 for p = inf)
                    d = d + pj * c[3]
                mj = mm[j] + (d - mm[j]) * c[0]
                vj = vv[j] * c[1] + d * d * c[2]
                mm[j] = mj
                vv[j] = vj
                pp[j] = pj * c[4] - c[5] * (mj / (math.sqrt(vj) / c[6] + c[7]))

    return adam


def _numpy_update(p, g, m, v, c) -> None:
    from .numpy import host_pool

    one_b1, b2, one_b2, l2, decay, step, bc2, eps = (c[k] for k in range(8))
    n = p.size
    n_blocks = -(-n // NUMPY_BLOCK)
    helpers = host_pool.helper_count() if n >= PARALLEL_MIN else 0
    scratch: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def work(block: int, who: int) -> None:
        lo, hi = block * NUMPY_BLOCK, min(n, (block + 1) * NUMPY_BLOCK)
        s = scratch.get(who)
        if s is None:
            s = scratch[who] = (np.empty(NUMPY_BLOCK, p.dtype), np.empty(NUMPY_BLOCK, p.dtype))
        s1, s2 = s[0][: hi - lo], s[1][: hi - lo]
        pb, gb, mb, vb = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        d = gb
        if l2:
            d = np.multiply(pb, l2, out=s1)
            np.add(gb, d, out=d)
        np.subtract(d, mb, out=s2)
        np.multiply(s2, one_b1, out=s2)
        np.add(mb, s2, out=mb)
        np.multiply(d, d, out=s2)
        np.multiply(s2, one_b2, out=s2)
        np.multiply(vb, b2, out=vb)
        np.add(vb, s2, out=vb)
        np.sqrt(vb, out=s2)
        np.divide(s2, bc2, out=s2)
        np.add(s2, eps, out=s2)
        np.divide(mb, s2, out=s2)
        np.multiply(s2, step, out=s2)
        if decay != 1:
            np.multiply(pb, decay, out=pb)
        np.subtract(pb, s2, out=pb)

    host_pool.run_blocks(work, n_blocks, helpers)


def one_pass(backend: Any, arrays: tuple) -> Callable | None:
    """``fn(p, g, m, v, constants)`` updating flat views of the four arrays in one pass, or None
    where this backend or these arrays (not C-contiguous host arrays of one float dtype) have
    none; ``constants``: 1 - b1, b2, 1 - b2, l2, decay factor, step size, sqrt(bias
    correction 2), eps, as an array of the parameter's dtype."""
    if backend.name not in ("numpy", "numba"):
        return None
    dt = arrays[0].dtype
    if dt not in (np.float32, np.float64) or not all(
        isinstance(a, np.ndarray) and a.dtype == dt and a.flags.c_contiguous for a in arrays
    ):
        return None
    if backend.name == "numba":
        return _numba_kernel(arrays[0].size >= PARALLEL_MIN)
    return _numpy_update


__all__ = ["one_pass"]
