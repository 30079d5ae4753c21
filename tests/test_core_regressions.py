"""Regression tests for core bugs the differential fuzzer found, each against numpy directly."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl


def _run_einsum(spec, shapes, dtypes=None, rng=None):
    rng = rng or np.random.default_rng(0)
    dtypes = dtypes or ["float64"] * len(shapes)
    g = tl.EinsumGraph()
    xs = [g.input(f"x{i}", s, dt) for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    g.output(g.einsum(spec, *xs), "y")
    ins = {
        f"x{i}": rng.uniform(0.5, 2.0, s).astype(dt)
        for i, (s, dt) in enumerate(zip(shapes, dtypes))
    }
    got = tl.compile(g, "numpy", 0)(ins)["y"]
    want = np.einsum(spec, *[ins[f"x{i}"].astype(np.float64) for i in range(len(shapes))])
    return got, want


@pytest.mark.parametrize(
    "spec,shapes",
    [
        ("ij,jk->ki", [(2, 3), (3, 4)]),  # output wants (right, left): operands were swapped
        ("ij,kj->ki", [(2, 3), (4, 3)]),
        ("a,b->ba", [(2,), (3,)]),  # outer product with swapped output
        ("a,ab->b", [(2,), (1, 3)]),  # size-1 dim broadcast: 'a' must be summed alone
        ("ij,jk->ik", [(2, 1), (3, 4)]),
        ("ab,a->", [(2, 1), (1,)]),
        ("...a,ab", [(2, 2), (1, 1)]),
        ("...a,...bb->b...a", [(1, 1), (1, 1)]),
        ("...a,aba,...cc", [(1, 1), (1, 2, 1), (1, 1)]),
    ],
)
def test_einsum_swapped_output_and_size1_broadcast(spec, shapes):
    got, want = _run_einsum(spec, shapes)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_einsum_mixed_dtypes_sums_in_result_precision():
    # the float32 operand's trace used to be summed in float32 inside a float64 einsum
    rng = np.random.default_rng(1)
    got, want = _run_einsum(",aa", [(), (40, 40)], ["float64", "float32"], rng)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu_of_a_scalar(dtype):
    g = tl.EinsumGraph()
    x = g.input("x", (), dtype)
    g.output(g.gelu(x), "y")
    v = np.array(0.7, dtype)
    got = tl.compile(g, "numpy", 0)(x=v)["y"]
    want = 0.5 * 0.7 * (1 + np.tanh(np.sqrt(2 / np.pi) * (0.7 + 0.044715 * 0.7**3)))
    np.testing.assert_allclose(got, want, rtol=1e-6)
