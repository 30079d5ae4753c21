"""The PTX emitter: renders a KernelSpec as PTX text, instruction by instruction.

Registers are named by class (%f f32, %fd f64, %r 32-bit integers, %rd 64-bit integers, %h 16-bit,
%p predicates) and numbered in order of use. Op semantics come from ``ops.PTX`` (one instruction
sequence per op) and the math macros of ``ptx_math``; the kernel skeletons (grid-stride loops,
16-byte vector loads/stores, warp-shuffle block reductions) are built here.
"""

from __future__ import annotations

from typing import Sequence

from ...errors import BackendError
from ...ir import ops
from . import ptx_math
from .spec import ITEMSIZE, SPLIT_THREADS, KernelSpec, RowLayout, row_block, row_layout, row_width

PTX_VERSION = "8.0"
PTYPE = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
# 16-bit floats move through .b16 registers and are converted to and from the compute type
_HALF_PT = ("f16", "bf16")
_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
_PREFIX = {"f32": "%f", "f64": "%fd", "pred": "%p", "u32": "%r", "s32": "%r", "b32": "%r",
           "u64": "%rd", "s64": "%rd", "b64": "%rd", "b16": "%h"}
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
        if name == "where":
            p = self.new("pred")
            self.emit(f"setp.ne.{self.ct} {p}, {args[0]}, {ptx_math.imm(0.0, self.ct)};",
                      f"selp.{self.ct} {d}, {args[1]}, {args[2]}, {p};")
            return d
        names = ("x",) if len(args) == 1 else ("a", "b")
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
        self.emit(f"cvt.rn.{pt}.{self.ct} {raw}, {v};",
                  f"st.global.{'b16' if pt in _HALF_PT else pt} [{addr}], {raw};")

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
            self.emit(f"cvt.rn.{pt}.{self.ct} {h[0]}, {lo};",
                      f"cvt.rn.{pt}.{self.ct} {h[1]}, {hi};", f"mov.b32 {r}, {{{h[0]}, {h[1]}}};")
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

    def program(self, ptrs: Sequence[str], offs: Sequence[str | None],
                preloaded: dict[int, str] | None = None, tail: str | None = None) -> str:
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
        self.emit(f"mov.u32 {c}, %ctaid.x;", f"mov.u32 {n}, %ntid.x;", f"mov.u32 {t}, %tid.x;",
                  f"mov.u32 {g}, %nctaid.x;")
        if self.it == "u32":
            i, s = self.new("u32"), self.new("u32")
            self.emit(f"mad.lo.u32 {i}, {c}, {n}, {t};", f"mul.lo.u32 {s}, {n}, {g};")
        else:
            i, s, t64 = self.new("u64"), self.new("u64"), self.new("u64")
            self.emit(f"mul.wide.u32 {i}, {c}, {n};", f"cvt.u64.u32 {t64}, {t};",
                      f"add.u64 {i}, {i}, {t64};", f"mul.wide.u32 {s}, {n}, {g};")
        return i, s

    def combine(self, tail: str, acc: str, v: str) -> str:
        """acc (+) v; max/min propagate a NaN operand like numpy (PTX max/min drop it)."""
        d = self.new(self.ct)
        op = _COMBINE[tail][0]
        if op not in ("max", "min"):
            self.emit(f"{op}.{self.ct} {d}, {acc}, {v};")
            return d
        m, s, p = self.new(self.ct), self.new(self.ct), self.new("pred")
        self.emit(f"{op}.{self.ct} {m}, {acc}, {v};", f"setp.nan.{self.ct} {p}, {acc}, {v};",
                  f"add.{self.ct} {s}, {acc}, {v};", f"selp.{self.ct} {d}, {s}, {m}, {p};")
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


def vector_width(spec: KernelSpec) -> int:
    """Elements per 16-byte vector access, or 0 if the kernel cannot vectorize."""
    if spec.family in ("row", "split"):
        w = row_width(spec)
        if w == 1 or (spec.family == "row" and row_layout(spec, w) is None):
            return 0
        return w
    if spec.family != "ew":
        return 0
    size = ITEMSIZE[spec.dtype]
    w = 16 // size
    for k, dt in enumerate(spec.in_dtypes):
        mode = spec.input_mode(k)
        if mode == "scalar":
            continue
        if ITEMSIZE[dt] != size or (mode == "strided" and not _row_vector(spec, k, w)):
            return 0
    return w


