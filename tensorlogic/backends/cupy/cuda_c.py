"""The CUDA C renderer: the same KernelSpec as the PTX emitter, as CUDA C for NVRTC.

Op semantics come from the op table's CUDA C column; the kernel skeletons (grid-stride loops,
block-per-row reductions with warp shuffles) mirror ``ptx`` so the two paths cross-check each
other. The source needs no headers: float16 and bfloat16 move through inline PTX conversions.
"""

from __future__ import annotations

import math
import struct
from typing import Sequence

from ...errors import BackendError
from ...ir import ops
from .spec import SPLIT_THREADS, KernelSpec, RowLayout, row_block, row_layout, row_width

CTYPE = {
    "float32": "float",
    "float64": "double",
    "float16": "unsigned short",
    "bfloat16": "unsigned short",
    "bool": "bool",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "complex64": "tl_c64",
    "complex128": "tl_c128",
}
_INTS = ("int", "long long", "unsigned int", "unsigned long long")  # integer compute types
_COMPLEX = ("tl_c64", "tl_c128")
# (smallest, largest) value of each integer compute type: the identities of max and min
_INT_LIMITS = {
    "int": ("(-2147483647 - 1)", "2147483647"),
    "long long": ("(-9223372036854775807LL - 1)", "9223372036854775807LL"),
    "unsigned int": ("0u", "4294967295u"),
    "unsigned long long": ("0ull", "18446744073709551615ull"),
}
# Ops the integer and bool kernels compute exactly (as numpy's loop of the stored type: ring
# operations wrap, comparisons and selections are exact); abs, relu, maximum and minimum take
# the op table's integer column (``ops.CUDA_INT``). Integer pow and reciprocal are left to
# CuPy's own loops (see ``generates``).
INT_OPS = ops.INTEGER_EXACT
# Ops the complex kernels compute (``COMPLEX_PRELUDE``: numpy's algorithms for division, exp and
# log); sqrt, tanh and the float-valued abs are left to CuPy's loops.
COMPLEX_OPS = frozenset(
    {
        "neg",
        "add",
        "sub",
        "mul",
        "div",
        "square",
        "reciprocal",
        "one_minus",
        "exp",
        "log",
        "eq",
        "ne",
        "where",
    }
)
# reductions of integer (sum, prod, max, min) and complex (sum, prod, mean) compute types
INT_TAILS = frozenset({"sum", "prod", "max", "min"})
COMPLEX_TAILS = frozenset({"sum", "prod", "mean"})
# 16-bit storage: (load conversion to float, store conversion from float)
# 16-bit storage: (load to float, store from float) helpers, defined by HALF_PRELUDE
HALF_CONV = {"float16": ("tl_h2f", "tl_f2h"), "bfloat16": ("tl_bf2f", "tl_f2bf")}
VTYPE = {("float", 4): "float4", ("double", 2): "double2"}
_LANES = "xyzw"

