"""The demo model: an MLP layer and an attention-style contraction with softmax."""

from __future__ import annotations

import time

import numpy as np

from .compiler.compile import compile as compile_graph
from .ir.graph import EinsumGraph


def build_demo_graph(batch: int = 64, seq: int = 128, width: int = 256, heads: int = 4,
                     seed: int = 0) -> tuple[EinsumGraph, dict[str, np.ndarray]]:
    """A transformer-like block: MLP layer, then multi-head attention over its output."""
    rng = np.random.default_rng(seed)
    d = width // heads

    def weights(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    g = EinsumGraph()
    x = g.input("x", shape=("B", seq, width), dtype="float32")
    w1 = g.constant(weights(width, width, scale=width**-0.5), name="w1")
    b1 = g.constant(weights(width, scale=0.1), name="b1")
    h = g.gelu(g.einsum("bsi,ij->bsj", x, w1) + b1)
    wq = g.constant(weights(width, heads, d, scale=width**-0.5), name="wq")
    wk = g.constant(weights(width, heads, d, scale=width**-0.5), name="wk")
    wv = g.constant(weights(width, heads, d, scale=width**-0.5), name="wv")
    q = g.einsum("bsi,ihd->bhsd", h, wq)
    k = g.einsum("bsi,ihd->bhsd", h, wk)
    v = g.einsum("bsi,ihd->bhsd", h, wv)
    scores = g.einsum("bhqd,bhkd->bhqk", q, k) * d**-0.5
    attn = g.softmax(scores, axis=-1)
    ctx = g.einsum("bhqk,bhkd->bqhd", attn, v)
    y = g.reshape(ctx, ("B", seq, width)) + h
    g.output(y, name="y")
    inputs = {"x": rng.standard_normal((batch, seq, width), dtype=np.float32)}
    return g, inputs


def numpy_reference(g: EinsumGraph, x: np.ndarray) -> np.ndarray:
    """The demo model written directly in numpy."""
    c = {g.node(i).name: a for i, a in g.constants.items()}
    h = x @ c["w1"] + c["b1"]
    h = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h**3)))
    q, k, v = (np.einsum("bsi,ihd->bhsd", h, c[n]) for n in ("wq", "wk", "wv"))
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    ctx = np.einsum("bhqk,bhkd->bqhd", s, v)
    return ctx.reshape(h.shape) + h


def run_demo(backend: str = "auto", opt_level: int = 2, repeat: int = 20) -> int:
    """Build, compile, run and check the demo model; print the plan and timings."""
    g, inputs = build_demo_graph()
    t0 = time.perf_counter()
    plan = compile_graph(g, backend=backend, opt_level=opt_level)
    out = plan(inputs, to_host=True)
    t_first = time.perf_counter() - t0
    ref = numpy_reference(g, inputs["x"])
    err = float(np.max(np.abs(out["y"] - ref)) / (np.max(np.abs(ref)) + 1e-30))
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        plan(inputs)
        plan.backend.synchronize()
        times.append(time.perf_counter() - t)
    t_np = []
    for _ in range(max(3, repeat // 4)):
        t = time.perf_counter()
        numpy_reference(g, inputs["x"])
        t_np.append(time.perf_counter() - t)
    print(plan)
    print()
    print(f"backend: {plan.backend.name}   input x: {inputs['x'].shape} float32")
    print(f"compile + first call: {t_first * 1e3:.1f} ms")
    print(
        f"median call: {np.median(times) * 1e3:.2f} ms  "
        f" plain numpy: {np.median(t_np) * 1e3:.2f} ms"
    )
    ok = err < 1e-4
    print(f"max relative error vs plain numpy: {err:.2e}  ->  {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1
