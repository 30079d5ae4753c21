"""The attention op's kernels on every backend against a float64 textbook attention.

Small block sizes force many query and key blocks on small inputs, so S not a multiple of a
block, the diagonal block of a causal mask and the online rescaling all run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorlogic as tl
from tensorlogic.backends.numpy import attention as attention_cpu
from tests.conftest import to_numpy


def textbook(q, k, v, scale, causal=False, mask=None):
    """softmax(scale q k^T + mask) v in float64; hidden keys of a causal mask get -inf."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("...qd,...kd->...qk", q, k) * scale
    if mask is not None:
        s = s + np.asarray(mask, np.float64)
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None], -np.inf, s)
    with np.errstate(invalid="ignore"):
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(-1, keepdims=True)
    return p @ v


def _graph(batch, sq, sk, d, dv, dtype, causal, mask_shape, scale=None):
    g = tl.EinsumGraph()
    q = g.input("q", (*batch, sq, d), dtype)
    k = g.input("k", (*batch, sk, d), dtype)
    v = g.input("v", (*batch, sk, dv), dtype)
    m = g.input("m", mask_shape, dtype) if mask_shape is not None else None
    g.output(g.attention(q, k, v, scale=scale, causal=causal, mask=m), "y")
    return g


def _inputs(g, rng):
    return {
        n: (rng.standard_normal(g.node(i).shape) * (2.0 if n == "m" else 1.0)).astype(
            g.node(i).dtype
        )
        for n, i in g.inputs.items()
    }


_TOL = {"float16": 2e-3, "float32": 2e-5, "float64": 1e-12}


def _check(backend, g, rng, tol=None, **opts):
    ins = _inputs(g, rng)
    plan = tl.compile(g, backend=backend, cache=False, **opts)
    got = to_numpy(plan(**ins)["y"])
    node = g.node(g.outputs["y"])
    want = textbook(
        ins["q"], ins["k"], ins["v"], node.args["scale"], node.args["causal"], ins.get("m")
    )
    t = tol or _TOL[node.dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=t, atol=t, equal_nan=True)
    return plan


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(attention_cpu, "BQ", 16)
    monkeypatch.setattr(attention_cpu, "BK", 24)


CASES = [
    # batch, sq, sk, d, dv, dtype, causal, mask shape
    ((2, 3), 5, 7, 4, 6, "float32", False, None),
    ((2,), 50, 50, 16, 16, "float32", True, None),
    ((3,), 37, 61, 8, 5, "float32", True, (37, 61)),
    ((2, 2), 61, 37, 8, 8, "float32", True, (2, 1, 1, 37)),
    ((), 100, 130, 32, 24, "float64", False, (100, 130)),
    ((2,), 45, 45, 16, 16, "float16", True, None),
    ((1, 2), 1, 97, 64, 64, "float32", False, None),
    ((2,), 97, 1, 64, 64, "float32", True, None),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in range(len(CASES))])
def test_attention_matches_textbook(backend, case, rng, small_blocks):
    _check(backend, _graph(*case), rng)


@pytest.mark.parametrize("scale", [0.05, -0.7, 1.0])
def test_explicit_scale(backend, scale, rng, small_blocks):
    _check(backend, _graph((2,), 33, 29, 8, 8, "float32", True, None, scale=scale), rng)


def test_fully_masked_row_is_nan_as_in_softmax(backend, rng, small_blocks):
    g = _graph((2,), 20, 30, 8, 8, "float32", False, (20, 30))
    ins = _inputs(g, rng)
    ins["m"][3, :] = -np.inf  # query 3 sees no key
    ins["m"][5, :25] = -np.inf  # query 5 sees only the last block's keys
    got = to_numpy(tl.compile(g, backend=backend, cache=False)(**ins)["y"])
    want = textbook(
        ins["q"], ins["k"], ins["v"], g.node(g.outputs["y"]).args["scale"], mask=ins["m"]
    )
    assert np.isnan(got[:, 3]).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sq=st.integers(1, 70),
    sk=st.integers(1, 70),
    d=st.integers(1, 20),
    dv=st.integers(1, 20),
    nb=st.integers(0, 2),
    causal=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_attention_property_host(sq, sk, d, dv, nb, causal, masked, seed, small_blocks):
    rng = np.random.default_rng(seed)
    g = _graph((2,) * nb, sq, sk, d, dv, "float32", causal, (sq, sk) if masked else None)
    for backend in ("numpy", "numba"):
        _check(backend, g, rng)


def test_scratch_is_declared_and_o_of_s(small_blocks):
    sq = sk = 512
    g = _graph((2,), sq, sk, 32, 32, "float32", False, None)
    plan = tl.compile(g, backend="numpy", cache=False).concrete
    (step,) = plan.steps
    assert step.scratch, "the kernel's temporaries are not in the memory plan"
    scratch = sum(plan.buffers[b].nbytes for b in step.scratch)
    assert scratch == plan.memory.peak_bytes
    assert scratch < sq * sk * 4 / 8  # far below one head's S x S scores


def test_threads_split_the_blocks(monkeypatch, rng):
    # many items, each run with one-thread BLAS on a pool participant; same result
    monkeypatch.setattr(attention_cpu, "PARALLEL_MIN_MACS", 0)
    monkeypatch.setattr(attention_cpu.host_pool, "helper_count", lambda: 3)
    plan = _check("numpy", _graph((3,), 300, 260, 16, 16, "float32", True, (300, 260)), rng)
    assert "4 thread(s)" in str(plan)


def test_agreement_harness_bounds_attention():
    # the public harness derives tolerances from error bounds: attention has its own rule
    from tensorlogic.testing import agree, bounds

    g = _graph((2,), 40, 50, 16, 8, "float32", True, (40, 50))
    rep = agree.assert_backends_agree(g, backends=("numpy", "numba"), seed=7)
    assert rep.tolerances["y"].source == "error bound"
    b = bounds.analyze(g, {"q": (-1, 1), "k": (-1, 1), "v": (-2, 3), "m": (-1, 0)})
    out = b[g.outputs["y"]]
    assert (out.lo, out.hi) == (-2.0, 3.0) and 0 < out.err < 0.05


def test_bfloat16_computes_in_float32_on_the_host(rng, small_blocks):
    g = _graph((2,), 37, 50, 16, 8, "bfloat16", True, (37, 50))
    for backend in ("numpy", "numba"):
        _check(backend, g, rng, tol=1.6e-2)  # a few bfloat16 ulps (eps 2**-7 at 1)
