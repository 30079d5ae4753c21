"""The attention_layout pass and the attention op's ``layout`` argument: projections written
as plain GEMMs, the attention reading and writing their layouts, the numpy reference the judge."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from optim_helpers import assert_same_as_o0
from test_attention_pass import FORMS, _build

import tensorlogic as tl
from tensorlogic.errors import GraphError, ShapeError
from tensorlogic.ir import attention as attn_ir
from tensorlogic.ir import ops, pairwise, serialize
from tensorlogic.ir import spec as einspec
from tensorlogic.optimizer import attention_layout, optimize
from tensorlogic.testing import reference

B, S, D, H = 2, 12, 24, 3
E = D // H


def _block(spelling: str, causal: bool = False, seed: int = 0) -> tl.EinsumGraph:
    """Multi-head attention with projections, in one of several einsum spellings."""
    rng = np.random.default_rng(seed)
    g = tl.EinsumGraph()
    x = g.input("x", (B, S, D))

    def w(shape):
        return g.constant((rng.standard_normal(shape) * D**-0.5).astype(np.float32))

    if spelling == "dhe":  # bench_gpu_models: weights (D, H, E), heads before the sequence
        q, k, v = (g.einsum("bsd,dhe->bhse", x, w((D, H, E))) for _ in range(3))
        sc = g.einsum("bhqe,bhke->bhqk", q, k) * E**-0.5
        ctx = "bhqk,bhke->bhqe"
        out = ("bhqe,hed->bqd", (H, E, D))
    elif spelling == "hkd":  # the model issue's spelling: weights (H, E, D), context bqhk
        q, k, v = (g.einsum("bsd,hkd->bhsk", x, w((H, E, D))) for _ in range(3))
        sc = g.einsum("bhqk,bhsk->bhqs", q, k) * E**-0.5
        ctx = "bhqs,bhsk->bqhk"
        out = ("bqhk,hkd->bqd", (H, E, D))
    elif spelling == "bshe":  # projections already (b, s, h, e): the attention pass transposes
        q, k, v = (g.einsum("bsd,dhe->bshe", x, w((D, H, E))) for _ in range(3))
        sc = g.einsum("bqhe,bkhe->bhqk", q, k) * E**-0.5
        ctx = "bhqk,bkhe->bqhe"
        out = ("bqhe,hed->bqd", (H, E, D))
    elif spelling == "heads_first":  # (h, b, s, e) tensors, weights (E, D, H)
        q, k, v = (g.einsum("bsd,edh->hbse", x, w((E, D, H))) for _ in range(3))
        sc = g.einsum("hbqe,hbke->hbqk", q, k) * E**-0.5
        ctx = "hbqk,hbke->hbqe"
        out = ("hbqe,edh->bqd", (E, D, H))
    else:
        raise AssertionError(spelling)
    if causal:
        sc = sc + g.constant(np.triu(np.full((S, S), -np.inf, np.float32), 1))
    p = g.softmax(sc, axis=-1)
    c = g.einsum(ctx, p, v)
    g.output(g.einsum(out[0], c, w(out[1])), "y")
    return g


SPELLINGS = ["dhe", "hkd", "bshe", "heads_first"]


def _o2(g, **options):
    return optimize(g, 2, {"attention_layout": True, **options})[0]


def _plan(g, node):
    shapes = [tuple(g.node(i).shape) for i in node.inputs]
    es = einspec.parse(node.args["spec"], [len(s) for s in shapes])
    return pairwise.plan_einsum(es, shapes, einspec.letter_sizes(es, shapes))


def _copies(g, node) -> int:
    """Elements the einsum node's contraction plan copies (operands and result)."""
    plan = _plan(g, node)
    return plan.copied + sum(int(np.prod(s)) for s, _ in plan.scratch)


def _only_weights_copied(g, node) -> bool:
    """The plan regroups nothing but constant operands (no activation, no result copy)."""
    plan = _plan(g, node)
    w = sum(int(np.prod(g.node(i).shape)) for i in node.inputs if g.node(i).kind == "constant")
    return plan.copied <= w and sum(int(np.prod(s)) for s, _ in plan.scratch) <= w


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_projections_become_plain_gemms(spelling):
    g = _block(spelling)
    before = optimize(g, 2)[0]  # the option's default on host backends: canonical layouts
    opt = _o2(g)
    (att,) = [n for n in opt if n.kind == ops.ATTENTION]
    (att0,) = [n for n in before if n.kind == ops.ATTENTION]
    assert "layout" not in att0.args
    lay = att.args["layout"]
    # q, k, v and the result keep the sequence axis where the projections put it: after b
    assert tuple(lay) == (1, 1, 1, 1)
    einsums = [n for n in opt if n.kind == ops.EINSUM]
    assert len(einsums) == 4
    # nothing but a weight is regrouped (weights (E, D, H) of the heads-first spelling)
    assert all(_only_weights_copied(opt, n) for n in einsums)
    assert sum(_copies(before, n) for n in before if n.kind == ops.EINSUM) > sum(
        _copies(opt, n) for n in einsums
    )
    assert not [n for n in opt if n.kind == ops.TRANSPOSE]


