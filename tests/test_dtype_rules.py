"""numpy's dtype rules for every op: promotion, NEP 50 scalars, result dtypes, refusals, values
on the CPU backends (integers exact), serialization of every dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tensorlogic as tl
from tensorlogic import dtypes
from tensorlogic.ir import ops
from tensorlogic.testing.einsum_calls import COMPLEX_OPS, int_programs, random_array
from tensorlogic.testing.reference import BINARY_UFUNCS

DTYPES = dtypes.DTYPES
CPU = [("numpy", 0), ("numpy", 2), ("numba", 0), ("numba", 2)]


def _numpy_promote(a: str, b: str) -> str:
    """numpy's promotion, and for bfloat16 (ml_dtypes) the float16 row with float16 read as
    bfloat16, except bfloat16 with float16, which is float32 (as in JAX)."""
    if "bfloat16" not in (a, b):
        return np.result_type(a, b).name
    if {a, b} == {"bfloat16", "float16"}:
        return "float32"
    r = np.result_type(*["float16" if d == "bfloat16" else d for d in (a, b)]).name
    return "bfloat16" if r == "float16" else r


def _as_f16(dt: str) -> str:
    return "float16" if dt == "bfloat16" else dt


def test_promotion_table_is_numpys():
    for a in DTYPES:
        for b in DTYPES:
            assert dtypes.promote(a, b) == _numpy_promote(a, b), (a, b)


@pytest.mark.parametrize("dt", DTYPES)
def test_python_scalars_are_weak_as_in_numpy(dt):
    arr = np.ones(2, dt)
    for value in (True, 3, 2.5, 1 + 2j):
        g = tl.EinsumGraph()
        x = g.input("x", (2,), dt)
        # bfloat16 is weak against Python scalars exactly as float16 is
        ref = arr.astype(_as_f16(dt))
        if dt == "bool" and isinstance(value, bool):
            y, want = g.mul(x, value), (ref * value).dtype
        else:
            y, want = x + value, (ref + value).dtype
        want_name = dt if dt == "bfloat16" and want == np.float16 else want.name
        assert y.dtype == want_name, (dt, value)
        # a reflected operator too
        assert (value * x).dtype == want_name


def test_out_of_range_python_int_is_refused():
    g = tl.EinsumGraph()
    x = g.input("x", (2,), "int8")
    with pytest.raises(tl.DTypeError, match="300 is out of bounds for int8"):
        x + 300
    assert (x + 100).dtype == "int8"


# numpy references written without our kernels: what a numpy user computes
def _f(x, res):
    return x.astype(res) if x.dtype != res else x


UNARY_REF = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "square": np.square,
    "reciprocal": np.reciprocal,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "sigmoid": lambda x: (lambda v: 1 / (1 + np.exp(-v)))(_f(x, np.tanh(x[:1]).dtype)),
    "softplus": lambda x: np.logaddexp(x, np.zeros((), x.dtype)),
    "gelu": lambda x: (
        lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))
    )(_f(x, np.tanh(x[:1]).dtype)),
    "gelu_grad": lambda x: (
        lambda v, t: 0.5 * (1 + t) + 0.3989422804014327 * v * (1 - t * t) * (1 + 0.134145 * v * v)
    )(
        _f(x, np.tanh(x[:1]).dtype),
        np.tanh(0.7978845608028654 * (lambda v: v + 0.044715 * v**3)(_f(x, np.tanh(x[:1]).dtype))),
    ),
    "step": lambda x: (x > 0).astype(x.dtype),
    "one_minus": lambda x: np.subtract(np.ones((), x.dtype), x),
}
BINARY_REF = BINARY_UFUNCS
_NUMPY_REFUSES = {
    ("neg", "bool"),
    ("sub", "bool"),
    ("one_minus", "bool"),
    ("softplus", "complex64"),
    ("softplus", "complex128"),
}
_ORDERED = {"relu", "step", "maximum", "minimum", "gt", "ge", "lt", "le"}


def _inputs(op, dt, rng, shape=(4, 7)):
    a, b = random_array(rng, shape, dt), random_array(rng, shape, dt)
    if dtypes.kind(dt) in "iu" and op in ("pow", "square", "reciprocal", "div"):
        a = (np.abs(a.astype(np.int64)) % 5 + 1).astype(dt)  # small positive: no 0**-k
        b = (np.abs(b.astype(np.int64)) % 4).astype(dt)
    if op in ("log", "sqrt") and dtypes.kind(dt) in "fi":
        a = np.abs(a) + np.ones((), dt)
    return a, b


def _close(got, want, what):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy {want.dtype}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        bits = ml_dtypes.finfo(want.dtype).bits // (2 if want.dtype.kind == "c" else 1)
        # bfloat16 keeps 8 significant bits: three of its epsilons
        tol = 2.5e-2 if want.dtype.name == "bfloat16" else {16: 3e-3, 32: 3e-6, 64: 1e-12}[bits]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


def _expected_dtype(op, dt):
    if dt == "bfloat16":  # ml_dtypes widens bfloat16 with Python floats; it sits as float16
        r = _expected_dtype(op, "float16")
        return "bfloat16" if r == "float16" else r
    if (op, dt) in _NUMPY_REFUSES or (op in _ORDERED and dtypes.kind(dt) == "c"):
        return None
    if op in UNARY_REF:
        ref = UNARY_REF[op](np.ones(2, dt))
    else:
        ref = BINARY_REF[op](np.ones(2, dt), np.ones(2, dt))
    # step gives 1/0 in its operand's dtype (documented); everything else, comparisons
    # included (bool), numpy's dtype
    return dt if op == "step" else ref.dtype.name


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ops.UNARY_OPS + ops.BINARY_OPS)
def test_elementwise_dtype_and_values(op, dt):
    g = tl.EinsumGraph()
    x, y = g.input("x", (4, 7), dt), g.input("y", (4, 7), dt)
    want_dt = _expected_dtype(op, dt)
    build = (lambda: g.unary(op, x)) if op in ops.UNARY_OPS else (lambda: g.binary(op, x, y))
    if want_dt is None:
        with pytest.raises(tl.DTypeError) as err:
            build()
        msg = str(err.value)
        assert op in msg and dt in msg and "it takes" in msg
        return
    t = build()
    assert t.dtype == want_dt
    g.output(t, "o")
    # chain a second op so O2 has something to fuse
    g.output(g.binary("mul", t, t), "o2")
    rng = np.random.default_rng(hash((op, dt)) % 2**32)
    a, b = _inputs(op, dt, rng)
    with np.errstate(all="ignore"):
        want = UNARY_REF[op](a) if op in UNARY_REF else BINARY_REF[op](a, b)
        want = np.asarray(want).astype(want_dt)
        want2 = want * want
        for backend, level in CPU:
            out = tl.compile(g, backend=backend, opt_level=level)(x=a, y=b)
            _close(out["o"], want, f"{op} {dt} {backend} O{level}")
            _close(out["o2"], want2, f"{op}*{op} {dt} {backend} O{level}")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ops.REDUCTIONS)
def test_reductions(op, dt):
    g = tl.EinsumGraph()
    x = g.input("x", (5, 6), dt)
    if op in ("max", "min", "logsumexp") and dtypes.kind(dt) == "c":
        with pytest.raises(tl.DTypeError, match=op):
            g.reduce(op, x, axis=1)
        return
    g.output(g.reduce(op, x, axis=1), "r")
    g.output(g.reduce(op, x * x, axis=None), "all")
    rng = np.random.default_rng(7)
    a = random_array(rng, (5, 6), dt)
    with np.errstate(all="ignore"):
        if op == "logsumexp":

            def ref(v, axis):
                v = v.astype(np.exp(v[:1]).dtype)
                m = v.max(axis=axis, keepdims=True)
                return (np.log(np.exp(v - m).sum(axis=axis, keepdims=True)) + m).squeeze(axis)
        else:

            def ref(v, axis):
                return getattr(np, op)(v, axis=axis)

        want, want_all = ref(a, 1), np.asarray(ref(a * a, None))
        for backend, level in CPU:
            out = tl.compile(g, backend=backend, opt_level=level)(x=a)
            _close(out["r"], want, f"{op} {dt} {backend} O{level}")
            _close(out["all"], want_all, f"{op}(x*x) {dt} {backend} O{level}")
    # numpy's sum of int8 is int64 (no wraparound in the sum); einsum's keeps int8
    if dt == "int8" and op == "sum":
        assert out["r"].dtype == np.int64


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ops.ROW_OPS)
def test_row_ops(op, dt):
    g = tl.EinsumGraph()
    x = g.input("x", (3, 8), dt)
    if dtypes.kind(dt) == "c":
        with pytest.raises(tl.DTypeError, match=op):
            g._rowop(op, x, -1, None)
        return
    t = getattr(g, op)(x, -1)
    res = np.exp(np.ones(1, dt)).dtype
    assert t.dtype == res.name
    g.output(t, "y")
    a = random_array(np.random.default_rng(8), (3, 8), dt)
    v = a.astype(res).astype(np.float64)
    if op == "layer_norm":
        want = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)
    else:
        z = v - v.max(-1, keepdims=True)
        want = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        if op == "log_softmax":
            want = z - np.log(np.exp(z).sum(-1, keepdims=True))
    for backend, level in CPU:
        got = tl.compile(g, backend=backend, opt_level=level)(x=a)["y"]
        tol = {"bfloat16": 3e-2, "float16": 1e-2, "float32": 1e-4}.get(res.name, 1e-10)
        assert got.dtype == res
        # float16 holds the large log-probabilities of full-range int16 rows to 3 digits
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("src", DTYPES)
def test_casts_are_astype(src):
    a = random_array(np.random.default_rng(9), (4, 5), src)
    g = tl.EinsumGraph()
    x = g.input("x", a.shape, src)
    for dst in DTYPES:
        g.output(g.cast(x, dst), dst)
    for backend, level in CPU:
        out = tl.compile(g, backend=backend, opt_level=level)(x=a)
        for dst in DTYPES:
            with np.errstate(all="ignore"):
                want = (
                    a.real if dtypes.kind(src) == "c" and dtypes.kind(dst) != "c" else a
                ).astype(dst)
            assert out[dst].dtype == want.dtype
            np.testing.assert_array_equal(out[dst], want, err_msg=f"{src}->{dst} {backend}")


@pytest.mark.parametrize("dt", DTYPES)
def test_where_promotes_branches(dt):
    rng = np.random.default_rng(10)
    c, a = rng.random((3, 4)) < 0.5, random_array(rng, (3, 4), dt)
    b = random_array(rng, (3, 4), "int16")
    g = tl.EinsumGraph()
    tc, ta, tb = (
        g.input("c", c.shape, "bool"),
        g.input("a", a.shape, dt),
        g.input("b", b.shape, "int16"),
    )
    g.output(g.where(tc, ta, tb), "w")
    res = _numpy_promote(dt, "int16")
    want = np.where(c, a.astype(res), b.astype(res))  # numpy has no bfloat16/int16 promotion
    for backend, level in CPU:
        got = tl.compile(g, backend=backend, opt_level=level)(c=c, a=a, b=b)["w"]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_integer_overflow_wraps_like_numpy():
    a = np.array([100, -128, 127, 50], np.int8)
    g = tl.EinsumGraph()
    x = g.input("x", (4,), "int8")
    g.output(x * 3 + 100, "y")
    g.output(-x, "n")
    g.output(g.abs(x), "abs")
    for backend, level in CPU:
        out = tl.compile(g, backend=backend, opt_level=level)(x=a)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(out["y"], a * np.int8(3) + np.int8(100))
            np.testing.assert_array_equal(out["n"], -a)
            np.testing.assert_array_equal(out["abs"], np.abs(a))
        assert out["y"].dtype == np.int8


def test_backends_refuse_dtypes_they_do_not_declare():
    # a backend that declares floats only (the Capabilities default)
    from tensorlogic.backends import register_backend, unregister_backend
    from tensorlogic.backends.numpy.backend import NumpyBackend
    from tensorlogic.backends.base import Capabilities

    class FloatOnly(NumpyBackend):
        name = "floatonly"
        capabilities = Capabilities(native_array=np.ndarray)

    register_backend("floatonly", FloatOnly)
    try:
        g = tl.EinsumGraph()
        x = g.input("x", (2, 2), "complex64")
        g.output(g.einsum("ij,jk->ik", x, x), "y")
        with pytest.raises(tl.DTypeError, match="complex64.*floatonly.*float16, float32, float64"):
            tl.compile(g, backend="floatonly")
        f = tl.EinsumGraph()
        y = f.input("y", (2, 2), "float32")
        f.output(f.einsum("ij,jk->ik", y, y), "y")
        tl.compile(f, backend="floatonly")  # floats run
    finally:
        unregister_backend("floatonly")


def test_serialization_round_trips_every_dtype(tmp_path):
    rng = np.random.default_rng(11)
    g = tl.EinsumGraph()
    feeds, consts = {}, {}
    for dt in DTYPES:
        x = g.input(f"x_{dt}", (3,), dt)
        c = random_array(rng, (3,), dt)
        consts[dt] = c
        k = g.constant(c, name=f"c_{dt}")
        g.output(g.einsum("i,i->i", x, k), f"y_{dt}")
        feeds[f"x_{dt}"] = random_array(rng, (3,), dt)
    g.save(tmp_path / "g.json")
    h = tl.EinsumGraph.load(tmp_path / "g.json")
    for dt in DTYPES:
        node = h.node(f"c_{dt}")
        assert node.dtype == dt
        arr = h.constants[node.id]
        assert arr.dtype == dt and np.array_equal(arr, consts[dt])
    assert h.fingerprint() == g.fingerprint()
    a = tl.compile(g, backend="numpy")(feeds)
    b = tl.compile(h, backend="numpy")(feeds)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
    from tensorlogic.ir.serialize import dumps, loads

    assert loads(dumps(g)).fingerprint() == g.fingerprint()


def test_numba_generates_integer_bool_and_complex_kernels():
    g = tl.EinsumGraph()
    x = g.input("x", (64, 5), "int8")
    c = g.input("c", (64, 5), "complex64")
    b = g.input("b", (64, 5), "bool")
    g.output(x * x + 3, "y")
    g.output(g.sum(x, axis=1), "s")
    g.output(g.exp(c) * c, "z")
    g.output(g.max(b, axis=0), "m")
    g.output(g.reciprocal(x), "r")  # numpy's integer reciprocal: numpy's own loop
    plan = tl.compile(g, backend="numba", opt_level=2)
    text = str(plan)
    kinds = {line.split()[1]: "numba" in line for line in text.splitlines()[3:10]}
    assert kinds and all(v for k, v in kinds.items() if not k.startswith("reciprocal")), text
    assert not next(v for k, v in kinds.items() if k.startswith("reciprocal")), text
    rng = np.random.default_rng(12)
    a = random_array(rng, (64, 5), "int8")
    cv = random_array(rng, (64, 5), "complex64")
    bv = random_array(rng, (64, 5), "bool")
    out = plan(x=a, c=cv, b=bv)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out["y"], a * a + np.int8(3))
        np.testing.assert_array_equal(out["s"], a.sum(axis=1))
        np.testing.assert_array_equal(out["m"], bv.max(axis=0))
        np.testing.assert_array_equal(out["r"], np.reciprocal(a))
    np.testing.assert_allclose(out["z"], np.exp(cv) * cv, rtol=1e-5)


def test_numpy_scalars_are_strong():
    g = tl.EinsumGraph()
    x = g.input("x", (2,), "float32")
    assert (x * np.float64(2.0)).dtype == (np.ones(2, np.float32) * np.float64(2.0)).dtype.name
    assert (x * 2.0).dtype == "float32"


def test_constant_folding_keeps_integer_semantics():
    g = tl.EinsumGraph()
    k = g.constant(np.array([100, 120, -128], np.int8))
    x = g.input("x", (3,), "int8")
    g.output(k * 3 + x, "y")  # the constant part folds at O2
    a = np.array([1, 2, 3], np.int8)
    with np.errstate(all="ignore"):
        want = np.array([100, 120, -128], np.int8) * np.int8(3) + a
    for level in (0, 2):
        got = tl.compile(g, backend="numpy", opt_level=level)(x=a)["y"]
        assert got.dtype == np.int8 and np.array_equal(got, want)
    # a complex constant's abs folds to its modulus, not to abs of its real part
    g = tl.EinsumGraph()
    k = g.constant(np.array([3 + 4j, -1j], np.complex64))
    x = g.input("x", (2,), "float32")
    g.output(g.abs(k) + x, "y")
    b = np.array([1, 2], np.float32)
    for level in (0, 2):
        got = tl.compile(g, backend="numpy", opt_level=level)(x=b)["y"]
        assert got.dtype == np.float32 and np.allclose(got, [6, 3])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(prog=int_programs())
def test_random_integer_programs_match_numpy(prog):
    rng = np.random.default_rng(13)
    arrays = [random_array(rng, prog.shape, d) for d in prog.dtypes]
    want = np.asarray(prog.evaluate(arrays))
    g = tl.EinsumGraph()
    ins = [g.input(f"x{k}", prog.shape, d) for k, d in enumerate(prog.dtypes)]
    g.output(prog.build(g, ins), "y")
    feeds = {f"x{k}": a for k, a in enumerate(arrays)}
    for backend, level in (("numpy", 0), ("numba", 2)):
        got = tl.compile(g, backend=backend, opt_level=level)(feeds)["y"]
        assert got.dtype == want.dtype, f"{backend} O{level}: {got.dtype} vs {want.dtype}"
        if want.dtype.kind in "fc":  # int8 with uint64 is float64 in numpy: sums may reorder
            scale = max(float(np.abs(a.astype(np.float64)).max()) for a in arrays) * arrays[0].size
            np.testing.assert_allclose(
                got, want, rtol=1e-12, atol=1e-13 * scale, err_msg=f"{backend} O{level}"
            )
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{backend} O{level}")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(prog=int_programs(max_steps=4, dtypes=dtypes.COMPLEX, ops=COMPLEX_OPS))
def test_random_complex_programs_match_numpy(prog):
    rng = np.random.default_rng(14)
    arrays = [random_array(rng, prog.shape, d) for d in prog.dtypes]
    want = np.asarray(prog.evaluate(arrays))
    g = tl.EinsumGraph()
    ins = [g.input(f"x{k}", prog.shape, d) for k, d in enumerate(prog.dtypes)]
    g.output(prog.build(g, ins), "y")
    feeds = {f"x{k}": a for k, a in enumerate(arrays)}
    tol = 1e-4 if want.dtype == np.complex64 else 1e-12
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    for backend, level in (("numpy", 0), ("numba", 2)):
        got = tl.compile(g, backend=backend, opt_level=level)(feeds)["y"]
        assert got.dtype == want.dtype, f"{backend} O{level}: {got.dtype} vs {want.dtype}"
        np.testing.assert_allclose(
            got, want, rtol=tol, atol=tol * scale, err_msg=f"{backend} O{level}"
        )


@pytest.mark.parametrize(
    "dt", ["float16", "float32", "float64", "int8", "uint64", "bool", "complex64"]
)
def test_comparisons_are_bool_and_masks_multiply(dt):
    """Comparisons give numpy's bool on every backend and level; a mask multiplies a tensor
    without a cast (bool promotes to the tensor's dtype), fused or not."""
    rng = np.random.default_rng(5)
    g = tl.EinsumGraph()
    x, y = g.input("x", (6, 9), dt), g.input("y", (6, 9), dt)
    w = g.input("w", (6, 9), "float32")
    cmps = ("eq", "ne") if dtypes.kind(dt) == "c" else ("gt", "ge", "lt", "le", "eq", "ne")
    for op in cmps:
        m = g.binary(op, x, y)
        assert m.dtype == "bool"
        g.output(m, op)
        g.output(g.exp(w * m) * 2.0 + w, f"{op}_masked")  # float32 all along
    a, b = random_array(rng, (6, 9), dt), random_array(rng, (6, 9), dt)
    b[::2] = a[::2]  # ties, for eq/ge/le
    wv = rng.standard_normal((6, 9)).astype(np.float32)
    for backend, level in CPU:
        out = tl.compile(g, backend=backend, opt_level=level)(x=a, y=b, w=wv)
        for op in cmps:
            want = BINARY_REF[op](a, b)
            assert out[op].dtype == np.bool_
            np.testing.assert_array_equal(out[op], want, err_msg=f"{op} {dt} {backend}")
            masked = out[f"{op}_masked"]
            assert masked.dtype == np.float32
            np.testing.assert_allclose(masked, np.exp(wv * want) * 2.0 + wv, rtol=2e-5, atol=1e-6)
