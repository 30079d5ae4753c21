"""Networks past 52 indices: numpy's interleaved form and opt_einsum's extended symbols, through
parsing, CSE, merging, planning, execution on numpy and numba, printing, JSON and Dask payloads."""

from __future__ import annotations

import numpy as np
import opt_einsum
import pytest

import tensorlogic as tl
from tensorlogic.errors import SerializationError, SpecError
from tensorlogic.ir import serialize
from tensorlogic.ir import spec as einspec
from tensorlogic.ir.graph import EinsumGraph
from tensorlogic.optimizer import optimize


def _interleaved(arrays, subs, out):
    return [x for a, s in zip(arrays, subs) for x in (a, s)] + [out]


def _build(shapes, subs, out, dtype="float64"):
    g = EinsumGraph()
    ts = [g.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]
    g.output(g.einsum(*_interleaved(ts, subs, out)), "y")
    return g


def _chain(n, rng):
    dims = rng.integers(2, 5, n + 1)
    subs = [[i, i + 1] for i in range(n)]
    shapes = [(int(dims[i]), int(dims[i + 1])) for i in range(n)]
    return shapes, subs, [0, n]


def _random_network(n_ops, n_idx, n_out, rng):
    """A random network of low treewidth: operands on a ring, each index joining two operands
    at most three apart (the ring bonds first), a few output indices on one operand each."""
    pairs = [(i, (i + 1) % n_ops) for i in range(n_ops)]
    while len(pairs) < n_idx - n_out:
        a = int(rng.integers(n_ops))
        pairs.append((a, (a + int(rng.integers(2, 4))) % n_ops))
    subs = [[] for _ in range(n_ops)]
    for k, (a, b) in enumerate(pairs):
        subs[a].append(k)
        subs[b].append(k)
    out = list(range(len(pairs), n_idx))
    for k in out:
        subs[int(rng.integers(n_ops))].append(k)
    dims = rng.integers(2, 4, n_idx)
    # operands within 3 of each other on a ring can share several indices: cap the rank
    shapes = [tuple(int(dims[k]) if len(s) < 9 else 2 for k in s) for s in subs]
    sizes = {}
    for s, shp in zip(subs, shapes):
        for k, d in zip(s, shp):
            sizes.setdefault(k, d)
    shapes = [tuple(sizes[k] for k in s) for s in subs]
    return shapes, subs, out


def _run(g, backend, arrays):
    plan = tl.compile(g, backend, 2)
    r = plan({f"x{i}": a for i, a in enumerate(arrays)})
    return plan, (r["y"] if isinstance(r, dict) else r)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_hundred_matrix_chain_matches_opt_einsum(backend):
    rng = np.random.default_rng(1)
    shapes, subs, out = _chain(100, rng)
    arrays = [rng.standard_normal(s) for s in shapes]
    g = _build(shapes, subs, out)
    plan, got = _run(g, backend, arrays)
    ref = opt_einsum.contract(*_interleaved(arrays, subs, out))
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max())
    assert "x99" in str(plan)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_random_network_200_operands_300_indices(backend):
    rng = np.random.default_rng(2)
    shapes, subs, out = _random_network(200, 300, 4, rng)
    assert len({k for s in subs for k in s}) == 300
    arrays = [rng.uniform(0.5, 1.5, s) for s in shapes]
    g = _build(shapes, subs, out)
    _, got = _run(g, backend, arrays)
    ref = opt_einsum.contract(*_interleaved(arrays, subs, out), optimize="greedy")
    np.testing.assert_allclose(got, ref, rtol=1e-9)


def test_extended_symbols_in_a_string_spec():
    rng = np.random.default_rng(3)
    n = 70
    sym = [opt_einsum.get_symbol(i) for i in range(n + 1)]
    eq = ",".join(sym[i] + sym[i + 1] for i in range(n)) + "->" + sym[0] + sym[n]
    arrays = [rng.standard_normal((2, 2)) for _ in range(n)]
    g = EinsumGraph()
    ts = [g.input(f"x{i}", (2, 2), "float64") for i in range(n)]
    g.output(g.einsum(eq, *ts), "y")
    _, got = _run(g, "numpy", arrays)
    np.testing.assert_allclose(got, opt_einsum.contract(eq, *arrays), rtol=1e-10)
    # implicit output: the free indices in symbol order, as opt_einsum orders them
    es = einspec.parse("Àa,aŔ", [2, 2])
    assert es.output == "ÀŔ"


