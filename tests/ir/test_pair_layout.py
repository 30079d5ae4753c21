"""Strided batched matmuls for pairs whose merged layout needs copies (``pair_layout``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tensorlogic.ir import pair_layout, pairwise
from tensorlogic.ir import spec as einspec


def _plan(spec, shapes, dtypes, monkeypatch, strided: bool, path=None):
    # the estimates decide alone (no timing), tilted all the way to one side
    monkeypatch.setattr(pair_layout, "CALL_NS", 0.0 if strided else 1e12)
    monkeypatch.setattr(pair_layout, "MEASURE_MIN_NS", float("inf"))
    es = einspec.parse(spec, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    return es, pairwise.plan_einsum(es, shapes, sizes, path or "optimal", dtypes, host=True)


def _run(plan, es, arrays, dtype, scratch: bool):
    sizes = einspec.letter_sizes(es, [a.shape for a in arrays])
    out = np.empty(tuple(sizes[c] for c in es.output), dtype)
    bufs = [np.full(s, 7, d) for s, d in plan.scratch] if scratch else None
    return plan.run(np, arrays, out, bufs)


def test_middle_index_runs_without_copy(monkeypatch):
    sp = pair_layout.strided_pair(
        "abltK", "t", [], ["t"], list("ablK"), [], dict.fromkeys("abltK", 4)
    )
    assert sp is not None and sp.calls == 4**3 and sp.result == "ablK"
    A = np.random.default_rng(0).random((4,) * 5)
    Av, Bv = sp.views(A, np.ones(4))
    assert np.shares_memory(Av, A)  # a view: nothing copied
    es, strided = _plan("abltK,t->ablK", [(4,) * 5, (4,)], ["float64"] * 2, monkeypatch, True)
    _, merged = _plan("abltK,t->ablK", [(4,) * 5, (4,)], ["float64"] * 2, monkeypatch, False)
    assert strided.copied == 0 and merged.copied == 4**5
    assert len(strided.scratch) < len(merged.scratch)


def test_contracted_letters_out_of_order_fall_back():
    sizes = dict.fromkeys("abcd", 3)
    # b and c are adjacent in both but in opposite orders: no common K matrix dimension
    assert pair_layout.strided_pair("abc", "cbd", [], ["b", "c"], ["a"], ["d"], sizes) is None
    # a batch letter after the summed one: neither of the matrix dims has a unit stride
    assert pair_layout.strided_pair("abc", "cbd", ["c"], ["b"], ["a"], ["d"], sizes) is None


def test_matrix_dims_apart_in_memory_need_no_copy():
    # attention's scores from per-head projections laid out (b, s, h, k): the matrix of each
    # (b, h) is (s, k) with a row stride of h * k, read by BLAS as it lies
    sizes = {"b": 2, "h": 3, "q": 5, "s": 4, "k": 6}
    sp = pair_layout.strided_pair("bqhk", "bshk", ["b", "h"], ["k"], ["q"], ["s"], sizes)
    assert sp is not None and sp.calls == 6 and sp.result == "bhqs"
    rng = np.random.default_rng(0)
    A, B = rng.random((2, 5, 3, 6)), rng.random((2, 4, 3, 6))
    Av, Bv = sp.views(A, B)
    assert np.shares_memory(Av, A) and np.shares_memory(Bv, B)
    np.testing.assert_allclose(
        np.matmul(Av, Bv).reshape(2, 3, 5, 4), np.einsum("bqhk,bshk->bhqs", A, B)
    )
    # the summed letter not innermost: the free letters that end the term have the unit stride
    sp = pair_layout.strided_pair("bshk", "bhqs", ["b", "h"], ["s"], ["k"], ["q"], sizes)
    assert sp is not None and sp.calls == 6 and sp.result == "bhkq"


_DTYPES = ["float64", "complex128", "int8", "uint16", "bool"]


def _arrays(rng, shapes, dtype):
    out = []
    for s in shapes:
        if dtype == "bool":
            out.append(rng.random(s) < 0.5)
        elif np.dtype(dtype).kind in "iu":
            info = np.iinfo(dtype)
            out.append(rng.integers(info.min, info.max, s, dtype=dtype, endpoint=True))
        elif dtype.startswith("complex"):
            out.append((rng.random(s) + 1j * rng.random(s) + 0.5).astype(dtype))
        else:
            out.append(rng.random(s).astype(dtype) + 0.5)
    return out


@st.composite
def _pairs(draw):
    """Two operands with shared letters in random places, some summed, some kept."""
    letters = "abcdefg"
    n = draw(st.integers(3, 6))
    used = letters[:n]
    sizes = {c: draw(st.integers(1, 4)) for c in used}
    a = "".join(draw(st.permutations(used))[: draw(st.integers(2, n))])
    rest = [c for c in used if c not in a]
    shared = draw(st.lists(st.sampled_from(a), min_size=1, max_size=len(a), unique=True))
    b = "".join(draw(st.permutations(shared + rest)))
    kept = [c for c in dict.fromkeys(a + b) if c not in shared or draw(st.booleans())]
    out = "".join(draw(st.permutations(kept)))
    # a third operand joins after the pair, so the pair is an inner step (the last pair of an
    # einsum keeps the layout that lands in its output)
    return (f"{a},{b},z->{out}z", [tuple(sizes[c] for c in t) for t in (a, b)] + [(2,)])


@settings(max_examples=120, deadline=None)
@given(
    case=_pairs(), dtype=st.sampled_from(_DTYPES), scratch=st.booleans(), seed=st.integers(0, 2**16)
)
def test_strided_pairs_match_numpy(case, dtype, scratch, seed):
    spec, shapes = case
    rng = np.random.default_rng(seed)
    arrays = _arrays(rng, shapes, dtype)
    ref = np.einsum(spec, *arrays)
    with pytest.MonkeyPatch.context() as mp:
        es, plan = _plan(spec, shapes, [dtype] * 3, mp, True, [(0, 1), (0, 1)])
    got = _run(plan, es, arrays, ref.dtype, scratch)
    assert got.dtype == ref.dtype
    if np.dtype(dtype).kind in "iub":
        np.testing.assert_array_equal(got, ref)  # exact, wraparound included
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_network_with_strided_steps_matches_numpy(dtype, monkeypatch, rng):
    spec = "abctd,t,cdu,ue->abe"
    shapes = [(3, 4, 2, 5, 3), (5,), (2, 3, 6), (6, 4)]
    arrays = _arrays(rng, shapes, dtype)
    es, plan = _plan(spec, shapes, [dtype] * 4, monkeypatch, True, [(0, 1), (0, 1), (0, 1)])
    got = _run(plan, es, arrays, np.dtype(dtype), True)
    np.testing.assert_allclose(got, np.einsum(spec, *arrays), rtol=1e-12)
    assert plan.copied == 0


def test_timed_choice_is_one_of_the_two(rng):
    # left to time both layouts (a 16^4 operand with the summed index in the middle: large
    # enough for timing), the plan is right whichever wins
    spec = "abtc,t->abc"
    shapes = [(16, 16, 16, 16), (16,)]
    arrays = _arrays(rng, shapes, "float64")
    es = einspec.parse(spec, [4, 1])
    sizes = einspec.letter_sizes(es, shapes)
    plan = pairwise.plan_einsum(es, shapes, sizes, "optimal", ["float64"] * 2, host=True)
    np.testing.assert_allclose(
        _run(plan, es, arrays, np.float64, True), np.einsum(spec, *arrays), rtol=1e-12
    )


@pytest.mark.parametrize("pick", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "spec,shapes",
    [
        ("abtc,tcd,z->abdz", [(3, 4, 5, 2), (5, 2, 3), (2,)]),
        ("abtc,dt,z->dcbaz", [(3, 4, 5, 2), (6, 5), (2,)]),
        ("btc,bct,z->bz", [(3, 5, 2), (3, 2, 5), (2,)]),
        ("xabt,ty,z->yxabz", [(2, 3, 4, 5), (5, 3), (2,)]),
        ("abtc,dt->dcba", [(3, 4, 5, 2), (6, 5)]),  # a last pair: the layouts that land in ``out``
    ],
)
def test_every_candidate_layout_matches_numpy(pick, spec, shapes, monkeypatch, rng):
    # each candidate (merged or strided, either orientation) forced in turn
    monkeypatch.setattr(
        pair_layout.Chooser,
        "choose",
        lambda self, est, build, shapes, key=None: min(pick, len(est) - 1),
    )
    arrays = _arrays(rng, shapes, "float64")
    es = einspec.parse(spec, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    path = [(0, 1), (0, 1)][: len(shapes) - 1]
    plan = pairwise.plan_einsum(es, shapes, sizes, path, ["float64"] * len(shapes), host=True)
    for scratch in (True, False):
        np.testing.assert_allclose(
            _run(plan, es, arrays, np.float64, scratch), np.einsum(spec, *arrays), rtol=1e-12
        )


@pytest.mark.parametrize("dtype", ["float64", "int16", "complex128"])
def test_temporaries_share_buffers_when_never_live_together(dtype, rng):
    # a chain of six: five pair results and the copies they need, but only a few alive at once
    spec = "ba,cb,dc,ed,fe,gf->ag"
    shapes = [(3, 4), (5, 3), (4, 5), (6, 4), (2, 6), (3, 2)]
    arrays = _arrays(rng, shapes, dtype)
    es = einspec.parse(spec, [2] * 6)
    sizes = einspec.letter_sizes(es, shapes)
    plan = pairwise.plan_einsum(
        es, shapes, sizes, [(0, 1), (0, 4), (0, 3), (0, 2), (0, 1)], [dtype] * 6
    )
    # fewer buffers than temporaries, none larger than the largest temporary
    assert 0 < len(plan.scratch) < 5
    assert max(s[0][0] for s in plan.scratch) <= max(
        sizes[a] * sizes[b] for a in sizes for b in sizes
    )
    ref = np.einsum(spec, *arrays)
    got = _run(plan, es, arrays, ref.dtype, True)  # buffers start full of garbage
    if np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-12)


def _split_plan(mp, split, spec, shapes, path):
    """A plan whose products all go to the pool mode's split GEMM (3 threads, no size floor),
    strided layouts preferred wherever the merged one would copy."""
    from tensorlogic.backends.numpy import host_pool, threads as cpu_threads

    mp.setattr(cpu_threads, "SPLIT", split)
    # where MKL runs the GEMMs: its blocks in numba's loop, or numpy's BLAS for the Python split
    mp.setenv("TL_MKL_SPLIT", "1")
    if split == "python":
        mp.setenv("TL_BLAS", "numpy")
    mp.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    mp.setattr(cpu_threads.parallel_matmul, "min_flops", 0)
    mp.setattr(host_pool, "helper_count", lambda: 2)
    mp.setattr(pair_layout, "CALL_NS", 0.0)
    mp.setattr(pair_layout, "MEASURE_MIN_NS", float("inf"))
    es = einspec.parse(spec, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    dts = ["float64"] * len(shapes)
    return es, pairwise.plan_einsum(es, shapes, sizes, path, dts, cpu_threads.parallel_matmul, True)


@pytest.mark.parametrize("split", ["numba", "python"])
@pytest.mark.parametrize(
    "spec,shapes",
    [
        ("bqhk,bshk,z->bhqsz", [(2, 5, 3, 6), (2, 4, 3, 6), (2,)]),  # attention scores
        ("bhqs,bshk,z->bhqkz", [(2, 3, 5, 4), (2, 4, 3, 6), (2,)]),  # attention values
        ("acbt,cty,z->cabyz", [(2, 3, 4, 5), (3, 5, 3), (2,)]),  # A's free "a" is a batch axis
        ("cty,acbt,z->cyabz", [(3, 5, 3), (2, 3, 4, 5), (2,)]),  # ... on the other side
    ],
)
def test_strided_products_on_split_gemms(split, spec, shapes, rng):
    from tensorlogic.backends import gemm_numba
    from tensorlogic.backends.numpy import threads as cpu_threads

    arrays = _arrays(rng, shapes, "float64")
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        es, plan = _split_plan(mp, split, spec, shapes, [(0, 1), (0, 1)])
        real = gemm_numba.prepare  # split products are prepared numba loops (kept per layout)
        mp.setattr(
            gemm_numba, "prepare", lambda A, B, out, g: calls.append(1) or real(A, B, out, g)
        )
        mp.setattr(cpu_threads, "_DISPATCH", {})
        with cpu_threads.single_threaded_blas():
            got = _run(plan, es, arrays, np.float64, True)
    assert plan.copied == 0  # every product read its operands where they lie
    assert bool(calls) == (split == "numba" and gemm_numba.available())
    np.testing.assert_allclose(got, np.einsum(spec, *arrays), rtol=1e-12)


@pytest.mark.parametrize("split", ["numba", "python"])
@settings(max_examples=40, deadline=None)
@given(case=_pairs(), seed=st.integers(0, 2**16))
def test_strided_pairs_on_split_gemms_match_numpy(split, case, seed):
    # the pool thread mode's split GEMM runs the strided products (broadcast batch axes too)
    from tensorlogic.backends.numpy import threads as cpu_threads

    spec, shapes = case
    arrays = _arrays(np.random.default_rng(seed), shapes, "float64")
    with pytest.MonkeyPatch.context() as mp:
        es, plan = _split_plan(mp, split, spec, shapes, [(0, 1), (0, 1)])
        with cpu_threads.single_threaded_blas():
            got = _run(plan, es, arrays, np.float64, True)
    np.testing.assert_allclose(got, np.einsum(spec, *arrays), rtol=1e-12)


# a pair whose result the next pair reads in another letter order: the value product of
# attention and the output projection that sums over heads (the reader takes the result first
# or second), a chain whose middle result is read transposed, and a batch letter between rows
READ_ORDER_CASES = [
    ("bhqs,bshk,hkd->bqd", [(2, 3, 5, 4), (2, 4, 3, 6), (3, 6, 7)], [(0, 1), (0, 1)]),
    ("hkd,bhqs,bshk->bqd", [(3, 6, 7), (2, 3, 5, 4), (2, 4, 3, 6)], [(1, 2), (0, 1)]),
    ("ij,jk,lki->l", [(5, 4), (4, 6), (3, 6, 5)], [(0, 1), (0, 1)]),
    ("bij,bjk,kbl->il", [(2, 5, 4), (2, 4, 6), (6, 2, 3)], [(0, 1), (0, 1)]),
]


@pytest.mark.parametrize("spec,shapes,path", READ_ORDER_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128", "int16"])
def test_results_land_in_the_order_their_reader_takes(spec, shapes, path, dtype, monkeypatch):
    rng = np.random.default_rng(7)
    arrays = _arrays(rng, shapes, dtype)
    # strided layouts preferred, no timing: the copy-free candidates
    es, plan = _plan(spec, shapes, [dtype] * len(shapes), monkeypatch, True, path)
    got = _run(plan, es, arrays, np.result_type(*arrays), True)
    ref = np.einsum(spec, *[a.astype(np.complex128) for a in arrays])
    if np.dtype(dtype).kind in "iu":  # integer products keep their letter order: exact
        np.testing.assert_array_equal(got, np.einsum(spec, *arrays))
    else:
        tol = 1e-5 if dtype == "float32" else 1e-12
        want = ref if np.iscomplexobj(got) else ref.real
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if spec.startswith("bhqs") and dtype == "float64":
        assert plan.copied == 0  # the head transpose before the projection is gone


@pytest.mark.parametrize("pick", [0, 1, 2, 3])
@pytest.mark.parametrize("spec,shapes,path", READ_ORDER_CASES)
def test_every_candidate_writes_a_result_its_reader_takes(pick, spec, shapes, path, monkeypatch):
    monkeypatch.setattr(
        pair_layout.Chooser,
        "choose",
        lambda self, est, build, shapes, key=None: min(pick, len(est) - 1),
    )
    arrays = _arrays(np.random.default_rng(pick), shapes, "float64")
    es = einspec.parse(spec, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    plan = pairwise.plan_einsum(es, shapes, sizes, path, ["float64"] * len(shapes), host=True)
    for scratch in (True, False):
        np.testing.assert_allclose(
            _run(plan, es, arrays, np.float64, scratch), np.einsum(spec, *arrays), rtol=1e-12
        )


@pytest.mark.parametrize("split", ["numba", "python"])
@pytest.mark.parametrize("spec,shapes,path", READ_ORDER_CASES[:2])
def test_reader_ordered_results_on_split_gemms(split, spec, shapes, path, rng):
    from tensorlogic.backends import gemm_numba
    from tensorlogic.backends.numpy import threads as cpu_threads

    arrays = _arrays(rng, shapes, "float64")
    outs = []
    with pytest.MonkeyPatch.context() as mp:
        es, plan = _split_plan(mp, split, spec, shapes, path)
        real = gemm_numba.prepare
        mp.setattr(
            gemm_numba,
            "prepare",
            lambda A, B, out, g: outs.append(out.flags.c_contiguous) or real(A, B, out, g),
        )
        mp.setattr(cpu_threads, "_DISPATCH", {})
        with cpu_threads.single_threaded_blas():
            got = _run(plan, es, arrays, np.float64, True)
    np.testing.assert_allclose(got, np.einsum(spec, *arrays), rtol=1e-12)
    assert plan.copied == 0
    if split == "numba" and gemm_numba.available():
        assert False in outs  # the value product wrote its strided result in numba's loop


@st.composite
def _read_chains(draw):
    """A pair (batch, row, column and summed letters in random order on both sides) and a third
    operand that reads its result with some of its letters, in random order."""
    pool = iter("abcdefghij")
    groups = [[next(pool) for _ in range(draw(st.integers(lo, 2)))] for lo in (0, 1, 1, 1)]
    batch, left, right, contr = groups
    sizes = {c: draw(st.integers(1, 4)) for g in groups for c in g}
    a = "".join(draw(st.permutations(batch + left + contr)))
    b = "".join(draw(st.permutations(batch + contr + right)))
    res = batch + left + right
    read = draw(st.lists(st.sampled_from(res), min_size=1, max_size=len(res), unique=True))
    extra = [next(pool) for _ in range(draw(st.integers(0, 2)))]
    sizes.update({c: draw(st.integers(1, 4)) for c in extra})
    c = "".join(draw(st.permutations(read + extra)))
    # the result's letters the reader does not take stay to the output; of its own, some
    kept = [x for x in res if x not in read] + [x for x in read + extra if draw(st.booleans())]
    out = "".join(draw(st.permutations(kept)))
    first = draw(st.booleans())
    terms = (a, b, c) if first else (c, a, b)
    path = [(0, 1), (0, 1)] if first else [(1, 2), (0, 1)]
    return ",".join(terms) + "->" + out, [tuple(sizes[x] for x in t) for t in terms], path


@settings(max_examples=150, deadline=None)
@given(case=_read_chains(), strided=st.booleans(), seed=st.integers(0, 2**16))
def test_read_ordered_chains_match_numpy(case, strided, seed):
    spec, shapes, path = case
    arrays = _arrays(np.random.default_rng(seed), shapes, "float64")
    with pytest.MonkeyPatch.context() as mp:
        es, plan = _plan(spec, shapes, ["float64"] * 3, mp, strided, path)
        got = _run(plan, es, arrays, np.float64, True)
    np.testing.assert_allclose(got, np.einsum(spec, *arrays), rtol=1e-12, atol=1e-12)