HALF_PRELUDE = r"""
__device__ __forceinline__ float tl_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short tl_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float tl_bf2f(unsigned short h) {
  float f; asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short tl_f2bf(float f) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
"""
# complex64/complex128 as a pair of floats (numpy's layout), with numpy's arithmetic: Smith's
# division as numpy's loops do it, exp and log as npy_cexp/npy_clog for finite values. Operators
# are hidden friends so that a bool or a real converts implicitly (where's condition, literals).
COMPLEX_PRELUDE = r"""
template <typename R> struct tl_complex {
  R x, y;
  tl_complex() = default;
  __device__ __forceinline__ tl_complex(R r, R i = R(0)) : x(r), y(i) {}
  template <typename S> __device__ __forceinline__ explicit tl_complex(tl_complex<S> o)
      : x(R(o.x)), y(R(o.y)) {}
  friend __device__ __forceinline__ tl_complex operator+(tl_complex a, tl_complex b) {
    return tl_complex(a.x + b.x, a.y + b.y); }
  friend __device__ __forceinline__ tl_complex operator-(tl_complex a, tl_complex b) {
    return tl_complex(a.x - b.x, a.y - b.y); }
  friend __device__ __forceinline__ tl_complex operator-(tl_complex a) {
    return tl_complex(-a.x, -a.y); }
  friend __device__ __forceinline__ tl_complex operator*(tl_complex a, tl_complex b) {
    return tl_complex(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }
  friend __device__ __forceinline__ tl_complex operator/(tl_complex a, tl_complex b) {
    const R br = fabs(b.x), bi = fabs(b.y);
    if (br >= bi) {
      if (br == R(0) && bi == R(0)) return tl_complex(a.x / br, a.y / br);
      const R rat = b.y / b.x, scl = R(1) / (b.x + b.y * rat);
      return tl_complex((a.x + a.y * rat) * scl, (a.y - a.x * rat) * scl);
    }
    const R rat = b.x / b.y, scl = R(1) / (b.y + b.x * rat);
    return tl_complex((a.x * rat + a.y) * scl, (a.y * rat - a.x) * scl); }
  friend __device__ __forceinline__ bool operator==(tl_complex a, tl_complex b) {
    return a.x == b.x && a.y == b.y; }
  friend __device__ __forceinline__ bool operator!=(tl_complex a, tl_complex b) {
    return !(a == b); }
};
typedef tl_complex<float> tl_c64;
typedef tl_complex<double> tl_c128;
template <typename R> __device__ __forceinline__ tl_complex<R> exp(tl_complex<R> z) {
  const R e = exp(z.x);
  return z.y == R(0) ? tl_complex<R>(e, z.y) : tl_complex<R>(e * cos(z.y), e * sin(z.y)); }
template <typename R> __device__ __forceinline__ tl_complex<R> log(tl_complex<R> z) {
  return tl_complex<R>(log(hypot(z.x, z.y)), atan2(z.y, z.x)); }
template <typename T> __device__ __forceinline__ T tl_shfl(T v, int m) {
  return __shfl_xor_sync(0xffffffffu, v, m); }
template <typename R> __device__ __forceinline__ tl_complex<R> tl_shfl(tl_complex<R> v, int m) {
  return tl_complex<R>(__shfl_xor_sync(0xffffffffu, v.x, m),
                       __shfl_xor_sync(0xffffffffu, v.y, m)); }
"""
_PRELUDE = (
    HALF_PRELUDE
    + r"""template <typename T> __device__ __forceinline__ T tl_max(T a, T b) {
  return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T tl_min(T a, T b) {
  return (a < b || a != a) ? a : b; }
"""
)

# the reductions of the table (ops.REDUCTION_TABLE), rendered; NaN wins in max/min, like numpy
_C_COMBINE = {
    "add": "({a} + {b})",
    "mul": "({a} * {b})",
    "max": "tl_max({a}, {b})",
    "min": "tl_min({a}, {b})",
}
_COMBINE = {n: _C_COMBINE[r.combine] for n, r in ops.REDUCTION_TABLE.items() if r.combine}
_IDENT = {n: r.identity for n, r in ops.REDUCTION_TABLE.items() if r.combine}


def literal(v: float, ct: str) -> str:
    """An exact C literal of ``v`` in the compute type (bit patterns for inf and NaN; for an
    integer type, -inf and inf are its smallest and largest value)."""
    if ct in _INTS:
        if math.isinf(v):
            return _INT_LIMITS[ct][v > 0]
        return f"(({ct}){int(v)})"
    if ct in _COMPLEX:
        real = "float" if ct == "tl_c64" else "double"
        return f"{ct}({literal(v, real)}, {literal(0.0, real)})"
    if ct == "float":
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        return f"__int_as_float(0x{bits:08x})"
    bits = struct.unpack("<Q", struct.pack("<d", v))[0]
    return f"__longlong_as_double(0x{bits:016x}LL)"


