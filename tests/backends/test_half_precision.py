"""16-bit floats (bfloat16, float16) on the CPU backends, the precision policy and TF32 option.

Each op on 16-bit operands computes in float32 and rounds its result once: the expected values
here are float32 numpy on the widened operands, rounded to the 16-bit dtype.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic import dtypes
from tensorlogic.ir import ops

HALF = ("bfloat16", "float16")
CPU = ("numpy", "numba")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _ulps(got, want, dtype) -> float:
    """Largest difference in units of the dtype's epsilon relative to max(|want|, 1)."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    return float((np.abs(g - w) / np.maximum(np.abs(w), 1.0)).max() / dtypes.eps(dtype))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_bfloat16_is_a_dtype_everywhere():
    assert dtypes.normalize("bfloat16") == "bfloat16"
    assert dtypes.normalize(ml_dtypes.bfloat16) == "bfloat16"
    assert dtypes.is_float(BF16) and not dtypes.is_float(np.int32)
    assert dtypes.eps("bfloat16") == 2.0**-7
    # as JAX places it: with float16 neither holds the other
    assert dtypes.promote("bfloat16", "float16") == "float32"
    assert dtypes.promote("bfloat16", "float32") == "float32"
    assert dtypes.promote("bfloat16", "float64") == "float64"
    assert dtypes.promote("bfloat16", "bfloat16") == "bfloat16"
    g = tl.EinsumGraph()
    a = g.input("a", (3,), "bfloat16")
    b = g.input("b", (3,), "float16")
    assert (a + b).dtype == "float32"
    assert (a * 2.0).dtype == "bfloat16"  # a Python scalar adopts the tensor's dtype


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("op", sorted(ops.ELEMENTWISE))
def test_every_elementwise_op_rounds_once(backend, dtype, op, rng):
    row = ops.ELEMENTWISE[op]
    shape = (37, 29)
    xs = [rng.uniform(0.25, 2.0, shape).astype(dtype) for _ in range(row.arity)]
    g = tl.EinsumGraph()
    ins = [g.input(f"x{k}", shape, dtype) for k in range(row.arity)]
    y = g.add_node(ops.KIND_OF_ARITY[row.arity], op, [t.id for t in ins])
    g.output(g.tensor(y), "y")
    got = tl.compile(g, backend=backend, opt_level=0)(**{f"x{k}": x for k, x in enumerate(xs)})["y"]
    if op in ops.COMPARISONS:  # numpy's bool, from the float32 comparison of exact values
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, row.numpy(*xs, out=np.empty(shape, bool)))
        return
    assert got.dtype == np.dtype(dtype)
    want = np.empty(shape, np.float32)
    row.numpy(*[x.astype(np.float32) for x in xs], out=want)
    # numpy rounds the very float32 result; numba's fast math may differ in the float32 last
    # bits, which can move a rounding to the next 16-bit value
    limit = 0 if backend == "numpy" else 1.01
    assert _ulps(got, want.astype(dtype), dtype) <= limit


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", HALF)
def test_sums_accumulate_in_float32(backend, dtype):
    # 4096 ones: a 16-bit accumulator stalls at 256 (bfloat16) or 2048 (float16)
    g = tl.EinsumGraph()
    x = g.input("x", (3, 4096), dtype)
    g.output(g.sum(x, 1), "s")
    g.output(g.mean(x * 3.0, 1), "m")
    g.output(g.einsum("ij->i", x), "e")
    out = tl.compile(g, backend=backend)(x=np.ones((3, 4096), dtype))
    np.testing.assert_array_equal(out["s"].astype(np.float32), 4096.0)
    np.testing.assert_array_equal(out["m"].astype(np.float32), 3.0)
    np.testing.assert_array_equal(out["e"].astype(np.float32), 4096.0)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", HALF)
def test_contractions_accumulate_in_float32(backend, dtype, rng):
    a = rng.standard_normal((6, 40, 300)).astype(dtype)
    b = rng.standard_normal((6, 300, 50)).astype(dtype)
    g = tl.EinsumGraph()
    x, w = g.input("a", a.shape, dtype), g.input("b", b.shape, dtype)
    g.output(g.einsum("bik,bkj->bij", x, w), "y")
    g.output(g.einsum("bik,bkj->j", x, w), "s")  # with a sum outside the matmul
    out = tl.compile(g, backend=backend)(a=a, b=b)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert out["y"].dtype == np.dtype(dtype)
    assert _ulps(out["y"], exact.astype(dtype), dtype) <= 1.01
    s = exact.sum(axis=(0, 1))
    assert _ulps(out["s"], s, dtype) <= 2 * np.sqrt(6 * 40)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", HALF)
