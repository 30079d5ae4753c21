"""The cupy backend's flash-attention kernel on a GPU: head dims, dtypes, masks, long sequences."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic import dtypes
from tests.backends.test_attention_kernels import _graph, _inputs, textbook
from tests.conftest import to_numpy

pytestmark = pytest.mark.gpu

# 16-bit: inputs, the probabilities fed to P V and the output are each rounded once
_TOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 3e-5, "float64": 1e-12}


def _poisoned(plan, ins):
    """The plan's output after a first call's output was filled with NaN and freed: CuPy's pool
    hands the same block to the next call, so an element the kernel misses stays NaN."""
    import cupy

    y = plan(**ins)["y"]
    y[...] = cupy.nan
    del y
    return plan(**ins)["y"]


@pytest.mark.parametrize("d", [32, 64, 80, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "dtype", ["float32", "float16", "bfloat16", "float16_ffma", "float32_ffma"]
)
def test_head_dims_dtypes_and_causal(d, causal, dtype, rng, monkeypatch):
    from tensorlogic.backends.cupy import attention_gpu

    if dtype.endswith("_ffma"):  # the exact kernel (unaligned views take it)
        monkeypatch.setattr(attention_gpu, "USE_MMA", False)
        dtype = dtype[: -len("_ffma")]
    g = _graph((1, 3), 333, 333 if causal else 517, d, d, dtype, causal, None)
    ins = _inputs(g, rng)
    want = textbook(ins["q"], ins["k"], ins["v"], g.node(g.outputs["y"]).args["scale"], causal)
    for graph_mode in (False, True):
        plan = tl.compile(g, backend="cupy", cache=False, cuda_graph=graph_mode)
        for _ in range(2):  # the second call replays a captured graph
            got = to_numpy(plan(**ins)["y"]).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=_TOL[dtype], atol=_TOL[dtype])


def _configs():
    from tensorlogic.backends.cupy.attention_mma import Config

    return [
        Config(8),
        Config(4),
        Config(4, 2, True),
        Config(4, 2, False),
        Config(8, 1, True, True),
        Config(4, 2, True, True),
        Config(4, 2, False, True),
        Config(8, 2, False),
        Config(4, 2, True, False, 128),
        Config(4, 2, False, True, 32),
    ]


@pytest.mark.parametrize("config", range(10))
@pytest.mark.parametrize(
    "shape",
    [  # batch, sq, sk, d, dv, causal, mask
        ((2, 3), 1, 700, 64, 64, False, None),
        ((5,), 129, 129, 128, 64, True, (5, 129, 129)),
        ((1, 2), 1000, 77, 32, 128, True, None),
        ((3,), 200, 1031, 16, 48, False, (1, 1031)),
        ((2,), 65, 64, 96, 96, True, None),
        ((2,), 1100, 1100, 64, 64, True, None),
    ],
)
def test_tensor_core_kernel_shapes_and_block_shapes(shape, config, rng, monkeypatch):
    from tensorlogic.backends.cupy import attention_gpu

    monkeypatch.setattr(attention_gpu, "MMA_CONFIG", _configs()[config])
    dtype = ("bfloat16", "float16")[config % 2]
    batch, sq, sk, d, dv, causal, mask = shape
    g = _graph(batch, sq, sk, d, dv, dtype, causal, mask, scale=0.3)
    ins = _inputs(g, rng)
    plan = tl.compile(g, backend="cupy", cache=False)
    assert "tensor-core mma" in plan.steps[0].info
    got = to_numpy(_poisoned(plan, ins)).astype(np.float64)
    want = textbook(ins["q"], ins["k"], ins["v"], 0.3, causal, ins.get("m"))
    np.testing.assert_allclose(got, want, rtol=_TOL[dtype], atol=_TOL[dtype])


@pytest.mark.parametrize("scale", [-0.2, 0.0])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_negative_and_zero_scales(scale, dtype, rng):
    # the tensor-core kernels specialize a positive scale (maxima of the raw scores); any other
    # scale takes the generic path
    g = _graph((2, 3), 150, 150, 64, 64, dtype, True, None, scale=scale)
    ins = _inputs(g, rng)
    plan = tl.compile(g, backend="cupy", cache=False)
    assert "tensor-core mma" in plan.steps[0].info
    got = to_numpy(_poisoned(plan, ins)).astype(np.float64)
    want = textbook(ins["q"], ins["k"], ins["v"], scale, True)
    np.testing.assert_allclose(got, want, rtol=_TOL[dtype], atol=_TOL[dtype])


def _tf32_configs():
    from tensorlogic.backends.cupy.attention_tf32 import Config

    return [
        Config(4, 1, False, 32),
        Config(4, 1, False, 64),
        Config(4, 1, True, 32),
        Config(8, 1, False, 32, True),
        Config(4, 2, False, 32),
        Config(4, 2, True, 64, True),
        Config(8, 2, False, 32),  # 186 KiB of shared memory at head dim 128
    ]


@pytest.mark.parametrize("config", range(7))
@pytest.mark.parametrize(
    "shape",
    [  # batch, sq, sk, d, dv, causal, mask
        ((2, 3), 1, 700, 64, 64, False, None),
        ((5,), 129, 129, 128, 64, True, (5, 129, 129)),
        ((1, 2), 1000, 77, 32, 128, True, None),
        ((3,), 200, 1031, 8, 48, False, (1, 1031)),
        ((2,), 1100, 1100, 40, 24, True, None),
    ],
)
@pytest.mark.parametrize("split", [True, False])
def test_float32_tensor_core_kernel_shapes_and_block_shapes(shape, config, split, rng, monkeypatch):
    # split: 3xTF32, float32's tolerance; else one TF32 MMA (matmul_precision="tf32")
    from tensorlogic.backends.cupy import attention_gpu

    monkeypatch.setattr(attention_gpu, "TF32_CONFIG", _tf32_configs()[config])
    batch, sq, sk, d, dv, causal, mask = shape
    g = _graph(batch, sq, sk, d, dv, "float32", causal, mask, scale=0.3)
    ins = _inputs(g, rng)
    plan = tl.compile(
        g, backend="cupy", cache=False, matmul_precision="highest" if split else "tf32"
    )
    assert ("3xTF32" in plan.steps[0].info) is split and "TF32" in plan.steps[0].info
    got = to_numpy(_poisoned(plan, ins)).astype(np.float64)
    want = textbook(ins["q"], ins["k"], ins["v"], 0.3, causal, ins.get("m"))
    tol = _TOL["float32"] if split else 5e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("mask_shape", [(70, 130), (2, 1, 70, 1), (3, 1, 130)])
@pytest.mark.parametrize("dims", [(24, 40), (64, 64)])
def test_broadcast_masks_and_float64(mask_shape, dims, rng):
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        g = _graph((2, 3), 70, 130, *dims, dtype, True, mask_shape)
        ins = _inputs(g, rng)
        got = to_numpy(tl.compile(g, backend="cupy", cache=False)(**ins)["y"])
        want = textbook(
            ins["q"], ins["k"], ins["v"], g.node(g.outputs["y"]).args["scale"], True, ins["m"]
        )
        np.testing.assert_allclose(got, want, rtol=_TOL[dtype], atol=_TOL[dtype])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_kernel_is_used_and_unaligned_inputs_fall_back(dtype, rng):
    import cupy

    g = _graph((2,), 200, 300, 64, 48, dtype, True, (200, 300))
    plan = tl.compile(g, backend="cupy", cache=False)
    assert "tensor-core mma" in plan.steps[0].info
    ins = _inputs(g, rng)
    want = textbook(
        ins["q"], ins["k"], ins["v"], g.node(g.outputs["y"]).args["scale"], True, ins["m"]
    )
    dev = {}
    for n, a in ins.items():  # C-contiguous views 2 bytes past an aligned start
        buf = cupy.empty(a.size + 1, a.dtype)[1:].reshape(a.shape)
        buf.set(a)
        dev[n] = buf
    assert dev["q"].data.ptr % 16
    for given in (ins, dev):
        got = to_numpy(plan(**given)["y"]).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=_TOL[dtype], atol=_TOL[dtype])


def test_default_block_shapes_are_the_measured_ones():
    from tensorlogic.backends.cupy.attention_gpu import mma_config
    from tensorlogic.backends.cupy.attention_mma import Config

    assert mma_config(1024, 8, 64, 64, False, 132) == Config(4)  # 64 blocks of 128: too few
    assert mma_config(4096, 8, 64, 64, False, 132) == Config(4, 2, True)
    assert mma_config(4096, 8, 64, 64, True, 132) == Config(4, 2, True, True)
    assert mma_config(4096, 8, 128, 128, False, 132) == Config(4, 2, False)
    assert mma_config(4096, 8, 128, 128, True, 132) == Config(8, 1, True, True)
    from tensorlogic.backends.cupy.attention_gpu import tf32_config
    from tensorlogic.backends.cupy.attention_tf32 import Config as T

    assert tf32_config(4096, 8, 64, 64, False, 132) == T(4, 2, False, 32)
    assert tf32_config(1024, 8, 64, 64, False, 132) == T(4, 1, True, 32)  # 64 blocks: too few
    assert tf32_config(4096, 8, 64, 64, True, 132) == T(4, 1, True, 32, True)
    assert tf32_config(4096, 8, 128, 128, False, 132) == T(4, 1, True, 32)


def test_written_out_model_attention_runs_fused_on_the_gpu(rng):
    # the model issue's spelling, causal through an additive -inf constant
    b, s, h, k, d = 2, 150, 4, 16, 64
    g = tl.EinsumGraph()
    x = g.input("x", (b, s, d))
    wq, wk, wv, wo = (
        g.constant((rng.standard_normal((h, k, d)) / 8).astype(np.float32)) for _ in range(4)
    )
    q, kk, v = (g.einsum("bsd,hkd->bhsk", x, w) for w in (wq, wk, wv))
    scores = g.einsum("bhqk,bhsk->bhqs", q, kk) * 0.25
    scores = scores + g.constant(np.triu(np.full((s, s), -np.inf, np.float32), 1))
    o = g.einsum("bhqs,bhsk->bqhk", g.softmax(scores, -1), v)
    g.output(g.einsum("bqhk,hkd->bqd", o, wo), "y")
    ins = {"x": rng.standard_normal(g.node(g.inputs["x"]).shape).astype(np.float32)}
    o0 = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**ins)["y"]
    plan = tl.compile(g, backend="cupy", opt_level=2, cache=False, fuse_attention=True)
    assert any("3xTF32" in st.info for st in plan.steps if st.kind == "attention")
    # fused by default in every float dtype the tensor cores take; fuse_attention=False keeps
    # the written-out form
    default = tl.compile(g, backend="cupy", opt_level=2, cache=False)
    assert any(st.kind == "attention" for st in default.steps)
    assert not any(
        st.kind == "attention"
        for st in tl.compile(
            g, backend="cupy", opt_level=2, cache=False, fuse_attention=False
        ).steps
    )
    np.testing.assert_allclose(to_numpy(plan(**ins)["y"]), o0, rtol=1e-4, atol=1e-4)
    tf32 = tl.compile(g, backend="cupy", opt_level=2, cache=False, matmul_precision="tf32")
    step = next(st for st in tf32.steps if st.kind == "attention")
    assert "TF32" in step.info and "3xTF32" not in step.info
    np.testing.assert_allclose(to_numpy(tf32(**ins)["y"]), o0, rtol=5e-3, atol=5e-3)
    half = tl.compile(g, backend="cupy", opt_level=2, cache=False, precision="bf16")
    step = next(st for st in half.steps if st.kind == "attention")
    assert "tensor-core mma" in step.info
    np.testing.assert_allclose(to_numpy(half(**ins)["y"]), o0, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sequence_of_16k_runs_in_o_of_s_memory(dtype, rng):
    import cupy

    s, d = 16384, 64
    g = _graph((1, 2), s, s, d, d, dtype, True, None)
    ins = {n: cupy.asarray(a) for n, a in _inputs(g, rng).items()}
    plan = tl.compile(g, backend="cupy", cache=False)
    assert plan.memory.peak_bytes == 0  # no arena: the scores live in shared memory
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    before = pool.total_bytes()
    y = plan(**ins)["y"]
    cupy.cuda.Device().synchronize()
    assert pool.total_bytes() - before <= 2 * y.nbytes  # the output (and no S x S anything)
    rows = rng.choice(s, 48, replace=False)
    qh, kh, vh = (to_numpy(ins[n]) for n in "qkv")
    want = np.empty((1, 2, len(rows), d))
    for r_i, r in enumerate(rows):  # query r sees keys 0..r
        ref = textbook(qh[:, :, r : r + 1], kh[:, :, : r + 1], vh[:, :, : r + 1], 1 / np.sqrt(d))
        want[:, :, r_i] = ref[:, :, 0]
    got = to_numpy(y)[:, :, rows].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=_TOL[dtype], atol=_TOL[dtype])


def _laid_out(batch, pos, sq, sk, d, dv, dtype, causal, mask_shape):
    """An attention node whose q, k, v and result hold their sequence axis at ``pos``."""
    from tensorlogic.ir import attention as attn_ir
    from tensorlogic.ir import ops

    canon = [(*batch, sq, d), (*batch, sk, d), (*batch, sk, dv)]
    g = tl.EinsumGraph()
    ts = [
        g.input(n, attn_ir.laid_out_shape(s, j), dtype)
        for n, s, j in zip(("q", "k", "v"), canon, pos)
    ]
    if mask_shape is not None:
        ts.append(g.input("m", mask_shape, dtype))
    args = {"scale": 0.3, "causal": causal, "layout": tuple(pos)}
    g.output(tl.Tensor(g, g.add_node(ops.ATTENTION, None, [t.id for t in ts], args)), "y")
    return g


@pytest.mark.parametrize(
    "case",
    [  # batch, sequence-axis positions (q, k, v, out), sq, sk, d, dv, causal, mask
        ((2, 4), (1, 1, 1, 1), 300, 300, 64, 64, False, None),
        ((2, 4), (1, 1, 1, 1), 257, 257, 128, 128, True, None),
        ((3, 2, 2), (0, 2, 1, 3), 130, 70, 32, 48, False, (130, 70)),
        ((2, 3), (0, 1, 2, 0), 65, 200, 16, 64, True, (2, 1, 65, 200)),
        ((2, 4), (1, 1, 1, 1), 90, 90, 40, 40, False, None),  # 40: FFMA kernel in 16 bits
        ((2, 3), (1, 1, 1, 1), 50, 70, 20, 36, True, None),  # FFMA kernel in every dtype
    ],
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_kernels_read_and_write_other_layouts(case, dtype, rng):
    batch, pos, sq, sk, d, dv, causal, mask = case
    g = _laid_out(batch, pos, sq, sk, d, dv, dtype, causal, mask)
    ins = _inputs(g, rng)
    canon = {n: np.moveaxis(ins[n], j, -2) for n, j in zip(("q", "k", "v"), pos)}
    want = np.moveaxis(
        textbook(canon["q"], canon["k"], canon["v"], 0.3, causal, ins.get("m")), -2, pos[3]
    )
    plan = tl.compile(g, backend="cupy", cache=False)
    step = 16 if dtype != "float32" else 8  # the MMA's k step
    mma = d % step == 0 and dv % step == 0
    assert ("tensor-core mma" in plan.steps[0].info) is mma
    got = to_numpy(_poisoned(plan, ins)).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=_TOL[dtype], atol=_TOL[dtype])


@pytest.mark.parametrize("hd", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_block_projections_feed_the_kernel_without_copies(hd, causal, rng):
    # bench_gpu_models' spelling: q, k, v written (b, s, h, e) by plain GEMMs, the attention
    # result read (b, q, h, e) by the output projection; float32 reference on the host
    b, s, h = 2, 192, 4
    dm = h * hd
    g = tl.EinsumGraph()
    x = g.input("x", (b, s, dm), "bfloat16")
    ws = [
        g.constant(
            (rng.standard_normal((dm, h, hd)) * dm**-0.5).astype(np.float32), dtype="bfloat16"
        )
        for _ in range(3)
    ]
    wo = g.constant(
        (rng.standard_normal((h, hd, dm)) * dm**-0.5).astype(np.float32), dtype="bfloat16"
    )
    q, k, v = (g.einsum("bsd,dhe->bhse", x, w) for w in ws)
    sc = g.einsum("bhqe,bhke->bhqk", q, k) * hd**-0.5
    if causal:
        sc = sc + g.constant(np.triu(np.full((s, s), -np.inf, np.float32), 1), dtype="bfloat16")
    o = g.einsum("bhqk,bhke->bhqe", g.softmax(sc, axis=-1), v)
    g.output(g.einsum("bhqe,hed->bqd", o, wo), "y")
    xv = rng.standard_normal((b, s, dm)).astype(np.float32)
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(x=xv.astype(dtypes.bfloat16))[
        "y"
    ]
    plan = tl.compile(g, backend="cupy", cache=False)
    (att,) = [n for n in plan.optimized_graph if n.kind == "attention"]
    assert tuple(att.args["layout"]) == (1, 1, 1, 1)
    specs = sorted(n.args["spec"] for n in plan.optimized_graph if n.kind == "einsum")
    assert specs == ["bqhe,hed->bqd"] + ["bsd,dhe->bshe"] * 3
    got = to_numpy(plan(x=xv.astype(dtypes.bfloat16))["y"]).astype(np.float64)
    np.testing.assert_allclose(got, np.asarray(ref, np.float64), rtol=3e-2, atol=3e-2)
    # the same plan with the canonical layouts (the option off) computes the same
    off = tl.compile(g, backend="cupy", cache=False, attention_layout=False)
    assert all("layout" not in n.args for n in off.optimized_graph if n.kind == "attention")
    np.testing.assert_allclose(
        to_numpy(off(x=xv.astype(dtypes.bfloat16))["y"]).astype(np.float64),
        got,
        rtol=3e-2,
        atol=3e-2,
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_heads_first_spelling_with_a_mask_runs_in_another_batch_order(dtype, rng):
    # (h, b, s, e) tensors: the attention takes its batch axes as (b, h), the projections
    # write (b, s, h, e) and the (h, b, q, k) mask is transposed to the new order
    b, s, h, hd = 2, 130, 4, 64
    dm = h * hd
    g = tl.EinsumGraph()
    x = g.input("x", (b, s, dm), dtype)
    ws = [
        g.constant((rng.standard_normal((hd, dm, h)) * dm**-0.5).astype(np.float32), dtype=dtype)
        for _ in range(4)
    ]
    q, k, v = (g.einsum("bsd,edh->hbse", x, w) for w in ws[:3])
    sc = g.einsum("hbqe,hbke->hbqk", q, k) * hd**-0.5 + g.input("m", (h, b, s, s), dtype)
    o = g.einsum("hbqk,hbke->hbqe", g.softmax(sc, axis=-1), v)
    g.output(g.einsum("hbqe,edh->bqd", o, ws[3]), "y")
    ins = {
        "x": rng.standard_normal((b, s, dm)).astype(dtype),
        "m": rng.standard_normal((h, b, s, s)).astype(dtype),
    }
    ref = np.asarray(tl.compile(g, backend="numpy", opt_level=0, cache=False)(**ins)["y"])
    plan = tl.compile(g, backend="cupy", cache=False)
    (att,) = [n for n in plan.optimized_graph if n.kind == "attention"]
    assert tuple(att.shape) == (b, s, h, hd)
    step = next(st for st in plan.steps if st.kind == "attention")
    assert "tensor-core mma" in step.info
    for _ in range(2):  # the second call replays the captured graph
        got = to_numpy(plan(**ins)["y"]).astype(np.float64)
        np.testing.assert_allclose(got, ref.astype(np.float64), rtol=3e-2, atol=3e-2)