class _Src:
    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.lines: list[str] = []
        self.n = 0
        self.ct = CTYPE[spec.compute]
        self.it = "unsigned long long" if spec.wide else "unsigned int"

    def shfl(self, v: str) -> str:
        """``v`` of the lane ``m`` lanes across (a complex value moves as its two parts)."""
        if self.ct in _COMPLEX:
            return f"tl_shfl({v}, m)"
        return f"__shfl_xor_sync(0xffffffffu, {v}, m)"

    def var(self, stem: str) -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def emit(self, line: str, depth: int = 1) -> None:
        self.lines.append("  " * depth + line)

    def load(self, k: int, off: str | None) -> str:
        dt = self.spec.in_dtypes[k]
        e = f"in{k}[{off or 0}]"
        if dt in HALF_CONV:  # float, then the compute type (a no-op cast for float)
            return f"(({self.ct}){HALF_CONV[dt][0]}({e}))"
        return e if CTYPE[dt] == self.ct else f"(({self.ct}){e})"

    def load_own(self, k: int, off: str | None) -> str:
        """Input k in its own dtype, as a nonzero test (where's condition: a truth value)."""
        dt = self.spec.in_dtypes[k]
        e = f"in{k}[{off or 0}]"
        if dt in HALF_CONV:
            return f"({HALF_CONV[dt][0]}({e}) != 0.0f)"
        return f"({e} != 0)"

    def op_expr(self, op: str, args: Sequence[str]) -> str:
        """C expression of elementwise ``op`` over ``args`` in the compute type."""
        row = ops.ELEMENTWISE[op]
        template = ops.CUDA_INT.get(op, row.cuda) if self.ct in _INTS else row.cuda
        return template.format(T=self.ct, **dict(zip(row.operands, args)))

    def store_expr(self, v: str) -> str:
        dt = self.spec.dtype
        if dt in HALF_CONV:  # 16-bit results always compute in float
            return f"{HALF_CONV[dt][1]}({v})"
        if dt == "bool":  # nonzero, as numpy's cast to bool (a complex value too)
            return f"({v} != ({self.ct})0)"
        return f"(({CTYPE[dt]}){v})"

    def program(
        self,
        offs: Sequence[str | None],
        depth: int,
        given: dict[int, str] | None = None,
        tail: str | None = None,
    ) -> str:
        """The program's value at ``offs``; with ``tail`` (the row op's value), the epilogue's."""
        spec = self.spec
        vals: dict[tuple, str] = {("in", k): v for k, v in (given or {}).items()}

        def ref(r) -> str:
            if r[0] == "in":
                key = r
                if key not in vals:
                    v = self.var("x")
                    self.emit(f"const {self.ct} {v} = {self.load(r[1], offs[r[1]])};", depth)
                    vals[key] = v
                return vals[key]
            if r[0] == "tmp":
                return tmps[r[1]]
            if r[0] == "tail":
                return tail
            return literal(float(r[1]), self.ct)

        def own(r) -> str:
            # an operand read in its own dtype (where's condition), once per point
            key = ("own", r[1])
            if key not in vals:
                if r in vals:  # given (vector lanes, row invariants): float32/64 kernels only
                    vals[key] = f"({vals[r]} != 0)"
                else:
                    v = self.var("c")
                    self.emit(f"const bool {v} = {self.load_own(r[1], offs[r[1]])};", depth)
                    vals[key] = v
            return vals[key]

        tmps: list[str] = []
        for ins in spec.instrs if tail is None else spec.epilogue:
            keep = ops.ELEMENTWISE[ins.op].own_dtype
            args = [
                own(a) if j in keep and a[0] == "in" else ref(a) for j, a in enumerate(ins.args)
            ]
            expr = self.op_expr(ins.op, args)
            t = self.var("t")
            self.emit(f"const {self.ct} {t} = {expr};", depth)
            tmps.append(t)
        return ref(spec.result) if tail is None else tmps[-1]

    def finish(self, expr: str, offs: Sequence[str | None], depth: int) -> str:
        """The value to store for the row op's value ``expr`` at ``offs`` (epilogue applied)."""
        if not self.spec.epilogue:
            return expr
        y = self.var("y")
        self.emit(f"const {self.ct} {y} = {expr};", depth)
        return self.program(offs, depth, tail=y)

    def offsets(self, group, idx: str, depth: int) -> list[str | None]:
        offs: list[str | None] = [None] * self.spec.n_inputs
        if not group:
            return offs
        q = idx
        for j, dim in enumerate(reversed(group)):
            if j == len(group) - 1:
                pos = q
            else:
                pos, nq = self.var("pos"), self.var("q")
                self.emit(
                    f"const {self.it} {pos} = {q} % {dim.size}u, {nq} = {q} / {dim.size}u;", depth
                )
                q = nq
            for k, st in enumerate(dim.strides):
                if st:
                    term = pos if st == 1 else f"{pos} * {st}u"
                    offs[k] = term if offs[k] is None else f"{offs[k]} + {term}"
        out: list[str | None] = []
        for o in offs:
            if o is None:
                out.append(None)
            else:
                v = self.var("off")
                self.emit(f"const {self.it} {v} = {o};", depth)
                out.append(v)
        return out

    @staticmethod
    def add(a: list[str | None], b: list[str | None]) -> list[str | None]:
        return [y if x is None else x if y is None else f"({x} + {y})" for x, y in zip(a, b)]


