"""The flash-attention kernel's CUDA C, compiled without a GPU: nvcc for sm_80 and sm_90, and its
PTX assembled by ptxas for both (nvcc and ptxas are part of the CI image)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tensorlogic.backends.cupy import attention_c, attention_mma
from tensorlogic.errors import BackendError

CASES = [  # d, dv, dtype, causal, mask
    (32, 32, "float32", False, False), (64, 64, "float32", True, False),
    (96, 80, "float32", False, True), (128, 128, "float32", True, True),
    (64, 64, "float16", True, True), (128, 128, "float16", False, False),
    (17, 5, "float64", True, True), (256, 256, "float32", False, False),
    (64, 64, "bfloat16", True, False),
]


MMA_CASES = [(64, 64, False, False), (128, 128, True, True), (32, 8, True, False),
             (80, 48, False, True), (16, 128, True, True)]


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
    for k, (d, dv, causal, mask) in enumerate(MMA_CASES):
        out.append(attention_mma.render(f"mma{k}", d, dv, causal, mask, helpers=k == 0))
    return "\n".join(out)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_c_compiles_and_its_ptx_assembles(arch, tmp_path):
    cu = tmp_path / "att.cu"
    cu.write_text(_sources())
    ptx = tmp_path / "att.ptx"
    r = subprocess.run([_tool("nvcc"), f"-arch={arch}", "-ptx", str(cu), "-o", str(ptx)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[:4000]
    r = subprocess.run([_tool("ptxas"), "--gpu-name", arch, "-v", str(ptx), "-o",
                        str(tmp_path / "att.cubin")], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[:4000]
    assert r.stderr.count("Compiling entry function") == len(CASES) + len(MMA_CASES)
    assert "mma.sync.aligned.m16n8k16" in ptx.read_text()


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
    assert attention_mma.supports(64, 64, "float16") and attention_mma.supports(128, 8, "float16")
    assert not attention_mma.supports(64, 64, "float32")
    assert not attention_mma.supports(72, 64, "float16")  # head dim not a multiple of 16
    assert not attention_mma.supports(64, 60, "float16")
    assert not attention_mma.supports(256, 64, "float16")
    with pytest.raises(BackendError, match="multiples"):
        attention_mma.render("k", 72, 64, False, False)
    assert attention_mma.shared_bytes(64, 64) == 2 * 3 * 64 * 72
