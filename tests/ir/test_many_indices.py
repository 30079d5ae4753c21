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
    arrays = {f"x{i}": rng.standard_normal(small.node(small.inputs[f"x{i}"]).shape)
              for i in range(80)}
    np.testing.assert_allclose(worker_plan(key, payload)(arrays)["y"], plan(arrays)["y"],
                               rtol=1e-12)


@pytest.mark.parametrize("spec", ["ab\ud800,bc->ac", "a b,bc->ac!", "a1,1b->ab"])
def test_loader_rejects_invalid_symbols(spec):
    g = _build([(2, 2), (2, 2)], [[0, 1], [1, 2]], [0, 2])
    doc, arrays = serialize.to_dict(g)
    for nd in doc["nodes"]:
        if nd["kind"] == "einsum":
            nd["args"]["spec"] = spec
    with pytest.raises((SerializationError, SpecError)):
        serialize.from_dict(doc, arrays)


@pytest.mark.parametrize("args, words", [
    (("A", "x"), "must be a string, or numpy's interleaved form"),
    (("A", [0, 1], "B", "x"), "sublist of operand 1"),
    (("A", [0, -1]), "entry 1 is -1"),
    (("A", [0, 1.5]), "entry 1 is 1.5"),
    (("A", [0, True]), "entry 1 is True"),
    (("A", [0, ..., ...]), "more than one"),
    (("A", [0, 1], "B", [1, 2], [0, "z"]), "output sublist"),
    (("A", [0, 1 << 30]), "expected an index"),
    (("A",), "interleaved form"),
])
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