def _no_element(name: str) -> str:
    raise BackendError(f"row program: {name!r} is not a scalar here")


def _expr(s: _Src, e, scal: dict[str, str], elem) -> str:
    """C expression of a row-program expression (``ops.RowStep``): scalars from ``scal``,
    per-element values (``x`` and the maps) from ``elem(name)``, ops from the op table."""
    if isinstance(e, str):
        if e in scal:
            return scal[e]
        if e == "inv_n":
            return literal(1.0 / s.spec.sizes[1], s.ct)
        if e == "eps":
            return literal(s.spec.eps, s.ct)
        return elem(e)
    if isinstance(e, (int, float)):
        return literal(float(e), s.ct)
    op, *args = e
    return s.op_expr(op, [_expr(s, a, scal, elem) for a in args])


def _let(s: _Src, scal: dict[str, str], name: str, expr, depth: int) -> None:
    var = s.var(name)
    s.emit(f"const {s.ct} {var} = {_expr(s, expr, scal, _no_element)};", depth)
    scal[name] = var


def _tail(s: _Src, run_pass, finish, write_row, depth: int) -> None:
    """The tail's row program rendered as passes over the row (row and col kernels): each
    reduce is a pass, maps are recomputed (inline) where they are used."""
    scal: dict[str, str] = {}
    maps: dict[str, object] = {}

    def at(v: str):
        def elem(name: str) -> str:
            return v if name == "x" else f"({_expr(s, maps[name], scal, elem)})"

        return elem

    for st in ops.ROW_PROGRAMS[s.spec.tail]:
        if st.kind == "reduce":
            scal[st.name] = run_pass(st.combine, lambda v, e=st.expr: _expr(s, e, scal, at(v)))
        elif st.kind == "let":
            _let(s, scal, st.name, st.expr, depth)
        elif st.kind == "map":
            maps[st.name] = st.expr
        elif st.kind == "write":
            write_row(lambda v, e=st.expr: _expr(s, e, scal, at(v)))
        else:
            finish(_expr(s, st.expr, scal, _no_element))


def _ew(s: _Src) -> None:
    spec, it = s.spec, s.it
    s.emit(
        f"for ({it} i = ({it})blockIdx.x * blockDim.x + threadIdx.x; i < {spec.total}u; "
        f"i += ({it})blockDim.x * gridDim.x) {{"
    )
    offs = s.offsets(spec.groups[0], "i", 2)
    v = s.program(offs, 2)
    s.emit(f"out[i] = {s.store_expr(v)};", 2)
    s.emit("}")


def _allreduce(s: _Src, tail: str, acc: str, threads: int, depth: int) -> None:
    """Reduce ``acc`` over the row's lanes (warp shuffles, then shared memory); all get it."""
    s.emit(
        f"for (int m = 16; m > 0; m >>= 1) {acc} = {_COMBINE[tail].format(a=acc, b=s.shfl(acc))};",
        depth,
    )
    if threads > 32:
        s.emit(f"if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = {acc};", depth)
        s.emit("__syncthreads();", depth)
        s.emit(f"{acc} = smem[0];", depth)
        s.emit(
            f"for (int w = 1; w < {threads // 32}; ++w) "
            f"{acc} = {_COMBINE[tail].format(a=acc, b='smem[w]')};",
            depth,
        )
        s.emit("__syncthreads();", depth)


