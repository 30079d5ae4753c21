"""Where the gradient has a choice to make: relu and step at 0, ties of max/min (shared
equally, as torch's amax), prod with zeros, complex numbers (torch's convention), 16-bit
dtypes, causal attention, and graphs whose loss ignores some inputs."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.testing import assert_grads_agree

CPU = ("numpy", "numba")


def _grads(g, of, wrt, backend="numpy", opt_level=2, **feed):
    return tl.compile(tl.grad(g, of, wrt), backend=backend, opt_level=opt_level)(**feed)


@pytest.mark.parametrize("backend", CPU)
def test_relu_abs_step_at_zero(backend):
    g = tl.EinsumGraph()
    x = g.input("x", (4,), "float32")
    g.output(g.sum(g.relu(x) + g.abs(x) + g.step(x) * 3.0), "loss")
    out = _grads(g, "loss", ["x"], backend, x=np.array([-1.0, 0.0, 0.0, 2.0], np.float32))
    # relu' = 0 at 0 (torch), abs' = sign = 0 at 0, step has no gradient
    np.testing.assert_array_equal(out["grad_x"], [-1.0, 0.0, 0.0, 2.0])


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("opt_level", [0, 2])
def test_max_min_ties_share_the_gradient(backend, opt_level):
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3), "float64")
    a = g.input("a", (3,), "float64")
    loss = (
        g.sum(g.max(x, axis=1) * 2.0)
        + g.sum(g.min(x, axis=0))
        + g.sum(g.maximum(a, 1.0))
        + g.sum(g.minimum(a, a))
    )
    g.output(loss, "loss")
    xv = np.array([[1.0, 3.0, 3.0], [5.0, 5.0, 5.0]])
    out = _grads(g, "loss", ["x", "a"], backend, opt_level, x=xv, a=np.array([1.0, 2.0, 0.0]))
    want = np.array([[0.0, 1.0, 1.0], [2 / 3, 2 / 3, 2 / 3]])  # amax: ties share equally
    want += np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # column minima, no ties
    np.testing.assert_allclose(out["grad_x"], want, rtol=1e-12)
    # maximum(a, 1): tie at a=1 gives 1/2; minimum(a, a): both halves reach a
    np.testing.assert_allclose(out["grad_a"], [0.5 + 1.0, 1.0 + 1.0, 0.0 + 1.0])


def test_prod_with_zeros():
    g = tl.EinsumGraph()
    x = g.input("x", (3, 3), "float64")
    g.output(g.sum(g.prod(x, axis=1)), "loss")
    xv = np.array([[2.0, 3.0, 4.0], [2.0, 0.0, 4.0], [0.0, 3.0, 0.0]])
    out = _grads(g, "loss", ["x"], x=xv)
    np.testing.assert_array_equal(out["grad_x"], [[12, 8, 6], [0, 8, 0], [0, 0, 0]])


def test_complex_follows_torch():
    g = tl.EinsumGraph()
    z = g.input("z", (3,), "complex128")
    w = g.input("w", (3,), "complex128")
    re = g.cast(g.einsum("i,i->", z, w), "float64")  # Re(sum z w)
    g.output(re + g.sum(g.square(g.abs(z))), "loss")  # + sum |z|^2
    rng = np.random.default_rng(1)
    zv = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    wv = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    out = _grads(g, "loss", ["z", "w"], z=zv, w=wv)
    # torch: dL/dRe + i dL/dIm, which is conj(w) for Re(z w) and 2z for |z|^2
    np.testing.assert_allclose(out["grad_z"], np.conj(wv) + 2 * zv, rtol=1e-12)
    np.testing.assert_allclose(out["grad_w"], np.conj(zv), rtol=1e-12)


def test_complex_ops_against_finite_differences():
    g = tl.EinsumGraph()
    z = g.input("z", (2, 3), "complex128")
    w = g.input("w", (3,), "complex64")
    y = g.exp(z * 0.3) / (w + 2.0) + g.log(g.square(z) + 3.0) * g.sqrt(w + 2.0)
    y = g.einsum("ij,j->i", y, g.reciprocal(w + 3.0)) + g.prod(z, axis=1)
    g.output(y, "y")  # complex output: a vjp
    assert_grads_agree(g, "y", ["z", "w"], backends=CPU)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_gradients(dtype):
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), dtype)
    w = g.input("w", (8, 4), dtype)
    h = g.gelu(g.einsum("bi,ij->bj", x, w))
    g.output(g.mean(g.softmax(h) * h), "loss")
    assert_grads_agree(g, "loss", ["x", "w"], backends=CPU, ranges={"x": (-1, 1), "w": (-1, 1)})


@pytest.mark.parametrize("causal", [False, True])
def test_attention_causal_and_16bit(causal):
    g = tl.EinsumGraph()
    q, k, v = (g.input(n, (2, 4, 8), "float32") for n in "qkv")
    g.output(g.attention(q, k, v, causal=causal, scale=0.3), "y")
    assert_grads_agree(g, "y", ["q", "k", "v"], backends=CPU)
    h = tl.EinsumGraph()
    q, k, v = (h.input(n, (1, 3, 16), "float16") for n in "qkv")
    h.output(h.sum(h.attention(q, k, v, causal=causal)), "loss")
    assert_grads_agree(
        h, "loss", ["q", "k", "v"], backends=("numpy",), ranges={n: (-1, 1) for n in "qkv"}
    )


def test_unused_input_gets_zeros_and_int_inputs_block():
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 3), "float32")
    g.input("u", (2,), "float32")  # the loss ignores it
    n = g.input("n", ("B", 3), "int64")
    g.output(g.sum(x * n), "loss")
    back = tl.grad(g, "loss", ["x", "u"])
    out = tl.compile(back, backend="numpy")(
        x=np.ones((2, 3), np.float32), u=np.ones(2, np.float32), n=np.arange(6).reshape(2, 3)
    )
    np.testing.assert_array_equal(out["grad_u"], np.zeros(2, np.float32))
    np.testing.assert_array_equal(out["grad_x"], np.arange(6).reshape(2, 3))
    assert out["grad_x"].dtype == np.float32 and out["loss"] == 15


def test_gradient_wrt_a_constant():
    g = tl.EinsumGraph()
    x = g.input("x", (3, 2), "float64")
    w = g.constant(np.array([[1.0, -2.0], [0.5, 3.0]]), name="w")
    g.output(g.sum(g.tanh(g.einsum("bi,ij->bj", x, w))), "loss")
    assert_grads_agree(g, "loss", ["w", "x"], backends=CPU)


def test_integer_operands_take_part_but_get_no_gradient():
    g = tl.EinsumGraph()
    x = g.input("x", (3,), "float32")
    n = g.input("n", (3,), "int64")
    y = x / n + x * n + g.maximum(x, n) + x**n
    g.output(g.sum(y), "loss")
    xv = np.array([0.5, 1.5, 3.5], np.float32)
    nv = np.array([2, 3, 1])
    out = _grads(g, "loss", ["x"], x=xv, n=nv)
    want = 1 / nv + nv + (xv > nv) + nv * xv ** (nv - 1)
    np.testing.assert_allclose(out["grad_x"], want, rtol=1e-6)
    assert out["grad_x"].dtype == np.float32


def test_a_comparison_that_flips_with_precision_skips_the_narrow_check():
    # x > float32(x) is never true in float64 and true for about half of the elements in the
    # graph's own dtypes: the narrow gradient is of another function, so only float64 is checked
    g = tl.EinsumGraph()
    x = g.input("x", (64,), "float64")
    up = g.cast(g.cast(x, "float32"), "float64")
    y = g.sum(g.where(x > up, x * x, x * 3.0))
    g.output(y, "y")
    report = assert_grads_agree(g, "y", backends=("numpy",), seed=7)
    assert report.checked > 0 and not report.dtype_errors