def test_heads_first_spelling_takes_another_batch_order():
    # (h, b, s, e) heads first: the GEMM writes (b, s, h, e); the attention takes its batch
    # axes as (b, h) (it is the same function of every batch index) and S after b
    g = _block("heads_first")
    opt = _o2(g)
    (att,) = [n for n in opt if n.kind == ops.ATTENTION]
    assert tuple(att.args["layout"]) == (1, 1, 1, 1)
    assert tuple(att.shape) == (B, S, H, E)
    einsums = [n for n in opt if n.kind == ops.EINSUM]
    assert all(_only_weights_copied(opt, n) for n in einsums)
    assert not [n for n in opt if n.kind == ops.TRANSPOSE]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_laid_out_attention_matches_the_reference(spelling, causal, backend, rng):
    g = _block(spelling, causal)
    x = rng.uniform(-1, 1, (B, S, D)).astype(np.float32)
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(x=x)["y"]
    plan = tl.compile(g, backend=backend, cache=False, attention_layout=True, fuse_attention=True)
    assert any(n.kind == ops.ATTENTION and n.args.get("layout") for n in plan.optimized_graph)
    np.testing.assert_allclose(plan(x=x)["y"], ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("form", FORMS)
def test_every_attention_spelling_stays_correct(form, rng):
    g, _, _ = _build(form)
    assert_same_as_o0(g, rng, 2, attention_layout=True)


def test_pass_is_idempotent_and_dtype_filtered():
    g = _block("dhe")
    once = _o2(g)
    again = attention_layout(once, {"attention_layout": True})
    assert not again.changed
    # a dtype list leaves attentions of other dtypes alone
    other = _o2(g, attention_layout=("bfloat16",))
    (att,) = [n for n in other if n.kind == ops.ATTENTION]
    assert "layout" not in att.args
    with pytest.raises(GraphError, match="attention_layout"):
        attention_layout(g, {"attention_layout": "yes"})
    with pytest.raises(tl.TensorLogicError, match="attention_layout"):
        tl.compile(g, backend="numpy", attention_layout=("float99",))


def test_shared_or_output_neighbours_keep_the_canonical_layout(rng):
    # q is also a graph output and the attention result feeds an elementwise op: those stay
    g = tl.EinsumGraph()
    x = g.input("x", (B, S, D))
    w = [g.constant(rng.standard_normal((D, H, E)).astype(np.float32)) for _ in range(3)]
    q, k, v = (g.einsum("bsd,dhe->bhse", x, wi) for wi in w)
    p = g.softmax(g.einsum("bhqe,bhke->bhqk", q, k) * 0.3, axis=-1)
    o = g.einsum("bhqk,bhke->bhqe", p, v)
    g.output(g.relu(o), "y")
    g.output(q, "q")
    opt = _o2(g)
    (att,) = [n for n in opt if n.kind == ops.ATTENTION]
    assert tuple(att.args["layout"]) == (2, 1, 1, 2)
    assert_same_as_o0(g, rng, 2, attention_layout=True)


def _laid_out_graph(shape_q, shape_k, shape_v, layout, causal, mask_shape=None):
    g = tl.EinsumGraph()
    ins = [g.input(n, s) for n, s in (("q", shape_q), ("k", shape_k), ("v", shape_v))]
    if mask_shape is not None:
        ins.append(g.input("m", mask_shape))
    args = {"scale": 0.4, "causal": causal, "layout": tuple(layout)}
    g.output(tl.Tensor(g, g.add_node(ops.ATTENTION, None, [t.id for t in ins], args)), "y")
    return g


@settings(max_examples=25, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    pos=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    sq=st.integers(1, 9),
    sk=st.integers(1, 9),
    causal=st.booleans(),
    mask=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layout_argument_is_attention_over_moved_axes(batch, pos, sq, sk, causal, mask, seed):
    rng = np.random.default_rng(seed)
    nb = len(batch)
    lay = [min(p, nb) for p in pos]
    d, dv = 3, 4
    canon = [(*batch, sq, d), (*batch, sk, d), (*batch, sk, dv)]
    shapes = [attn_ir.laid_out_shape(s, j) for s, j in zip(canon, lay)]
    g = _laid_out_graph(*shapes, lay, causal, (sq, sk) if mask else None)
    out_node = g.node(g.outputs["y"])
    assert tuple(out_node.shape) == attn_ir.laid_out_shape((*batch, sq, dv), lay[3])
    xs = {n: rng.uniform(-1, 1, g.node(i).shape).astype(np.float32) for n, i in g.inputs.items()}
    # the same attention on canonical tensors, with the axes moved by numpy
    qc, kc, vc = (np.moveaxis(xs[n], j, -2) for n, j in zip(("q", "k", "v"), lay[:3]))
    gc = tl.EinsumGraph()
    t = [gc.input(n, a.shape) for n, a in (("q", qc), ("k", kc), ("v", vc))]
    m = gc.input("m", (sq, sk)) if mask else None
    gc.output(gc.attention(*t, scale=0.4, causal=causal, mask=m), "y")
    feed = {"q": qc, "k": kc, "v": vc, **({"m": xs["m"]} if mask else {})}
    want = np.moveaxis(tl.compile(gc, backend="numpy", opt_level=0)(**feed)["y"], -2, lay[3])
    for backend in ("numpy", "numba"):
        got = tl.compile(g, backend=backend, opt_level=0, cache=False)(**xs)["y"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)
    ref = reference.evaluate(g, xs)["y"]
    np.testing.assert_allclose(ref, want, rtol=2e-5, atol=2e-5, equal_nan=True)


def test_bad_layouts_are_refused():
    q = (2, 5, 3, 4)
    with pytest.raises(GraphError, match="layout"):
        _laid_out_graph(q, q, q, (1, 1, 1), False)
    with pytest.raises(GraphError, match="layout"):
        _laid_out_graph(q, q, q, (1, 1, 1, True), False)
    with pytest.raises(ShapeError, match="sequence axis of q"):
        _laid_out_graph(q, q, q, (3, 1, 1, 1), False)


def test_layout_survives_serialization_and_gradients(rng):
    g = _laid_out_graph((2, 5, 3, 4), (2, 6, 3, 4), (2, 3, 6, 4), (1, 1, 2, 1), False)
    doc, arrays = serialize.to_dict(g)
    back = serialize.from_dict(json.loads(json.dumps(doc)), arrays)
    xs = {n: rng.uniform(-1, 1, g.node(i).shape).astype(np.float32) for n, i in g.inputs.items()}
    a = tl.compile(g, backend="numpy", opt_level=0)(**xs)["y"]
    b = tl.compile(back, backend="numpy", opt_level=0)(**xs)["y"]
    np.testing.assert_array_equal(a, b)
    # gradients of sum(y * w) through the laid-out node against central differences
    w = rng.uniform(-1, 1, a.shape).astype(np.float64)
    gg = tl.EinsumGraph()
    t = {n: gg.input(n, g.node(i).shape, "float64") for n, i in g.inputs.items()}
    args = {"scale": 0.4, "causal": False, "layout": (1, 1, 2, 1)}
    y = tl.Tensor(gg, gg.add_node(ops.ATTENTION, None, [t["q"].id, t["k"].id, t["v"].id], args))
    loss = gg.sum(y * gg.constant(w))
    gg.output(loss, "loss")
    grads = tl.grad(gg, "loss", ["q", "k", "v"])
    x64 = {n: v.astype(np.float64) for n, v in xs.items()}
    got = tl.compile(grads, backend="numpy", opt_level=0)(**x64)
    f = tl.compile(gg, backend="numpy", opt_level=0)
    for name in ("q", "k", "v"):
        num = np.zeros_like(x64[name])
        for idx in np.ndindex(*num.shape):
            hi, lo = dict(x64), dict(x64)
            hi[name] = x64[name].copy()
            lo[name] = x64[name].copy()
            hi[name][idx] += 1e-6
            lo[name][idx] -= 1e-6
            num[idx] = (f(**hi)["loss"] - f(**lo)["loss"]) / 2e-6
        np.testing.assert_allclose(got[f"grad_{name}"], num, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_shape", [(B, S, S), (H, B, S, S), (S, S)])
@pytest.mark.parametrize("q_is_input", [False, True])
def test_another_batch_order_moves_masks_and_plain_inputs(mask_shape, q_is_input, rng):
    # heads first: k and v from projections, q either one too or a plain (h, b, s, e) input;
    # a mask over (b, q, k) or (h, b, q, k) follows the batch order the pass picks
    g = tl.EinsumGraph()
    x = g.input("x", (B, S, D))
    w = [g.constant((rng.standard_normal((E, D, H)) * 0.2).astype(np.float32)) for _ in range(4)]
    q = g.input("q", (H, B, S, E)) if q_is_input else g.einsum("bsd,edh->hbse", x, w[0])
    k, v = (g.einsum("bsd,edh->hbse", x, wi) for wi in w[1:3])
    sc = g.einsum("hbqe,hbke->hbqk", q, k) * 0.3 + g.input("m", mask_shape)
    o = g.einsum("hbqk,hbke->hbqe", g.softmax(sc, axis=-1), v)
    g.output(g.einsum("hbqe,edh->bqd", o, w[3]), "y")
    opt = _o2(g, fuse_attention=True)
    (att,) = [n for n in opt if n.kind == ops.ATTENTION]
    assert att.args.get("layout") is not None
    assert tuple(att.shape) == (B, S, H, E)  # batch order (b, h), S after b
    xs = {n: rng.uniform(-1, 1, opt.node(i).shape).astype(np.float32) for n, i in g.inputs.items()}
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**xs)["y"]
    for backend in ("numpy", "numba"):
        got = tl.compile(
            g, backend=backend, cache=False, attention_layout=True, fuse_attention=True
        )(**xs)["y"]
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)