class _Chunks:
    """Program values of a row chunk: scalar, or 16-byte vector loads of inputs contiguous along
    the row with row-invariant inputs read once (mirrors ptx_rows._RowValues)."""

    def __init__(self, s: _Src, base: list[str | None], width: int, depth: int) -> None:
        self.s, self.base, self.width = s, base, width
        spec = s.spec
        gr = spec.groups[1]
        self.along = [gr[0].strides[k] if gr else 0 for k in range(spec.n_inputs)]
        self.pre: dict[int, str] = {}
        self.epre: dict[int, str] = {}
        if width > 1:
            # row-invariant operands once per row: the program's, then the epilogue's
            for k in sorted(spec.prologue_inputs() | spec.epilogue_inputs()):
                if self.along[k] == 0:
                    v = s.var("p")
                    s.emit(f"const {s.ct} {v} = {s.load(k, base[k])};", depth)
                    if k in spec.prologue_inputs():
                        self.pre[k] = v
                    if k in spec.epilogue_inputs():
                        self.epre[k] = v

    def values(self, c: str, depth: int) -> list[str]:
        """Program values of the ``width`` elements of chunk ``c``."""
        return self._values(c, depth, None)

    def finish(self, c: str, depth: int, tails: list[str]) -> list[str]:
        """Values to store for the row op's values ``tails`` of chunk ``c`` (epilogue applied)."""
        if not self.s.spec.epilogue:
            return tails
        ys = []
        for t in tails:
            y = self.s.var("y")
            self.s.emit(f"const {self.s.ct} {y} = {t};", depth)
            ys.append(y)
        return self._values(c, depth, ys)

    def _values(self, c: str, depth: int, tails: list[str] | None) -> list[str]:
        s, w, spec = self.s, self.width, self.s.spec
        if w == 1:
            offs = s.add(self.base, s.offsets(spec.groups[1], c, depth))
            return [s.program(offs, depth, tail=None if tails is None else tails[0])]
        vt = VTYPE[(s.ct, w)]
        vecs: dict[int, str] = {}
        used = spec.prologue_inputs() if tails is None else spec.epilogue_inputs()
        for k in sorted(used):
            if self.along[k] == 1:
                q = s.var("q")
                off = f"{c} * {w}u" if self.base[k] is None else f"({self.base[k]} + {c} * {w}u)"
                s.emit(
                    f"const {vt} {q} = __ldg(reinterpret_cast<const {vt}*>(in{k} + {off}));", depth
                )
                vecs[k] = q
        pre = self.pre if tails is None else self.epre
        return [
            s.program(
                [None] * spec.n_inputs,
                depth,
                {**pre, **{k: f"{q}.{_LANES[lane]}" for k, q in vecs.items()}},
                None if tails is None else tails[lane],
            )
            for lane in range(w)
        ]


