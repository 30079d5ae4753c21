"""GPU code generation without a GPU: PTX assembled by ptxas, CUDA C compiled by nvcc, golden text.

ptxas and nvcc are part of the CI image; a missing one fails these tests instead of skipping them.
"""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from cupy_cases import EXACT_DTYPES, all_cases, contiguous_spec, dtype_cases, op_program
from tensorlogic.backends.cupy import cuda_c, ptx, ptx_math, spec as S
from tensorlogic.backends.cupy.cache import KernelCache
from tensorlogic.errors import BackendError
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedOp

GOLDEN = Path(__file__).parent / "golden"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: the GPU codegen tests need the CUDA toolkit's {name}")
    return path


def _module(sources: list[str]) -> str:
    """Many emitted kernels as one PTX module (one header, every entry)."""
    head, bodies = None, []
    for src in sources:
        cut = src.index(".visible .entry")
        head = head or src[:cut]
        bodies.append(src[cut:])
    return head + "\n".join(bodies)


@pytest.fixture(scope="module")
def emitted():
    """PTX of every case (scalar and, where possible, vector variants)."""
    out = []
    for name, spec in all_cases():
        out.append(ptx.emit(spec, name, 80))
        if ptx.vector_width(spec):
            out.append(ptx.emit(spec, name + "_v", 80, vector=True))
    return out


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_ptx_assembles_for_every_op_dtype_and_family(emitted, arch, tmp_path):
    ptxas = _tool("ptxas")
    f = tmp_path / "all.ptx"
    f.write_text(_module(emitted))
    r = subprocess.run(
        [ptxas, "--gpu-name", arch, str(f), "-o", str(tmp_path / "all.cubin")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]
    assert (tmp_path / "all.cubin").stat().st_size > 0


def test_ptx_covers_every_op_dtype_and_family():
    names = {n for n, _ in all_cases()}
    for dt in ("float32", "float64"):
        for op in ops.ELEMENTWISE:
            assert f"ew_{op}_{dt}" in names
        for tail in ops.REDUCTIONS + ops.ROW_OPS:
            assert f"{tail}_0_{dt}" in names
    families = {s.family for _, s in all_cases()}
    assert families == {"ew", "row", "col", "split"}


def test_cuda_c_compiles_with_nvcc(tmp_path):
    nvcc = _tool("nvcc")
    srcs = [
        cuda_c.render(spec, name, prelude=(k == 0)) for k, (name, spec) in enumerate(all_cases())
    ]
    srcs += [
        cuda_c.render(spec, name + "_v", prelude=False, vector=True)
        for name, spec in all_cases()
        if cuda_c.vectorizes(spec)
    ]
    f = tmp_path / "all.cu"
    f.write_text("\n".join(srcs))
    r = subprocess.run(
        [nvcc, "-arch=sm_90", "-c", str(f), "-o", str(tmp_path / "all.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]


def _golden_specs():
    add = contiguous_spec(op_program("add", (1024,)), "float32", [(1024,), (1024,)])
    prog = S.Program((FusedOp("exp", (("in", 0),)),), ("tmp", 0), (8, 256), "sum", (1,))
    red = contiguous_spec(prog, "float32", [(8, 256)])
    return {"ew_add_f32": add, "row_sum_exp_f32": red}


@pytest.mark.parametrize("name", ["ew_add_f32", "row_sum_exp_f32"])
def test_golden_text(name):
    spec = _golden_specs()[name]
    got_ptx = ptx.emit(spec, name, 90, vector=bool(ptx.vector_width(spec)))
    got_c = cuda_c.render(spec, name)
    assert got_ptx == (GOLDEN / f"{name}.ptx").read_text()
    assert got_c == (GOLDEN / f"{name}.cu").read_text()


def test_vector_kernel_uses_16_byte_accesses_and_a_tail():
    spec = contiguous_spec(op_program("mul", (1001,)), "float32", [(1001,), (1001,)])
    src = ptx.emit(spec, "k", 90, vector=True)
    assert src.count("ld.global.nc.v4.f32") == 2 and "st.global.v4.f32" in src
    assert "$L_tail" in src and "ld.global.nc.f32" in src  # the 1001 % 4 leftover element
    f64 = contiguous_spec(op_program("mul", (64,)), "float64", [(64,), (64,)])
    assert "ld.global.nc.v2.f64" in ptx.emit(f64, "k", 90, vector=True)


def test_row_kernel_uses_warp_shuffles_and_grid_stride():
    prog = S.Program((), ("in", 0), (64, 1000), "softmax", (1,))
    src = ptx.emit(contiguous_spec(prog, "float64", [(64, 1000)]), "k", 90)
    assert src.count("shfl.sync.bfly.b32") == 2 * 5 * 2  # 2 reductions, 5 steps, 2 halves of f64
    assert "%nctaid.x" in src and "bar.sync 0" in src


def test_register_rows_read_once_with_vector_loads():
    """A row that fits is held in registers: one vector load per chunk, no second pass."""
    prog = S.Program(
        (FusedOp("mul", (("in", 0), ("in", 1))),), ("tmp", 0), (16, 4096), "softmax", (1,)
    )
    spec = contiguous_spec(prog, "float32", [(16, 4096), (16, 1)])
    lay = S.row_layout(spec, 4)
    assert (lay.threads, lay.rows, lay.chunks) == (256, 1, 4)
    src = ptx.emit(spec, "k", 90, vector=True)
    assert src.count("ld.global.nc.v4.f32") == lay.chunks  # the (16, 1) operand: one scalar load
    assert src.count("ld.global.nc.f32") == 1 and src.count("st.global.v4.f32") == lay.chunks
    # a short row: a warp per row, four rows per block, shuffles only
    small = contiguous_spec(
        S.Program((), ("in", 0), (4096, 1024), "log_softmax", (1,)), "float32", [(4096, 1024)]
    )
    assert S.row_layout(small, 4) == S.RowLayout(32, 4, 4, 8)
    assert "bar.sync" not in ptx.emit(small, "k", 90, vector=True)
    # too long for registers: the multi-pass kernel
    assert (
        S.row_layout(
            contiguous_spec(
                S.Program((), ("in", 0), (2, 70001), "softmax", (1,)), "float32", [(2, 70001)]
            ),
            1,
        )
        is None
    )


def test_full_reduction_splits_over_blocks():
    spec = contiguous_spec(
        S.Program((), ("in", 0), (1 << 24,), "max", (0,)), "float32", [(1 << 24,)]
    )
    assert spec.family == "split" and spec.sizes == (1, 1 << 24) and spec.splits == S.SPLIT_BLOCKS
    fin = S.finish_program(spec)
    assert fin.space == (1, spec.splits) and fin.tail == "max"
    mean = contiguous_spec(
        S.Program((), ("in", 0), (8, 100000), "mean", (1,)), "float64", [(8, 100000)]
    )
    assert mean.family == "split" and S.finish_program(mean).tail == "sum"
    lse = contiguous_spec(
        S.Program((), ("in", 0), (1 << 20,), "logsumexp", (0,)), "float32", [(1 << 20,)]
    )
    assert lse.family == "row"  # partial logsumexps don't combine by one operation: one block
    src = ptx.emit(mean, "k", 90, vector=True)
    assert "ld.global.nc.v2.f64" in src and src.count("st.global.f64") == 1  # one partial a block


def test_max_min_reductions_propagate_nan_in_the_text():
    for tail in ("max", "min"):
        spec = contiguous_spec(
            S.Program((), ("in", 0), (8, 256), tail, (1,)), "float32", [(8, 256)]
        )
        assert "setp.nan.f32" in ptx.emit(spec, "k", 90)
        assert f"tl_{tail}(" in cuda_c.render(spec, "k")


def test_registers_are_named_by_class():
    src = ptx.emit(contiguous_spec(op_program("pow", (10,)), "float64", [(10,), (10,)]), "k", 90)
    decls = [ln.split()[1:] for ln in src.splitlines() if ln.strip().startswith(".reg")]
    assert {d[0] for d in decls} <= {".f32", ".f64", ".pred", ".b32", ".b64", ".b16"}
    assert any(d[1].startswith("%fd<") for d in decls)


def test_immediates_are_exact_hex():
    assert ptx_math.imm(1.0, "f32") == "0f3F800000"
    assert ptx_math.imm(0.5, "f64") == "0d3FE0000000000000"
    assert ptx_math.imm(float("-inf"), "f32") == "0fFF800000"


def test_vector_request_for_a_strided_spec_is_refused():
    prog = op_program("add", (8, 9))
    spec = contiguous_spec(prog, "float32", [(8, 9), (8, 1)])
    assert ptx.vector_width(spec) == 0
    with pytest.raises(BackendError, match="vector"):
        ptx.emit(spec, "k", 90, vector=True)


def test_unsupported_dtype_is_a_backend_error():
    with pytest.raises(BackendError, match="float128"):
        contiguous_spec(op_program("neg", (4,)), "float128", [(4,)])


def test_ptx_leaves_integer_bool_and_complex_kernels_to_cuda_c():
    for dt in ("int32", "bool", "complex64"):
        spec = contiguous_spec(op_program("add", (4,)), dt, [(4,), (4,)])
        with pytest.raises(BackendError, match="cuda_c renders the others"):
            ptx.emit(spec, "k", 90)
    # a comparison of floats computes in float32 but stores bool
    cmp = S.make_spec(
        op_program("gt", (4,)), "bool", [(4,)] * 2, ["float32"] * 2, [(1,)] * 2, "float32"
    )
    with pytest.raises(BackendError, match="bool"):
        ptx.emit(cmp, "k", 90)


def test_integer_bool_and_complex_kernels_compile_with_nvcc(tmp_path):
    """Every op and reduction numpy has a loop for, over every integer, bool and complex dtype,
    mixed operands and bool comparisons: what CUDA C takes compiles for sm_90."""
    cases = [(n, s) for n, s in dtype_cases() if cuda_c.generates(s)]
    src = cuda_c._PRELUDE + cuda_c.COMPLEX_PRELUDE
    src += "\n".join(cuda_c.render(spec, name, prelude=False) for name, spec in cases)
    f = tmp_path / "dtypes.cu"
    f.write_text(src)
    r = subprocess.run(
        [_tool("nvcc"), "-arch=sm_90", "-c", str(f), "-o", str(tmp_path / "dtypes.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]
    # a kernel with its own prelude (as the backend compiles it) compiles alone too
    name, spec = next(c for c in cases if c[0] == "sum_0_complex128")
    f.write_text(cuda_c.render(spec, name))
    r = subprocess.run(
        [_tool("nvcc"), "-arch=sm_90", "-c", str(f), "-o", str(tmp_path / "one.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]


def test_cuda_c_takes_every_exact_op_and_leaves_the_rest_to_cupy():
    names = {n: cuda_c.generates(s) for n, s in dtype_cases()}
    refused = {n for n, ok in names.items() if not ok}
    ints = [d for d in EXACT_DTYPES if not d.startswith("complex")]
    expected = {f"ew_{op}_{d}" for d in ints for op in ("reciprocal", "pow")}
    expected |= {
        f"ew_{op}_{d}"
        for d in ("complex64", "complex128")
        for op in ("abs", "sqrt", "sigmoid", "tanh", "gelu", "gelu_grad", "pow")
    }
    assert refused == expected
    for d in ints:
        for op in cuda_c.INT_OPS:
            if f"ew_{op}_{d}" in names:  # numpy has a loop for it
                assert names[f"ew_{op}_{d}"], (op, d)
        for tail in ("sum", "prod", "max", "min", "mean"):
            assert names[f"{tail}_0_{d}"] and names[f"{tail}_5_{d}"]
    for d in ("complex64", "complex128"):
        for tail in ("sum", "prod", "mean"):
            assert all(names[f"{tail}_{j}_{d}"] for j in range(6))
    # integer kernels never go through double: abs/relu/maximum/minimum take exact forms
    spec = contiguous_spec(op_program("maximum", (4,)), "int64", [(4,), (4,)])
    text = cuda_c.render(spec, "k")
    assert "fmax" not in text and "long long" in text


def _node(g, t):
    node = g.node(t)
    return node, [g.node(i) for i in node.inputs]


def test_cupy_routing_of_every_dtype_kind():
    from tensorlogic.backends.cupy import routing

    g = tl.EinsumGraph()
    f = g.input("f", (8, 4), "float32")
    i8 = g.input("i8", (8, 4), "int8")
    c = g.input("c", (8, 4), "complex64")
    cases = {
        "float add": (f + f, "ptx"),
        "int8 add": (i8 + i8, "cuda"),
        "int8 + float": (i8 + f, "cuda"),
        "int8 sum": (g.sum(i8, axis=1), "cuda"),
        "int8 pow": (g.elementwise("pow", i8, i8), None),
        "complex mul": (c * c, "cuda"),
        "complex sqrt": (g.elementwise("sqrt", c), None),
        "complex abs": (g.elementwise("abs", c), None),
        "cast int8->float32": (g.cast(i8, "float32"), None),
        "cast float32->float64": (g.cast(f, "float64"), "ptx"),
    }
    for what, (t, path) in cases.items():
        node, ins = _node(g, t)
        assert routing.kernel_path(node, ins, "ptx") == path, what
    node, ins = _node(g, g.elementwise("gt", f, f))
    assert routing.compute_dtype(node, ins) == "float32"


# ------------------------------------------------------------------ layout (index arithmetic)
def _offsets(groups, n_inputs, index_per_group):
    """Per-input element offsets the kernels compute for one point (a Python model of them)."""
    offs = [0] * n_inputs
    for group, idx in zip(groups, index_per_group):
        q = idx
        for dim in reversed(group):
            pos, q = q % dim.size, q // dim.size
            for k, s in enumerate(dim.strides):
                offs[k] += pos * s
    return offs


@st.composite
def _layouts(draw):
    rank = draw(st.integers(1, 4))
    space = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        r = draw(st.integers(0, rank))
        shapes.append(tuple(1 if draw(st.booleans()) else d for d in space[rank - r :]))
    axes = tuple(sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1))))
    return space, shapes, axes


@settings(max_examples=150, deadline=None)
@given(_layouts())
def test_layout_offsets_match_numpy_broadcasting(layout):
    """Every point of every family reads the element numpy broadcasting would read."""
    space, shapes, axes = layout
    n = len(shapes)
    prog = S.Program((), ("in", 0), space, "sum", axes)
    spec = S.make_spec(
        prog, "float32", shapes, ["float32"] * n, [S.contiguous_strides(s) for s in shapes]
    )
    # the value at each space point, per input, as numpy broadcasting gives it
    views = [np.broadcast_to(np.arange(max(1, math.prod(s))).reshape(s), space) for s in shapes]
    seen = np.zeros(space, dtype=int)
    pshape = [space[a] for a in spec.order]
    for idx in itertools.product(*(range(s) for s in spec.sizes)):
        offs = _offsets(spec.groups, n, idx)
        lin = 0
        for i, s in zip(idx, spec.sizes):
            lin = lin * s + i
        point = [0] * len(space)
        for a, v in zip(spec.order, np.unravel_index(lin, pshape)):
            point[a] = int(v)
        seen[tuple(point)] += 1
        for k in range(n):
            assert offs[k] == views[k][tuple(point)]
    assert (seen == 1).all()  # every point visited exactly once


def test_codegen_modules_import_without_cupy():
    code = (
        "import sys; sys.modules['cupy'] = None\n"
        "import tensorlogic\n"
        "from tensorlogic.backends.cupy import spec, ptx, ptx_math, cuda_c, cache\n"
        "import tensorlogic.backends as b; assert 'cupy' in b.registered_backends()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cupy_factory_without_cupy_raises_backend_error():
    code = (
        "import sys; sys.modules['cupy'] = None\n"
        "import tensorlogic as tl\n"
        "try:\n    tl.get_backend('cupy')\nexcept tl.BackendError as e:\n    print('ok', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr


def test_disk_cache_roundtrip(tmp_path):
    c = KernelCache(tmp_path)
    k1 = c.key("src", "ptx", "90", "t")
    assert k1 != c.key("src", "ptx", "80", "t") != c.key("src2", "ptx", "90", "t")
    assert c.get(k1) is None
    c.put(k1, b"\x7fELF-bytes")
    assert KernelCache(tmp_path).get(k1) == b"\x7fELF-bytes"
    assert c.stats.misses == 1 and c.clear() == 1 and c.get(k1) is None


# ------------------------------------------------------------------ epilogues and PDL
def test_epilogue_kernels_load_their_operands_at_the_store():
    """The epilogue's operands are read once, where the row is written: gamma and the
    residual with one 16-byte load per chunk, after the row's reductions."""
    from cupy_cases import epilogue_program, epilogue_shapes

    prog = epilogue_program("layer_norm", (64, 1024), 1, prologue=False)
    spec = contiguous_spec(prog, "float32", epilogue_shapes((64, 1024), 1))
    assert spec.prologue_inputs() == {0} and spec.epilogue_inputs() == {1, 2}
    lay = S.row_layout(spec, 4)
    src = ptx.emit(spec, "k", 90, vector=True)
    body = src[src.index("shfl.sync") :]
    assert src.count("ld.global.nc.v4.f32") == 3 * lay.chunks
    assert body.count("ld.global.nc.v4.f32") == 2 * lay.chunks  # after the first reduction
    assert src.count("st.global.v4.f32") == lay.chunks
    c = cuda_c.render(spec, "k", vector=True)
    assert c.count("__ldg(reinterpret_cast<const float4*>(in1") == 1
    assert c.index("float4*>(in2") > c.index("rstd")  # the residual is read after the statistics


@pytest.mark.parametrize("mode", ["wait", "trigger"])
def test_pdl_kernels_assemble_for_sm_90(mode, tmp_path):
    from cupy_cases import epilogue_cases

    specs = [s for n, s in all_cases() if n.endswith("float32")][:12] + [
        s for n, s in epilogue_cases() if n.endswith("float32")
    ]
    srcs = [ptx.emit(s, f"k{j}", 90, pdl=mode) for j, s in enumerate(specs)]
    assert all("griddepcontrol.wait;" in t for t in srcs)
    assert all(("griddepcontrol.launch_dependents;" in t) == (mode == "trigger") for t in srcs)
    f = tmp_path / "pdl.ptx"
    f.write_text(_module(srcs))
    r = subprocess.run(
        [_tool("ptxas"), "--gpu-name", "sm_90", str(f), "-o", str(tmp_path / "pdl.cubin")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]
    cu = tmp_path / "pdl.cu"
    cu.write_text(
        "\n".join(
            [cuda_c.render(specs[0], "k0", pdl=mode)]
            + [
                cuda_c.render(s, f"k{j}", prelude=False, pdl=mode)
                for j, s in enumerate(specs[1:], 1)
            ]
        )
    )
    r = subprocess.run(
        [_tool("nvcc"), "-arch=sm_90", "-c", str(cu), "-o", str(tmp_path / "p.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]
    with pytest.raises(BackendError, match="sm >= 90"):
        ptx.emit(specs[0], "k", 80, pdl=mode)


def test_pdl_launch_structs_match_cuda_h(tmp_path):
    """The ctypes mirrors of CUlaunchAttribute / CUlaunchConfig have cuda.h's layout."""
    import ctypes
    from tensorlogic.backends.cupy.pdl import (
        PROGRAMMATIC_STREAM_SERIALIZATION,
        LaunchAttribute,
        LaunchConfig,
    )

    src = tmp_path / "layout.c"
    src.write_text(
        "#include <cuda.h>\n#include <stdio.h>\n#include <stddef.h>\n"
        'int main(void) { printf("%zu %zu %zu %zu %zu %zu %d\\n", sizeof(CUlaunchAttribute),'
        " offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig),"
        " offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),"
        " offsetof(CUlaunchConfig, numAttrs),"
        " (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION); return 0; }\n"
    )
    exe = tmp_path / "layout"
    r = subprocess.run(
        [_tool("nvcc"), "-x", "c", str(src), "-o", str(exe)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[:2000]
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    mine = [
        ctypes.sizeof(LaunchAttribute),
        LaunchAttribute.value.offset,
        ctypes.sizeof(LaunchConfig),
        LaunchConfig.hStream.offset,
        LaunchConfig.attrs.offset,
        LaunchConfig.numAttrs.offset,
        PROGRAMMATIC_STREAM_SERIALIZATION,
    ]
    assert [int(v) for v in got] == mine


@pytest.mark.parametrize("pdl", [False, True])
def test_launch_variants_of_every_case(pdl):
    """Every case gets a scalar variant and, exactly where vector_width allows, a vector one,
    each with a positive geometry (row kernels: the block the code was emitted for)."""
    from cupy_cases import epilogue_cases
    from tensorlogic.backends.cupy import launch

    for name, spec in all_cases() + epilogue_cases():
        var = launch.variants(spec, 132, pdl)
        assert [v.vector for v in var] == ([False, True] if ptx.vector_width(spec) else [False])
        for v in var:
            assert v.grid >= 1 and 32 <= v.block <= 1024, name
            assert v.pdl == (("trigger" if v.grid <= 132 else "wait") if pdl else "")
            src = ptx.emit(spec, "k", 90, vector=v.vector, pdl=v.pdl)
            if ".maxntid" in src:  # the block the kernel was emitted for is the launch block
                assert f".maxntid {v.block}, 1, 1" in src, name
    tiny = contiguous_spec(op_program("tanh", (64, 64)), "float32", [(64, 64)])
    assert [v.pdl for v in launch.variants(tiny, 132, True)] == ["trigger", "trigger"]
    big = contiguous_spec(op_program("tanh", (1 << 24,)), "float32", [(1 << 24,)])
    assert [v.pdl for v in launch.variants(big, 132, True)] == ["wait", "wait"]
