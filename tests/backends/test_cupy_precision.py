"""16-bit floats, TF32 and the precision policy on the cupy backend (run with ``pytest -m gpu``).

The numpy backend (float32 arithmetic on widened operands, each result rounded once) is the
reference; a GPU result may differ from it by the rounding of a float32 value computed in a
different order, so comparisons are in units of the 16-bit dtype's epsilon.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic import dtypes
from tensorlogic.ir import ops

pytestmark = pytest.mark.gpu

HALF = ("bfloat16", "float16")
POSITIVE = {"log", "sqrt", "reciprocal", "pow", "div"}
BF16 = np.dtype(ml_dtypes.bfloat16)


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _eps_err(got, want, dtype) -> float:
    g = np.asarray(_host(got), np.float64)
    w = np.asarray(want, np.float64)
    return float((np.abs(g - w) / np.maximum(np.abs(w), 1.0)).max() / dtypes.eps(dtype))


def _data(rng, shape, dtype, positive=False):
    x = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape) * 2
    return x.astype(dtype)


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("op", list(ops.ELEMENTWISE))
def test_every_elementwise_op_16bit(op, dtype, codegen, rng):
    arity = ops.ELEMENTWISE[op].arity
    g = tl.EinsumGraph()
    xs = [g.input(f"x{k}", (257, 33), dtype) for k in range(arity)]
    g.output(g.elementwise(op, *xs), "y")
    inputs = {f"x{k}": _data(rng, (257, 33), dtype, op in POSITIVE) for k in range(arity)}
    ref = tl.compile(g, backend="numpy", opt_level=0)(**inputs)["y"]
    got = tl.compile(g, backend="cupy", opt_level=0, codegen=codegen, cuda_graph=False)(**inputs)
    assert got["y"].dtype == ref.dtype  # the input's dtype; bool for comparisons
    # both round a float32 value once; GPU math may move the float32 value by a few ulps
    assert _eps_err(got["y"], ref, dtype) <= 1.01


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tail", ops.REDUCTIONS + ops.ROW_OPS)
@pytest.mark.parametrize(
    "shape,axis",
    [((64, 1000), 1), ((17, 300), 0), ((96, 4096), 1), ((3, 70001), 1), ((1 << 20,), None)],
)
def test_reductions_and_row_ops_16bit(tail, dtype, codegen, shape, axis, rng):
    if tail in ops.ROW_OPS and axis is None:
        pytest.skip("row ops take one axis")
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    if tail in ops.ROW_OPS:
        y = getattr(g, tail)(g.tanh(x), axis=axis)
    else:
        y = getattr(g, tail)(g.tanh(x), axis)
    g.output(y, "y")
    data = _data(rng, shape, dtype)
    ref = tl.compile(g, backend="numpy", opt_level=2)(x=data)["y"]
    got = tl.compile(g, backend="cupy", opt_level=2, codegen=codegen)(x=data)["y"]
    assert got.dtype == np.dtype(dtype)
    # sums in float32 (a 16-bit accumulator would be off by far more over these lengths)
    assert _eps_err(got, ref, dtype) <= 2.01


@pytest.mark.parametrize("dtype", HALF)
def test_long_sums_accumulate_in_float32(dtype):
    # a 16-bit accumulator stalls at 256 (bfloat16) or 2048 (float16); these sums are exact
    g = tl.EinsumGraph()
    x = g.input("x", (5, 8192), dtype)
    g.output(g.sum(x, 1), "s")
    g.output(g.einsum("ij->i", x), "e")
    f = g.input("f", (1 << 16,), dtype)
    g.output(g.sum(f * 0.0625), "full")  # one long row: a split reduction
    out = tl.compile(g, backend="cupy")(
        x=np.ones((5, 8192), dtype), f=np.ones(1 << 16, dtype), to_host=True
    )
    np.testing.assert_array_equal(out["s"].astype(np.float32), 8192.0)
    np.testing.assert_array_equal(out["e"].astype(np.float32), 8192.0)
    assert float(out["full"]) == 4096.0


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "spec,shapes",
    [
        ("ik,kj->ij", [(300, 200), (200, 100)]),
        ("bik,bkj->bij", [(4, 64, 96), (4, 96, 32)]),
        ("ki,jk->ij", [(200, 300), (100, 200)]),  # transposed operands: cuBLAS flags
        ("bhqd,bhkd->bhqk", [(2, 4, 64, 32), (2, 4, 64, 32)]),
        ("bsd,de->bse", [(3, 50, 64), (64, 48)]),
        ("ij,jk,kl->il", [(40, 50), (50, 60), (60, 30)]),
        ("iij,jk->ik", [(20, 20, 30), (30, 10)]),  # a diagonal: widened to float32
        ("ij,ij->", [(64, 64), (64, 64)]),  # a full inner product
    ],
)
def test_contractions_16bit_on_cublas(dtype, spec, shapes, rng):
    arrays = [_data(rng, s, dtype) for s in shapes]
    g = tl.EinsumGraph()
    ins = [g.input(f"x{k}", s, dtype) for k, s in enumerate(shapes)]
    g.output(g.einsum(spec, *ins), "y")
    feed = {f"x{k}": a for k, a in enumerate(arrays)}
    got = tl.compile(g, backend="cupy")(**feed, to_host=True)["y"]
    exact = np.einsum(spec, *[a.astype(np.float64) for a in arrays])
    assert got.dtype == np.dtype(dtype)
    # relative to the result's scale: a chain of products rounds its intermediates to 16 bits
    # (as torch does), whose errors no single output element's size bounds
    err = np.abs(np.asarray(got, np.float64) - exact).max() / np.abs(exact).max()
    assert err <= (2 if len(shapes) == 2 else 4) * dtypes.eps(dtype)


def test_tf32_is_an_option_and_default_is_exact(rng):
    a = rng.standard_normal((512, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 256)).astype(np.float32)
    g = tl.EinsumGraph()
    g.output(g.einsum("ik,kj->ij", g.input("a", a.shape), g.input("b", b.shape)), "y")
    exact = a.astype(np.float64) @ b.astype(np.float64)
    hi = tl.compile(g, backend="cupy")(a=a, b=b, to_host=True)["y"]
    tf = tl.compile(g, backend="cupy", matmul_precision="tf32")(a=a, b=b, to_host=True)["y"]
    scale = np.abs(exact).max()
    err_hi = np.abs(hi - exact).max() / scale
    err_tf = np.abs(tf - exact).max() / scale
    assert err_hi < 1e-5
    # TF32 keeps 10 mantissa bits: visibly less exact than float32, still close
    assert 1e-5 < err_tf < 5e-3
    with pytest.raises(tl.TensorLogicError, match="matmul_precision"):
        tl.compile(g, backend="cupy", matmul_precision="fast")


@pytest.mark.parametrize(
    "src,dst",
    [
        ("float32", "bfloat16"),
        ("bfloat16", "float32"),
        ("float64", "bfloat16"),
        ("bfloat16", "float64"),
        ("float16", "bfloat16"),
        ("bfloat16", "float16"),
    ],
)
def test_casts_round_to_nearest_even(src, dst, rng):
    v = np.concatenate(
        [
            np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), np.inf, -np.inf, np.nan, 0.0, -0.0]),
            rng.standard_normal(1000) * 100,
        ]
    ).astype(src)
    g = tl.EinsumGraph()
    g.output(g.cast(g.input("x", v.shape, src), dst), "y")
    got = tl.compile(g, backend="cupy")(x=v, to_host=True)["y"]
    want = tl.compile(g, backend="numpy")(x=v)["y"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_dlpack_bfloat16_from_torch_is_used_as_is():
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 128, device="cuda").to(torch.bfloat16)
    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", (64, 128), "bfloat16")) * 2.0, "y")
    got = tl.compile(g, backend="cupy")(x=x, to_host=True)["y"]
    want = (torch.exp(x.float()) * 2.0).to(torch.bfloat16).float().cpu().numpy()
    assert got.dtype == BF16
    assert _eps_err(got, want, "bfloat16") <= 1.01


def _encoder_block(rng, d=64, heads=4, s=128):
    """A transformer encoder block from the graph API (the benchmark's model, smaller)."""
    g = tl.EinsumGraph()
    dh = d // heads
    x = g.input("x", ("B", s, d))

    def w(shape, name, scale=None):
        return g.constant(
            (rng.standard_normal(shape) * (scale or shape[0] ** -0.5)).astype(np.float32), name=name
        )

    qkv = g.einsum("bsd,tdhe->tbhse", x, w((3, d, heads, dh), "wqkv", d**-0.5))
    q = g.einsum("tbhse,t->bhse", qkv, g.constant(np.array([1, 0, 0], np.float32)))
    k = g.einsum("tbhse,t->bhse", qkv, g.constant(np.array([0, 1, 0], np.float32)))
    v = g.einsum("tbhse,t->bhse", qkv, g.constant(np.array([0, 0, 1], np.float32)))
    att = g.softmax(g.einsum("bhqe,bhke->bhqk", q, k) * (dh**-0.5), axis=-1)
    o = g.einsum("bhqk,bhke,hed->bqd", att, v, w((heads, dh, d), "wo", d**-0.5))
    h = g.layer_norm(o + x, axis=-1) * w((d,), "g1", 1.0) + w((d,), "b1", 0.1)
    m = g.gelu(g.einsum("bsd,df->bsf", h, w((d, 4 * d), "w1")) + w((4 * d,), "c1", 0.1))
    m = g.einsum("bsf,fd->bsd", m, w((4 * d, d), "w2")) + w((d,), "c2", 0.1)
    y = g.layer_norm(m + h, axis=-1) * w((d,), "g2", 1.0) + w((d,), "b2", 0.1)
    g.output(y, "y")
    return g


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_precision_policy_on_the_gpu_matches_the_cpu_policy(precision, rng):
    g = _encoder_block(rng)
    x = rng.standard_normal((2, 128, 64)).astype(np.float32)
    exact = tl.compile(g, backend="numpy")(x=x)["y"]
    cpu = tl.compile(g, backend="numpy", precision=precision)(x=x)["y"]
    plan = tl.compile(g, backend="cupy", precision=precision)
    gpu = plan(x=x, to_host=True)["y"]
    gpu2 = plan(x=x, to_host=True)["y"]  # a CUDA-graph replay gives the same
    np.testing.assert_array_equal(gpu, gpu2)
    assert gpu.dtype == np.float32
    eps = dtypes.eps({"bf16": "bfloat16", "fp16": "float16"}[precision])
    assert np.abs(gpu - exact).max() <= 24 * eps * np.abs(exact).max()
    assert np.abs(gpu - cpu).max() <= 24 * eps * np.abs(exact).max()
    steps = plan.specialize(B=2).steps
    assert all(s.dtype != "float32" for s in steps if s.kind == ops.EINSUM)


def test_tf32_block_and_exact_block(rng):
    g = _encoder_block(rng)
    x = rng.standard_normal((2, 128, 64)).astype(np.float32)
    exact = tl.compile(g, backend="numpy")(x=x)["y"]
    hi = tl.compile(g, backend="cupy")(x=x, to_host=True)["y"]
    tf = tl.compile(g, backend="cupy", matmul_precision="tf32")(x=x, to_host=True)["y"]
    np.testing.assert_allclose(hi, exact, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tf, exact, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("offset", [0, 1])
def test_bias_rows_read_with_vector_loads(dtype, offset, rng):
    # gelu(x + bias): the bias broadcast over leading axes is read 16 bytes at a time; a bias
    # that starts off a 16-byte boundary (offset 1) runs the scalar variant
    import cupy

    x = _data(rng, (4, 96, 512), dtype)
    b = _data(rng, (512 + offset,), dtype)
    g = tl.EinsumGraph()
    y = g.gelu(g.input("x", x.shape, dtype) + g.input("b", (512,), dtype))
    g.output(y * 0.5, "y")
    bias = cupy.asarray(b)[offset:]
    got = tl.compile(g, backend="cupy")(x=cupy.asarray(x), b=bias, to_host=True)["y"]
    ref = tl.compile(g, backend="numpy")(x=x, b=b[offset:].copy())["y"]
    assert _eps_err(got, ref, dtype) <= (1.01 if dtype != "float32" else 64)