def _row_reg(s: _Src, lay: RowLayout) -> None:
    """Register-held rows (mirrors ptx_rows._row_reg): one read, one write."""
    spec, it, ct = s.spec, s.it, s.ct
    (go, _gr), (n_o, n_r) = spec.groups, spec.sizes
    T, R, W, CH = lay.threads, lay.rows, lay.width, lay.chunks
    per, n_ch = CH * W, n_r // W
    if T > 32:
        s.emit(f"__shared__ {ct} smem[{T // 32}];")
    s.emit(f"const unsigned int lane = threadIdx.x % {T}u, sub = threadIdx.x / {T}u;")
    s.emit(
        f"for ({it} row = ({it})blockIdx.x * {R}u + sub; row < {n_o}u; "
        f"row += ({it})gridDim.x * {R}u) {{"
    )
    ch = _Chunks(s, s.offsets(go, "row", 2), W, 2)
    s.emit(f"{ct} v[{per}]; bool ok[{CH}];", 2)
    s.emit("#pragma unroll", 2)
    s.emit(f"for (int j = 0; j < {CH}; ++j) {{", 2)
    s.emit(f"const {it} c0 = ({it})j * {T}u + lane;", 3)
    s.emit(f"ok[j] = c0 < {n_ch}u;", 3)
    s.emit(f"const {it} c = ok[j] ? c0 : 0u;", 3)
    for lane, v in enumerate(ch.values("c", 3)):
        s.emit(f"v[j * {W} + {lane}] = {v};", 3)
    s.emit("}", 2)

    def reduce(tail: str, value) -> str:
        acc = s.var("acc")
        s.emit(f"{ct} {acc} = {literal(_IDENT[tail], ct)};", 2)
        s.emit("#pragma unroll", 2)
        s.emit(
            f"for (int e = 0; e < {per}; ++e) if (ok[e / {W}]) "
            f"{acc} = {_COMBINE[tail].format(a=acc, b=value('e'))};",
            2,
        )
        _allreduce(s, tail, acc, T, 2)
        return acc

    def finish(v: str) -> None:
        s.emit(f"if (lane == 0) out[row] = {s.store_expr(v)};", 2)

    def write(expr) -> None:
        s.emit("#pragma unroll", 2)
        s.emit(f"for (int j = 0; j < {CH}; ++j) if (ok[j]) {{", 2)
        s.emit(f"const {it} c = ({it})j * {T}u + lane;", 3)
        if W == 1:
            (y,) = ch.finish("c", 3, [expr("j")])
            s.emit(f"out[row * {n_r}u + c] = {s.store_expr(y)};", 3)
        else:
            vt = VTYPE[(ct, W)]
            ys = ch.finish("c", 3, [expr(f"j * {W} + {lane}") for lane in range(W)])
            s.emit(f"{vt} o;", 3)
            for lane in range(W):
                s.emit(f"o.{_LANES[lane]} = {ys[lane]};", 3)
            s.emit(f"*reinterpret_cast<{vt}*>(out + (row * {n_ch}u + c) * {W}u) = o;", 3)
        s.emit("}", 2)

    # the tail's row program over the held values: maps are held in arrays too (computed once;
    # lanes past the row's end are masked out of the sums)
    scal: dict[str, str] = {}
    held = {"x": "v"}

    def value(expr):
        return lambda e: _expr(s, expr, scal, lambda name: f"{held[name]}[{e}]")

    for st in ops.ROW_PROGRAMS[spec.tail]:
        if st.kind == "let":
            _let(s, scal, st.name, st.expr, 2)
        elif st.kind == "result":
            finish(_expr(s, st.expr, scal, _no_element))
        elif st.kind == "map":
            arr = s.var(st.name)
            s.emit(f"{ct} {arr}[{per}];", 2)
            s.emit("#pragma unroll", 2)
            s.emit(f"for (int e = 0; e < {per}; ++e) {arr}[e] = {value(st.expr)('e')};", 2)
            held[st.name] = arr
        elif st.kind == "reduce":
            scal[st.name] = reduce(st.combine, value(st.expr))
        else:
            write(value(st.expr))
    s.emit("}")


def _split(s: _Src, width: int) -> None:
    """Stage one of a multi-block reduction (mirrors ptx_rows._split)."""
    spec, it, ct = s.spec, s.it, s.ct
    (go, _gr), (_n_o, n_r) = spec.groups, spec.sizes
    S, T = spec.splits, SPLIT_THREADS
    tail = "sum" if spec.tail == "mean" else spec.tail
    s.emit(f"__shared__ {ct} smem[{T // 32}];")
    s.emit(f"const unsigned int sl = blockIdx.x % {S}u;")
    s.emit(f"const {it} o = blockIdx.x / {S}u;")
    ch = _Chunks(s, s.offsets(go, "o", 1), width, 1)
    s.emit(f"{ct} acc = {literal(_IDENT[tail], ct)};")
    s.emit(f"for ({it} c = ({it})sl * {T}u + threadIdx.x; c < {n_r // width}u; c += {S * T}u) {{")
    for v in ch.values("c", 2):
        s.emit(f"acc = {_COMBINE[tail].format(a='acc', b=v)};", 2)
    s.emit("}")
    _allreduce(s, tail, "acc", T, 1)
    s.emit("if (threadIdx.x == 0) out[blockIdx.x] = acc;")


