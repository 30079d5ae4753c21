"""The demo model: an MLP layer and an attention-style contraction with softmax."""

from __future__ import annotations

import time

import numpy as np

from .compiler.compile import compile as compile_graph
from .ir.graph import EinsumGraph


def build_demo_graph(
    batch: int = 64, seq: int = 128, width: int = 256, heads: int = 4, seed: int = 0
) -> tuple[EinsumGraph, dict[str, np.ndarray]]:
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
    """The demo model as a numpy user writes it: matmul and ``einsum(..., optimize=True)``."""
    c = {g.node(i).name: a for i, a in g.constants.items()}
    h = x @ c["w1"] + c["b1"]
    h = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h**3)))
    q, k, v = (np.einsum("bsi,ihd->bhsd", h, c[n], optimize=True) for n in ("wq", "wk", "wv"))
    s = np.einsum("bhqd,bhkd->bhqk", q, k, optimize=True) * q.shape[-1] ** -0.5
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    ctx = np.einsum("bhqk,bhkd->bqhd", s, v, optimize=True)
    return ctx.reshape(h.shape) + h


def torch_reference(g: EinsumGraph):
    """The demo model in PyTorch (eager, no autograd), or None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    c = {g.node(i).name: torch.from_numpy(np.array(a)) for i, a in g.constants.items()}

    def model(x):
        h = torch.nn.functional.gelu(x @ c["w1"] + c["b1"], approximate="tanh")
        q, k, v = (torch.einsum("bsi,ihd->bhsd", h, c[n]) for n in ("wq", "wk", "wv"))
        p = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        return (p @ v).transpose(1, 2).reshape(h.shape) + h

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(x)).numpy()

    return run


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def run_demo(backend: str = "auto", opt_level: int = 2, repeat: int = 20) -> int:
    """Build, compile, run and check the demo model; print the plan and timings against numpy
    (``einsum(..., optimize=True)``) and, when installed, PyTorch."""
    g, inputs = build_demo_graph()
    x = inputs["x"]
    t0 = time.perf_counter()
    plan = compile_graph(g, backend=backend, opt_level=opt_level)
    out = plan(inputs, to_host=True)
    t_first = time.perf_counter() - t0
    ref = numpy_reference(g, x)
    err = float(np.max(np.abs(out["y"] - ref)) / (np.max(np.abs(ref)) + 1e-30))

    def ours():
        plan(inputs)
        plan.backend.synchronize()

    ours()
    t_ours = _median_ms(ours, repeat)
    t_np = _median_ms(lambda: numpy_reference(g, x), max(3, repeat // 2))
    print(plan)
    print()
    print(f"backend: {plan.backend.name}   input x: {x.shape} float32")
    print(f"compile + first call: {t_first * 1e3:.1f} ms")
    print(
        f"median call: {t_ours:.2f} ms   numpy (einsum optimize=True): {t_np:.2f} ms "
        f"({t_np / t_ours:.2f}x)"
    )
    torch_run = torch_reference(g)
    if torch_run is None:
        print("torch: not installed (pip install 'tensorlogic[peers]' to compare)")
    else:
        t_err = float(np.max(np.abs(torch_run(x) - ref)) / (np.max(np.abs(ref)) + 1e-30))
        torch_run(x)
        t_torch = _median_ms(lambda: torch_run(x), max(3, repeat // 2))
        print(
            f"torch eager: {t_torch:.2f} ms ({t_torch / t_ours:.2f}x; same process, run after "
            f"ours; max relative difference {t_err:.1e})"
        )
    ok = err < 1e-4
    print(f"max relative error vs numpy: {err:.2e}  ->  {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1