def _row_vector(spec: KernelSpec, k: int, w: int) -> bool:
    """Whether strided input k is read in runs of ``w`` along the innermost dimension (a bias
    broadcast over leading axes): unit inner stride, inner size and outer strides multiples of w,
    so every vector of ``w`` output points reads ``w`` consecutive, aligned elements."""
    (group,) = spec.groups
    if not group or group[-1].strides[k] != 1 or group[-1].size % w:
        return False
    return all(d.strides[k] % w == 0 for d in group[:-1])


def vector_inputs(spec: KernelSpec) -> list[int]:
    """Inputs an elementwise vector kernel reads 16 bytes at a time (their pointers must be
    16-byte aligned): the full ones and the row vectors of ``_row_vector``."""
    return [j for j in range(spec.n_inputs) if spec.input_mode(j) != "scalar"]


def _ew(k: _Kernel, ptrs: list[str], vector: bool) -> None:
    spec = k.spec
    it, n = k.it, spec.total
    out, ins = ptrs[0], ptrs[1:]
    idx, step = k.global_index()
    p = k.new("pred")
    if not vector:
        (group,) = spec.groups
        loop, end = k.label("loop"), k.label("end")
        k.emit(f"setp.ge.{it} {p}, {idx}, {n};", f"@{p} bra {end};", f"{loop}:")
        offs = k.offsets(group, idx)
        v = k.program(ins, offs)
        k.store(out, idx, v)
        k.emit(f"add.{it} {idx}, {idx}, {step};", f"setp.lt.{it} {p}, {idx}, {n};",
               f"@{p} bra {loop};", f"{end}:", "ret;")
        return
    w = vector_width(spec)
    nv = n // w
    # scalar (broadcast) operands are loop invariant: load them once
    zero = k.new(it)
    k.emit(f"mov.{it} {zero}, 0;")
    pre = {j: k.load(ins[j], zero, spec.in_dtypes[j]) for j in range(spec.n_inputs)
           if spec.input_mode(j) == "scalar"}
    full = [j for j in range(spec.n_inputs) if spec.input_mode(j) == "full"]
    loop, tail = k.label("vloop"), k.label("tail")
    k.emit(f"setp.ge.{it} {p}, {idx}, {nv};", f"@{p} bra {tail};", f"{loop}:")
    lanes: dict[int, list[str]] = {}
    for j in full:
        lanes[j] = k.vload(k.address(ins[j], idx, 16), spec.in_dtypes[j], w)
    rows = [j for j in range(spec.n_inputs) if spec.input_mode(j) == "strided"]
    if rows:  # row vectors: offsets of the vector's first point (w consecutive elements on)
        e = k.new(it)
        k.emit(f"mul.lo.{it} {e}, {idx}, {w};")
        offs = k.offsets(spec.groups[0], e)
        for j in rows:
            dt = spec.in_dtypes[j]
            lanes[j] = k.vload(k.address(ins[j], offs[j], ITEMSIZE[dt]), dt, w)
    results = []
    for lane in range(w):
        given = {**pre, **{j: v[lane] for j, v in lanes.items()}}
        results.append(k.program(ins, [None] * spec.n_inputs, given))
    k.vstore(k.address(out, idx, 16), results)
    k.emit(f"add.{it} {idx}, {idx}, {step};", f"setp.lt.{it} {p}, {idx}, {nv};",
           f"@{p} bra {loop};", f"{tail}:")
    # the last n % w elements: one per thread of the first block
    if n % w:
        t, end = k.new(it), k.label("end")
        tid = k.new("u32")
        k.emit(f"mov.u32 {tid}, %tid.x;")
        if it == "u32":
            k.emit(f"add.u32 {t}, {tid}, {nv * w};")
        else:
            k.emit(f"cvt.u64.u32 {t}, {tid};", f"add.u64 {t}, {t}, {nv * w};")
        c = k.new("u32")
        q = k.new("pred")
        k.emit(f"mov.u32 {c}, %ctaid.x;", f"setp.ne.u32 {q}, {c}, 0;", f"@{q} bra {end};",
               f"setp.ge.{it} {p}, {t}, {n};", f"@{p} bra {end};")
        offs = [t if spec.input_mode(j) == "full" else None for j in range(spec.n_inputs)]
        v = k.program(ins, offs, pre)
        k.store(out, t, v)
        k.emit(f"{end}:")
    k.emit("ret;")


