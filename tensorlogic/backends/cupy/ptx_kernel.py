"""The PTX kernel builder: virtual registers, op templates, loads/stores and index arithmetic.

Registers are named by class (%f f32, %fd f64, %r 32-bit integers, %rd 64-bit integers, %h 16-bit,
%p predicates) and numbered in order of use. Op semantics come from ``ops.PTX`` (one instruction
sequence per op) and the math macros of ``ptx_math``. The kernel families are built on it in
``ptx`` (elementwise, the entry point) and ``ptx_rows`` (reductions and row ops).
"""

from __future__ import annotations

from typing import Sequence

from ...ir import ops
from . import ptx_math
from .spec import ITEMSIZE, KernelSpec

PTX_VERSION = "8.0"
PTYPE = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
# 16-bit floats move through .b16 registers and are converted to and from the compute type
_HALF_PT = ("f16", "bf16")
_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
_PREFIX = {
    "f32": "%f",
    "f64": "%fd",
    "pred": "%p",
    "u32": "%r",
    "s32": "%r",
    "b32": "%r",
    "u64": "%rd",
    "s64": "%rd",
    "b64": "%rd",
    "b16": "%h",
}
_DECL = {"%f": ".f32", "%fd": ".f64", "%p": ".pred", "%r": ".b32", "%rd": ".b64", "%h": ".b16"}

# reduction tails of the table (ops.REDUCTION_TABLE): (combine instruction, identity); the
# combine kinds are PTX's own mnemonics
_COMBINE = {n: (r.combine, r.identity) for n, r in ops.REDUCTION_TABLE.items() if r.combine}


class _Regs:
    """Allocates systematically named virtual registers."""

    def __init__(self) -> None:
        self.count = {p: 0 for p in _DECL}

    def new(self, ptype: str) -> str:
        pre = _PREFIX[ptype]
        self.count[pre] += 1
        return f"{pre}{self.count[pre]}"

    def decls(self) -> list[str]:
        return [f"  .reg {_DECL[p]} {p}<{n + 1}>;" for p, n in self.count.items() if n]


class _Imm:
    """``{c:0.5}`` in an op template: the immediate 0.5 of the compute type."""

    def __init__(self, ptype: str) -> None:
        self.ptype = ptype

    def __format__(self, spec: str) -> str:
        return ptx_math.imm(float(spec), self.ptype)


class _Fields(dict):
    """Template fields; ``{t0}``.. and ``{p0}``.. allocate fresh registers on first use."""

    def __init__(self, regs: _Regs, ptype: str, **given: str) -> None:
        super().__init__(given, T=ptype, c=_Imm(ptype))
        self.regs, self.ptype = regs, ptype

    def __missing__(self, key: str) -> str:
        if key[0] == "t":
            self[key] = self.regs.new(self.ptype)
        elif key[0] == "p":
            self[key] = self.regs.new("pred")
        else:
            raise KeyError(key)
        return self[key]


