"""The PTX emitter: renders a KernelSpec as PTX text, instruction by instruction.

``emit`` writes the kernel's entry (parameters, pointers, shared memory) and its body: the
elementwise family here (grid-stride loops, 16-byte vector loads/stores), reductions and row ops
in ``ptx_rows``, on the kernel builder of ``ptx_kernel``.
"""

from __future__ import annotations

from ...errors import BackendError
from . import ptx_rows
from .ptx_kernel import PTX_VERSION, _Kernel, _params, _pointers
from .spec import ITEMSIZE, PTX_DTYPES, SPLIT_THREADS, KernelSpec, row_block, row_layout, row_width


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
        k.emit(
            f"add.{it} {idx}, {idx}, {step};",
            f"setp.lt.{it} {p}, {idx}, {n};",
            f"@{p} bra {loop};",
            f"{end}:",
            "ret;",
        )
        return
    w = vector_width(spec)
    nv = n // w
    # scalar (broadcast) operands are loop invariant: load them once
    zero = k.new(it)
    k.emit(f"mov.{it} {zero}, 0;")
    pre = {
        j: k.load(ins[j], zero, spec.in_dtypes[j])
        for j in range(spec.n_inputs)
        if spec.input_mode(j) == "scalar"
    }
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
    k.emit(
        f"add.{it} {idx}, {idx}, {step};",
        f"setp.lt.{it} {p}, {idx}, {nv};",
        f"@{p} bra {loop};",
        f"{tail}:",
    )
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
        k.emit(
            f"mov.u32 {c}, %ctaid.x;",
            f"setp.ne.u32 {q}, {c}, 0;",
            f"@{q} bra {end};",
            f"setp.ge.{it} {p}, {t}, {n};",
            f"@{p} bra {end};",
        )
        offs = [t if spec.input_mode(j) == "full" else None for j in range(spec.n_inputs)]
        v = k.program(ins, offs, pre)
        k.store(out, t, v)
        k.emit(f"{end}:")
    k.emit("ret;")


# programmatic dependent launch (see cupy/pdl.py): "wait" resolves the dependency on the grid
# ahead first thing; "trigger" also lets the next grid be scheduled at once
PDL_MODES = ("", "wait", "trigger")


def emit(spec: KernelSpec, name: str, sm: int = 80, vector: bool = False, pdl: str = "") -> str:
    """PTX text of one kernel ``name`` for compute capability ``sm`` (e.g. 80, 90); ``pdl``
    (sm 90+) opens the kernel with ``griddepcontrol`` instructions (``PDL_MODES``)."""
    if spec.compute not in ("float32", "float64") or any(
        d not in PTX_DTYPES for d in (spec.dtype, *spec.in_dtypes)
    ):
        raise BackendError(
            f"kernel {name}: the PTX emitter renders kernels of {', '.join(PTX_DTYPES)} "
            f"(this one: {spec.dtype} from {', '.join(spec.in_dtypes)}, computed in "
            f"{spec.compute}); cuda_c renders the others"
        )
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
        lanes = (
            SPLIT_THREADS
            if spec.family == "split"
            else lay.threads
            if lay is not None
            else row_block(spec.sizes[1])
        )
        threads = lay.block if spec.family == "row" and lay is not None else lanes
        size = 8 if k.ct == "f64" else 4
        smem_decl = f"  .shared .align 8 .b8 {name}_smem[{max(lanes // 32, 1) * size}];"
        if spec.family == "split":
            ptx_rows._split(k, ptrs, f"{name}_smem", vector_width(spec) if vector else 1)
        elif lay is not None:
            ptx_rows._row_reg(k, ptrs, f"{name}_smem", lay)
        else:
            ptx_rows._row(k, ptrs, f"{name}_smem")
    elif spec.family == "col":
        ptx_rows._col(k, ptrs)
    else:
        raise BackendError(f"unknown kernel family {spec.family!r}")
    head = [
        f"// tensorlogic generated: {spec.family} {spec.tail or 'elementwise'} {spec.dtype}",
        f".version {PTX_VERSION}",
        f".target sm_{sm}",
        ".address_size 64",
        "",
        f".visible .entry {name}(",
        "  " + ",\n  ".join(params),
        ")",
    ]
    if threads:
        head.append(f".maxntid {threads}, 1, 1")
    head.append("{")
    if smem_decl:
        head.append(smem_decl)
    return "\n".join(head + k.regs.decls() + k.body + ["}", ""])