def _shfl(k: _Kernel, v: str, lane_mask: int) -> str:
    o = k.new(k.ct)
    if k.ct == "f32":
        k.emit(f"shfl.sync.bfly.b32 {o}, {v}, {lane_mask}, 31, -1;")
        return o
    lo, hi, lo2, hi2 = (k.new("b32") for _ in range(4))
    k.emit(f"mov.b64 {{{lo}, {hi}}}, {v};",
           f"shfl.sync.bfly.b32 {lo2}, {lo}, {lane_mask}, 31, -1;",
           f"shfl.sync.bfly.b32 {hi2}, {hi}, {lane_mask}, 31, -1;",
           f"mov.b64 {o}, {{{lo2}, {hi2}}};")
    return o


def _block_allreduce(k: _Kernel, tail: str, v: str, block: int, smem: str) -> str:
    """Reduce ``v`` over the block (warp butterflies, then across warps through shared memory);
    every thread gets the result."""
    for m in (16, 8, 4, 2, 1):
        v = k.combine(tail, v, _shfl(k, v, m))
    if block <= 32:
        return v
    size = 8 if k.ct == "f64" else 4
    tid, lane, warp, a = k.new("u32"), k.new("u32"), k.new("u32"), k.new("u32")
    p = k.new("pred")
    skip = k.label("skip")
    k.emit(f"mov.u32 {tid}, %tid.x;", f"and.b32 {lane}, {tid}, 31;", f"shr.u32 {warp}, {tid}, 5;",
           f"setp.ne.u32 {p}, {lane}, 0;", f"@{p} bra {skip};",
           f"mov.u32 {a}, {smem};", f"mad.lo.u32 {a}, {warp}, {size}, {a};",
           f"st.shared.{k.ct} [{a}], {v};", f"{skip}:", "bar.sync 0;")
    base = k.new("u32")
    k.emit(f"mov.u32 {base}, {smem};")
    acc = None
    for w in range(block // 32):
        x = k.new(k.ct)
        k.emit(f"ld.shared.{k.ct} {x}, [{base}+{w * size}];")
        acc = x if acc is None else k.combine(tail, acc, x)
    k.emit("bar.sync 0;")  # the buffer is reused by the next reduction
    return acc


def _scaled(k: _Kernel, v: str, c: float) -> str:
    """v * c for a constant c."""
    r = k.new(k.ct)
    k.emit(f"mul.{k.ct} {r}, {v}, {ptx_math.imm(c, k.ct)};")
    return r


def _rstd(k: _Kernel, sq_sum: str) -> str:
    """1 / sqrt(sq_sum / n + eps) of a layer_norm row (correctly rounded sqrt and reciprocal)."""
    var = _scaled(k, sq_sum, 1.0 / k.spec.sizes[1])
    t, r = k.new(k.ct), k.new(k.ct)
    k.emit(f"add.{k.ct} {t}, {var}, {ptx_math.imm(k.spec.eps, k.ct)};",
           f"sqrt.rn.{k.ct} {t}, {t};", f"rcp.rn.{k.ct} {r}, {t};")
    return r


def _tail_passes(k: _Kernel, run_pass, finish_reduce, write_row) -> None:
    """The reduction/row-op tail, given a pass runner over the row (shared by row and col)."""
    spec = k.spec
    tail = spec.tail
    if tail in _COMBINE:
        acc = run_pass(tail, lambda v: v)
        if tail == "mean":
            acc2 = k.new(k.ct)
            k.emit(f"mul.{k.ct} {acc2}, {acc}, {ptx_math.imm(1.0 / spec.sizes[1], k.ct)};")
            acc = acc2
        finish_reduce(acc)
        return
    if tail == "layer_norm":
        mu = _scaled(k, run_pass("sum", lambda v: v), 1.0 / spec.sizes[1])

        def centred(v: str) -> str:
            c = k.new(k.ct)
            k.emit(f"sub.{k.ct} {c}, {v}, {mu};")
            return c

        def squared(v: str) -> str:
            c = centred(v)
            q = k.new(k.ct)
            k.emit(f"mul.{k.ct} {q}, {c}, {c};")
            return q

        rstd = _rstd(k, run_pass("sum", squared))

        def normed(v: str) -> str:
            r = k.new(k.ct)
            k.emit(f"mul.{k.ct} {r}, {centred(v)}, {rstd};")
            return r
        write_row(normed)
        return
    m = run_pass("max", lambda v: v)
    # a row of -inf has max -inf: subtract 0 instead so exp gives 0, not NaN
    ninf, ms = k.new("pred"), k.new(k.ct)
    k.emit(f"setp.eq.{k.ct} {ninf}, {m}, {ptx_math.imm(float('-inf'), k.ct)};",
           f"selp.{k.ct} {ms}, {ptx_math.imm(0.0, k.ct)}, {m}, {ninf};")

    def shifted_exp(v: str) -> str:
        t = k.new(k.ct)
        k.emit(f"sub.{k.ct} {t}, {v}, {ms};")
        return k.macro("exp", t)

    s = run_pass("sum", shifted_exp)
    if tail == "logsumexp":
        ls = k.macro("log", s)
        r = k.new(k.ct)
        k.emit(f"add.{k.ct} {r}, {ls}, {ms};")
        finish_reduce(r)
    elif tail == "softmax":
        inv = k.new(k.ct)
        k.emit(f"rcp.rn.{k.ct} {inv}, {s};")

        def soft(v: str) -> str:
            e = shifted_exp(v)
            r = k.new(k.ct)
            k.emit(f"mul.{k.ct} {r}, {e}, {inv};")
            return r
        write_row(soft)
    elif tail == "log_softmax":
        ls = k.macro("log", s)
        sh = k.new(k.ct)
        k.emit(f"add.{k.ct} {sh}, {ls}, {ms};")

        def logsoft(v: str) -> str:
            r = k.new(k.ct)
            k.emit(f"sub.{k.ct} {r}, {v}, {sh};")
            return r
        write_row(logsoft)
    else:
        raise BackendError(f"no PTX for tail {tail!r}")


def _row(k: _Kernel, ptrs: list[str], smem: str) -> None:
    spec = k.spec
    it = k.it
    (go, gr), (n_o, n_r) = spec.groups, spec.sizes
    block = row_block(n_r)
    out, ins = ptrs[0], ptrs[1:]
    row, step, tid = k.new(it), k.new(it), k.new(it)
    c, g, t = k.new("u32"), k.new("u32"), k.new("u32")
    k.emit(f"mov.u32 {c}, %ctaid.x;", f"mov.u32 {g}, %nctaid.x;", f"mov.u32 {t}, %tid.x;")
    cv = "mov.u32" if it == "u32" else "cvt.u64.u32"
    k.emit(f"{cv} {row}, {c};", f"{cv} {step}, {g};", f"{cv} {tid}, {t};")
    p = k.new("pred")
    rloop, rend = k.label("row"), k.label("rowend")
    k.emit(f"setp.ge.{it} {p}, {row}, {n_o};", f"@{p} bra {rend};", f"{rloop}:")
    base = k.offsets(go, row)

    def run_pass(tail: str, f) -> str:
        acc = k.const(_COMBINE[tail][1])
        r, q = k.new(it), k.new("pred")
        loop, done = k.label("r"), k.label("rdone")
        k.emit(f"mov.{it} {r}, {tid};", f"setp.ge.{it} {q}, {r}, {n_r};", f"@{q} bra {done};",
               f"{loop}:")
        offs = k.add_offsets(base, k.offsets(gr, r))
        v = f(k.program(ins, k.zero_offsets(offs)))
        k.emit(f"mov.{k.ct} {acc}, {k.combine(tail, acc, v)};",
               f"add.{it} {r}, {r}, {block};", f"setp.lt.{it} {q}, {r}, {n_r};",
               f"@{q} bra {loop};", f"{done}:")
        return _block_allreduce(k, tail, acc, block, smem)

    def finish_reduce(v: str) -> None:
        q, skip = k.new("pred"), k.label("w")
        k.emit(f"setp.ne.{it} {q}, {tid}, 0;", f"@{q} bra {skip};")
        k.store(out, row, v)
        k.emit(f"{skip}:")

    def write_row(f) -> None:
        r, q = k.new(it), k.new("pred")
        loop, done = k.label("w"), k.label("wdone")
        k.emit(f"mov.{it} {r}, {tid};", f"setp.ge.{it} {q}, {r}, {n_r};", f"@{q} bra {done};",
               f"{loop}:")
        offs = k.zero_offsets(k.add_offsets(base, k.offsets(gr, r)))
        v = k.finish(f(k.program(ins, offs)), ins, offs)
        o = k.new(it)
        k.emit(f"mad.lo.{it} {o}, {row}, {n_r}, {r};")
        k.store(out, o, v)
        k.emit(f"add.{it} {r}, {r}, {block};", f"setp.lt.{it} {q}, {r}, {n_r};",
               f"@{q} bra {loop};", f"{done}:")

    _tail_passes(k, run_pass, finish_reduce, write_row)
    k.emit(f"add.{it} {row}, {row}, {step};", f"setp.lt.{it} {p}, {row}, {n_o};",
           f"@{p} bra {rloop};", f"{rend}:", "ret;")


# ------------------------------------------------------------------ register-held rows
def _row_index(k: _Kernel, lay: RowLayout) -> tuple[str, str, str]:
    """(lane, first row, row step) of this thread in the index type."""
    it = k.it
    t, c, g = k.new("u32"), k.new("u32"), k.new("u32")
    k.emit(f"mov.u32 {t}, %tid.x;", f"mov.u32 {c}, %ctaid.x;", f"mov.u32 {g}, %nctaid.x;")
    lane32, sub = k.new("u32"), k.new("u32")
    if lay.rows > 1:
        k.emit(f"and.b32 {lane32}, {t}, {lay.threads - 1};", f"shr.u32 {sub}, {t}, 5;",
               f"mad.lo.u32 {sub}, {c}, {lay.rows}, {sub};", f"mul.lo.u32 {g}, {g}, {lay.rows};")
    else:
        k.emit(f"mov.u32 {lane32}, {t};", f"mov.u32 {sub}, {c};")
    if it == "u32":
        return lane32, sub, g
    lane, row, step = k.new(it), k.new(it), k.new(it)
    k.emit(f"cvt.u64.u32 {lane}, {lane32};", f"cvt.u64.u32 {row}, {sub};",
           f"cvt.u64.u32 {step}, {g};")
    return lane, row, step


class _RowValues:
    """Loads a row's (or a slice's) chunks and evaluates the program on them.

    Vector mode (width > 1): an input with element stride 1 along the row is read with one
    16-byte load per chunk, an input constant along the row is read once per row.
    """

    def __init__(self, k: _Kernel, ins: list[str], base: list[str | None], width: int) -> None:
        self.k, self.ins, self.base, self.width = k, ins, base, width
        spec = k.spec
        gr = spec.groups[1]
        self.along = [gr[0].strides[j] if gr else 0 for j in range(spec.n_inputs)]
        self.pre: dict[int, str] = {}
        self.epre: dict[int, str] = {}
        if width > 1:
            # row-invariant operands once per row: the program's, then the epilogue's
            first, late = spec.prologue_inputs(), spec.epilogue_inputs()
            self.pre = {j: k.load(ins[j], base[j], spec.in_dtypes[j])
                        for j in sorted(first) if self.along[j] == 0}
            self.epre = {j: self.pre.get(j) or k.load(ins[j], base[j], spec.in_dtypes[j])
                         for j in sorted(late) if self.along[j] == 0}

    def chunk(self, c: str) -> list[str]:
        """Program values of the ``width`` elements of chunk ``c`` (an index register)."""
        return self._values(c, None)

    def finish(self, c: str, values: list[str]) -> list[str]:
        """Values to store for the row op's ``values`` of chunk ``c``: the epilogue applied to
        each (its inputs along the row read with one vector load per chunk)."""
        if not self.k.spec.epilogue:
            return values
        return self._values(c, values)

    def _values(self, c: str, tails: list[str] | None) -> list[str]:
        k, spec, w = self.k, self.k.spec, self.width
        if w == 1:
            offs = k.zero_offsets(k.add_offsets(self.base, k.offsets(spec.groups[1], c)))
            if tails is None:
                return [k.program(self.ins, offs)]
            return [k.program(self.ins, offs, tail=tails[0])]
        used = spec.prologue_inputs() if tails is None else spec.epilogue_inputs()
        lanes: dict[int, list[str]] = {}
        for j in sorted(used):
            if self.along[j] != 1:
                continue
            e = k.new(k.it)
            if self.base[j] is None:
                k.emit(f"mul.lo.{k.it} {e}, {c}, {w};")
            else:
                k.emit(f"mad.lo.{k.it} {e}, {c}, {w}, {self.base[j]};")
            addr = k.address(self.ins[j], e, ITEMSIZE[spec.in_dtypes[j]])
            lanes[j] = k.vload(addr, spec.in_dtypes[j], w)
        n = spec.n_inputs
        pre = self.pre if tails is None else self.epre
        return [k.program(self.ins, [None] * n, {**pre, **{j: r[lane] for j, r in lanes.items()}},
                          None if tails is None else tails[lane])
                for lane in range(w)]


def _row_reg(k: _Kernel, ptrs: list[str], smem: str, lay: RowLayout) -> None:
    """Row kernel with the row's values held in registers: one read, one write."""
    spec, it, w = k.spec, k.it, lay.width
    (go, _gr), (n_o, n_r) = spec.groups, spec.sizes
    n_ch = n_r // w
    out, ins = ptrs[0], ptrs[1:]
    lane, row, step = _row_index(k, lay)
    p = k.new("pred")
    rloop, rend = k.label("row"), k.label("rowend")
    k.emit(f"setp.ge.{it} {p}, {row}, {n_o};", f"@{p} bra {rend};", f"{rloop}:")
    rv = _RowValues(k, ins, k.offsets(go, row), w)
    chunks, valid, vals = [], [], []
    for j in range(lay.chunks):
        c, cc, q = k.new(it), k.new(it), k.new("pred")
        k.emit(f"add.{it} {c}, {lane}, {j * lay.threads};", f"setp.lt.{it} {q}, {c}, {n_ch};",
               f"selp.b{32 if it == 'u32' else 64} {cc}, {c}, 0, {q};")
        chunks.append(cc)
        valid.append(q)
        vals.append(rv.chunk(cc))

    def reduce(tail: str, values: list[list[str]]) -> str:
        acc = k.const(_COMBINE[tail][1])
        for q, vs in zip(valid, values):
            for v in vs:
                t = k.combine(tail, acc, v)
                a2 = k.new(k.ct)
                k.emit(f"selp.{k.ct} {a2}, {t}, {acc}, {q};")
                acc = a2
        return _block_allreduce(k, tail, acc, lay.threads, smem)

    def finish(v: str) -> None:
        q, skip = k.new("pred"), k.label("w")
        k.emit(f"setp.ne.{it} {q}, {lane}, 0;", f"@{q} bra {skip};")
        k.store(out, row, v)
        k.emit(f"{skip}:")

    # an epilogue's operand loads for every chunk go first, back to back, so their latencies
    # overlap (a chunk past the row's end reads chunk 0, in bounds, and is not stored); only
    # with at least 128 registers a thread (512 threads a block at most), as they all stay live
    eager = bool(spec.epilogue) and lay.block <= 512

    def write(values: list[list[str]]) -> None:
        if eager:
            values = [rv.finish(cc, vs) for cc, vs in zip(chunks, values)]
        for cc, q, vs in zip(chunks, valid, values):
            skip = k.label("w")
            o = k.new(it)
            k.emit(f"@!{q} bra {skip};", f"mad.lo.{it} {o}, {row}, {n_r // w}, {cc};")
            if not eager:
                vs = rv.finish(cc, vs)
            if w == 1:
                k.store(out, o, vs[0])
            else:
                k.vstore(k.address(out, o, 16), vs)
            k.emit(f"{skip}:")

    def mapv(values: list[list[str]], f) -> list[list[str]]:
        return [[f(v) for v in vs] for vs in values]

    tail = spec.tail
    if tail in _COMBINE:
        acc = reduce(tail, vals)
        if tail == "mean":
            acc2 = k.new(k.ct)
            k.emit(f"mul.{k.ct} {acc2}, {acc}, {ptx_math.imm(1.0 / n_r, k.ct)};")
            acc = acc2
        finish(acc)
    elif tail == "layer_norm":
        # the held values are centred once; masked lanes never enter the sums (reduce selects)
        mu = _scaled(k, reduce("sum", vals), 1.0 / n_r)

        def centre(v: str) -> str:
            c = k.new(k.ct)
            k.emit(f"sub.{k.ct} {c}, {v}, {mu};")
            return c

        def square(v: str) -> str:
            q = k.new(k.ct)
            k.emit(f"mul.{k.ct} {q}, {v}, {v};")
            return q

        cent = mapv(vals, centre)
        rstd = _rstd(k, reduce("sum", mapv(cent, square)))

        def scale_ln(v: str) -> str:
            r = k.new(k.ct)
            k.emit(f"mul.{k.ct} {r}, {v}, {rstd};")
            return r
        write(mapv(cent, scale_ln))
    else:
        m = reduce("max", vals)
        ninf, ms = k.new("pred"), k.new(k.ct)
        k.emit(f"setp.eq.{k.ct} {ninf}, {m}, {ptx_math.imm(float('-inf'), k.ct)};",
               f"selp.{k.ct} {ms}, {ptx_math.imm(0.0, k.ct)}, {m}, {ninf};")

        def shifted_exp(v: str) -> str:
            t = k.new(k.ct)
            k.emit(f"sub.{k.ct} {t}, {v}, {ms};")
            return k.macro("exp", t)

        exps = mapv(vals, shifted_exp)
        s = reduce("sum", exps)
        if tail == "logsumexp":
            ls = k.macro("log", s)
            r = k.new(k.ct)
            k.emit(f"add.{k.ct} {r}, {ls}, {ms};")
            finish(r)
        elif tail == "softmax":
            inv = k.new(k.ct)
            k.emit(f"rcp.rn.{k.ct} {inv}, {s};")

            def scale(v: str) -> str:
                r = k.new(k.ct)
                k.emit(f"mul.{k.ct} {r}, {v}, {inv};")
                return r
            write(mapv(exps, scale))
        elif tail == "log_softmax":
            ls = k.macro("log", s)
            sh = k.new(k.ct)
            k.emit(f"add.{k.ct} {sh}, {ls}, {ms};")

            def shift(v: str) -> str:
                r = k.new(k.ct)
                k.emit(f"sub.{k.ct} {r}, {v}, {sh};")
                return r
            write(mapv(vals, shift))
        else:
            raise BackendError(f"no PTX for tail {tail!r}")
    k.emit(f"add.{it} {row}, {row}, {step};", f"setp.lt.{it} {p}, {row}, {n_o};",
           f"@{p} bra {rloop};", f"{rend}:", "ret;")


def _split(k: _Kernel, ptrs: list[str], smem: str, width: int) -> None:
    """Stage one of a multi-block reduction: block b reduces slice b % S of row b / S into
    partial b (compute dtype)."""
    spec, it, w = k.spec, k.it, width
    (go, _gr), (_n_o, n_r) = spec.groups, spec.sizes
    S, T = spec.splits, SPLIT_THREADS
    tail = "sum" if spec.tail == "mean" else spec.tail
    n_ch = n_r // w
    out, ins = ptrs[0], ptrs[1:]
    c32, t32, s32, o32 = (k.new("u32") for _ in range(4))
    k.emit(f"mov.u32 {c32}, %ctaid.x;", f"mov.u32 {t32}, %tid.x;",
           f"rem.u32 {s32}, {c32}, {S};", f"div.u32 {o32}, {c32}, {S};")
    if it == "u32":
        o, ch = o32, k.new("u32")
        k.emit(f"mad.lo.u32 {ch}, {s32}, {T}, {t32};")
    else:
        o, ch, t64 = k.new("u64"), k.new("u64"), k.new("u64")
        k.emit(f"cvt.u64.u32 {o}, {o32};", f"mul.wide.u32 {ch}, {s32}, {T};",
               f"cvt.u64.u32 {t64}, {t32};", f"add.u64 {ch}, {ch}, {t64};")
    rv = _RowValues(k, ins, k.offsets(go, o), w)
    acc = k.const(_COMBINE[tail][1])
    q = k.new("pred")
    loop, done = k.label("s"), k.label("sdone")
    k.emit(f"setp.ge.{it} {q}, {ch}, {n_ch};", f"@{q} bra {done};", f"{loop}:")
    for v in rv.chunk(ch):
        k.emit(f"mov.{k.ct} {acc}, {k.combine(tail, acc, v)};")
    k.emit(f"add.{it} {ch}, {ch}, {S * T};", f"setp.lt.{it} {q}, {ch}, {n_ch};",
           f"@{q} bra {loop};", f"{done}:")
    total = _block_allreduce(k, tail, acc, T, smem)
    skip = k.label("w")
    k.emit(f"setp.ne.u32 {q}, {t32}, 0;", f"@{q} bra {skip};")
    idx = c32  # the partial's index is the block index
    if it != "u32":
        idx = k.new("u64")
        k.emit(f"cvt.u64.u32 {idx}, {c32};")
    addr = k.address(out, idx, 8 if k.ct == "f64" else 4)
    k.emit(f"st.global.{k.ct} [{addr}], {total};", f"{skip}:", "ret;")


def _col(k: _Kernel, ptrs: list[str]) -> None:
    spec = k.spec
    it = k.it
    (go, gr, gi), (n_o, n_r, n_i) = spec.groups, spec.sizes
    out, ins = ptrs[0], ptrs[1:]
    idx, step = k.global_index()
    p = k.new("pred")
    loop, end = k.label("pt"), k.label("end")
    k.emit(f"setp.ge.{it} {p}, {idx}, {n_o * n_i};", f"@{p} bra {end};", f"{loop}:")
    o, i = k.new(it), k.new(it)
    k.emit(f"div.{it} {o}, {idx}, {n_i};", f"rem.{it} {i}, {idx}, {n_i};")
    base = k.add_offsets(k.offsets(go, o), k.offsets(gi, i))

    def serial(body) -> None:
        r, q = k.new(it), k.new("pred")
        lp, done = k.label("r"), k.label("rdone")
        k.emit(f"mov.{it} {r}, 0;", f"setp.ge.{it} {q}, {r}, {n_r};", f"@{q} bra {done};", f"{lp}:")
        offs = k.zero_offsets(k.add_offsets(base, k.offsets(gr, r)))
        body(r, k.program(ins, offs), offs)
        k.emit(f"add.{it} {r}, {r}, 1;", f"setp.lt.{it} {q}, {r}, {n_r};", f"@{q} bra {lp};",
               f"{done}:")

    def run_pass(tail: str, f) -> str:
        acc = k.const(_COMBINE[tail][1])
        serial(lambda r, v, offs: k.emit(f"mov.{k.ct} {acc}, {k.combine(tail, acc, f(v))};"))
        return acc

    def finish_reduce(v: str) -> None:
        k.store(out, idx, v)

    def write_row(f) -> None:
        def body(r: str, v: str, offs: list[str]) -> None:
            w = k.finish(f(v), ins, offs)
            off = k.new(it)
            k.emit(f"mad.lo.{it} {off}, {o}, {n_r}, {r};", f"mad.lo.{it} {off}, {off}, {n_i}, {i};")
            k.store(out, off, w)
        serial(body)

    _tail_passes(k, run_pass, finish_reduce, write_row)
    k.emit(f"add.{it} {idx}, {idx}, {step};", f"setp.lt.{it} {p}, {idx}, {n_o * n_i};",
           f"@{p} bra {loop};", f"{end}:", "ret;")


# programmatic dependent launch (see cupy/pdl.py): "wait" resolves the dependency on the grid
# ahead first thing; "trigger" also lets the next grid be scheduled at once
PDL_MODES = ("", "wait", "trigger")


def emit(spec: KernelSpec, name: str, sm: int = 80, vector: bool = False, pdl: str = "") -> str:
    """PTX text of one kernel ``name`` for compute capability ``sm`` (e.g. 80, 90); ``pdl``
    (sm 90+) opens the kernel with ``griddepcontrol`` instructions (``PDL_MODES``)."""
    if vector and not vector_width(spec):
        raise BackendError(f"kernel {name}: this spec cannot use vector loads")
    if pdl not in PDL_MODES or (pdl and sm < 90):
        raise BackendError(f"kernel {name}: pdl={pdl!r} needs one of {PDL_MODES} and sm >= 90")
    k = _Kernel(spec)
    if pdl == "trigger":
        k.emit("griddepcontrol.launch_dependents;")
    if pdl:
        k.emit("griddepcontrol.wait;")
    params, pnames = _params(name, spec.n_inputs)
    ptrs = _pointers(k, pnames)
    smem_decl = ""
    threads = 0  # threads per block the kernel is launched with (0: not fixed by the spec)
    if spec.family == "ew":
        _ew(k, ptrs, vector)
    elif spec.family in ("row", "split"):
        lay = row_layout(spec, vector_width(spec) if vector else 1)
        lanes = (SPLIT_THREADS if spec.family == "split" else
                 lay.threads if lay is not None else row_block(spec.sizes[1]))
        threads = lay.block if spec.family == "row" and lay is not None else lanes
        size = 8 if k.ct == "f64" else 4
        smem_decl = f"  .shared .align 8 .b8 {name}_smem[{max(lanes // 32, 1) * size}];"
        if spec.family == "split":
            _split(k, ptrs, f"{name}_smem", vector_width(spec) if vector else 1)
        elif lay is not None:
            _row_reg(k, ptrs, f"{name}_smem", lay)
        else:
            _row(k, ptrs, f"{name}_smem")
    elif spec.family == "col":
        _col(k, ptrs)
    else:
        raise BackendError(f"unknown kernel family {spec.family!r}")
    head = [f"// tensorlogic generated: {spec.family} {spec.tail or 'elementwise'} {spec.dtype}",
            f".version {PTX_VERSION}", f".target sm_{sm}", ".address_size 64", "",
            f".visible .entry {name}(", "  " + ",\n  ".join(params), ")"]
    if threads:
        head.append(f".maxntid {threads}, 1, 1")
    head.append("{")
    if smem_decl:
        head.append(smem_decl)
    return "\n".join(head + k.regs.decls() + k.body + ["}", ""])
