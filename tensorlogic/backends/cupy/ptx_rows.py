"""PTX kernels over rows: reductions and row ops (a block per row, register-held rows, split
rows, and a thread per column for reductions over a leading axis)."""

from __future__ import annotations

from ...errors import BackendError
from ...ir import ops
from .ptx_kernel import _COMBINE, _Kernel
from .spec import ITEMSIZE, SPLIT_THREADS, RowLayout, row_block


def _shfl(k: _Kernel, v: str, lane_mask: int) -> str:
    o = k.new(k.ct)
    if k.ct == "f32":
        k.emit(f"shfl.sync.bfly.b32 {o}, {v}, {lane_mask}, 31, -1;")
        return o
    lo, hi, lo2, hi2 = (k.new("b32") for _ in range(4))
    k.emit(
        f"mov.b64 {{{lo}, {hi}}}, {v};",
        f"shfl.sync.bfly.b32 {lo2}, {lo}, {lane_mask}, 31, -1;",
        f"shfl.sync.bfly.b32 {hi2}, {hi}, {lane_mask}, 31, -1;",
        f"mov.b64 {o}, {{{lo2}, {hi2}}};",
    )
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
    k.emit(
        f"mov.u32 {tid}, %tid.x;",
        f"and.b32 {lane}, {tid}, 31;",
        f"shr.u32 {warp}, {tid}, 5;",
        f"setp.ne.u32 {p}, {lane}, 0;",
        f"@{p} bra {skip};",
        f"mov.u32 {a}, {smem};",
        f"mad.lo.u32 {a}, {warp}, {size}, {a};",
        f"st.shared.{k.ct} [{a}], {v};",
        f"{skip}:",
        "bar.sync 0;",
    )
    base = k.new("u32")
    k.emit(f"mov.u32 {base}, {smem};")
    acc = None
    for w in range(block // 32):
        x = k.new(k.ct)
        k.emit(f"ld.shared.{k.ct} {x}, [{base}+{w * size}];")
        acc = x if acc is None else k.combine(tail, acc, x)
    k.emit("bar.sync 0;")  # the buffer is reused by the next reduction
    return acc


def _no_element(name: str) -> str:
    raise BackendError(f"row program: {name!r} is not a scalar here")


def _expr(k: _Kernel, e, scal: dict[str, str], elem) -> str:
    """Register of a row-program expression (``ops.RowStep``): scalars from ``scal``,
    per-element values (``x`` and the maps) from ``elem(name)``, ops from the op table."""
    if isinstance(e, str):
        if e in scal:
            return scal[e]
        if e == "inv_n":
            return k.const(1.0 / k.spec.sizes[1])
        if e == "eps":
            return k.const(k.spec.eps)
        return elem(e)
    if isinstance(e, (int, float)):
        return k.const(float(e))
    op, *args = e
    return k.op(op, [_expr(k, a, scal, elem) for a in args])


def _tail_passes(k: _Kernel, run_pass, finish_reduce, write_row) -> None:
    """The tail's row program rendered as passes over the row (row and col kernels): each
    reduce is a pass, maps are recomputed in the passes that use them."""
    scal: dict[str, str] = {}
    maps: dict[str, object] = {}

    def at(v: str):
        memo = {"x": v}

        def elem(name: str) -> str:
            if name not in memo:
                memo[name] = _expr(k, maps[name], scal, elem)
            return memo[name]

        return elem

    for st in ops.ROW_PROGRAMS[k.spec.tail]:
        if st.kind == "reduce":
            scal[st.name] = run_pass(st.combine, lambda v, e=st.expr: _expr(k, e, scal, at(v)))
        elif st.kind == "let":
            scal[st.name] = _expr(k, st.expr, scal, _no_element)
        elif st.kind == "map":
            maps[st.name] = st.expr
        elif st.kind == "write":
            write_row(lambda v, e=st.expr: _expr(k, e, scal, at(v)))
        else:
            finish_reduce(_expr(k, st.expr, scal, _no_element))


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
        k.emit(
            f"mov.{it} {r}, {tid};",
            f"setp.ge.{it} {q}, {r}, {n_r};",
            f"@{q} bra {done};",
            f"{loop}:",
        )
        offs = k.add_offsets(base, k.offsets(gr, r))
        v = f(k.program(ins, k.zero_offsets(offs)))
        k.emit(
            f"mov.{k.ct} {acc}, {k.combine(tail, acc, v)};",
            f"add.{it} {r}, {r}, {block};",
            f"setp.lt.{it} {q}, {r}, {n_r};",
            f"@{q} bra {loop};",
            f"{done}:",
        )
        return _block_allreduce(k, tail, acc, block, smem)

    def finish_reduce(v: str) -> None:
        q, skip = k.new("pred"), k.label("w")
        k.emit(f"setp.ne.{it} {q}, {tid}, 0;", f"@{q} bra {skip};")
        k.store(out, row, v)
        k.emit(f"{skip}:")

    def write_row(f) -> None:
        r, q = k.new(it), k.new("pred")
        loop, done = k.label("w"), k.label("wdone")
        k.emit(
            f"mov.{it} {r}, {tid};",
            f"setp.ge.{it} {q}, {r}, {n_r};",
            f"@{q} bra {done};",
            f"{loop}:",
        )
        offs = k.zero_offsets(k.add_offsets(base, k.offsets(gr, r)))
        v = k.finish(f(k.program(ins, offs)), ins, offs)
        o = k.new(it)
        k.emit(f"mad.lo.{it} {o}, {row}, {n_r}, {r};")
        k.store(out, o, v)
        k.emit(
            f"add.{it} {r}, {r}, {block};",
            f"setp.lt.{it} {q}, {r}, {n_r};",
            f"@{q} bra {loop};",
            f"{done}:",
        )

    _tail_passes(k, run_pass, finish_reduce, write_row)
    k.emit(
        f"add.{it} {row}, {row}, {step};",
        f"setp.lt.{it} {p}, {row}, {n_o};",
        f"@{p} bra {rloop};",
        f"{rend}:",
        "ret;",
    )


# ------------------------------------------------------------------ register-held rows
def _row_index(k: _Kernel, lay: RowLayout) -> tuple[str, str, str]:
    """(lane, first row, row step) of this thread in the index type."""
    it = k.it
    t, c, g = k.new("u32"), k.new("u32"), k.new("u32")
    k.emit(f"mov.u32 {t}, %tid.x;", f"mov.u32 {c}, %ctaid.x;", f"mov.u32 {g}, %nctaid.x;")
    lane32, sub = k.new("u32"), k.new("u32")
    if lay.rows > 1:
        k.emit(
            f"and.b32 {lane32}, {t}, {lay.threads - 1};",
            f"shr.u32 {sub}, {t}, 5;",
            f"mad.lo.u32 {sub}, {c}, {lay.rows}, {sub};",
            f"mul.lo.u32 {g}, {g}, {lay.rows};",
        )
    else:
        k.emit(f"mov.u32 {lane32}, {t};", f"mov.u32 {sub}, {c};")
    if it == "u32":
        return lane32, sub, g
    lane, row, step = k.new(it), k.new(it), k.new(it)
    k.emit(
        f"cvt.u64.u32 {lane}, {lane32};", f"cvt.u64.u32 {row}, {sub};", f"cvt.u64.u32 {step}, {g};"
    )
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
            self.pre = {
                j: k.load(ins[j], base[j], spec.in_dtypes[j])
                for j in sorted(first)
                if self.along[j] == 0
            }
            self.epre = {
                j: self.pre.get(j) or k.load(ins[j], base[j], spec.in_dtypes[j])
                for j in sorted(late)
                if self.along[j] == 0
            }

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
        return [
            k.program(
                self.ins,
                [None] * n,
                {**pre, **{j: r[lane] for j, r in lanes.items()}},
                None if tails is None else tails[lane],
            )
            for lane in range(w)
        ]


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
        k.emit(
            f"add.{it} {c}, {lane}, {j * lay.threads};",
            f"setp.lt.{it} {q}, {c}, {n_ch};",
            f"selp.b{32 if it == 'u32' else 64} {cc}, {c}, 0, {q};",
        )
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

    # the tail's row program over the held values: maps are held too (computed once)
    scal: dict[str, str] = {}
    held: dict[str, list[list[str]]] = {"x": vals}
    for st in ops.ROW_PROGRAMS[spec.tail]:
        if st.kind == "let":
            scal[st.name] = _expr(k, st.expr, scal, _no_element)
            continue
        if st.kind == "result":
            finish(_expr(k, st.expr, scal, _no_element))
            continue
        values = [
            [_expr(k, st.expr, scal, lambda n, j=j, i=i: held[n][j][i]) for i in range(len(vs))]
            for j, vs in enumerate(vals)
        ]
        if st.kind == "map":
            held[st.name] = values
        elif st.kind == "reduce":
            scal[st.name] = reduce(st.combine, values)
        else:
            write(values)
    k.emit(
        f"add.{it} {row}, {row}, {step};",
        f"setp.lt.{it} {p}, {row}, {n_o};",
        f"@{p} bra {rloop};",
        f"{rend}:",
        "ret;",
    )


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
    k.emit(
        f"mov.u32 {c32}, %ctaid.x;",
        f"mov.u32 {t32}, %tid.x;",
        f"rem.u32 {s32}, {c32}, {S};",
        f"div.u32 {o32}, {c32}, {S};",
    )
    if it == "u32":
        o, ch = o32, k.new("u32")
        k.emit(f"mad.lo.u32 {ch}, {s32}, {T}, {t32};")
    else:
        o, ch, t64 = k.new("u64"), k.new("u64"), k.new("u64")
        k.emit(
            f"cvt.u64.u32 {o}, {o32};",
            f"mul.wide.u32 {ch}, {s32}, {T};",
            f"cvt.u64.u32 {t64}, {t32};",
            f"add.u64 {ch}, {ch}, {t64};",
        )
    rv = _RowValues(k, ins, k.offsets(go, o), w)
    acc = k.const(_COMBINE[tail][1])
    q = k.new("pred")
    loop, done = k.label("s"), k.label("sdone")
    k.emit(f"setp.ge.{it} {q}, {ch}, {n_ch};", f"@{q} bra {done};", f"{loop}:")
    for v in rv.chunk(ch):
        k.emit(f"mov.{k.ct} {acc}, {k.combine(tail, acc, v)};")
    k.emit(
        f"add.{it} {ch}, {ch}, {S * T};",
        f"setp.lt.{it} {q}, {ch}, {n_ch};",
        f"@{q} bra {loop};",
        f"{done}:",
    )
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
        k.emit(
            f"add.{it} {r}, {r}, 1;",
            f"setp.lt.{it} {q}, {r}, {n_r};",
            f"@{q} bra {lp};",
            f"{done}:",
        )

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
    k.emit(
        f"add.{it} {idx}, {idx}, {step};",
        f"setp.lt.{it} {p}, {idx}, {n_o * n_i};",
        f"@{p} bra {loop};",
        f"{end}:",
        "ret;",
    )
