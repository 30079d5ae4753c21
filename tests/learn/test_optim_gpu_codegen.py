"""The optimizers' update programs (with their 0-d scalar arguments) as GPU code, without a GPU:
the PTX the cupy backend emits is assembled by ptxas and its CUDA C compiled by nvcc."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tensorlogic.backends.cupy import cuda_c, ptx, spec as S
from tensorlogic.optim import adam, sgd

SHAPE = (48, 40)

PROGRAMS = {  # name: (program, indices of the 0-d inputs, input count)
    "adam_m": (adam._first(0.9, 0.01), (), 3),
    "adam_v": (adam._second(0.999, 0.0), (), 3),
    "adam_p": (adam._param(1e-8, True), (3, 4, 5), 6),
    "sgd": (sgd._plain(0.1), (2,), 3),
    "sgd_buf": (sgd._buffer(0.0), (3, 4), 5),
    "sgd_nesterov": (sgd._momentum(0.01, 0.9, True), (3,), 4),
}


def _specs(dtype):
    for name, (prog, scalars, n) in PROGRAMS.items():
        body = prog.body(SHAPE)
        program = S.Program(body.instrs, body.result, SHAPE)
        shapes = [() if k in scalars else SHAPE for k in range(n)]
        strides = [S.contiguous_strides(s) for s in shapes]
        yield f"{name}_{dtype}", S.make_spec(program, dtype, shapes, [dtype] * n, strides)


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH (the CUDA toolkit is part of the CI image)")
    return path


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_update_kernels_assemble_and_compile(dtype, tmp_path):
    specs = list(_specs(dtype))
    sources = [ptx.emit(spec, name, 90) for name, spec in specs]
    head = sources[0][: sources[0].index(".visible .entry")]
    f = tmp_path / "updates.ptx"
    f.write_text(head + "\n".join(s[s.index(".visible .entry") :] for s in sources))
    r = subprocess.run(
        [_tool("ptxas"), "--gpu-name", "sm_90", str(f), "-o", str(tmp_path / "u.cubin")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]
    cu = tmp_path / "updates.cu"
    cu.write_text(
        "\n".join(
            cuda_c.render(spec, name, prelude=(k == 0)) for k, (name, spec) in enumerate(specs)
        )
    )
    r = subprocess.run(
        [_tool("nvcc"), "-arch=sm_90", "-c", str(cu), "-o", str(tmp_path / "u.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]
