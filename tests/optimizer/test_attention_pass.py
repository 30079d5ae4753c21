"""The attention pass: written-out attention in many einsum spellings becomes one node."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from optim_helpers import assert_same_as_o0, count, random_inputs

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.optimizer import attention, optimize

B, H, S, T, D = 2, 3, 9, 11, 4


def _att(g):
    return [n for n in g if n.kind == ops.ATTENTION]


def _o2(g):
    return optimize(g, 2)[0]


def _bhsd(g, name, s=S, d=D):
    return g.input(name, (B, H, s, d))


def _causal_const(sq, sk, fill=-np.inf, dtype=np.float32):
    return np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None], fill, 0).astype(dtype)


def _build(form: str):
    """A written-out attention; returns (graph, expected causal flag, expects a mask input)."""
    g = tl.EinsumGraph()
    sk = S if form.startswith("causal") else T
    if form == "model":  # the model issue's spelling: head dim 'k', keys 's', output bqhk
        x = g.input("x", (B, S, 8))
        w = [
            g.constant(np.random.default_rng(i).standard_normal((H, D, 8)).astype(np.float32))
            for i in range(3)
        ]
        q, k, v = (g.einsum("bsd,hkd->bhsk", x, wi) for wi in w)
        p = g.softmax(g.einsum("bhqk,bhsk->bhqs", q, k) * float(1 / np.sqrt(D)), -1)
        g.output(g.einsum("bqhk,hkd->bqd", g.einsum("bhqs,bhsk->bqhk", p, v), w[0]), "y")
        return g, False, False
    if form == "bshd":  # torch-like (B, S, H, D) tensors, head axis in the middle
        q = g.input("q", (B, S, H, D))
        k = g.input("k", (B, sk, H, D))
        v = g.input("v", (B, sk, H, 5))
        p = g.softmax(g.einsum("bqhd,bkhd->bhqk", q, k) / 2.0, axis=-1)
        g.output(g.einsum("bhqk,bkhe->bqhe", p, v), "y")
        return g, False, False
    if form == "keys_first":  # scores laid out (b, k, h, q): softmax over axis 1; swapped operands
        q, k, v = _bhsd(g, "q"), _bhsd(g, "k", sk), _bhsd(g, "v", sk, 6)
        s = g.einsum("bhkd,bhqd->bkhq", k, q)
        p = g.softmax(0.5 * s, axis=1)
        g.output(g.einsum("bhke,bkhq->hbqe", v, p), "y")
        return g, False, False
    q, k, v = _bhsd(g, "q"), _bhsd(g, "k", sk), _bhsd(g, "v", sk, 6)
    s = g.einsum("bhqd,bhkd->bhqk", q, k)
    mask = False
    causal = False
    if form == "plain":
        x = s * 0.3
    elif form == "scalar_operand":  # the scale already inside the contraction (merge's form)
        x = g.einsum("bhqd,bhkd,->bhqk", q, k, g.constant(np.float32(0.3)))
    elif form == "mask_then_scale":
        x = (s + g.input("m", (S, T))) * 0.25
        mask = True
    elif form == "scale_then_sub_mask":
        x = s / 4.0 - g.input("m", (B, 1, S, T))
        mask = True
    elif form == "causal_add":
        x = s * 0.5 + g.constant(_causal_const(S, S))
        causal = True
    elif form == "causal_finfo_min":
        x = g.constant(_causal_const(S, S, np.finfo(np.float32).min)) + s * 0.5
        causal = True
    elif form == "causal_where":
        x = g.where(g.constant(np.tril(np.ones((S, S), np.float32))), s * 0.5, -np.inf)
        causal = True
    elif form == "causal_where_inverted":
        x = g.where(g.constant(np.triu(np.ones((1, 1, S, S), np.float32), 1)), -np.inf, s) * 0.5
        causal = True
    elif form == "causal_from_comparison":  # folded to a constant at O1, then recognized
        i = g.constant(np.arange(S, dtype=np.float32).reshape(S, 1))
        j = g.constant(np.arange(S, dtype=np.float32).reshape(1, S))
        x = g.where(j <= i, s * 0.5, -np.inf)
        causal = True
    elif form == "causal_and_mask":
        x = s * 0.5 + g.constant(_causal_const(S, S)) + g.input("m", (H, 1, S))
        causal = mask = True
    elif form == "mask_minus_1e9":  # not hard enough to be causal: kept as an additive mask
        x = s + g.constant(_causal_const(S, T, -1e9))
        mask = True
    else:
        raise AssertionError(form)
    p = g.softmax(x, axis=-1)
    g.output(g.einsum("bhqk,bhke->bhqe", p, v), "y")
    return g, causal, mask


FORMS = [
    "model",
    "bshd",
    "keys_first",
    "plain",
    "scalar_operand",
    "mask_then_scale",
    "scale_then_sub_mask",
    "causal_add",
    "causal_finfo_min",
    "causal_where",
    "causal_where_inverted",
    "causal_from_comparison",
    "causal_and_mask",
    "mask_minus_1e9",
]


@pytest.mark.parametrize("form", FORMS)
def test_every_spelling_becomes_one_attention_node(form):
    g, causal, mask = _build(form)
    opt = _o2(g)
    (att,) = _att(opt)
    assert att.args["causal"] is causal
    assert (len(att.inputs) == 4) is mask
    assert count(opt, ops.ROWOP, "softmax") == 0
    # no S x S tensor survives a causal rewrite without a user mask
    if causal and not mask:
        assert all(n.kind != ops.CONSTANT or n.shape[-2:] != (S, S) for n in opt)


@pytest.mark.parametrize("form", FORMS)
def test_rewrite_is_numerically_the_same(form, rng):
    g, _, _ = _build(form)
    assert_same_as_o0(g, rng, 2)
    inputs = {
        n: rng.uniform(-1, 1, g.node(i).shape).astype(np.float32) for n, i in g.inputs.items()
    }
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**inputs)["y"]
    got = tl.compile(g, backend="numba", opt_level=2, cache=False)(**inputs)["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


def _blocked(which: str):
    g = tl.EinsumGraph()
    q, k, v = _bhsd(g, "q"), _bhsd(g, "k", T), _bhsd(g, "v", T, 6)
    s = g.einsum("bhqd,bhkd->bhqk", q, k)
    x = s * 0.5
    if which == "scores_output":
        g.output(s, "s")
    if which == "mask_is_data_dependent_where":
        x = g.where(s, x, -np.inf)
    p = g.softmax(x, axis=2 if which == "wrong_axis" else -1)
    if which == "probs_used_twice":
        g.output(p, "p")
    if which == "log_softmax":
        p = g.log_softmax(x, -1)
    if which == "two_contracted":
        g.output(g.einsum("bhqk,bhke->bhe", p, v), "y")
        return g
    if which == "value_has_no_new_axis":
        g.output(g.einsum("bhqk,bhkd->bhqd", p, k), "y")
        g.output(v, "v_out")
        return g
    g.output(g.einsum("bhqk,bhke->bhqe", p, v), "y")
    return g


@pytest.mark.parametrize(
    "which",
    [
        "scores_output",
        "probs_used_twice",
        "wrong_axis",
        "log_softmax",
        "two_contracted",
        "mask_is_data_dependent_where",
    ],
)
def test_blocked_rewrites_leave_the_graph_correct(which, rng):
    g = _blocked(which)
    assert not _att(_o2(g))
    assert_same_as_o0(g, rng, 2)


def test_softmax_over_the_query_axis_swaps_the_roles(rng):
    # softmax over axis 2 of 'bhqk' contracted over q: attention with q and k exchanged
    g = tl.EinsumGraph()
    q, k, w = _bhsd(g, "q"), _bhsd(g, "k", T), _bhsd(g, "w", S, 6)
    p = g.softmax(g.einsum("bhqd,bhkd->bhqk", q, k) * 0.5, axis=2)
    g.output(g.einsum("bhqk,bhqe->bhke", p, w), "y")
    assert len(_att(_o2(g))) == 1
    assert_same_as_o0(g, rng, 2)


def test_value_contraction_with_the_key_tensor_is_still_attention(rng):
    # v may be any tensor, k included: p @ k is attention with v = k
    g = _blocked("value_has_no_new_axis")
    assert len(_att(_o2(g))) == 1
    assert_same_as_o0(g, rng, 2)


def test_pass_is_idempotent_and_leaves_input_untouched():
    g, _, _ = _build("model")
    before = len(g)
    once = attention(g)
    assert once.changed and len(g) == before
    assert not attention(once.graph).changed


def test_o1_keeps_the_written_out_form():
    g, _, _ = _build("plain")
    assert not _att(optimize(g, 1)[0])


def test_fused_plan_memory_is_a_fraction_of_the_unfused_one():
    g = tl.EinsumGraph()
    s = 2048
    q, k, v = (g.input(n, (1, 1, s, 16)) for n in "qkv")
    p = g.softmax(g.einsum("bhqd,bhkd->bhqk", q, k) * 0.2, -1)
    g.output(g.einsum("bhqk,bhkd->bhqd", p, v), "y")
    o0 = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    o2 = tl.compile(g, backend="numpy", opt_level=2, cache=False, fuse_attention=True)
    assert o0.memory.peak_bytes >= s * s * 4
    assert o2.memory.peak_bytes * 8 <= o0.memory.peak_bytes


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_auto_fuses_only_large_scores(backend, rng, monkeypatch):
    att_pass = importlib.import_module("tensorlogic.optimizer.attention")
    g, _, _ = _build("causal_add")
    scores = max(math.prod(n.shape) * 4 for n in g if n.kind == ops.ROWOP)
    inputs = random_inputs(g, rng)
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**inputs)["y"]

    def fused(limit: int) -> bool:
        monkeypatch.setattr(att_pass, "AUTO_MIN_SCORE_BYTES", limit)
        plan = tl.compile(g, backend=backend, opt_level=2, cache=False)
        np.testing.assert_allclose(plan(**inputs)["y"], ref, rtol=2e-5, atol=2e-5)
        return any(s.kind == ops.ATTENTION for s in plan.steps)

    # the host default is "auto": written out below the limit, fused from it on
    assert not fused(scores + 1)
    assert fused(scores)


def test_fuse_attention_option_keeps_the_written_out_form(rng):
    g, _, _ = _build("causal_add")
    plan = assert_same_as_o0(g, rng, 2, fuse_attention=False)
    assert not any(s.kind == ops.ATTENTION for s in plan.steps)
    with pytest.raises(tl.errors.GraphError, match="fuse_attention"):
        tl.compile(g, backend="numpy", cache=False, fuse_attention="no").steps  # noqa: B018


def test_fuse_attention_by_dtype(rng):
    g, _, _ = _build("causal_add")  # float32
    plan = assert_same_as_o0(g, rng, 2, fuse_attention=["bfloat16", "float16"])
    assert not any(s.kind == ops.ATTENTION for s in plan.steps)
    plan = assert_same_as_o0(g, rng, 2, fuse_attention=("float32",))
    assert any(s.kind == ops.ATTENTION for s in plan.steps)
    # under the bf16 policy the attention is bfloat16 (its -inf mask constant included)
    half = tl.compile(
        g, backend="numpy", cache=False, precision="bf16", fuse_attention={"bfloat16"}
    )
    assert any(s.kind == ops.ATTENTION for s in half.steps)
    for bad in ("bfloat16", ["bf16"], [1]):
        with pytest.raises(tl.errors.GraphError, match="fuse_attention"):
            tl.compile(g, backend="numpy", cache=False, fuse_attention=bad)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_any_layout_and_letters_is_found_and_exact(data):
    """Random axis orders for q, k, v, the scores and the result, random letters per einsum,
    either operand order, optional mask: always one attention node, same numbers as O0."""
    roles = {"b": 2, "h": 3, "q": 5, "k": 7, "d": 4, "e": 6}
    perm = lambda xs: data.draw(st.permutations(xs))  # noqa: E731
    q_l, k_l, s_l = perm("bhqd"), perm("bhkd"), perm("bhqk")
    v_l, o_l = perm("bhke"), perm("bhqe")

    def letters():
        picked = data.draw(
            st.lists(
                st.sampled_from("abcdefghijklmnopqrstuvwxyz"), min_size=6, max_size=6, unique=True
            )
        )
        return dict(zip("bhqkde", picked))

    n1, n2 = letters(), letters()
    g = tl.EinsumGraph()
    q = g.input("q", tuple(roles[r] for r in q_l))
    k = g.input("k", tuple(roles[r] for r in k_l))
    v = g.input("v", tuple(roles[r] for r in v_l))
    t = lambda ls, n: "".join(n[r] for r in ls)  # noqa: E731
    terms = [(t(q_l, n1), q), (t(k_l, n1), k)]
    if data.draw(st.booleans()):
        terms.reverse()
    s = g.einsum(f"{terms[0][0]},{terms[1][0]}->{t(s_l, n1)}", terms[0][1], terms[1][1])
    x = s * 0.37
    masked = data.draw(st.booleans())
    if masked:
        x = x + g.input("m", tuple(roles[r] if data.draw(st.booleans()) else 1 for r in s_l))
    p = g.softmax(x, axis=s_l.index("k"))
    terms = [(t(s_l, n2), p), (t(v_l, n2), v)]
    if data.draw(st.booleans()):
        terms.reverse()
    g.output(g.einsum(f"{terms[0][0]},{terms[1][0]}->{t(o_l, n2)}", terms[0][1], terms[1][1]), "y")
    (att,) = _att(_o2(g))
    assert (len(att.inputs) == 4) is masked
    assert_same_as_o0(g, np.random.default_rng(data.draw(st.integers(0, 2**31))), 2)


def test_attention_of_constants_folds(rng):
    g = tl.EinsumGraph()
    q, k, v = (g.constant(rng.standard_normal((2, 7, 4)).astype(np.float32)) for _ in range(3))
    g.output(g.attention(q, k, v, causal=True) + g.input("x", (2, 7, 4)), "y")
    assert count(optimize(g, 1)[0], ops.ATTENTION) == 0
    assert_same_as_o0(g, rng, 1)


@pytest.mark.parametrize("form", ["causal_where", "causal_where_inverted", "causal_add"])
def test_unfused_causal_forms_stay_exact(form, rng):
    # with the pass off, where -> softmax becomes one fused kernel that writes in place over the
    # scores: its where must read the scores before overwriting them
    g, _, _ = _build(form)
    assert_same_as_o0(g, rng, 2, fuse_attention=False)
