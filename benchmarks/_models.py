"""The bench models, each written three ways: a tensorlogic graph, numpy float64, torch.

Every process rebuilds a model's weights and inputs from the same seed, so contenders running in
separate processes compute on identical data and their outputs can be compared afterwards.
A model is a ``Model`` record: ``arrays()`` gives the data by name, ``graph(arrays)`` the
tensorlogic graph (weights as constants, the rest as inputs), ``reference(arrays)`` float64
numpy outputs, and ``torch_fn(arrays, sdpa)`` a torch function of the graph inputs written the
way a PyTorch user would.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tensorlogic as tl

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GELU_C = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Model:
    """One bench model; ``inputs`` are the names fed per call (the rest are weights)."""

    name: str
    arrays: Callable[[], dict[str, np.ndarray]]
    inputs: tuple[str, ...]
    graph: Callable[[dict], tl.EinsumGraph]
    reference: Callable[[dict], dict[str, np.ndarray]]
    torch_fn: Callable | None  # (arrays, sdpa: bool) -> (fn(*inputs) -> tuple of outputs)
    outputs: tuple[str, ...]
    sdpa: bool = False  # whether torch's scaled_dot_product_attention applies


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------- transformer encoder block
def _block_arrays(b, s, d, h, causal, seed=0):
    def make():
        rng = np.random.default_rng(seed)
        dk = d // h
        a = {"x": _rand(rng, b, s, d)}
        for w in ("wq", "wk", "wv", "wo"):
            a[w] = _rand(rng, h, dk, d, scale=d**-0.5)
        a["w1"] = _rand(rng, d, 4 * d, scale=d**-0.5)
        a["b1"] = _rand(rng, 4 * d, scale=0.1)
        a["w2"] = _rand(rng, 4 * d, d, scale=(4 * d) ** -0.5)
        a["b2"] = _rand(rng, d, scale=0.1)
        for k in ("1", "2"):
            a["g" + k] = (1 + _rand(rng, d, scale=0.1)).astype(np.float32)
            a["be" + k] = _rand(rng, d, scale=0.1)
        if causal:  # the additive mask a user builds: 0 on and below the diagonal, -inf above
            a["mask"] = np.triu(np.full((s, s), -np.inf, np.float32), 1)
        return a

    return make


def _block_graph(a):
    g = tl.EinsumGraph()
    b, s, d = a["x"].shape
    dk = a["wq"].shape[1]
    x = g.input("x", (b, s, d), "float32")
    c = {k: g.constant(v, name=k) for k, v in a.items() if k not in ("x", "mask")}
    q = g.einsum("bsd,hkd->bhsk", x, c["wq"])
    k = g.einsum("bsd,hkd->bhsk", x, c["wk"])
    v = g.einsum("bsd,hkd->bhsk", x, c["wv"])
    scores = g.einsum("bhqk,bhsk->bhqs", q, k) * (1.0 / math.sqrt(dk))
    if "mask" in a:
        scores = scores + g.input("mask", (s, s), "float32")
    p = g.softmax(scores, axis=-1)
    ctx = g.einsum("bhqs,bhsk->bqhk", p, v)
    att = g.einsum("bqhk,hkd->bqd", ctx, c["wo"])
    y = g.layer_norm(x + att) * c["g1"] + c["be1"]
    m = g.gelu(g.einsum("bsd,df->bsf", y, c["w1"]) + c["b1"])
    z = g.layer_norm(y + g.einsum("bsf,fd->bsd", m, c["w2"]) + c["b2"]) * c["g2"] + c["be2"]
    g.output(z, name="out")
    return g


def _np_layer_norm(x, gamma, beta, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _np_gelu(x):
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x**3)))


def _np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _block_reference(a):
    a = {k: v.astype(np.float64) for k, v in a.items()}
    x = a["x"]
    dk = a["wq"].shape[1]
    q, k, v = (np.einsum("bsd,hkd->bhsk", x, a[w]) for w in ("wq", "wk", "wv"))
    sc = np.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(dk)
    if "mask" in a:
        sc = sc + a["mask"]
    ctx = np.einsum("bhqs,bhsk->bqhk", _np_softmax(sc), v)
    y = _np_layer_norm(x + np.einsum("bqhk,hkd->bqd", ctx, a["wo"]), a["g1"], a["be1"])
    m = _np_gelu(y @ a["w1"] + a["b1"])
    return {"out": _np_layer_norm(y + m @ a["w2"] + a["b2"], a["g2"], a["be2"])}


def _block_torch(a, sdpa):
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_numpy(v) for k, v in a.items() if k not in ("x", "mask")}
    h, dk, d = a["wq"].shape
    # nn.Linear layout (out_features x in_features): per-head projections as one matmul
    wqkv = torch.cat([t[w].reshape(h * dk, d) for w in ("wq", "wk", "wv")]).contiguous()
    wo = t["wo"].reshape(h * dk, d).contiguous()
    w1t, w2t = t["w1"].T.contiguous(), t["w2"].T.contiguous()
    scale = 1.0 / math.sqrt(dk)

    def block(x, mask=None):
        b, s, _ = x.shape
        qkv = F.linear(x, wqkv).view(b, s, 3, h, dk).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if sdpa:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            sc = (q @ k.transpose(-1, -2)) * scale
            if mask is not None:
                sc = sc + mask
            ctx = torch.softmax(sc, dim=-1) @ v
        att = ctx.transpose(1, 2).reshape(b, s, h * dk) @ wo
        y = F.layer_norm(x + att, (d,), t["g1"], t["be1"])
        m = F.gelu(F.linear(y, w1t, t["b1"]), approximate="tanh")
        return (F.layer_norm(y + F.linear(m, w2t, t["b2"]), (d,), t["g2"], t["be2"]),)

    return block


def block(b, s, d, h, causal=False) -> Model:
    """The transformer encoder block of the issue (einsum projections, post-norm, GELU MLP)."""
    name = f"block B={b} S={s} D={d} H={h}" + (" causal" if causal else "")
    return Model(
        name,
        _block_arrays(b, s, d, h, causal),
        ("x", "mask") if causal else ("x",),
        _block_graph,
        _block_reference,
        _block_torch,
        ("out",),
        sdpa=True,
    )


# ---------------------------------------------------------------- 4-layer MLP
def _mlp_arrays(batch, width, layers, seed=1):
    def make():
        rng = np.random.default_rng(seed)
        a = {"x": _rand(rng, batch, width)}
        for i in range(layers):
            a[f"w{i}"] = _rand(rng, width, width, scale=(2 / width) ** 0.5)
            a[f"b{i}"] = _rand(rng, width, scale=0.1)
        return a

    return make


def _n_layers(a):
    return sum(1 for k in a if k.startswith("w"))


def _mlp_graph(a):
    g = tl.EinsumGraph()
    h = g.input("x", a["x"].shape, "float32")
    n = _n_layers(a)
    for i in range(n):
        h = g.einsum("bi,ij->bj", h, g.constant(a[f"w{i}"], name=f"w{i}")) + g.constant(
            a[f"b{i}"], name=f"b{i}"
        )
        if i < n - 1:
            h = g.relu(h)
    g.output(h, name="out")
    return g


def _mlp_reference(a):
    h = a["x"].astype(np.float64)
    n = _n_layers(a)
    for i in range(n):
        h = h @ a[f"w{i}"] + a[f"b{i}"]
        if i < n - 1:
            h = np.maximum(h, 0)
    return {"out": h}


def _mlp_torch(a, sdpa):
    import torch
    import torch.nn.functional as F

    n = _n_layers(a)
    ws = [torch.from_numpy(a[f"w{i}"]).T.contiguous() for i in range(n)]
    bs = [torch.from_numpy(a[f"b{i}"]) for i in range(n)]

    def mlp(x):
        for i in range(n):
            x = F.linear(x, ws[i], bs[i])
            if i < n - 1:
                x = F.relu(x)
        return (x,)

    return mlp


def mlp(batch=256, width=1024, layers=4) -> Model:
    """A ReLU MLP of ``layers`` square layers."""
    return Model(
        f"MLP {batch}x{width}, {layers} layers",
        _mlp_arrays(batch, width, layers),
        ("x",),
        _mlp_graph,
        _mlp_reference,
        _mlp_torch,
        ("out",),
    )


# ---------------------------------------------------------------- the examples/ programs
def _program(file: str) -> tl.Program:
    """An examples/ program without its declarations (they fix toy sizes; the data sets them)."""
    text = (EXAMPLES / file).read_text()
    body = "\n".join(
        line for line in text.splitlines() if not re.match(r"\s*[A-Za-z_]\w*\s*:", line)
    )
    return tl.parse(body, file)


def _program_graph(file, outputs, inputs):
    def build(a):
        from tensorlogic.lang.equations import build_equations

        prog = _program(file)
        g = tl.EinsumGraph()
        env = {
            k: (g.input(k, v.shape, "float32") if k in inputs else g.constant(v, name=k))
            for k, v in a.items()
        }
        outs = build_equations(g, prog.equations, env)
        for name in outputs:
            g.output(outs[name], name=name)
        return g

    return build


def _attention_arrays(p, d, k, v, seed=2):
    def make():
        rng = np.random.default_rng(seed)
        return {
            "Emb": _rand(rng, p, d),
            "WQ": _rand(rng, k, d, scale=d**-0.5),
            "WK": _rand(rng, k, d, scale=d**-0.5),
            "WV": _rand(rng, v, d, scale=d**-0.5),
            "Dk": np.array(k, np.float32),
        }

    return make


def _attention_reference(a):
    a = {n: x.astype(np.float64) for n, x in a.items()}
    q, k, v = (a["Emb"] @ a[w].T for w in ("WQ", "WK", "WV"))
    return {"Attn": _np_softmax(q @ k.T / np.sqrt(a["Dk"])) @ v}


def _attention_torch(a, sdpa):
    import torch
    import torch.nn.functional as F

    wq, wk, wv = (torch.from_numpy(a[w]) for w in ("WQ", "WK", "WV"))
    scale = 1.0 / math.sqrt(float(a["Dk"]))

    def attention(emb):
        q, k, v = F.linear(emb, wq), F.linear(emb, wk), F.linear(emb, wv)
        if sdpa:
            return (F.scaled_dot_product_attention(q[None], k[None], v[None])[0],)
        return (torch.softmax(q @ k.T * scale, dim=-1) @ v,)

    return attention


def _pmlp_arrays(b, i, h, o, seed=3):
    def make():
        rng = np.random.default_rng(seed)
        return {
            "X": _rand(rng, b, i),
            "W1": _rand(rng, h, i, scale=(2 / i) ** 0.5),
            "B1": _rand(rng, h, scale=0.1),
            "W2": _rand(rng, o, h, scale=h**-0.5),
            "B2": _rand(rng, o, scale=0.1),
        }

    return make


def _pmlp_reference(a):
    a = {n: x.astype(np.float64) for n, x in a.items()}
    hid = np.maximum(a["X"] @ a["W1"].T + a["B1"], 0)
    return {"Y": _np_softmax(hid @ a["W2"].T + a["B2"])}


def _pmlp_torch(a, sdpa):
    import torch
    import torch.nn.functional as F

    t = {n: torch.from_numpy(x) for n, x in a.items() if n != "X"}

    def pmlp(x):
        return (
            torch.softmax(
                F.linear(F.relu(F.linear(x, t["W1"], t["B1"])), t["W2"], t["B2"]), dim=-1
            ),
        )

    return pmlp


def _kernel_arrays(n, f, q, seed=4):
    def make():
        rng = np.random.default_rng(seed)
        return {
            "X": _rand(rng, n, f, scale=f**-0.5),
            "Xq": _rand(rng, q, f, scale=f**-0.5),
            "A": np.abs(_rand(rng, n)) / n,
            "Ys": np.sign(_rand(rng, n)).astype(np.float32),
            "B": np.array(0.01, np.float32),
        }

    return make


def _kernel_reference(a):
    a = {n: x.astype(np.float64) for n, x in a.items()}
    k = (a["Xq"] @ a["X"].T + 1) ** 2
    return {"Score": k @ (a["A"] * a["Ys"]) + a["B"]}


def _kernel_torch(a, sdpa):
    import torch

    x = torch.from_numpy(a["X"])
    ay = torch.from_numpy(a["A"] * a["Ys"])
    bias = float(a["B"])

    def kernel_machine(xq):
        k = torch.square(xq @ x.T + 1)
        return (k @ ay + bias,)

    return kernel_machine


def examples() -> list[Model]:
    """The examples/ programs that have a torch equivalent, at realistic sizes."""
    return [
        Model(
            "attention.tl P=2048 D=512 K=V=64",
            _attention_arrays(2048, 512, 64, 64),
            ("Emb",),
            _program_graph("attention.tl", ("Attn",), ("Emb",)),
            _attention_reference,
            _attention_torch,
            ("Attn",),
            sdpa=True,
        ),
        Model(
            "mlp.tl B=2048 1024-1024-512",
            _pmlp_arrays(2048, 1024, 1024, 512),
            ("X",),
            _program_graph("mlp.tl", ("Y",), ("X",)),
            _pmlp_reference,
            _pmlp_torch,
            ("Y",),
        ),
        Model(
            "kernel_machine.tl N=4096 F=256 Q=2048",
            _kernel_arrays(4096, 256, 2048),
            ("Xq",),
            _program_graph("kernel_machine.tl", ("Score",), ("Xq",)),
            _kernel_reference,
            _kernel_torch,
            ("Score",),
        ),
    ]


def all_models() -> list[Model]:
    """Every bench model, in report order."""
    return [
        block(4, 256, 256, 4),
        block(4, 256, 256, 4, causal=True),
        block(2, 512, 512, 8),
        mlp(256, 1024, 4),
        *examples(),
    ]
