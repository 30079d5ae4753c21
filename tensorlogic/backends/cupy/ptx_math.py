"""PTX math macros (exp, log, tanh, pow) for float32 and float64.

The op table's PTX column writes ``@exp d, x`` where an op needs one of these. float32 uses the
hardware's ``ex2``/``lg2`` approximations (a few ulp); float64 has no such instructions, so it
gets range reduction plus a polynomial (about 1 ulp): exp by n = rint(x/ln2), r = x - n*ln2 and a
degree-13 Taylor polynomial, scaled by 2^n in two halves so that neither factor overflows; log
by splitting off the exponent and summing the atanh series of (m-1)/(m+1).
"""

from __future__ import annotations

import math
import struct
from typing import Callable, Protocol


class Regs(Protocol):
    """What a macro needs from the emitter: fresh registers of a PTX type."""

    def new(self, ptype: str) -> str:
        """A fresh register of ``ptype`` (f32, f64, pred, u32, s32, u64, b16)."""


def imm(value: float, ptype: str) -> str:
    """A float immediate in PTX's exact hex form (0f... for f32, 0d... for f64)."""
    if ptype == "f32":
        return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]
    return "0d%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
LN2_HI = 6.93147180369123816490e-01  # low 32 bits zero: n * LN2_HI is exact
LN2_LO = 1.90821492927058770002e-10
INF = float("inf")
NAN = float("nan")


def _exp32(r: Regs, d: str, x: str) -> list[str]:
    t = r.new("f32")
    return [f"mul.f32 {t}, {x}, {imm(LOG2E, 'f32')};", f"ex2.approx.f32 {d}, {t};"]


def _log32(r: Regs, d: str, x: str) -> list[str]:
    t = r.new("f32")
    return [f"lg2.approx.f32 {t}, {x};", f"mul.f32 {d}, {t}, {imm(LN2, 'f32')};"]


def _exp64(r: Regs, d: str, x: str) -> list[str]:
    c = lambda v: imm(v, "f64")  # noqa: E731
    xc, t, n, nn, rr, p, d0 = (r.new("f64") for _ in range(7))
    ni, n1, n2 = r.new("s32"), r.new("s32"), r.new("s32")
    w1, w2 = r.new("u64"), r.new("u64")
    s1, s2 = r.new("f64"), r.new("f64")
    pn = r.new("pred")
    out = [
        # clamp so that n fits the two-step scaling; NaN is restored at the end
        f"min.f64 {xc}, {x}, {c(1100.0)};",
        f"max.f64 {xc}, {xc}, {c(-1100.0)};",
        f"mul.f64 {t}, {xc}, {c(LOG2E)};",
        f"cvt.rni.f64.f64 {n}, {t};",
        f"neg.f64 {nn}, {n};",
        f"fma.rn.f64 {rr}, {nn}, {c(LN2_HI)}, {xc};",
        f"fma.rn.f64 {rr}, {nn}, {c(LN2_LO)}, {rr};",
        f"mov.f64 {p}, {c(1 / math.factorial(13))};",
    ]
    for k in range(12, -1, -1):
        out.append(f"fma.rn.f64 {p}, {p}, {rr}, {c(1 / math.factorial(k))};")
    out += [
        f"cvt.rni.s32.f64 {ni}, {n};",
        f"shr.s32 {n1}, {ni}, 1;",
        f"sub.s32 {n2}, {ni}, {n1};",
        f"add.s32 {n1}, {n1}, 1023;",
        f"add.s32 {n2}, {n2}, 1023;",
        f"cvt.u64.s32 {w1}, {n1};",
        f"cvt.u64.s32 {w2}, {n2};",
        f"shl.b64 {w1}, {w1}, 52;",
        f"shl.b64 {w2}, {w2}, 52;",
        f"mov.b64 {s1}, {w1};",
        f"mov.b64 {s2}, {w2};",
        f"mul.f64 {d0}, {p}, {s1};",
        f"mul.f64 {d0}, {d0}, {s2};",
        f"setp.nan.f64 {pn}, {x}, {x};",
        f"selp.f64 {d}, {x}, {d0}, {pn};",
    ]
    return out


