"""The kernel protocol's memory attributes: scratch buffers and alias-safe (in-place) inputs."""

from __future__ import annotations

import dataclasses

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorlogic as tl
from tensorlogic.backends import kernels
from tensorlogic.ir import pairwise as contract
from tensorlogic.backends.numpy.backend import NumpyBackend
from tensorlogic.ir import ops, spec as einspec


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_merge_is_view_matches_numpy(data):
    rank = data.draw(st.integers(1, 5))
    shape = tuple(data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=rank, max_size=rank)))
    perm = data.draw(st.permutations(range(rank)))
    cuts = sorted(data.draw(st.lists(st.integers(0, rank), min_size=2, max_size=2)))
    lens = [cuts[0], cuts[1] - cuts[0], rank - cuts[1]]
    t = np.empty(shape, np.float32).transpose(perm)
    new = []
    pos = 0
    for n in lens:
        new.append(math.prod(t.shape[pos : pos + n]))
        pos += n
    try:
        t.reshape(new, copy=False)
        numpy_view = True
    except ValueError:
        numpy_view = False
    assert contract.merge_is_view(shape, list(perm), lens) == numpy_view


EINSUMS = [
    ("ij,jk->ik", [(5, 6), (6, 7)]),
    ("ij,jk->ki", [(5, 6), (6, 7)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("ijk,kj->i", [(4, 5, 6), (6, 5)]),  # regroup copy of a non-matching layout
    ("ikj,jl->kil", [(3, 4, 5), (5, 6)]),
    ("ii,ij->j", [(4, 4), (4, 3)]),  # diagonal (repeated index)
    ("ij,kl->ijkl", [(2, 3), (4, 5)]),  # outer product
    ("ijx,jk->ik", [(3, 4, 5), (4, 6)]),  # x summed away before the matmul
    ("ij,jk,kl->il", [(2, 3), (3, 2), (2, 2)]),  # a pair whose operands swap
    ("ij,jk,kl,lm->im", [(3, 4), (4, 5), (5, 6), (6, 2)]),
    ("abc,cd,bd->a", [(2, 3, 4), (4, 5), (3, 5)]),
    ("ij,j->i", [(4, 1), (5,)]),  # broadcast dimension
    ("ij->ji", [(3, 4)]),
    ("iij->j", [(3, 3, 2)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_scratch_matches_numpy(spec, shapes, rng):
    es = einspec.parse(spec, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    plan = contract.plan_einsum(es, shapes, sizes, None, ["float32"] * len(shapes))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.einsum(spec, *arrays)
    out_shape = einspec.output_shape(es, sizes)
    # with scratch buffers (poisoned, so nothing can depend on their old contents)
    scratch = [np.full(shape, np.nan, dtype) for shape, dtype in plan.scratch]
    out = np.full(out_shape, np.nan, np.float32)
    res = plan.run(np, arrays, out, scratch)
    assert res is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # and without them (the kernel allocates)
    out2 = np.empty(out_shape, np.float32)
    np.testing.assert_allclose(plan.run(np, arrays, out2), want, rtol=1e-5, atol=1e-5)


def _node(kind, op, shape, dtype="float32", **args):
    from types import MappingProxyType

    from tensorlogic.ir.graph import Node

    return Node(0, kind, op, (), tuple(shape), dtype, "n", MappingProxyType(args))


ALIAS_CASES = [(ops.UNARY, op, 1) for op in ops.UNARY_OPS] + [
    (ops.BINARY, op, 2) for op in ops.BINARY_OPS
]


@pytest.mark.parametrize("kind,op,arity", ALIAS_CASES, ids=[c[1] for c in ALIAS_CASES])
def test_declared_inplace_inputs_are_alias_safe(kind, op, arity, rng):
    node = _node(kind, op, (6, 7))
    k = kernels.make_kernel(np, node, [node] * arity, True)
    args = [np.abs(rng.standard_normal((6, 7))).astype(np.float32) + 0.1 for _ in range(arity)]
    want = k([a.copy() for a in args], np.empty((6, 7), np.float32)).copy()
    declared = getattr(k, "inplace", ())
    assert bool(declared) == ops.ELEMENTWISE[op].alias_safe
    for pos in declared:
        xs = [a.copy() for a in args]
        got = k(xs, xs[pos])
        np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, 1])
def test_rowop_kernels_in_place_and_with_scratch(op, axis, rng):
    node = _node(ops.ROWOP, op, (5, 8), axis=axis)
    k = kernels.make_kernel(np, node, [node], True)
    x = rng.standard_normal((5, 8)).astype(np.float32) * 4
    m = x - x.max(axis=axis, keepdims=True)
    want = m - np.log(np.exp(m).sum(axis=axis, keepdims=True))
    want = np.exp(want) if op == "softmax" else want
    scratch = [np.full(s, np.nan, d) for s, d in k.scratch]
    np.testing.assert_allclose(k([x.copy()], np.empty_like(x)), want, rtol=1e-5, atol=1e-6)
    xs = x.copy()
    np.testing.assert_allclose(k([xs, *scratch], xs), want, rtol=1e-5, atol=1e-6)
    assert k.inplace == (0,)


@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_kernel_with_scratch(keepdims, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32) * 10
    x[1] = -np.inf  # an all -inf row stays -inf instead of becoming nan
    x[2, 3] = np.inf
    node = _node(
        ops.REDUCE, "logsumexp", (4, 1) if keepdims else (4,), axes=(1,), keepdims=keepdims
    )
    k = kernels.make_kernel(np, node, [_node(ops.INPUT, None, (4, 6))], True)
    scratch = [np.full(s, np.nan if d != "bool" else True, d) for s, d in k.scratch]
    out = np.empty(node.shape, np.float32)
    with np.errstate(all="ignore"):
        k([x, *scratch], out)
        m = x.max(axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        want = np.log(np.exp(x - m).sum(axis=1, keepdims=True)) + m
    np.testing.assert_allclose(out, want.reshape(out.shape), rtol=1e-5)
    assert np.isneginf(out.reshape(-1)[1]) and np.isposinf(out.reshape(-1)[2])


def test_where_kernel_in_place_over_condition_and_else(rng):
    node = _node(ops.WHERE, None, (3, 5))
    k = kernels.make_kernel(np, node, [node] * 3, True)
    c = (rng.standard_normal((3, 5)) > 0).astype(np.float32)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32)
    want = np.where(c != 0, a, b)
    assert k.inplace == (0, 2)
    for pos in k.inplace:
        xs = [c.copy(), a.copy(), b.copy()]
        np.testing.assert_array_equal(k([*xs, np.empty((3, 5), bool)], xs[pos]), want)


@pytest.fixture
def register(monkeypatch):
    """Register a backend for one test only (other tests loop over every registered backend)."""
    from tensorlogic.backends import base

    names = []

    def add(name, factory):
        names.append(name)
        monkeypatch.setitem(base._factories, name, factory)

    yield add
    for n in names:
        base._instances.pop(n, None)


class WrappingBackend(NumpyBackend):
    """A backend whose kernels are plain functions without attributes (older protocol)."""

    name = "wrapping_test"

    def prepare(self, step, node, in_nodes, graph):  # noqa: D102
        inner = super().prepare(step, node, in_nodes, graph)
        return lambda a, out: inner(a, out)


def test_kernels_without_memory_attributes_still_work(rng, register):
    register("wrapping_test", WrappingBackend)
    g = tl.EinsumGraph()
    x = g.input("x", (6, 8))
    w = g.constant(rng.standard_normal((8, 3, 4)).astype(np.float32))
    h = g.einsum("ij,jkl->lki", x, w)
    h = g.log_softmax(g.reshape(h, (12, 6)), axis=0)
    h = g.where(h > -2.0, h, g.logsumexp(h, axis=1, keepdims=True))
    g.output(h, name="y")
    xv = rng.standard_normal((6, 8)).astype(np.float32)
    plain = tl.compile(g, backend="wrapping_test", cache=False)
    ref = tl.compile(g, backend="numpy", cache=False)
    assert not any(s.scratch for s in plain.steps) and not plain.memory.inplace
    assert any(s.scratch for s in ref.steps)
    np.testing.assert_allclose(plain(x=xv)["y"], ref(x=xv)["y"], rtol=1e-6)


def test_bad_scratch_declaration_is_a_backend_error(register):
    class BadBackend(NumpyBackend):
        name = "bad_scratch_test"

        def prepare(self, step, node, in_nodes, graph):  # noqa: D102
            k = super().prepare(step, node, in_nodes, graph)
            return dataclasses.replace(k, scratch=(("not a shape",),))

    register("bad_scratch_test", BadBackend)
    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", (2, 2))), name="y")
    with pytest.raises(tl.BackendError, match="scratch entry 0"):
        tl.compile(g, backend="bad_scratch_test", cache=False)
