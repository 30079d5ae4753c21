"""Host contractions of operands whose batch letters do not merge (heads between the sequence
and the head dim) match numpy, in both thread modes."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl

# heads between the sequence and the head dim: (b h) cannot merge in bshk
SPECS = [
    ("bshk,bthk->bhst", [(2, 7, 3, 5), (2, 6, 3, 5)]),
    ("bhst,bthk->bshk", [(2, 3, 7, 6), (2, 6, 3, 5)]),
    ("sbhk,tbhk->bhst", [(4, 2, 3, 5), (6, 2, 3, 5)]),
    ("bshk,hkd->bhsd", [(2, 7, 3, 5), (3, 5, 4)]),
]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("spec,shapes", SPECS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_batch_views_match_numpy(rng, backend, spec, shapes, dtype):
    g = tl.EinsumGraph()
    ins = [g.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]
    g.output(g.einsum(spec, *ins), "y")
    arrays = {f"x{i}": (rng.standard_normal(s) * 3).astype(dtype) for i, s in enumerate(shapes)}
    want = np.einsum(spec, *[a.astype(np.float64) for a in arrays.values()])
    for threads in ("pool", "blas"):
        got = tl.compile(g, backend=backend, opt_level=2, threads=threads, cache=False)(**arrays)[
            "y"
        ]
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_split_gemm_reads_batch_views(rng, monkeypatch):
    # large enough for the split: the heads-inside layout goes to the numba loop as a view
    from tensorlogic.backends.numpy import threads as cpu_threads

    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    g = tl.EinsumGraph()
    q = g.input("q", (2, 64, 4, 16), "float32")
    k = g.input("k", (2, 48, 4, 16), "float32")
    g.output(g.einsum("bshk,bthk->bhst", q, k), "y")
    qa = rng.standard_normal((2, 64, 4, 16)).astype(np.float32)
    ka = rng.standard_normal((2, 48, 4, 16)).astype(np.float32)
    got = tl.compile(g, backend="numba", cache=False)(q=qa, k=ka)["y"]
    np.testing.assert_allclose(got, np.einsum("bshk,bthk->bhst", qa, ka), rtol=1e-5, atol=1e-5)
