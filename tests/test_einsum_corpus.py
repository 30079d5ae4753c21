"""Differential corpus: every einsum form numpy accepts, compiled and run on each backend."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl

from conftest import to_numpy

# (spec, operand shapes)
CORPUS = [
    # two operands: matmul family
    ("ij,jk->ik", [(5, 4), (4, 3)]),
    ("ij,jk", [(5, 4), (4, 3)]),
    ("ij,kj->ik", [(5, 4), (3, 4)]),
    ("ji,jk->ik", [(4, 5), (4, 3)]),
    ("ij,jk->ki", [(5, 4), (4, 3)]),
    ("ij,jk->ik", [(1, 4), (4, 1)]),
    ("bij,bjk->bik", [(3, 5, 4), (3, 4, 2)]),
    ("bij,bkj->bik", [(3, 5, 4), (3, 2, 4)]),
    ("bij,bjk->bki", [(3, 5, 4), (3, 4, 2)]),
    ("bij,bjk->ikb", [(3, 5, 4), (3, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 5, 6), (2, 3, 6, 4)]),
    ("bhqk,bhkd->bqhd", [(2, 3, 5, 6), (2, 3, 6, 4)]),
    ("bsi,ihd->bhsd", [(2, 5, 6), (6, 3, 4)]),
    ("ijk,jkl->il", [(4, 3, 5), (3, 5, 6)]),
    ("ijk,kjl->li", [(4, 3, 5), (5, 3, 6)]),
    ("abcd,cdef->abef", [(2, 3, 4, 5), (4, 5, 2, 3)]),
    ("ab,ba->", [(4, 5), (5, 4)]),
    ("ab,ab->", [(4, 5), (4, 5)]),
    ("ab,ab->a", [(4, 5), (4, 5)]),
    ("ab,ab->ab", [(4, 5), (4, 5)]),
    ("ab,ab->ba", [(4, 5), (4, 5)]),
    ("ab,b->a", [(4, 5), (5,)]),
    ("b,ab->a", [(5,), (4, 5)]),
    ("a,b->ab", [(4,), (5,)]),
    ("a,b->ba", [(4,), (5,)]),
    ("ab,cd->abcd", [(2, 3), (4, 2)]),
    ("ab,cd->cadb", [(2, 3), (4, 2)]),
    ("i,i->", [(7,), (7,)]),
    ("i,i->i", [(7,), (7,)]),
    ("i,i", [(7,), (7,)]),
    ("i,j->", [(3,), (4,)]),
    ("ij,ij->j", [(3, 4), (3, 4)]),
    ("bi,bi->b", [(6, 5), (6, 5)]),
    ("ab,bc->", [(3, 4), (4, 5)]),
    (",ab->ab", [(), (3, 4)]),
    ("ab,->ba", [(3, 4), ()]),
    (",->", [(), ()]),
    # single operand: transpose, reduce, diagonal, trace
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii->", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("iij->j", [(3, 3, 5)]),
    ("iji->ij", [(3, 5, 3)]),
    ("ijk->kij", [(2, 3, 4)]),
    ("ijk->jk", [(2, 3, 4)]),
    ("ba", [(3, 4)]),
    ("i->i", [(5,)]),
    ("->", [()]),
    # repeated indices inside an operand of a multi-operand einsum
    ("ii,ij->j", [(4, 4), (4, 3)]),
    ("iij,jk->ik", [(3, 3, 4), (4, 2)]),
    ("ij,jj->i", [(3, 4), (4, 4)]),
    # ellipsis broadcasting
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    ("...ij,...jk->...ik", [(3, 4, 5), (5, 6)]),
    ("...ij,...jk->...ik", [(1, 4, 5), (3, 5, 6)]),
    ("...ij,...jk", [(2, 4, 5), (2, 5, 6)]),
    ("...i,...i->...", [(2, 3, 4), (2, 3, 4)]),
    ("i...->...i", [(3, 2, 4)]),
    ("...->...", [(2, 3)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("ij...,jk...->ik...", [(3, 4, 2), (4, 5, 2)]),
    ("...,...->...", [(3, 1), (1, 4)]),
    # size-1 broadcasting of named indices (numpy accepts it)
    ("ij,ij->ij", [(3, 1), (3, 4)]),
    ("ij,jk->ik", [(3, 1), (4, 2)]),
    # uppercase letters
    ("Ab,bC->AC", [(3, 4), (4, 2)]),
    # 3- to 8-operand networks
    ("abc,bcd,cde->ae", [(3, 4, 5), (4, 5, 2), (5, 2, 3)]),
    ("ij,jk,kl->il", [(4, 5), (5, 6), (6, 3)]),
    ("ij,jk,kl,lm->im", [(4, 5), (5, 6), (6, 3), (3, 2)]),
    ("ij,jk,kl,lm,mn,no->io", [(3, 4), (4, 5), (5, 3), (3, 4), (4, 2), (2, 3)]),
    ("ab,bc,cd,de,ef,fg,gh->ah", [(2, 3), (3, 4), (4, 2), (2, 3), (3, 2), (2, 4), (4, 3)]),
    (
        "ab,bc,cd,de,ef,fg,gh,hi->ai",
        [(2, 3), (3, 2), (2, 3), (3, 2), (2, 3), (3, 2), (2, 3), (3, 2)],
    ),
    ("bi,bj,bk->bijk", [(2, 3), (2, 4), (2, 5)]),
    ("ij,ij,ij->ij", [(3, 4), (3, 4), (3, 4)]),
    ("i,i,i->", [(5,), (5,), (5,)]),
    ("ijk,il,jl,kl->l", [(3, 4, 5), (3, 2), (4, 2), (5, 2)]),
    ("ab,cd,ef->abcdef", [(2, 2), (2, 3), (3, 2)]),
    ("abc,cd,db->a", [(3, 4, 5), (5, 2), (2, 4)]),
    ("ea,fb,abcd,gc,hd->efgh", [(2, 3), (2, 3), (3, 3, 3, 3), (2, 3), (2, 3)]),
    ("bhqd,bhkd,bhkv->bhqv", [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3)]),
    ("ii,ij,jk->k", [(3, 3), (3, 4), (4, 2)]),
    ("...i,ij,jk->...k", [(2, 3, 4), (4, 5), (5, 2)]),
]


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 60


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("spec,shapes", CORPUS, ids=[c[0] for c in CORPUS])
def test_einsum_matches_numpy(spec, shapes, dtype, backend, rng):
    g = tl.EinsumGraph()
    ins = [g.input(f"x{k}", s, dtype) for k, s in enumerate(shapes)]
    g.output(g.einsum(spec, *ins), name="y")
    plan = tl.compile(g, backend=backend, opt_level=0)
    arrays = {f"x{k}": rng.uniform(0.5, 1.5, s).astype(dtype) for k, s in enumerate(shapes)}
    got = to_numpy(plan(arrays)["y"])
    want = np.einsum(spec, *arrays.values(), optimize=False)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# integer, bool and complex einsums: integers and bool bit for bit (products and sums wrap
# around in the operands' dtype, as numpy's do), complex to its precision
EXACT_DTYPES = ["int8", "uint8", "int16", "uint32", "int64", "uint64", "bool"]


@pytest.mark.parametrize("level", [0, 2])
@pytest.mark.parametrize("dtype", EXACT_DTYPES + ["complex64", "complex128"])
def test_einsum_corpus_in_other_dtypes(dtype, level, rng):
    from tensorlogic.testing.einsum_calls import random_array

    for backend in ("numpy", "numba"):
        for spec, shapes in CORPUS:
            g = tl.EinsumGraph()
            ins = [g.input(f"x{k}", s, dtype) for k, s in enumerate(shapes)]
            g.output(g.einsum(spec, *ins), name="y")
            arrays = {f"x{k}": random_array(rng, s, dtype) for k, s in enumerate(shapes)}
            got = tl.compile(g, backend=backend, opt_level=level)(arrays)["y"]
            with np.errstate(all="ignore"):
                want = np.einsum(spec, *arrays.values(), optimize=False)
            what = f"{spec} {dtype} {backend} O{level}"
            assert got.shape == want.shape and got.dtype == want.dtype, what
            if dtype in EXACT_DTYPES:
                np.testing.assert_array_equal(got, want, err_msg=what)
            else:
                tol = 1e-5 if dtype == "complex64" else 1e-12
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10, err_msg=what)


@pytest.mark.parametrize("spec,shapes", CORPUS[::4], ids=[c[0] for c in CORPUS[::4]])
def test_einsum_at_every_opt_level(spec, shapes, rng):
    g = tl.EinsumGraph()
    ins = [g.input(f"x{k}", s, "float64") for k, s in enumerate(shapes)]
    g.output(g.einsum(spec, *ins), name="y")
    arrays = {f"x{k}": rng.standard_normal(s) for k, s in enumerate(shapes)}
    want = np.einsum(spec, *arrays.values())
    for level in range(4):
        got = tl.compile(g, backend="numpy", opt_level=level)(arrays)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_output_of_transposed_input_view(rng):
    # a non-contiguous input must give the same result as a contiguous one
    g = tl.EinsumGraph()
    a, b = g.input("a", (5, 4)), g.input("b", (4, 3))
    g.output(g.einsum("ij,jk->ik", a, b), name="y")
    plan = tl.compile(g, backend="numpy")
    A = rng.standard_normal((4, 5)).astype(np.float32).T
    B = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(plan(a=A, b=B)["y"], A @ B, rtol=1e-5, atol=1e-5)