def _log64(r: Regs, d: str, x: str) -> list[str]:
    c = lambda v: imm(v, "f64")  # noqa: E731
    ps, pb, pz, pneg, pinf, pnan = (r.new("pred") for _ in range(6))
    sc, xs, m, mh, nm, dm, s, s2, q, lm, ef, res = (r.new("f64") for _ in range(12))
    ea, e32, e, one = (r.new("s32") for _ in range(4))
    bits, eb, mb = r.new("u64"), r.new("u64"), r.new("u64")
    out = [
        # subnormals: scale by 2^54 first so the exponent field is meaningful
        f"setp.lt.f64 {ps}, {x}, {c(2.0**-1022)};",
        f"selp.f64 {sc}, {c(2.0**54)}, {c(1.0)}, {ps};",
        f"mul.f64 {xs}, {x}, {sc};",
        f"selp.s32 {ea}, -54, 0, {ps};",
        f"mov.b64 {bits}, {xs};",
        f"shr.u64 {eb}, {bits}, 52;",
        f"cvt.u32.u64 {e32}, {eb};",
        f"and.b32 {e32}, {e32}, 2047;",
        f"sub.s32 {e}, {e32}, 1023;",
        f"add.s32 {e}, {e}, {ea};",
        f"and.b64 {mb}, {bits}, 4503599627370495;",
        f"or.b64 {mb}, {mb}, 4607182418800017408;",
        f"mov.b64 {m}, {mb};",
        # m in [1, 2) -> [sqrt(1/2), sqrt(2)) keeps s = (m-1)/(m+1) under 0.172
        f"setp.gt.f64 {pb}, {m}, {c(math.sqrt(2.0))};",
        f"mul.f64 {mh}, {m}, {c(0.5)};",
        f"selp.f64 {m}, {mh}, {m}, {pb};",
        f"selp.s32 {one}, 1, 0, {pb};",
        f"add.s32 {e}, {e}, {one};",
        f"sub.f64 {nm}, {m}, {c(1.0)};",
        f"add.f64 {dm}, {m}, {c(1.0)};",
        f"div.rn.f64 {s}, {nm}, {dm};",
        f"mul.f64 {s2}, {s}, {s};",
        f"mov.f64 {q}, {c(1 / 23)};",
    ]
    for k in range(21, 0, -2):
        out.append(f"fma.rn.f64 {q}, {q}, {s2}, {c(1 / k)};")
    out += [
        f"mul.f64 {lm}, {s}, {q};",
        f"add.f64 {lm}, {lm}, {lm};",
        f"cvt.rn.f64.s32 {ef}, {e};",
        f"fma.rn.f64 {lm}, {ef}, {c(LN2_LO)}, {lm};",
        f"fma.rn.f64 {res}, {ef}, {c(LN2_HI)}, {lm};",
        f"setp.eq.f64 {pz}, {x}, {c(0.0)};",
        f"selp.f64 {res}, {c(-INF)}, {res}, {pz};",
        f"setp.lt.f64 {pneg}, {x}, {c(0.0)};",
        f"selp.f64 {res}, {c(NAN)}, {res}, {pneg};",
        f"setp.eq.f64 {pinf}, {x}, {c(INF)};",
        f"selp.f64 {res}, {c(INF)}, {res}, {pinf};",
        f"setp.nan.f64 {pnan}, {x}, {x};",
        f"selp.f64 {d}, {x}, {res}, {pnan};",
    ]
    return out


def _tanh(ptype: str, exp: Callable) -> Callable:
    def tanh(r: Regs, d: str, x: str) -> list[str]:
        # tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|) in (0, 1]: never overflows
        a, t, e, n, m, y = (r.new(ptype) for _ in range(6))
        return [
            f"abs.{ptype} {a}, {x};",
            f"mul.{ptype} {t}, {a}, {imm(-2.0, ptype)};",
            *exp(r, e, t),
            f"sub.{ptype} {n}, {imm(1.0, ptype)}, {e};",
            f"add.{ptype} {m}, {imm(1.0, ptype)}, {e};",
            f"div.rn.{ptype} {y}, {n}, {m};",
            f"copysign.{ptype} {d}, {x}, {y};",
        ]

    return tanh


def _pow(ptype: str, exp: Callable, log: Callable) -> Callable:
    def pow_(r: Regs, d: str, a: str, b: str) -> list[str]:
        c = lambda v: imm(v, ptype)  # noqa: E731
        aa, lg, res, bi, h, hi, nres = (r.new(ptype) for _ in range(7))
        isint, odd, neg, p1, p2, p3, p4 = (r.new("pred") for _ in range(7))
        return [
            f"abs.{ptype} {aa}, {a};",
            *log(r, lg, aa),
            f"mul.{ptype} {lg}, {lg}, {b};",
            *exp(r, res, lg),
            # negative base: odd integer exponent flips the sign, a non-integer one gives NaN
            f"cvt.rzi.{ptype}.{ptype} {bi}, {b};",
            f"setp.eq.{ptype} {isint}, {bi}, {b};",
            f"mul.{ptype} {h}, {b}, {c(0.5)};",
            f"cvt.rzi.{ptype}.{ptype} {hi}, {h};",
            f"setp.neu.{ptype} {odd}, {hi}, {h};",
            f"and.pred {odd}, {odd}, {isint};",
            f"setp.lt.{ptype} {neg}, {a}, {c(0.0)};",
            f"and.pred {p1}, {neg}, {odd};",
            f"neg.{ptype} {nres}, {res};",
            f"selp.{ptype} {res}, {nres}, {res}, {p1};",
            f"not.pred {p2}, {isint};",
            f"and.pred {p2}, {p2}, {neg};",
            f"selp.{ptype} {res}, {c(NAN)}, {res}, {p2};",
            # x**0 == 1 and 1**y == 1, even for NaN
            f"setp.eq.{ptype} {p3}, {b}, {c(0.0)};",
            f"setp.eq.{ptype} {p4}, {a}, {c(1.0)};",
            f"or.pred {p3}, {p3}, {p4};",
            f"selp.{ptype} {d}, {c(1.0)}, {res}, {p3};",
        ]

    return pow_


MACROS: dict[str, dict[str, Callable[..., list[str]]]] = {
    "f32": {
        "exp": _exp32,
        "log": _log32,
        "tanh": _tanh("f32", _exp32),
        "pow": _pow("f32", _exp32, _log32),
    },
    "f64": {
        "exp": _exp64,
        "log": _log64,
        "tanh": _tanh("f64", _exp64),
        "pow": _pow("f64", _exp64, _log64),
    },
}