def test_ellipsis_gets_fresh_symbols_past_52():
    used = "".join(einspec.symbol(i) for i in range(52))
    es = einspec.parse(used + "...", [54])
    assert len(set(es.inputs[0])) == 54
    assert es.output.startswith(es.inputs[0][52:])


def test_cse_and_merge_past_52_indices():
    """Two renamings of one 60-index einsum become one node (CSE); an einsum of two such
    einsums (121 indices together) merges into one (fresh symbols do not run out)."""
    n = 60
    g = EinsumGraph()
    ts = [g.input(f"x{i}", (2, 2), "float64") for i in range(n)]
    a = g.einsum(*_interleaved(ts, [[i, i + 1] for i in range(n)], [0, n]))
    b = g.einsum(*_interleaved(ts, [[i + 100, i + 101] for i in range(n)], [100, 100 + n]))
    g.output(g.einsum("ij,jk->ik", a, b), "y")
    og, _ = optimize(g, 1)
    assert sum(nd.kind == "einsum" for nd in og.nodes) == 2
    g2 = EinsumGraph()
    ts = [g2.input(f"x{i}", (2, 2), "float64") for i in range(n)]
    a = g2.einsum(*_interleaved(ts, [[i, i + 1] for i in range(n)], [0, n]))
    b = g2.einsum(*_interleaved(ts[::-1], [[i, i + 1] for i in range(n)], [0, n]))
    g2.output(g2.einsum("ij,jk->ik", a, b), "y")
    og, _ = optimize(g2, 2)
    assert sum(nd.kind == "einsum" for nd in og.nodes) == 1
    rng = np.random.default_rng(4)
    arrays = [rng.uniform(0.5, 1.0, (2, 2)) for _ in range(n)]
    _, got = _run(g2, "numpy", arrays)
    chain = opt_einsum.contract(*_interleaved(arrays, [[i, i + 1] for i in range(n)], [0, n]))
    back = opt_einsum.contract(*_interleaved(arrays[::-1], [[i, i + 1] for i in range(n)], [0, n]))
    np.testing.assert_allclose(got, chain @ back, rtol=1e-10)


def test_json_and_dask_payload_round_trip_thousands_of_indices():
    rng = np.random.default_rng(5)
    n = 3000
    shapes, subs, out = _chain(n, rng)
    g = _build(shapes, subs, out)
    g2 = serialize.loads(serialize.dumps(g))
    (e1,) = [nd for nd in g.nodes if nd.kind == "einsum"]
    (e2,) = [nd for nd in g2.nodes if nd.kind == "einsum"]
    assert e1.args["spec"] == e2.args["spec"]
    assert len(einspec.parse(e2.args["spec"], [2] * n).letters) == n + 1
    assert tuple(e2.shape) == tuple(e1.shape)

    from tensorlogic.pipeline.dask import plan_payload, worker_plan

    small = _build(*_chain(80, rng))
    plan = tl.compile(small, "numpy", 2)
    key, payload = plan_payload(plan)
    arrays = {
        f"x{i}": rng.standard_normal(small.node(small.inputs[f"x{i}"]).shape) for i in range(80)
    }
    np.testing.assert_allclose(
        worker_plan(key, payload)(arrays)["y"], plan(arrays)["y"], rtol=1e-12
    )


@pytest.mark.parametrize("spec", ["ab\ud800,bc->ac", "a b,bc->ac!", "a1,1b->ab"])
def test_loader_rejects_invalid_symbols(spec):
    g = _build([(2, 2), (2, 2)], [[0, 1], [1, 2]], [0, 2])
    doc, arrays = serialize.to_dict(g)
    for nd in doc["nodes"]:
        if nd["kind"] == "einsum":
            nd["args"]["spec"] = spec
    with pytest.raises((SerializationError, SpecError)):
        serialize.from_dict(doc, arrays)


