"""The backward row ops' CUDA C kernels (``backends/cupy/rowgrad_c``): every op, dtype and block
size compiles with nvcc without a GPU; on a GPU the kernels agree with the reference
interpreter's explicit Jacobians."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends.cupy import rowgrad_c
from tensorlogic.errors import BackendError
from tensorlogic.ir import ops
from tensorlogic.testing import reference_evaluate


def test_every_row_backward_compiles_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.fail("nvcc is not on PATH: the GPU codegen tests need the CUDA toolkit's nvcc")
    srcs = []
    for op in sorted(ops.ROW_GRAD_PROGRAMS):
        for dtype in rowgrad_c.DTYPES:
            for threads in (32, 256):
                name = f"k_{op}_{dtype}_{threads}"
                # the 16-bit helpers once per module
                src = rowgrad_c.render(name, op, dtype, 1e-5, threads, prelude=not srcs)
                assert f"{name}(" in src
                srcs.append(src)
    f = tmp_path / "all.cu"
    f.write_text("\n".join(srcs))
    r = subprocess.run(
        [nvcc, "-arch=sm_90", "-c", str(f), "-o", str(tmp_path / "all.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:4000]


def test_render_refuses_other_dtypes():
    with pytest.raises(BackendError, match="takes"):
        rowgrad_c.render("k", "softmax", "int32", 0.0, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(ops.ROW_GRAD_PROGRAMS))
@pytest.mark.parametrize(
    "shape,axis", [((5, 7), -1), ((4, 6), 0), ((2, 3, 1500), 2), ((3, 40, 2), 1)]
)
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-11), ("float32", 1e-5), ("bfloat16", 3e-2)])
def test_row_backward_on_the_gpu(op, shape, axis, dtype, tol):
    import cupy

    rng = np.random.default_rng()
    x = rng.standard_normal(shape)
    if op == "softmax":
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        x = e / e.sum(axis=axis, keepdims=True)
    elif op == "log_softmax":
        x = x - np.log(np.exp(x).sum(axis=axis, keepdims=True))
    g = tl.EinsumGraph()
    a, ct = g.input("a", shape, dtype), g.input("g", shape, dtype)
    g.output(g.row_grad(op, [a, ct], axis), "dx")
    feed = {"a": x.astype(a.dtype), "g": rng.standard_normal(shape).astype(a.dtype)}
    want = reference_evaluate(g, feed)["dx"]
    plan = tl.compile(g, backend="cupy", cache=False)
    assert any("CUDA C row backward" in s.info for s in plan.steps)
    got = cupy.asnumpy(plan(**feed)["dx"]).astype(np.float64)
    np.testing.assert_allclose(got, want, atol=tol * max(np.abs(want).max(), 1.0), rtol=tol)