def _row(s: _Src) -> None:
    spec, it, ct = s.spec, s.it, s.ct
    (go, gr), (n_o, n_r) = spec.groups, spec.sizes
    block = row_block(n_r)
    s.emit(f"__shared__ {ct} smem[{max(block // 32, 1)}];")
    s.emit(f"for ({it} row = blockIdx.x; row < {n_o}u; row += gridDim.x) {{")
    base = s.offsets(go, "row", 2)

    def run_pass(tail: str, f) -> str:
        acc = s.var("acc")
        s.emit(f"{ct} {acc} = {literal(_IDENT[tail], ct)};", 2)
        s.emit(f"for ({it} r = threadIdx.x; r < {n_r}u; r += {block}u) {{", 2)
        v = s.program(s.add(base, s.offsets(gr, "r", 3)), 3)
        s.emit(f"{acc} = {_COMBINE[tail].format(a=acc, b=f(v))};", 3)
        s.emit("}", 2)
        s.emit(
            f"for (int m = 16; m > 0; m >>= 1) {acc} = "
            f"{_COMBINE[tail].format(a=acc, b=s.shfl(acc))};",
            2,
        )
        if block > 32:
            s.emit(f"if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = {acc};", 2)
            s.emit("__syncthreads();", 2)
            s.emit(f"{acc} = smem[0];", 2)
            s.emit(
                f"for (int w = 1; w < {block // 32}; ++w) "
                f"{acc} = {_COMBINE[tail].format(a=acc, b='smem[w]')};",
                2,
            )
            s.emit("__syncthreads();", 2)
        return acc

    def finish(v: str) -> None:
        s.emit(f"if (threadIdx.x == 0) out[row] = {s.store_expr(v)};", 2)

    def write_row(f) -> None:
        s.emit(f"for ({it} r = threadIdx.x; r < {n_r}u; r += {block}u) {{", 2)
        offs = s.add(base, s.offsets(gr, "r", 3))
        v = s.finish(f(s.program(offs, 3)), offs, 3)
        s.emit(f"out[row * {n_r}u + r] = {s.store_expr(v)};", 3)
        s.emit("}", 2)

    _tail(s, run_pass, finish, write_row, 2)
    s.emit("}")


def _col(s: _Src) -> None:
    spec, it, ct = s.spec, s.it, s.ct
    (go, gr, gi), (n_o, n_r, n_i) = spec.groups, spec.sizes
    s.emit(
        f"for ({it} idx = ({it})blockIdx.x * blockDim.x + threadIdx.x; idx < {n_o * n_i}u; "
        f"idx += ({it})blockDim.x * gridDim.x) {{"
    )
    s.emit(f"const {it} o = idx / {n_i}u, ii = idx % {n_i}u;", 2)
    base = s.add(s.offsets(go, "o", 2), s.offsets(gi, "ii", 2))

    def run_pass(tail: str, f) -> str:
        acc = s.var("acc")
        s.emit(f"{ct} {acc} = {literal(_IDENT[tail], ct)};", 2)
        s.emit(f"for ({it} r = 0; r < {n_r}u; ++r) {{", 2)
        v = s.program(s.add(base, s.offsets(gr, "r", 3)), 3)
        s.emit(f"{acc} = {_COMBINE[tail].format(a=acc, b=f(v))};", 3)
        s.emit("}", 2)
        return acc

    def finish(v: str) -> None:
        s.emit(f"out[idx] = {s.store_expr(v)};", 2)

    def write_row(f) -> None:
        s.emit(f"for ({it} r = 0; r < {n_r}u; ++r) {{", 2)
        offs = s.add(base, s.offsets(gr, "r", 3))
        v = s.finish(f(s.program(offs, 3)), offs, 3)
        s.emit(f"out[(o * {n_r}u + r) * {n_i}u + ii] = {s.store_expr(v)};", 3)
        s.emit("}", 2)

    _tail(s, run_pass, finish, write_row, 2)
    s.emit("}")


