"""GEMMs with a cuBLASLt bias / GELU / ReLU / residual epilogue on the GPU (``pytest -m gpu``).

Each plan is checked against a float32 numpy reference of the same graph on fresh random data,
within the dtype's tolerance, and ``print(plan)`` must name the epilogue step.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorlogic as tl

pytestmark = pytest.mark.gpu

TOL = {"bfloat16": 3e-2, "float16": 4e-3, "float32": 2e-5}


def _np_dtype(dtype):
    return np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)


def _reference(x, p, spec, act, residual):
    """float32 numpy: act(einsum + bias [+ x])."""
    f = np.float32
    y = np.einsum(spec, x.astype(f), p["w"].astype(f)) + p["b"].astype(f)
    if residual:
        y = y + x.astype(f)
    if act == "relu":
        y = np.maximum(y, 0)
    elif act == "gelu":
        y = 0.5 * y * (1 + np.tanh(0.7978845608028654 * (y + 0.044715 * y**3)))
    return y


def _graph(dtype, spec, xshape, wshape, n, act, residual, p):
    g = tl.EinsumGraph()
    x = g.input("x", xshape, dtype)
    w = g.constant(p["w"], name="w", dtype=dtype)
    b = g.constant(p["b"], name="b", dtype=dtype)
    h = g.einsum(spec, x, w) + b
    if residual:
        h = h + x
    if act is not None:
        h = getattr(g, act)(h)
    g.output(h, "y")
    return g


CASES = [
    # spec, x shape, w shape, bias length
    ("bsd,df->bsf", (3, 37, 24), (24, 40), 40),
    ("md,nd->mn", (67, 33), (19, 33), 19),
    ("dm,dn->mn", (33, 67), (33, 19), 19),
    ("sd,de->se", (45, 24), (24, 24), 24),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("act", [None, "gelu", "relu"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_epilogue_matches_reference(dtype, act, case):
    spec, xshape, wshape, n = CASES[case]
    residual = act is None and spec == "sd,de->se"
    rng = np.random.default_rng(case * 7 + len(dtype))
    p = {
        "w": (rng.standard_normal(wshape) / np.sqrt(wshape[0])).astype(np.float32),
        "b": rng.standard_normal((n,)).astype(np.float32),
    }
    nd = _np_dtype(dtype)
    p16 = {k: v.astype(nd) for k, v in p.items()}
    plan = tl.compile(_graph(dtype, spec, xshape, wshape, n, act, residual, p), backend="cupy")
    assert "cuBLASLt epilogue" in str(plan)
    for _ in range(3):  # fresh data each call, through the plan's CUDA graph once captured
        x = rng.standard_normal(xshape).astype(np.float32).astype(nd)
        got = np.asarray(plan(x=x)["y"].get(), np.float32)
        want = _reference(x, p16, spec, act, residual)
        scale = np.maximum(np.abs(want), 1.0)
        assert float((np.abs(got - want) / scale).max()) < TOL[dtype]


def test_tf32_plan_runs_the_epilogue():
    rng = np.random.default_rng(3)
    p = {"w": rng.standard_normal((64, 48)).astype(np.float32) / 8, "b": rng.standard_normal(48)}
    p["b"] = p["b"].astype(np.float32)
    g = _graph("float32", "md,dn->mn", (50, 64), (64, 48), 48, "gelu", False, p)
    plan = tl.compile(g, backend="cupy", matmul_precision="tf32")
    assert "GELU_BIAS" in str(plan)
    x = rng.standard_normal((50, 64)).astype(np.float32)
    got = plan(x=x)["y"].get()
    np.testing.assert_allclose(got, _reference(x, p, "md,dn->mn", "gelu", False), atol=5e-3)


def test_input_off_a_16_byte_boundary_takes_the_fallback():
    import cupy

    rng = np.random.default_rng(4)
    p = {"w": rng.standard_normal((24, 40)).astype(np.float32) / 5, "b": rng.standard_normal(40)}
    p["b"] = p["b"].astype(np.float32)
    g = _graph("bfloat16", "md,df->mf", (30, 24), (24, 40), 40, "relu", False, p)
    plan = tl.compile(g, backend="cupy")
    nd = _np_dtype("bfloat16")
    host = rng.standard_normal(30 * 24 + 1).astype(np.float32).astype(nd)
    dev = cupy.asarray(host)[1:].reshape(30, 24)  # contiguous, 2 bytes past an aligned start
    assert dev.data.ptr % 16
    got = np.asarray(plan(x=dev)["y"].get(), np.float32)
    p16 = {k: v.astype(nd) for k, v in p.items()}
    want = _reference(host[1:].reshape(30, 24), p16, "md,df->mf", "relu", False)
    assert float((np.abs(got - want) / np.maximum(np.abs(want), 1)).max()) < TOL["bfloat16"]


def test_unfused_pairs_keep_two_steps():
    rng = np.random.default_rng(5)
    g = tl.EinsumGraph()
    x = g.input("x", (16, 32), "float32")
    w = g.constant(rng.standard_normal((32, 8)).astype(np.float32), name="w")
    h = g.einsum("ij,jk->ik", x, w)
    g.output(g.tanh(h + g.constant(rng.standard_normal(8).astype(np.float32), name="b")), "y")
    g.output(h, "h")
    plan = tl.compile(g, backend="cupy")
    assert "cuBLASLt" not in str(plan)
    xv = rng.standard_normal((16, 32)).astype(np.float32)
    ref = tl.compile(g, backend="numpy")(x=xv)
    out = plan(x=xv)
    np.testing.assert_allclose(out["y"].get(), ref["y"], rtol=1e-5, atol=1e-5)
