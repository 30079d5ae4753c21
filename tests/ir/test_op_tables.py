"""The reduction and row-op rows: one description that every code generator and the cost model
read."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends.numba import codegen as numba_codegen
from tensorlogic.backends.cupy import cuda_c, ptx_kernel as ptx
from tensorlogic.ir import cost, ops

_NUMPY_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@pytest.mark.parametrize("name", ops.COMBINED_REDUCTIONS)
def test_identity_is_neutral_and_combine_folds_to_the_numpy_function(name, rng):
    row = ops.REDUCTION_TABLE[name]
    x = rng.uniform(0.5, 1.5, 37)
    comb = _NUMPY_COMBINE[row.combine]
    acc = row.identity
    for v in x:
        acc = comb(acc, v)
    if row.mean:
        acc = acc / x.size
    np.testing.assert_allclose(acc, getattr(np, row.numpy)(x), rtol=1e-12)
    assert comb(row.identity, 0.75) == 0.75


def test_every_generator_renders_every_combined_reduction():
    for name in ops.COMBINED_REDUCTIONS:
        assert name in numba_codegen._INIT and name in cuda_c._COMBINE and name in ptx._COMBINE
        assert cuda_c._IDENT[name] == ptx._COMBINE[name][1] == ops.REDUCTION_TABLE[name].identity
        assert eval(numba_codegen._INIT[name], {"np": np}) == ops.REDUCTION_TABLE[name].identity


@pytest.mark.parametrize("op", ops.REDUCTIONS)
def test_step_flops_come_from_the_table(op):
    g = tl.EinsumGraph()
    x = g.input("x", (6, 7))
    g.output(getattr(g, op)(x, axis=1), name="y")
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    assert plan.steps[0].flops == 42 * ops.REDUCTION_TABLE[op].flops


def test_fused_flops_count_like_the_steps_they_replace():
    g = tl.EinsumGraph()
    x = g.input("x", (8, 16))
    g.output(g.softmax(g.exp(x) * 2.0, axis=1), name="y")
    o0 = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    o2 = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    assert len(o2.steps) == 1 < len(o0.steps)
    assert o2.steps[0].flops == sum(s.flops for s in o0.steps)
    assert cost.row_op_flops("softmax", 128) == 128 * ops.ROW_OP_FLOPS["softmax"]
    assert math.prod(o2.steps[0].shape) == 128
