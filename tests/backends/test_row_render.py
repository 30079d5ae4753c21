"""The numpy rendering of row programs (``backends/numpy/rows.py``): selects rendered as masked
copies, comparisons only a select reads folded into its mask, and the plan step's bound
function; every form against the row-program evaluator, on rows holding NaN and infinities."""

from __future__ import annotations

import numpy as np
import pytest

from tensorlogic.backends.kernels import row_kernel
from tensorlogic.backends.numpy import rows
from tensorlogic.ir import ops
from tensorlogic.ir.evaluate import run_row_program

R = ops.RowStep
# each program puts a select in another place of the schedule: into the slot of its second
# operand, of its first, into a fresh buffer, into out (which may be x), and behind a
# comparison that a later step reads too (so it is not folded into the mask)
PROGRAMS = {
    "select_into_b": (
        R("reduce", "m", "x", "max"),
        R("let", "ms", ("where", ("eq", "m", float("-inf")), 0.0, "m")),
        R("write", "", ("sub", "x", "ms")),
    ),
    "select_into_a": (
        R("reduce", "m", "x", "max"),
        R("let", "ms", ("where", ("eq", ("sub", "m", "m"), 0.0), "m", 0.0)),
        R("write", "", ("sub", "x", "ms")),
    ),
    "select_ordered": (
        R("reduce", "m", "x", "max"),
        R("let", "ms", ("where", ("lt", "m", 0.5), ("mul", "m", 2.0), ("add", "m", 1.0))),
        R("write", "", ("mul", "x", "ms")),
    ),
    "select_map": (
        R("reduce", "s", "x", "sum"),
        R("write", "", ("where", ("gt", "x", 0.0), ("mul", "x", "s"), ("sub", "x", "s"))),
    ),
    "select_of_x": (
        R("reduce", "s", "x", "sum"),
        R("write", "", ("where", ("ne", "x", 1.0), "x", "s")),
    ),
    "compare_read_twice": (
        R("reduce", "m", "x", "max"),
        R("let", "c", ("eq", "m", float("inf"))),
        R("let", "ms", ("where", "c", 0.0, "m")),
        R("write", "", ("add", ("sub", "x", "ms"), "c")),
    ),
    "select_result": (
        R("reduce", "m", "x", "min"),
        R("result", "", ("where", ("ge", "m", 0.0), "m", ("neg", "m"))),
    ),
}


def _rows(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    x[0] = -np.inf  # a row of -inf
    x[1, 0] = np.inf
    x[2, 1] = np.nan
    x[3, :2] = -np.inf
    x[4, 0] = 1.0
    return x


@pytest.fixture(params=sorted(PROGRAMS))
def program(request, monkeypatch):
    name = request.param
    monkeypatch.setitem(ops.ROW_PROGRAMS, name, PROGRAMS[name])
    monkeypatch.setattr(
        ops, "ROW_OPS", (*ops.ROW_OPS, *(n for n in PROGRAMS if n != "select_result"))
    )
    return name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("in_place", [False, True])
def test_rendered_selects_match_the_evaluator(program, dtype, in_place, rng):
    shape = (6, 9)
    x = _rows(rng, shape, dtype)
    with np.errstate(all="ignore"):
        want = run_row_program(ops.ROW_PROGRAMS[program], {"x": x.copy()}, (1,), 0.0, program)
    k = rows.RowKernel(program, dtype, (1,))
    row_op = program in ops.ROW_OPS
    out_shape = shape if row_op else (shape[0], 1)
    bufs = [np.full(s, 7.0, d) for s, d in k.scratch(shape)]  # stale values in the scratch
    for run in ("call", "step"):
        xin = x.copy()
        out = xin if (in_place and row_op) else np.full(out_shape, 5.0, dtype)
        with np.errstate(all="ignore"):  # inf - inf: the NaN the evaluator computes too
            if run == "call":
                k(xin, out, bufs)
            else:
                k.step_function(shape)([xin, *bufs], out)
        np.testing.assert_array_equal(out.reshape(np.shape(want)), want, err_msg=run)


def test_a_compare_only_the_select_reads_becomes_its_mask():
    """softmax's shift: no equal() into a float buffer and no where function per call."""
    k = rows.RowKernel("softmax", "float32", (1,))
    names = k._run.__code__.co_names
    assert "_copyto" in names
    assert not any(k._run.__globals__[n] is rows._WHERE for n in names if n.startswith("_f"))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp", "layer_norm", "mean"])
def test_plan_step_kernel_takes_the_general_path_for_other_calls(name, rng):
    """The bound step function serves the plan's call (its shape, dtype and scratch); any other
    call (no scratch, another dtype, a reduction's out without the kept axis) runs the general
    kernel, with the same result."""
    shape, axes = (5, 12), (1,)
    x = rng.standard_normal(shape).astype(np.float32)
    kernel = row_kernel(np, name, shape, "float32", axes, 1e-5)
    row_op = name in ops.ROW_OPS
    kept = shape if row_op else (5, 1)
    want = run_row_program(ops.ROW_PROGRAMS[name], {"x": x}, axes, 1e-5, name)
    scratch = [np.empty(s, d) for s, d in kernel.scratch]
    for args, out in [
        ([x, *scratch], np.empty(kept, np.float32)),  # the plan's call
        ([x], np.empty(kept, np.float32)),  # no scratch
        ([x.astype(np.float64), *scratch], np.empty(kept, np.float32)),  # another dtype
        ([x, *scratch], np.empty(shape if row_op else (5,), np.float32)),  # no kept axis
    ]:
        got = kernel(args, out)
        np.testing.assert_allclose(np.reshape(got, np.shape(want)), want, rtol=2e-6, atol=1e-6)