def generates(spec: KernelSpec) -> bool:
    """Whether ``render`` computes this spec as numpy does: float arithmetic (over inputs of
    any real dtype, converted as numpy's loop converts them), integer and bool arithmetic of
    ``INT_OPS``/``INT_TAILS`` and complex arithmetic of ``COMPLEX_OPS``/``COMPLEX_TAILS``.
    The backend runs what this refuses on CuPy's own loops."""
    ct = CTYPE[spec.compute]
    if ct in _INTS:
        allowed, tails = INT_OPS, INT_TAILS
    elif ct in _COMPLEX:
        allowed, tails = COMPLEX_OPS, COMPLEX_TAILS
    else:
        allowed, tails = None, None
    if tails is not None and spec.tail is not None and spec.tail not in tails:
        return False
    for ins in (*spec.instrs, *spec.epilogue):
        if allowed is not None and ins.op not in allowed:
            return False
    # a complex value converted to a real compute type would lose its imaginary part (only
    # where's condition, tested for nonzero, may be complex there)
    if ct not in _COMPLEX:
        own = {
            v
            for ins in (*spec.instrs, *spec.epilogue)
            for j, (kind, v) in enumerate(ins.args)
            if kind == "in" and j in ops.ELEMENTWISE[ins.op].own_dtype
        }
        other = set(range(spec.n_inputs)) - own
        if spec.result[0] == "in" and spec.result[1] in own:
            other.add(spec.result[1])
        if any(CTYPE[spec.in_dtypes[k]] in _COMPLEX for k in other):
            return False
    return True


def _needs_complex(spec: KernelSpec) -> bool:
    return any(CTYPE[d] in _COMPLEX for d in (spec.compute, spec.dtype, *spec.in_dtypes))


def vectorizes(spec: KernelSpec) -> bool:
    """Whether this renderer has a 16-byte vector form of the spec (row and split kernels of
    float32/float64; 16-bit rows vectorize on the PTX path only)."""
    if spec.family not in ("row", "split"):
        return False
    w = row_width(spec)
    if w == 1 or (spec.family == "row" and row_layout(spec, w) is None):
        return False
    return (
        not spec.calc
        and spec.dtype in ("float32", "float64")
        and all(dt in ("float32", "float64") for dt in spec.in_dtypes)
    )


def render(
    spec: KernelSpec, name: str, prelude: bool = True, vector: bool = False, pdl: str = ""
) -> str:
    """CUDA C source of one ``extern "C"`` kernel ``name`` (``prelude``: with its helpers;
    ``vector``: 16-byte accesses along rows, see ``ptx.vector_width``; ``pdl``: open with the
    ``griddepcontrol`` instructions of ``ptx.PDL_MODES``, compute capability 9.0+)."""
    s = _Src(spec)
    if pdl not in ("", "wait", "trigger"):
        raise BackendError(f"kernel {name}: unknown pdl mode {pdl!r}")
    if pdl == "trigger":
        s.emit('asm volatile("griddepcontrol.launch_dependents;" ::: "memory");')
    if pdl:
        s.emit('asm volatile("griddepcontrol.wait;" ::: "memory");')
    out_t = CTYPE[spec.compute] if spec.family == "split" else CTYPE[spec.dtype]
    params = [f"{out_t}* __restrict__ out"] + [
        f"const {CTYPE[dt]}* __restrict__ in{k}" for k, dt in enumerate(spec.in_dtypes)
    ]
    width = row_width(spec) if vector else 1
    if vector and not vectorizes(spec):
        raise BackendError(f"kernel {name}: this spec cannot use vector loads")
    bounds = 0  # threads per block the kernel is launched with (0: not fixed by the spec)
    if spec.family == "ew":
        _ew(s)
    elif spec.family == "split":
        _split(s, width)
        bounds = SPLIT_THREADS
    elif spec.family == "row":
        lay = row_layout(spec, width)
        if lay is not None:
            _row_reg(s, lay)
            bounds = lay.block
        elif vector:
            raise BackendError(f"kernel {name}: this row is too long for vector loads")
        else:
            _row(s)
            bounds = row_block(spec.sizes[1])
    elif spec.family == "col":
        _col(s)
    else:
        raise BackendError(f"unknown kernel family {spec.family!r}")
    head = f"// tensorlogic generated: {spec.family} {spec.tail or 'elementwise'} {spec.dtype}"
    lb = f"__launch_bounds__({bounds}) " if bounds else ""
    complex_prelude = [COMPLEX_PRELUDE.strip()] if prelude and _needs_complex(spec) else []
    return "\n".join(
        [
            head,
            _PRELUDE.strip() if prelude else "",
            *complex_prelude,
            f'extern "C" __global__ void {lb}{name}(',
            "    " + ", ".join(params) + ") {",
            *s.lines,
            "}",
            "",
        ]
    )