@pytest.mark.parametrize(
    "args, words",
    [
        (("A", "x"), "must be a string, or numpy's interleaved form"),
        (("A", [0, 1], "B", "x"), "sublist of operand 1"),
        (("A", [0, -1]), "entry 1 is -1"),
        (("A", [0, 1.5]), "entry 1 is 1.5"),
        (("A", [0, True]), "entry 1 is True"),
        (("A", [0, ..., ...]), "more than one"),
        (("A", [0, 1], "B", [1, 2], [0, "z"]), "output sublist"),
        (("A", [0, 1 << 30]), "expected an index"),
        (("A",), "interleaved form"),
    ],
)
def test_bad_interleaved_inputs_raise_spec_error(args, words):
    g = EinsumGraph()
    t = {"A": g.input("a", (2, 2), "float64"), "B": g.input("b", (2, 2), "float64")}
    real = tuple(t.get(x, x) if isinstance(x, str) else x for x in args)
    with pytest.raises(SpecError, match=words.replace(".", r"\.")):
        g.einsum(*real)


def test_interleaved_rank_mismatch_names_the_term():
    g = EinsumGraph()
    a = g.input("a", (2, 2), "float64")
    with pytest.raises(SpecError, match="operand 0"):
        g.einsum(a, [0, 1, 2], [0])


def test_every_get_symbol_is_an_index():
    """opt_einsum's symbols past 52 include Unicode spaces (U+2000...) and the planes past the
    surrogates: all are indices; a surrogate is not."""
    for i in [
        *range(0, 2000),
        *range(0x2000 - 140, 0x2100 - 140),
        0x3000 - 140,
        55155,
        55296,
        100_000,
        einspec.MAX_INDICES - 1,
    ]:
        assert einspec.is_index(opt_einsum.get_symbol(i)), i
    # ours skip the surrogates get_symbol yields just below 55296, and never repeat
    ours = [einspec.symbol(i) for i in range(54_000, 57_000)]
    assert all(map(einspec.is_index, ours)) and len(set(ours)) == len(ours)
    assert ours[:1000] == [opt_einsum.get_symbol(i) for i in range(54_000, 55_000)]
    assert not einspec.is_index("\ud800") and not einspec.is_index(" ")
    eq = opt_einsum.get_symbol(0x2000 - 140) + "a,a" + opt_einsum.get_symbol(0x3000 - 140)
    es = einspec.parse(eq, [2, 2])
    assert len(es.output) == 2


def test_index_count_is_bounded_with_a_short_message():
    big = "".join(einspec.symbol(i) for i in range(einspec.MAX_INDICES + 1))
    with pytest.raises(SpecError, match="distinct indices; expected at most") as err:
        einspec.parse(big, [len(big)])
    assert len(str(err.value)) < 300
    with pytest.raises(SpecError, match="has rank 2") as err:
        einspec.parse(big[:5000], [2])
    assert len(str(err.value)) < 600


@pytest.mark.parametrize(
    "subs", [([3, 0], [0, 1]), ([30, 2], [2, 5]), ([51, 0], [0, 26]), ([1, 0], [0, 1], [1, 0])]
)
def test_interleaved_matches_numpy_implicit_and_explicit(subs):
    """Index k is numpy's k-th letter below 52: the implicit output orders like numpy's."""
    rng = np.random.default_rng(6)
    sizes = {}
    arrays = [
        rng.standard_normal(tuple(sizes.setdefault(k, 2 + k % 3) for k in s)) for s in subs[:2]
    ]
    out = list(subs[2]) if len(subs) == 3 else None
    g = EinsumGraph()
    ts = [g.input(f"x{i}", a.shape, "float64") for i, a in enumerate(arrays)]
    args = _interleaved(ts, subs[:2], out) if out else _interleaved(ts, subs[:2], None)[:-1]
    g.output(g.einsum(*args), "y")
    _, got = _run(g, "numpy", arrays)
    np_args = (
        _interleaved(arrays, subs[:2], out) if out else _interleaved(arrays, subs[:2], None)[:-1]
    )
    np.testing.assert_allclose(got, np.einsum(*np_args), rtol=1e-12)
