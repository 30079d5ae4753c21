"""Vectorizable exp, log, tanh and log1p (and float ordering keys) for generated numba kernels.

numba's ``math.exp``/``math.log`` call scalar libm on machines without SVML, which keeps LLVM
from vectorizing any loop that uses them. These versions are straight-line float arithmetic plus
integer bit tricks (no calls, no branches, no tables), so a loop over them vectorizes to
AVX-512.

exp: Cody-Waite range reduction ``x = n*ln2 + r`` with ``|r| <= ln2/2`` (``n`` rounded by
adding and subtracting ``1.5 * 2**(mantissa bits)``, not floor(), a scalar libm call; ln2 split
in a high part with trailing zero bits, so ``n*ln2_hi`` is exact), a Taylor polynomial for
``exp(r)`` (degree 7 in float32, 13 in float64; truncation error far below half an ulp), and
``2**n`` built from exponent bits in two halves so results that underflow into subnormals or
overflow to inf round once, correctly. log: fdlibm's algorithm, ``x = 2**k * m`` with ``m`` in
[sqrt(2)/2, sqrt(2)), ``f = m - 1``, ``s = f/(2+f)`` and the odd series of
``log((1+s)/(1-s))``; subnormal inputs are scaled by 2**54 first. Special values follow
IEEE/libm: exp(nan)=nan, exp(+inf)=inf, exp(-inf)=0, log(0)=-inf, log(x<0)=nan, log(inf)=inf.

tanh: for ``|x| < 0.625`` Cephes' odd minimax polynomial (float32) or rational function
(float64) in ``x*x``; above, ``1 - 2/(exp(2|x|) + 1)`` with the fast exp and the sign restored
(``|x|`` clamped where tanh rounds to 1, so large inputs and inf give exactly +-1). Both branches
are computed and one selected, so the loop stays branch-free. log1p:
``log(u) - ((u - 1) - x) / u`` with ``u = 1 + x``: ``(u - 1) - x`` is the exact rounding error
of ``u``, removed to first order (which gives ``x`` where ``u`` rounds to 1). sigmoid and gelu
(through exp: ``1 / (1 + exp(-x))``, ``x / (1 + exp(-2u))``) and softplus (through exp and
log1p) use these in fast-math kernels, so they vectorize too. ``key_*``/``unkey_*`` map floats
to order-preserving integers (int32 for float32, int64 for float64), so a running max
(softmax's row max) is an integer max that vectorizes.

Measured accuracy (tests/backends/test_numba_runtime.py sweeps the finite range densely):
bounded by 2 ulp (float32) and 4 ulp (float64) for exp, log, tanh and log1p; observed maxima for
exp/log are below 1 ulp (the test prints them all).

Generated kernels import these functions from here (they are compiled once per process and
type, and cached on disk like the kernels); ``SOURCE_DIGEST`` hashes this file and is written into
every generated module that uses them, so a change here gives those modules new content addresses
and the disk cache never serves a kernel built with an older exp/log.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from llvmlite import ir as _llir
from numba import njit
from numba.core import types as _types
from numba.extending import intrinsic as _intrinsic

from . import cache as numba_cache


@_intrinsic
def _bits_of(typingctx, x):
    """The IEEE bits of a float as int64 (float32 bits zero-extended)."""
    if x == _types.float64:

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], _llir.IntType(64))

        return _types.int64(x), codegen
    if x == _types.float32:

        def codegen(context, builder, sig, args):
            return builder.zext(builder.bitcast(args[0], _llir.IntType(32)), _llir.IntType(64))

        return _types.int64(x), codegen
    return None


@_intrinsic
def _f64_from_bits(typingctx, b):
    """Reinterpret int64 bits as float64."""
    if isinstance(b, _types.Integer):

        def codegen(context, builder, sig, args):
            v = args[0]
            if v.type.width != 64:
                v = builder.sext(v, _llir.IntType(64))
            return builder.bitcast(v, _llir.DoubleType())

        return _types.float64(b), codegen
    return None


@_intrinsic
def _f32_from_bits(typingctx, b):
    """Reinterpret the low 32 bits of an integer as float32."""
    if isinstance(b, _types.Integer):

        def codegen(context, builder, sig, args):
            v = args[0]
            if v.type.width > 32:
                v = builder.trunc(v, _llir.IntType(32))
            elif v.type.width < 32:
                v = builder.sext(v, _llir.IntType(32))
            return builder.bitcast(v, _llir.FloatType())

        return _types.float32(b), codegen
    return None


_D_LOG2E = np.float64(1.4426950408889634)
_D_LN2_HI = np.float64(6.93147180369123816490e-01)
_D_LN2_LO = np.float64(1.90821492927058770002e-10)
_D_HI = np.float64(709.8)
_D_LO = np.float64(-745.2)
_D_HALF = np.float64(0.5)
_D_SHIFT = np.float64(6755399441055744.0)  # 1.5 * 2**52
_D_ONE = np.float64(1.0)
_D_TWO = np.float64(2.0)
_D_P2 = np.float64(1.0 / 2)
_D_P3 = np.float64(1.0 / 6)
_D_P4 = np.float64(1.0 / 24)
_D_P5 = np.float64(1.0 / 120)
_D_P6 = np.float64(1.0 / 720)
_D_P7 = np.float64(1.0 / 5040)
_D_P8 = np.float64(1.0 / 40320)
_D_P9 = np.float64(1.0 / 362880)
_D_P10 = np.float64(1.0 / 3628800)
_D_P11 = np.float64(1.0 / 39916800)
_D_P12 = np.float64(1.0 / 479001600)
_D_P13 = np.float64(1.0 / 6227020800)
_D_LG1 = np.float64(6.666666666666735130e-01)
_D_LG2 = np.float64(3.999999999940941908e-01)
_D_LG3 = np.float64(2.857142874366239149e-01)
_D_LG4 = np.float64(2.222219843214978396e-01)
_D_LG5 = np.float64(1.818357216161805012e-01)
_D_LG6 = np.float64(1.531383769920937332e-01)
_D_LG7 = np.float64(1.479819860511658591e-01)
_D_TWO54 = np.float64(18014398509481984.0)
_D_TINY = np.float64(2.2250738585072014e-308)
_D_INF = np.float64(np.inf)
_D_NAN = np.float64(np.nan)
_D_ZERO = np.float64(0.0)


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def _nan_clamp_f64(x):
    """x clamped to [_D_LO, _D_HI] with NaN kept: the exps below carry a NaN through their
    polynomial instead of selecting it back at the end. Such a select, in a loop that writes
    exp(x) over x, compiles to a masked store, which AMD's cores microcode (an in-place exp
    ran 1.5 ns per element instead of 0.5). The exponent bits come from the NaN-free clamp:
    converting NaN to an integer has no defined result."""
    x = _D_LO if x < _D_LO else x
    return _D_HI if x > _D_HI else x


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def _nan_clamp_f32(x):
    """``_nan_clamp_f64`` for float32."""
    x = _F_LO if x < _F_LO else x
    return _F_HI if x > _F_HI else x


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def exp_f64(x):
    """exp of a float64 (vectorizable; see the module docstring for accuracy)."""
    xc = min(max(x, _D_LO), _D_HI)
    # round to nearest by the 1.5 * 2**52 shifter: no floor() call, which LLVM leaves as a
    # scalar libm call that keeps the loop from vectorizing
    fn = (xc * _D_LOG2E + _D_SHIFT) - _D_SHIFT
    n = np.int64(fn)
    r = (_nan_clamp_f64(x) - fn * _D_LN2_HI) - fn * _D_LN2_LO
    p = _D_P12 + r * _D_P13
    p = _D_P11 + r * p
    p = _D_P10 + r * p
    p = _D_P9 + r * p
    p = _D_P8 + r * p
    p = _D_P7 + r * p
    p = _D_P6 + r * p
    p = _D_P5 + r * p
    p = _D_P4 + r * p
    p = _D_P3 + r * p
    p = _D_P2 + r * p
    p = _D_ONE + r * p
    p = _D_ONE + r * p
    n1 = n >> 1
    n2 = n - n1
    b2 = np.int64(0) if x < _D_LO else (n2 + 1023) << 52  # exactly 0 there (see exp_f32)
    return p * _f64_from_bits((n1 + 1023) << 52) * _f64_from_bits(b2)


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def log_f64(x):
    """log of a float64 (vectorizable; see the module docstring for accuracy)."""
    sub = x < _D_TINY
    xs = x * _D_TWO54 if sub else x
    bits = _bits_of(xs)
    k = ((bits >> 52) & 0x7FF) - 1023 - (54 if sub else 0)
    # mantissa scaled into [1, 2); move [sqrt2, 2) down to [sqrt2/2, 1)
    mb = (bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000
    big = (bits & 0x000FFFFFFFFFFFFF) > 0x6A09E667F3BCD
    mb = mb - 0x0010000000000000 if big else mb
    k = k + 1 if big else k
    m = _f64_from_bits(mb)
    f = m - _D_ONE
    s = f / (_D_TWO + f)
    z = s * s
    w = z * z
    t1 = w * (_D_LG2 + w * (_D_LG4 + w * _D_LG6))
    t2 = z * (_D_LG1 + w * (_D_LG3 + w * (_D_LG5 + w * _D_LG7)))
    rr = t2 + t1
    hfsq = _D_HALF * f * f
    dk = np.float64(k)
    y = dk * _D_LN2_HI - ((hfsq - (s * (hfsq + rr) + dk * _D_LN2_LO)) - f)
    y = x if x == _D_INF else y
    y = -_D_INF if x == _D_ZERO else y
    return _D_NAN if (x < _D_ZERO or x != x) else y


_F_LOG2E = np.float32(1.4426950408889634)
_F_LN2_HI = np.float32(0.693359375)
_F_LN2_LO = np.float32(-2.12194440e-4)
_F_HI = np.float32(88.8)
_F_LO = np.float32(-104.0)
_F_HALF = np.float32(0.5)
_F_SHIFT = np.float32(12582912.0)  # 1.5 * 2**23
_F_ONE = np.float32(1.0)
_F_TWO = np.float32(2.0)
_F_P2 = np.float32(1.0 / 2)
_F_P3 = np.float32(1.0 / 6)
_F_P4 = np.float32(1.0 / 24)
_F_P5 = np.float32(1.0 / 120)
_F_P6 = np.float32(1.0 / 720)
_F_P7 = np.float32(1.0 / 5040)
_F_LG1 = np.float32(0.66666662693)
_F_LG2 = np.float32(0.40000972152)
_F_LG3 = np.float32(0.28498786688)
_F_LG4 = np.float32(0.24279078841)
_F_LN2F_HI = np.float32(6.9313812256e-01)
_F_LN2F_LO = np.float32(9.0580006145e-06)
_F_TWO25 = np.float32(33554432.0)
_F_TINY = np.float32(1.1754943508222875e-38)
_F_INF = np.float32(np.inf)
_F_NAN = np.float32(np.nan)
_F_ZERO = np.float32(0.0)


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def exp_f32(x):
    """exp of a float32 (vectorizable; see the module docstring for accuracy)."""
    xc = min(max(x, _F_LO), _F_HI)
    fn = (xc * _F_LOG2E + _F_SHIFT) - _F_SHIFT  # round to nearest (see exp_f64)
    n = np.int32(fn)
    r = (_nan_clamp_f32(x) - fn * _F_LN2_HI) - fn * _F_LN2_LO
    p = _F_P6 + r * _F_P7
    p = _F_P5 + r * p
    p = _F_P4 + r * p
    p = _F_P3 + r * p
    p = _F_P2 + r * p
    p = _F_ONE + r * p
    p = _F_ONE + r * p
    n1 = n >> 1
    n2 = n - n1
    # below _F_LO the result rounds to 0: a zero second factor gives it exactly, where the
    # subnormal product would take a microcode assist (-inf, a masked score, ran 1.6x slower)
    b2 = np.int32(0) if x < _F_LO else (n2 + 127) << 23
    return p * _f32_from_bits((n1 + 127) << 23) * _f32_from_bits(b2)


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def log_f32(x):
    """log of a float32 (vectorizable; see the module docstring for accuracy)."""
    sub = x < _F_TINY
    xs = x * _F_TWO25 if sub else x
    bits = _bits_of(xs)
    k = ((bits >> 23) & 0xFF) - 127 - (25 if sub else 0)
    mb = (bits & 0x007FFFFF) | 0x3F800000
    big = (bits & 0x007FFFFF) > 0x3504F3
    mb = mb - 0x00800000 if big else mb
    k = k + 1 if big else k
    m = _f32_from_bits(mb)
    f = m - _F_ONE
    s = f / (_F_TWO + f)
    z = s * s
    w = z * z
    t1 = w * (_F_LG2 + w * _F_LG4)
    t2 = z * (_F_LG1 + w * _F_LG3)
    rr = t2 + t1
    hfsq = _F_HALF * f * f
    dk = np.float32(k)
    y = dk * _F_LN2F_HI - ((hfsq - (s * (hfsq + rr) + dk * _F_LN2F_LO)) - f)
    y = x if x == _F_INF else y
    y = -_F_INF if x == _F_ZERO else y
    return _F_NAN if (x < _F_ZERO or x != x) else y


_D_TANH_SMALL = np.float64(0.625)
_D_TANH_BIG = np.float64(22.0)  # tanh(22) rounds to 1.0 in float64
_D_TP0 = np.float64(-9.64399179425052238628e-1)
_D_TP1 = np.float64(-9.92877231001918586564e1)
_D_TP2 = np.float64(-1.61468768441708447952e3)
_D_TQ0 = np.float64(1.12811678491632931402e2)
_D_TQ1 = np.float64(2.23548839060100448583e3)
_D_TQ2 = np.float64(4.84406305325125486048e3)
_F_TANH_SMALL = np.float32(0.625)
_F_TANH_BIG = np.float32(9.0)  # tanh(9) rounds to 1.0 in float32
_F_TP0 = np.float32(-5.70498872745e-3)
_F_TP1 = np.float32(2.06390887954e-2)
_F_TP2 = np.float32(-5.37397155531e-2)
_F_TP3 = np.float32(1.33314422036e-1)
_F_TP4 = np.float32(-3.33332819422e-1)


# inline="always": numba inlines tanh into the caller's IR (LLVM's inliner declines a body this
# size, and a call per element keeps the loop scalar); the caller's fastmath flags then apply,
# which tanh tolerates (no compensated sums; NaN handling is a select, and kernels keep NaN
# semantics). log1p's compensation would not survive reassociation, so it is a normal call,
# which LLVM inlines with its own flags.
@njit(fastmath={"contract"}, error_model="numpy", nogil=True, inline="always")
def tanh_f64(x):
    """tanh of a float64 (vectorizable; see the module docstring for accuracy)."""
    z = x * x
    small = x + x * z * (
        ((_D_TP0 * z + _D_TP1) * z + _D_TP2) / (((z + _D_TQ0) * z + _D_TQ1) * z + _D_TQ2)
    )
    a = abs(x)
    a = _D_TANH_BIG if a > _D_TANH_BIG else a  # NaN stays NaN through exp (no select of x)
    big = _D_ONE - _D_TWO / (exp_f64(a + a) + _D_ONE)
    # tanh is odd: the sign of x, -0.0 included, by bits rather than a select of x
    return np.copysign(small if a < _D_TANH_SMALL else big, x)


@njit(fastmath={"contract"}, error_model="numpy", nogil=True, inline="always")
def tanh_f32(x):
    """tanh of a float32 (vectorizable; see the module docstring for accuracy)."""
    z = x * x
    small = x + x * z * ((((_F_TP0 * z + _F_TP1) * z + _F_TP2) * z + _F_TP3) * z + _F_TP4)
    a = abs(x)
    a = _F_TANH_BIG if a > _F_TANH_BIG else a  # NaN stays NaN through exp (no select of x)
    big = _F_ONE - _F_TWO / (exp_f32(a + a) + _F_ONE)
    # tanh is odd: the sign of x, -0.0 included, by bits rather than a select of x
    return np.copysign(small if a < _F_TANH_SMALL else big, x)


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def log1p_f64(x):
    """log(1 + x) of a float64 (vectorizable; see the module docstring for accuracy)."""
    u = _D_ONE + x
    lu = log_f64(u)
    # u = 1 + x + c with c = (u - 1) - x exact; log(1 + x) = log(u) - c/u to first order
    y = lu - ((u - _D_ONE) - x) / u
    return lu if (u == _D_ZERO or u == _D_INF) else y


@njit(fastmath={"contract"}, error_model="numpy", nogil=True)
def log1p_f32(x):
    """log(1 + x) of a float32 (vectorizable; see the module docstring for accuracy)."""
    u = _F_ONE + x
    lu = log_f32(u)
    # u = 1 + x + c with c = (u - 1) - x exact; log(1 + x) = log(u) - c/u to first order
    y = lu - ((u - _F_ONE) - x) / u
    return lu if (u == _F_ZERO or u == _F_INF) else y


# Order-preserving integer keys of floats: key(a) < key(b) exactly when a < b (non-NaN; -0.0 just
# below +0.0; a positive NaN above +inf). A running max over keys is an integer max, which LLVM
# vectorizes; a float max(m, v) is a compare-and-select it keeps scalar without no-NaNs flags.
_I64_MAG = 0x7FFFFFFFFFFFFFFF


@_intrinsic
def _flip32(typingctx, b):
    """``b ^ 0x7FFFFFFF`` where the int32 ``b`` is negative, else ``b`` (an involution), typed
    int32 so that a loop of float32 keys stays 8 lanes wide on AVX2 (numba would widen the
    integer arithmetic to int64 and halve them)."""
    if b == _types.int32:

        def codegen(context, builder, sig, args):
            i32 = _llir.IntType(32)
            v = args[0]
            sign = builder.ashr(v, _llir.Constant(i32, 31))
            return builder.xor(v, builder.and_(sign, _llir.Constant(i32, 0x7FFFFFFF)))

        return _types.int32(b), codegen
    return None


@_intrinsic
def _bits32_of(typingctx, x):
    """The IEEE bits of a float32 as int32."""
    if x == _types.float32:

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], _llir.IntType(32))

        return _types.int32(x), codegen
    return None


@njit(error_model="numpy", nogil=True)
def key_f32(x):
    """Order-preserving int32 key of a float32 (see ``unkey_f32``): the sign-magnitude bits as
    a two's complement order. The max pass of a softmax over int32 keys runs 3.5x faster than
    over int64 keys (1M float32 on one AVX2 core: 0.08 vs 0.28 ms)."""
    return _flip32(_bits32_of(x))


@njit(error_model="numpy", nogil=True)
def unkey_f32(k):
    """The float32 whose ``key_f32`` is ``k``."""
    return _f32_from_bits(_flip32(k))


@njit(error_model="numpy", nogil=True)
def key_f64(x):
    """Order-preserving int64 key of a float64 (see ``unkey_f64``)."""
    b = _bits_of(x)
    return b if b >= 0 else b ^ _I64_MAG


@njit(error_model="numpy", nogil=True)
def unkey_f64(k):
    """The float64 whose ``key_f64`` is ``k``."""
    return _f64_from_bits(k if k >= 0 else k ^ _I64_MAG)


SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
NAMES = (
    "exp_f32",
    "exp_f64",
    "log_f32",
    "log_f64",
    "tanh_f32",
    "tanh_f64",
    "log1p_f32",
    "log1p_f64",
    "key_f32",
    "key_f64",
    "unkey_f32",
    "unkey_f64",
)
for _fn in (
    exp_f32,
    exp_f64,
    log_f32,
    log_f64,
    tanh_f32,
    tanh_f64,
    log1p_f32,
    log1p_f64,
    key_f32,
    key_f64,
    unkey_f32,
    unkey_f64,
):
    # compiled on a kernel's first cold compile in a process, then served from the disk cache
    numba_cache.attach(_fn, SOURCE_DIGEST)

__all__ = [
    "NAMES",
    "SOURCE_DIGEST",
    "exp_f32",
    "exp_f64",
    "key_f32",
    "key_f64",
    "log1p_f32",
    "log1p_f64",
    "log_f32",
    "log_f64",
    "tanh_f32",
    "tanh_f64",
    "unkey_f32",
    "unkey_f64",
]