class _Kernel:
    """One kernel under construction: registers, body lines, labels."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.regs = _Regs()
        self.body: list[str] = []
        self.ct = PTYPE[spec.compute]
        self.it = "u64" if spec.wide else "u32"
        self.labels = 0

    def emit(self, *lines: str) -> None:
        self.body.extend("  " + ln if not ln.startswith("$") else ln for ln in lines)

    def label(self, stem: str) -> str:
        self.labels += 1
        return f"$L_{stem}_{self.labels}"

    def new(self, ptype: str) -> str:
        return self.regs.new(ptype)

    # -------------------------------------------------------------- the elementwise program
    def op(self, name: str, args: Sequence[str]) -> str:
        d = self.new(self.ct)
        names = ops.ELEMENTWISE[name].operands
        fields = _Fields(self.regs, self.ct, d=d, **dict(zip(names, args)))
        for tmpl in ops.PTX[name]:
            line = tmpl.format_map(fields)
            if line.startswith("@"):
                macro, rest = line[1:].split(" ", 1)
                regs = [a.strip() for a in rest.rstrip(";").split(",")]
                self.emit(*ptx_math.MACROS[self.ct][macro](self.regs, *regs))
            else:
                self.emit(line)
        return d

    def load(self, ptr: str, off: str, dtype: str) -> str:
        """Load element ``off`` of a global array and convert it to the compute type."""
        addr = self.address(ptr, off, ITEMSIZE[dtype])
        pt = PTYPE[dtype]
        if pt == self.ct:
            v = self.new(self.ct)
            self.emit(f"ld.global.nc.{pt} {v}, [{addr}];")
            return v
        raw = self.new("b16" if pt in _HALF_PT else pt)
        self.emit(f"ld.global.nc.{'b16' if pt in _HALF_PT else pt} {raw}, [{addr}];")
        return self.convert(raw, pt)

    def convert(self, raw: str, pt: str) -> str:
        """A value of PTX type ``pt`` converted to the compute type."""
        if pt == "bf16" and self.ct == "f64":  # cvt.f64.bf16 needs sm_90: widen through f32
            mid = self.new("f32")
            self.emit(f"cvt.f32.bf16 {mid}, {raw};")
            raw, pt = mid, "f32"
        v = self.new(self.ct)
        rnd = ".rn" if _BITS[pt] > _BITS[self.ct] else ""
        self.emit(f"cvt{rnd}.{self.ct}.{pt} {v}, {raw};")
        return v

    def store(self, ptr: str, off: str, v: str) -> None:
        dtype = self.spec.dtype
        addr = self.address(ptr, off, ITEMSIZE[dtype])
        pt = PTYPE[dtype]
        if pt == self.ct:
            self.emit(f"st.global.{pt} [{addr}], {v};")
            return
        raw = self.new("b16" if pt in _HALF_PT else pt)
        self.emit(
            f"cvt.rn.{pt}.{self.ct} {raw}, {v};",
            f"st.global.{'b16' if pt in _HALF_PT else pt} [{addr}], {raw};",
        )

    def vload(self, addr: str, dtype: str, w: int) -> list[str]:
        """``w`` consecutive elements (16 bytes at ``addr``) in compute-type registers; 16-bit
        values come as 32-bit words of two (the lower half is the first element)."""
        pt = PTYPE[dtype]
        if pt == self.ct:
            regs = [self.new(self.ct) for _ in range(w)]
            self.emit(f"ld.global.nc.v{w}.{pt} {{{', '.join(regs)}}}, [{addr}];")
            return regs
        words = [self.new("b32") for _ in range(w // 2)]
        self.emit(f"ld.global.nc.v{w // 2}.b32 {{{', '.join(words)}}}, [{addr}];")
        out = []
        for r in words:
            lo, hi = self.new("b16"), self.new("b16")
            self.emit(f"mov.b32 {{{lo}, {hi}}}, {r};")
            out += [self.convert(lo, pt), self.convert(hi, pt)]
        return out

    def vstore(self, addr: str, values: Sequence[str]) -> None:
        """Store compute-type ``values`` as consecutive elements of the output (16 bytes)."""
        pt = PTYPE[self.spec.dtype]
        if pt == self.ct:
            self.emit(f"st.global.v{len(values)}.{pt} [{addr}], {{{', '.join(values)}}};")
            return
        words = []
        for lo, hi in zip(values[0::2], values[1::2]):
            h = [self.new("b16"), self.new("b16")]
            r = self.new("b32")
            self.emit(
                f"cvt.rn.{pt}.{self.ct} {h[0]}, {lo};",
                f"cvt.rn.{pt}.{self.ct} {h[1]}, {hi};",
                f"mov.b32 {r}, {{{h[0]}, {h[1]}}};",
            )
            words.append(r)
        self.emit(f"st.global.v{len(words)}.b32 [{addr}], {{{', '.join(words)}}};")

    def address(self, ptr: str, off: str | None, size: int) -> str:
        if off is None:  # a broadcast scalar: element 0
            return ptr
        a = self.new("u64")
        if self.it == "u32":
            self.emit(f"mul.wide.u32 {a}, {off}, {size};")
        else:
            self.emit(f"mul.lo.u64 {a}, {off}, {size};")
        self.emit(f"add.s64 {a}, {ptr}, {a};")
        return a

    def program(
        self,
        ptrs: Sequence[str],
        offs: Sequence[str | None],
        preloaded: dict[int, str] | None = None,
        tail: str | None = None,
    ) -> str:
        """Evaluate the spec's program at the given per-input element offsets; with ``tail``
        (the row op's value there), evaluate its epilogue instead."""
        spec = self.spec
        loaded: dict[int, str] = dict(preloaded or {})

        def ref(r) -> str:
            kind, v = r
            if kind == "in":
                if v not in loaded:
                    loaded[v] = self.load(ptrs[v], offs[v], spec.in_dtypes[v])
                return loaded[v]
            if kind == "tmp":
                return tmps[v]
            if kind == "tail":
                return tail
            reg = self.new(self.ct)
            self.emit(f"mov.{self.ct} {reg}, {ptx_math.imm(float(v), self.ct)};")
            return reg

        tmps: list[str] = []
        for ins in spec.instrs if tail is None else spec.epilogue:
            tmps.append(self.op(ins.op, [ref(a) for a in ins.args]))
        return ref(spec.result) if tail is None else tmps[-1]

    def finish(self, v: str, ptrs: Sequence[str], offs: Sequence[str | None]) -> str:
        """The value to store for the row op's value ``v`` at ``offs``: the epilogue's result
        (its inputs loaded there), or ``v`` itself without an epilogue."""
        if not self.spec.epilogue:
            return v
        return self.program(ptrs, offs, tail=v)

    # -------------------------------------------------------------- index arithmetic
    def offsets(self, group, idx: str) -> list[str | None]:
        """Per-input element offsets of the point ``idx`` of a group (None: offset 0)."""
        n = self.spec.n_inputs
        it = self.it
        if not group:
            return [None] * n
        offs: list[str | None] = [None] * n
        q = idx
        for j, dim in enumerate(reversed(group)):
            last = j == len(group) - 1
            if last:
                pos = q
            else:
                pos, nq = self.new(it), self.new(it)
                self.emit(f"rem.{it} {pos}, {q}, {dim.size};", f"div.{it} {nq}, {q}, {dim.size};")
                q = nq
            for k, st in enumerate(dim.strides):
                if st == 0:
                    continue
                if offs[k] is None:
                    if st == 1:
                        offs[k] = pos
                    else:
                        o = self.new(it)
                        self.emit(f"mul.lo.{it} {o}, {pos}, {st};")
                        offs[k] = o
                else:
                    o = self.new(it)
                    self.emit(f"mad.lo.{it} {o}, {pos}, {st}, {offs[k]};")
                    offs[k] = o
        return offs

    def add_offsets(self, a: list[str | None], b: list[str | None]) -> list[str | None]:
        out: list[str | None] = []
        for x, y in zip(a, b):
            if x is None or y is None:
                out.append(y if x is None else x)
            else:
                o = self.new(self.it)
                self.emit(f"add.{self.it} {o}, {x}, {y};")
                out.append(o)
        return out

    def zero_offsets(self, offs: list[str | None]) -> list[str]:
        out = []
        for o in offs:
            if o is None:
                z = self.new(self.it)
                self.emit(f"mov.{self.it} {z}, 0;")
                o = z
            out.append(o)
        return out

    def global_index(self) -> tuple[str, str]:
        """(first index, grid stride) of this thread, in the index type."""
        c, n, t, g = (self.new("u32") for _ in range(4))
        self.emit(
            f"mov.u32 {c}, %ctaid.x;",
            f"mov.u32 {n}, %ntid.x;",
            f"mov.u32 {t}, %tid.x;",
            f"mov.u32 {g}, %nctaid.x;",
        )
        if self.it == "u32":
            i, s = self.new("u32"), self.new("u32")
            self.emit(f"mad.lo.u32 {i}, {c}, {n}, {t};", f"mul.lo.u32 {s}, {n}, {g};")
        else:
            i, s, t64 = self.new("u64"), self.new("u64"), self.new("u64")
            self.emit(
                f"mul.wide.u32 {i}, {c}, {n};",
                f"cvt.u64.u32 {t64}, {t};",
                f"add.u64 {i}, {i}, {t64};",
                f"mul.wide.u32 {s}, {n}, {g};",
            )
        return i, s

    def combine(self, tail: str, acc: str, v: str) -> str:
        """acc (+) v; max/min propagate a NaN operand like numpy (PTX max/min drop it)."""
        d = self.new(self.ct)
        op = _COMBINE[tail][0]
        if op not in ("max", "min"):
            self.emit(f"{op}.{self.ct} {d}, {acc}, {v};")
            return d
        m, s, p = self.new(self.ct), self.new(self.ct), self.new("pred")
        self.emit(
            f"{op}.{self.ct} {m}, {acc}, {v};",
            f"setp.nan.{self.ct} {p}, {acc}, {v};",
            f"add.{self.ct} {s}, {acc}, {v};",
            f"selp.{self.ct} {d}, {s}, {m}, {p};",
        )
        return d

    def const(self, v: float) -> str:
        reg = self.new(self.ct)
        self.emit(f"mov.{self.ct} {reg}, {ptx_math.imm(v, self.ct)};")
        return reg

    def macro(self, name: str, *args: str) -> str:
        d = self.new(self.ct)
        self.emit(*ptx_math.MACROS[self.ct][name](self.regs, d, *args))
        return d


def _params(name: str, n_inputs: int) -> tuple[list[str], list[str]]:
    params = [f".param .u64 {name}_param_{k}" for k in range(n_inputs + 1)]
    return params, [f"{name}_param_{k}" for k in range(n_inputs + 1)]


def _pointers(k: _Kernel, pnames: list[str]) -> list[str]:
    ptrs = []
    for p in pnames:
        r = k.new("u64")
        k.emit(f"ld.param.u64 {r}, [{p}];", f"cvta.to.global.u64 {r}, {r};")
        ptrs.append(r)
    return ptrs