def test_row_ops_and_fused_groups(backend, dtype, rng):
    x = rng.standard_normal((64, 512)).astype(dtype)
    gam = rng.standard_normal(512).astype(dtype)
    g = tl.EinsumGraph()
    t = g.input("x", x.shape, dtype)
    gm = g.input("g", gam.shape, dtype)
    g.output(g.layer_norm(g.gelu(t * 1.5 + 0.25), axis=-1) * gm + t, "ln")
    g.output(g.softmax(t, axis=-1), "sm")
    g.output(g.logsumexp(t, 1), "lse")
    for level in (0, 2):
        out = tl.compile(g, backend=backend, opt_level=level)(x=x, g=gam)
        xf, gf = x.astype(np.float64), gam.astype(np.float64)
        h = 1.5 * xf + 0.25
        h = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h**3)))
        mu = h.mean(-1, keepdims=True)
        ln = (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * gf + xf
        e = np.exp(xf - xf.max(-1, keepdims=True))
        for name, want in (
            ("ln", ln),
            ("sm", e / e.sum(-1, keepdims=True)),
            ("lse", np.log(np.exp(xf).sum(-1))),
        ):
            assert out[name].dtype == np.dtype(dtype)
            # O0 rounds every op's result; a fused group once; either way a few epsilons
            assert _ulps(out[name], want, dtype) <= 8, (name, level)


@pytest.mark.parametrize("backend", CPU)
def test_casts_round_to_nearest_even(backend):
    # halfway cases between bfloat16 neighbours go to the even one
    v = np.array(
        [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-40, np.inf, np.nan], np.float32
    )
    g = tl.EinsumGraph()
    x = g.input("x", v.shape, "float32")
    b = g.cast(x, "bfloat16")
    g.output(b, "b")
    g.output(g.cast(b, "float64"), "back")
    out = tl.compile(g, backend=backend)(x=v)
    np.testing.assert_array_equal(out["b"].view(np.uint16), v.astype(BF16).view(np.uint16))
    assert out["b"].astype(np.float32)[0] == 1.0 and out["b"].astype(np.float32)[1] == 1 + 2**-6
    np.testing.assert_array_equal(out["back"], v.astype(BF16).astype(np.float64))


@pytest.mark.parametrize("backend", CPU)
def test_mixed_half_dtypes_promote_to_float32(backend, rng):
    a = rng.standard_normal(100).astype(BF16)
    b = rng.standard_normal(100).astype(np.float16)
    g = tl.EinsumGraph()
    y = g.input("a", (100,), "bfloat16") * g.input("b", (100,), "float16")
    g.output(y, "y")
    out = tl.compile(g, backend=backend)(a=a, b=b)["y"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, a.astype(np.float32) * b.astype(np.float32))


def test_bfloat16_inputs_are_checked(rng):
    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", (4,), "bfloat16")), "y")
    plan = tl.compile(g, backend="numpy")
    with pytest.raises(tl.TensorLogicError):
        plan(x=np.ones(4, np.int32))
    assert plan(x=np.ones(4, BF16))["y"].dtype == BF16


def test_bfloat16_graph_saves_and_loads(tmp_path):
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3), "bfloat16")
    c = g.constant(np.array([0.5, 1.5, -2.0], np.float32), name="c", dtype="bfloat16")
    g.output(x * c, "y")
    g.save(tmp_path / "m.json")
    g2 = tl.EinsumGraph.load(tmp_path / "m.json")
    assert [n.dtype for n in g2.nodes] == ["bfloat16"] * 3
    x0 = np.ones((2, 3), BF16)
    np.testing.assert_array_equal(
        tl.compile(g2, backend="numpy")(x=x0)["y"], tl.compile(g, backend="numpy")(x=x0)["y"]
    )


def _block(rng, d=32):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 16, d))
    w = g.constant((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), name="w")
    gam = g.constant(rng.standard_normal(d).astype(np.float32), name="gamma")
    h = g.layer_norm(g.einsum("bsd,de->bse", x, w) + x, axis=-1) * gam
    att = g.softmax(g.einsum("bsd,btd->bst", h, h) * 0.125, axis=-1)
    y = g.einsum("bst,btd->bsd", att, h)
    g.output(y, "y")
    g.output(g.sum(y, 2), "s")
    g.output(g.cast(x, "float64") * 2.0, "wide")  # float64 stays float64
    return g


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_precision_policy_lowers_the_interior(backend, precision, rng):
    g = _block(rng)
    half = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    x = rng.standard_normal((3, 16, 32)).astype(np.float32)
    ref = tl.compile(g, backend="numpy")(x=x)
    plan = tl.compile(g, backend=backend, precision=precision)
    out = plan(x=x)
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in ref.items()}
    np.testing.assert_array_equal(out["wide"], ref["wide"])
    for name in ("y", "s"):
        scale = np.abs(ref[name]).max()
        assert np.abs(out[name] - ref[name]).max() <= 16 * dtypes.eps(half) * scale, name
        assert np.abs(out[name] - ref[name]).max() > 0  # it did compute in 16 bits
    steps = plan.specialize(B=3).steps
    assert {s.dtype for s in steps if s.kind == ops.EINSUM} == {half}


def test_precision_policy_graph_structure(rng):
    from tensorlogic.optimizer.precision import lower_precision

    g = _block(rng)
    low = lower_precision(g, "bfloat16")
    kinds = {n.kind: n.dtype for n in low.nodes if n.kind in (ops.EINSUM, ops.ROWOP)}
    assert kinds == {ops.EINSUM: "bfloat16", ops.ROWOP: "bfloat16"}
    assert low.node(low.inputs["x"]).dtype == "float32"
    assert {name: low.node(nid).dtype for name, nid in low.outputs.items()} == {
        "y": "float32",
        "s": "float32",
        "wide": "float64",
    }
    assert all(
        low.constants[n.id].dtype == BF16
        for n in low.nodes
        if n.kind == ops.CONSTANT and n.dtype == "bfloat16"
    )
    low.validate()


@pytest.mark.parametrize("backend", CPU)
def test_tf32_option_is_exact_on_cpu(backend, rng):
    g = _block(rng)
    x = rng.standard_normal((2, 16, 32)).astype(np.float32)
    a = tl.compile(g, backend=backend)(x=x)
    b = tl.compile(g, backend=backend, matmul_precision="tf32")(x=x)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize(
    "bad",
    [
        {"precision": "int8"},
        {"precision": 16},
        {"matmul_precision": "medium"},
        {"matmul_precision": None},
    ],
)
def test_bad_precision_options_raise(bad, rng):
    with pytest.raises(tl.TensorLogicError, match="precision"):
        tl.compile(_block(rng), backend="numpy", **bad)
