"""The flash-attention kernel's CUDA C, compiled without a GPU: nvcc for sm_80 and sm_90, and its
PTX assembled by ptxas for both (nvcc and ptxas are part of the CI image)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tensorlogic.backends.cupy import attention_c, attention_mma, attention_tf32
from tensorlogic.errors import BackendError

CASES = [  # d, dv, dtype, causal, mask
    (32, 32, "float32", False, False),
    (64, 64, "float32", True, False),
    (96, 80, "float32", False, True),
    (128, 128, "float32", True, True),
    (64, 64, "float16", True, True),
    (128, 128, "float16", False, False),
    (17, 5, "float64", True, True),
    (256, 256, "float32", False, False),
    (64, 64, "bfloat16", True, False),
]


_C = attention_mma.Config
MMA_CASES = [  # d, dv, dtype, causal, mask, block shape
    (64, 64, "bfloat16", False, False, _C(8)),
    (128, 128, "bfloat16", True, True, _C(8)),
    (32, 32, "float16", True, False, _C(4)),
    (96, 48, "bfloat16", False, True, _C(4)),
    (16, 128, "float16", True, True, _C(8, 2, False, True)),
    (128, 64, "float16", False, False, _C(4, 2, False)),
    (64, 64, "bfloat16", True, False, _C(4, 2, True, True)),
    (64, 64, "bfloat16", False, False, _C(4, 2, True, bn=128)),
    (128, 128, "float16", True, False, _C(4, 2, False, True, bn=32)),
]


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (it is part of the CI image)"
    return path


def _sources() -> str:
    # each kernel is self-contained (no macros or file-scope types): they concatenate
    prelude_seen = False
    out = []
    for k, (d, dv, dt, causal, mask) in enumerate(CASES):
        src = attention_c.render(f"att{k}", d, dv, dt, causal, mask)
        if dt in ("float16", "bfloat16"):
            if prelude_seen:
                src = src.replace(attention_c.HALF_PRELUDE, "")
            prelude_seen = True
        out.append(src)
    for k, (d, dv, dt, causal, mask, cfg) in enumerate(MMA_CASES):
        # odd cases: the kernel for a positive scale (raw-score maxima, one FMA per exponent)
        out.append(
            attention_mma.render(
                f"mma{k}", d, dv, dt, causal, mask, cfg, helpers=k == 0, positive_scale=k % 2 == 1
            )
        )
    return "\n".join(out)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_c_compiles_and_its_ptx_assembles(arch, tmp_path):
    cu = tmp_path / "att.cu"
    cu.write_text(_sources())
    ptx = tmp_path / "att.ptx"
    r = subprocess.run(  # C++14, as the backend's NVRTC call compiles them
        [_tool("nvcc"), f"-arch={arch}", "-std=c++14", "-ptx", str(cu), "-o", str(ptx)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr[:4000]
    r = subprocess.run(
        [_tool("ptxas"), "--gpu-name", arch, "-v", str(ptx), "-o", str(tmp_path / "att.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr[:4000]
    assert r.stderr.count("Compiling entry function") == len(CASES) + len(MMA_CASES)
    text = ptx.read_text()
    # one generic-to-shared conversion per tensor-core kernel: every other shared address is a
    # 32-bit base plus a constant (a conversion per ldmatrix or cp.async costs issue slots)
    assert text.count("cvta.to.shared") == len(MMA_CASES)
    for instr in (
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "ldmatrix.sync.aligned",
        ".trans",
        "cp.async.cg.shared.global",
        "ex2.approx",
    ):
        assert instr in text, instr


def test_shared_memory_and_bad_head_dims():
    # float32, d = dv = 64: query tile 64x65, key/value tile 64x65, probability tile 64x65
    assert attention_c.shared_bytes(64, 64, "float32") == 4 * 3 * 64 * 65
    with pytest.raises(BackendError, match="head dims"):
        attention_c.render("k", 300, 64, "float32", False, False)
    with pytest.raises(BackendError, match="dtype"):
        attention_c.render("k", 64, 64, "int32", False, False)


def test_flags_reach_the_source():
    causal = attention_c.render("k", 64, 64, "float32", True, True)
    plain = attention_c.render("k", 64, 64, "float32", False, False)
    assert "CAUSAL = true, HAS_MASK = true" in causal
    assert "CAUSAL = false, HAS_MASK = false" in plain
    assert "tl_h2f" in attention_c.render("k", 64, 64, "float16", False, False)


def test_tensor_core_path_limits():
    assert attention_mma.supports(64, 64, "float16") and attention_mma.supports(128, 16, "bfloat16")
    assert attention_mma.supports(96, 96, "bfloat16")
    assert not attention_mma.supports(64, 64, "float32")  # attention_tf32 takes it
    assert not attention_mma.supports(72, 64, "float16")  # head dim not a multiple of 16
    assert not attention_mma.supports(64, 56, "bfloat16")
    assert not attention_mma.supports(256, 64, "float16")
    with pytest.raises(BackendError, match="multiples"):
        attention_mma.render("k", 72, 64, "bfloat16", False, False)
    with pytest.raises(BackendError, match="warps"):
        attention_mma.render("k", 64, 64, "bfloat16", False, False, _C(warps=2))
    with pytest.raises(BackendError, match="m-tiles"):
        attention_mma.render("k", 64, 64, "bfloat16", False, False, _C(mt=3))
    with pytest.raises(BackendError, match="keys a"):
        attention_mma.render("k", 64, 64, "bfloat16", False, False, _C(bn=48))
    assert attention_mma.shared_bytes(64, 64, _C(4, 2, bn=128)) == 2 * (128 * 72 + 4 * 128 * 72)
    # a positive scale without a mask tensor takes the raw-score maxima; a mask keeps them scaled
    assert "RAW = true" in attention_mma.render(
        "k", 64, 64, "bfloat16", True, False, positive_scale=True
    )
    assert "RAW = false" in attention_mma.render(
        "k", 64, 64, "bfloat16", True, True, positive_scale=True
    )
    assert "RAW = false" in attention_mma.render("k", 64, 64, "bfloat16", True, False)
    # 128 query rows (64 + 8 padded), two stages of 64 keys and 64 values
    assert attention_mma.shared_bytes(64, 64, _C(8)) == 2 * (128 * 72 + 4 * 64 * 72)
    assert _C(4, 2).rows == 128 and _C(4, 2).threads == 128
    src = attention_mma.render("k", 64, 64, "bfloat16", True, False, _C(warps=4))
    assert "tl_att_mma_bf16(" in src and "WARPS = 4" in src and "CAUSAL = true" in src
    # paired blocks: half the query blocks along x, and only under a causal mask
    assert attention_mma.grid_x(1000, True, _C(4, 2, pair=True)) == 4  # 8 blocks of 128
    assert attention_mma.grid_x(1000, False, _C(4, 2, pair=True)) == 8
    assert attention_mma.grid_x(1100, True, _C(8, 1, pair=True)) == 5  # 9 blocks: one alone
    assert "PAIR = false" in attention_mma.render(
        "k", 64, 64, "float16", False, False, _C(pair=True)
    )


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tensor_core_kernel_keeps_its_registers(arch, tmp_path):
    # spills in the plain kernel (no causal or mask branches) would slow every tile; ptxas
    # reports them (the causal and masked variants may spill a few bytes under the 128-register
    # cap that keeps two blocks of 64-wide heads per multiprocessor)
    cu = tmp_path / "mma.cu"
    cu.write_text(
        "\n".join(
            attention_mma.render(
                f"k{i}", d, d, dt, False, False, cfg, helpers=i == 0, positive_scale=pos
            )
            for i, (d, dt, cfg, pos) in enumerate(
                [
                    (64, "bfloat16", _C(8), False),
                    (128, "float16", _C(8), False),
                    (64, "bfloat16", _C(4, 2, True), False),
                    (128, "bfloat16", _C(4, 2, False), False),
                    (64, "bfloat16", _C(4, 2, True), True),  # the default at head dim 64
                    (128, "bfloat16", _C(4, 2, False), True),  # the default at head dim 128
                    (48, "float16", _C(4, 2, True), True),  # rows of 6 chunks: the loop form
                ]
            )
        )
    )
    r = subprocess.run(
        [
            _tool("nvcc"),
            f"-arch={arch}",
            "-cubin",
            "-Xptxas",
            "-v",
            str(cu),
            "-o",
            str(tmp_path / "mma.cubin"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr[:4000]
    assert r.stderr.count(" 0 bytes spill stores") == 7, r.stderr


_T = attention_tf32.Config
TF32_CASES = [  # d, dv, causal, mask, block shape, split
    (64, 64, False, False, _T(4, 1, True, 32), True),
    (128, 128, False, False, _T(4, 1, True, 32), True),
    (128, 128, True, True, _T(4, 1, False, 32, True), True),
    (32, 128, True, False, _T(8, 2, True, 64), True),
    (40, 24, False, True, _T(4, 2, False, 64), False),
    (64, 64, True, False, _T(4, 1, True, 64, True), False),
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_float32_tensor_core_kernel_compiles_and_keeps_its_registers(arch, tmp_path):
    cu = tmp_path / "tf32.cu"
    cu.write_text(
        "\n".join(
            attention_tf32.render(f"t{i}", d, dv, causal, mask, cfg, split, helpers=i == 0)
            for i, (d, dv, causal, mask, cfg, split) in enumerate(TF32_CASES)
        )
    )
    ptx = tmp_path / "tf32.ptx"
    r = subprocess.run(
        [_tool("nvcc"), f"-arch={arch}", "-ptx", str(cu), "-o", str(ptx)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr[:4000]
    text = ptx.read_text()
    for instr in (
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
        "cvt.rna.tf32.f32",
        "cp.async.cg.shared.global",
        "ex2.approx",
    ):
        assert instr in text, instr
    r = subprocess.run(
        [_tool("ptxas"), "--gpu-name", arch, "-v", str(ptx), "-o", str(tmp_path / "t.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr[:4000]
    assert r.stderr.count("Compiling entry function") == len(TF32_CASES)
    # the default shape of attention_gpu.tf32_config spills nothing in the plain kernels (the
    # first two; a causal mask with a mask tensor may spill a few bytes under the 128 cap)
    for name in ("t0", "t1"):
        report = r.stderr.split(f"Compiling entry function '{name}'")[1].split("Compiling")[0]
        assert " 0 bytes spill stores" in report, report


def test_float32_tensor_core_kernel_limits():
    assert attention_tf32.supports(64, 64, "float32") and attention_tf32.supports(8, 128, "float32")
    assert not attention_tf32.supports(64, 64, "bfloat16")
    assert not attention_tf32.supports(36, 64, "float32")  # not a multiple of 8
    assert not attention_tf32.supports(136, 64, "float32")
    with pytest.raises(BackendError, match="multiples of 8"):
        attention_tf32.render("k", 36, 64, False, False)
    with pytest.raises(BackendError, match="warps"):
        attention_tf32.render("k", 64, 64, False, False, _T(warps=2))
    with pytest.raises(BackendError, match="keys a tile"):
        attention_tf32.render("k", 64, 64, False, False, _T(bn=48))
    # 64 query rows and two stages of 32 keys and 32 values, rows padded by 4 floats
    assert attention_tf32.shared_bytes(64, 64, _T(4, 1, False, 32)) == 4 * (64 * 68 + 4 * 32 * 68)
    assert attention_tf32.grid_x(1000, True, _T(4, 1, pair=True)) == 8  # 16 blocks of 64
    assert attention_tf32.grid_x(1000, False, _T(4, 1, pair=True)) == 16
    one = attention_tf32.render("k", 64, 64, True, False, _T(), split=False)
    assert "SPLIT = false" in one and "CAUSAL = true" in one
    assert "SPLIT = true" in attention_tf32.render("k", 64, 64, False, False)
