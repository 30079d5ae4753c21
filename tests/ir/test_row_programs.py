"""Row programs: each row op and reduction described once in the op table, checked against the
independent float64 reference; the GPU generators render a program they have never seen."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tensorlogic.backends.cupy import cuda_c, ptx
from tensorlogic.backends.cupy import spec as S
from tensorlogic.ir import ops
from tensorlogic.ir.evaluate import row_program
from tensorlogic.ir.fused import FusedOp
from tensorlogic.testing import reference

_NAMES = {"x", "inv_n", "eps"}


def _refs(e) -> set[str]:
    if isinstance(e, str):
        return {e}
    if isinstance(e, (int, float)):
        return set()
    op, *args = e
    assert op in ops.ELEMENTWISE and ops.ELEMENTWISE[op].arity == len(args), e
    return set().union(*map(_refs, args))


@pytest.mark.parametrize("name", sorted(ops.ROW_PROGRAMS))
def test_program_is_well_formed(name):
    prog = ops.ROW_PROGRAMS[name]
    known = set(_NAMES)
    for step in prog[:-1]:
        assert step.kind in ("reduce", "let", "map"), step
        assert _refs(step.expr) <= known, step
        if step.kind == "reduce":
            assert ops.REDUCTION_TABLE[step.combine].combine is not None
        known.add(step.name)
    last = prog[-1]
    assert _refs(last.expr) <= known
    assert last.kind == ("write" if name in ops.ROW_OPS else "result")


def test_every_row_op_and_reduction_has_a_program():
    assert set(ops.ROW_OPS) | set(ops.REDUCTIONS) == set(ops.ROW_PROGRAMS)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(sorted(ops.ROW_PROGRAMS)),
    st.sampled_from(["float32", "float64"]),
    st.integers(1, 4),
    st.integers(1, 9),
    st.integers(0, 2**31 - 1),
)
def test_program_matches_the_reference(name, dtype, rows, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, (rows, n)).astype(dtype)
    got = row_program(name, x, (1,), 1e-5)
    want = (
        reference._rowop(name, x.astype(np.float64), 1, 1e-5)
        if name in ops.ROW_OPS
        else reference._reduce(name, x.astype(np.float64), (1,), True)
    )
    tol = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_shift_of_rows_that_are_not_finite():
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0]])
    lse = row_program("logsumexp", x, (1,)).ravel()
    assert lse[0] == -np.inf and lse[1] == np.inf and np.isnan(lse[2])
    with np.errstate(all="ignore"):  # numpy's softmax of these rows is NaN too
        want = np.exp(x - x.max(1, keepdims=True))
        want = want / want.sum(1, keepdims=True)
    np.testing.assert_array_equal(row_program("softmax", x, (1,)), want)


# a row op the generators have never seen: x / sqrt(mean(x^2) + eps)
_RMS = (
    ops.RowStep("reduce", "q", ("square", "x"), "sum"),
    ops.RowStep("let", "r", ("reciprocal", ("sqrt", ("add", ("mul", "q", "inv_n"), "eps")))),
    ops.RowStep("write", "", ("mul", "x", "r")),
)


def test_a_new_row_program_runs_on_the_host(monkeypatch, rng):
    monkeypatch.setitem(ops.ROW_PROGRAMS, "rms_norm", _RMS)
    x = rng.standard_normal((3, 50))
    want = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(row_program("rms_norm", x, (1,), 1e-6), want, rtol=1e-12)


@pytest.mark.parametrize("shape", [(8, 1000), (300, 7)])
def test_a_new_row_program_renders_for_the_gpu(monkeypatch, shape, tmp_path):
    """PTX (ptxas) and CUDA C (nvcc) of a program added to the table and nowhere else, in the
    register-held, block-per-row and vector forms the specs choose."""
    monkeypatch.setitem(ops.ROW_PROGRAMS, "rms_norm", _RMS)
    prog = S.Program((FusedOp("exp", (("in", 0),)),), ("tmp", 0), shape, "rms_norm", (1,), eps=1e-6)
    spec = S.make_spec(prog, "float32", [shape], ["float32"], [S.contiguous_strides(shape)])
    srcs = [ptx.emit(spec, "rms", 80)]
    if ptx.vector_width(spec):
        srcs.append(ptx.emit(spec, "rms_v", 80, vector=True).split(".visible", 1)[1])
        srcs[-1] = ".visible" + srcs[-1]
    for src in srcs:
        assert "ex2.approx" in src and "rcp.rn.f32" in src and "sqrt.rn.f32" in src
    ptxas, nvcc = shutil.which("ptxas"), shutil.which("nvcc")
    if ptxas is None or nvcc is None:
        pytest.fail("the GPU codegen tests need the CUDA toolkit's ptxas and nvcc")
    f = tmp_path / "rms.ptx"
    f.write_text("\n".join(srcs))
    r = subprocess.run(
        [ptxas, "--gpu-name", "sm_90", str(f), "-o", str(tmp_path / "rms.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:3000]
    c = tmp_path / "rms.cu"
    c.write_text(cuda_c.render(spec, "rms_c"))
    r = subprocess.run(
        [nvcc, "-arch=sm_90", "-c", str(c), "-o", str(tmp_path / "rms_c.o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[:3000]


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_numba_renders_row_programs(monkeypatch, name, rng):
    """The numba generator's rendering of row programs (used for row ops without a tuned
    kernel), checked on the built-in programs under a new name and on a new one."""
    from tensorlogic.backends import get_backend
    from tensorlogic.ir.fused import FusedBody

    monkeypatch.setitem(ops.ROW_PROGRAMS, "rms_norm", _RMS)
    new = f"{name}_by_program"
    monkeypatch.setitem(ops.ROW_PROGRAMS, new, ops.ROW_PROGRAMS[name])
    monkeypatch.setattr(ops, "ROW_OPS", ops.ROW_OPS + (new,))
    backend = get_backend("numba")
    x = rng.standard_normal((6, 37))
    scaled = (FusedOp("mul", (("in", 0), ("const", 0.5))),)
    for axis, instrs in ((1, ()), (0, ()), (1, scaled)):
        body = FusedBody(instrs, x.shape, new, (axis,), eps=1e-5)
        kernel = backend.kernel_for(body, [x.shape], "float64")
        out = kernel([x], np.empty_like(x))
        want = row_program(name, x * 0.5 if instrs else x, (axis,), 1e-5)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name,axes,keepdims",
    [("logsumexp", (0, 2), False), ("mean", (1,), True), ("softmax", (2,), True)],
)
def test_host_program_kernel_matches_the_reference(name, axes, keepdims, rng):
    """The host kernel of a row op or reduction, rendered from its row program."""
    from tensorlogic.backends.kernels import row_kernel

    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    want = (
        reference._rowop(name, x.astype(np.float64), axes[0])
        if name in ops.ROW_OPS
        else reference._reduce(name, x.astype(np.float64), axes, keepdims)
    )
    out = np.empty(np.shape(want), np.float32)
    row_kernel(np, name, x.shape, "float32", axes)([x], out)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)


def test_where_is_a_three_operand_row(rng):
    row = ops.ELEMENTWISE["where"]
    assert row.arity == 3 and ops.KIND_OF_ARITY[3] == ops.WHERE and row.operands[0] == "cond"
    c = (rng.standard_normal((4, 5)) > 0).astype(np.float32)
    c[0, 0] = np.nan  # a NaN condition is nonzero
    a, b = rng.standard_normal((2, 4, 5)).astype(np.float32)
    want = np.where(c != 0, a, b)
    for alias in range(3):  # out may be any operand exactly
        xs = [c.copy(), a.copy(), b.copy()]
        np.testing.assert_array_equal(row.numpy(*xs, out=xs[alias]), want)
