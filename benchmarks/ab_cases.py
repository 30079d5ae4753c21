"""The cases of ``ab_trees.py``, run in a child process against one source tree.

Only the public graph API that every tree since the first compiled plans offers (``EinsumGraph``
methods, ``tl.compile``), so two trees run the very same cases: the fused CPU kernels and row
ops of ``bench_fused_cpu.py``, the einsum specs and executor overhead of ``bench_einsum_cpu.py``,
the blocks and compile time of ``bench_optimizer.py``, and small numpy row ops.

Usage (by ab_trees.py): PYTHONPATH=<tree> python ab_cases.py [--quick] [--only PARTS]
       [--clock wall|thread]
Prints one JSON line: case -> median seconds per call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import tensorlogic as tl
from _common import median_time
from bench_einsum_cpu import CASES, chain_graph

F32 = "float32"
EINSUM = CASES  # the einsum rows of bench_einsum_cpu


def sample(fn, repeat: int, min_time: float, clock=time.perf_counter) -> float:
    """Median seconds per call over ``repeat`` samples, each looping ``fn`` for ``min_time``."""
    return median_time(fn, repeat, warmup=2, min_time=min_time, clock=clock)


# cases that run on the calling thread alone (small steps below the fused kernels' threshold,
# no BLAS, compiling): ``--clock thread`` times them in that thread's CPU time
ONE_THREAD = ("numpy small ", "executor ", "compile 1000-node")


# extra compile options (JSON) for every plan, to attribute a difference to one option
OPTIONS = json.loads(os.environ.get("AB_COMPILE_OPTIONS") or "{}")


def plan_call(backend, level, g, feed, out_shapes=None):
    plan = tl.compile(g, backend=backend, opt_level=level, **OPTIONS)
    out = {k: np.empty(s, F32) for k, s in (out_shapes or {}).items()}
    if out:
        return lambda: plan(feed, out=out)
    return lambda: plan(feed)


def chain5(n):
    g = tl.EinsumGraph()
    a, b, c, d, e = (g.input(k, (n,), F32) for k in "abcde")
    g.output(g.relu(a * b + c) * d - e, "y")
    rng = np.random.default_rng(0)
    return g, {k: rng.uniform(-1, 1, n).astype(F32) for k in "abcde"}


def chain12(n):
    g = tl.EinsumGraph()
    x = g.input("x", (n,), F32)
    t = g.sqrt(g.maximum(g.abs(x * 1.5 + 0.25) - x, 0.1)) * x + 0.5
    t = -(g.minimum(t, 2.0) * 0.75 - x * 0.5 + 1.0)
    g.output(t, "y")
    return g, {"x": np.random.default_rng(2).uniform(-1, 1, n).astype(F32)}


def row(op, m, k, pre=False):
    g = tl.EinsumGraph()
    x = g.input("x", (m, k), F32)
    h = x * 0.5 + 0.25 if pre else x
    if op == "logsumexp":
        y = g.logsumexp(h, axis=1, keepdims=True)
    elif op in ("sum", "max"):
        y = getattr(g, op)(h, axis=1, keepdims=True)
    else:
        y = getattr(g, op)(h, axis=1)
    g.output(y, "y")
    shape = (m, 1) if op in ("logsumexp", "sum", "max") else (m, k)
    return g, {"x": np.random.default_rng(1).standard_normal((m, k)).astype(F32)}, {"y": shape}


def full_reduce(op, n):
    g = tl.EinsumGraph()
    g.output(getattr(g, op)(g.input("x", (n,), F32)), "y")
    return g, {"x": np.random.default_rng(3).uniform(-1, 1, n).astype(F32)}


def mlp_block(B=512, D=512, H=2048):
    g = tl.EinsumGraph()
    rng = np.random.default_rng(0)
    x = g.input("x", (B, D), F32)
    w1 = g.constant((rng.standard_normal((D, H)) / np.sqrt(D)).astype(F32))
    b1 = g.constant(rng.standard_normal(H).astype(F32) * 0.1)
    w2 = g.constant((rng.standard_normal((H, D)) / np.sqrt(H)).astype(F32))
    b2 = g.constant(rng.standard_normal(D).astype(F32) * 0.1)
    h = g.gelu(g.einsum("bd,dh->bh", x, w1) + b1)
    r = g.einsum("bh,hd->bd", h, w2) + b2 + x
    mu = g.mean(r, axis=-1, keepdims=True)
    c = r - mu
    g.output(c / g.sqrt(g.mean(c * c, axis=-1, keepdims=True) + 1e-5), "y")
    return g, {"x": rng.standard_normal((B, D)).astype(F32)}


def attention_block(B=8, T=256, d=64):
    g = tl.EinsumGraph()
    q, k, v = (g.input(n, (B, T, d), F32) for n in "qkv")
    # a Python float: a numpy float64 scalar is strong under NEP 50 (the product would be float64)
    s = g.einsum("bqd,bkd->bqk", q * float(1.0 / np.sqrt(d)), k)
    g.output(g.einsum("bqk,bkd->bqd", g.softmax(s, axis=-1), v), "o")
    rng = np.random.default_rng(1)
    return g, {n: rng.standard_normal((B, T, d)).astype(F32) for n in "qkv"}


def tiny_chain(n_nodes, size):
    """bench_einsum_cpu's graph of cheap elementwise ops on tiny tensors, and its feed."""
    g = chain_graph(n_nodes, size)
    return g, {"x": np.full(size, 0.5, F32), "y": np.full(size, 0.25, F32)}


def cases(quick: bool):
    """(name, callable, repeat, min_time) of every case, built lazily."""
    big = 1 << (20 if quick else 24)
    m, k = (1024, 1024) if quick else (4096, 1024)
    mb = big >> 20
    out = []

    def add(name, build, repeat=5, min_time=0.04):
        out.append((name, build, repeat, min_time))

    for be in ("numba", "numpy"):
        if big > 1 << 20:
            add(f"{be} chain relu(a*b+c)*d-e 1M", lambda be=be: plan_call(be, 2, *chain5(1 << 20)))
        add(f"{be} chain relu(a*b+c)*d-e {mb}M", lambda be=be: plan_call(be, 2, *chain5(big)))
        add(f"{be} 14-op chain {mb}M", lambda be=be: plan_call(be, 2, *chain12(big)))
        add(f"{be} sum {mb}M", lambda be=be: plan_call(be, 0, *full_reduce("sum", big)))
        add(f"{be} max {mb}M", lambda be=be: plan_call(be, 0, *full_reduce("max", big)))
        for op in ("softmax", "log_softmax", "layer_norm", "logsumexp"):
            add(f"{be} {op} {m}x{k}", lambda be=be, op=op: plan_call(be, 0, *row(op, m, k)))
        add(
            f"{be} softmax(x*0.5+0.25) {m}x{k} O2",
            lambda be=be: plan_call(be, 2, *row("softmax", m, k, pre=True)),
        )
        add(f"{be} MLP block 512x512x2048 O2", lambda be=be: plan_call(be, 2, *mlp_block()), 3)
        add(
            f"{be} attention block 8x256x64 O2",
            lambda be=be: plan_call(be, 2, *attention_block()),
            3,
        )
    for op in ("softmax", "log_softmax", "layer_norm", "logsumexp", "sum"):
        for shape in ((8, 16), (64, 128)):
            add(
                f"numpy small {op} {shape[0]}x{shape[1]}",
                lambda op=op, shape=shape: plan_call("numpy", 0, *row(op, *shape)),
                9,
                0.03,
            )
    for name, spec, shapes in EINSUM:

        def build(spec=spec, shapes=shapes):
            g = tl.EinsumGraph()
            ins = [g.input(f"x{j}", s, F32) for j, s in enumerate(shapes)]
            g.output(g.einsum(spec, *ins), "y")
            rng = np.random.default_rng(0)
            feed = {f"x{j}": rng.standard_normal(s).astype(F32) for j, s in enumerate(shapes)}
            return plan_call("numpy", 2, g, feed)

        add(f"einsum {name} {spec}", build)
    add(
        "executor 200-node tiny chain (numpy O0)",
        lambda: plan_call("numpy", 0, *tiny_chain(200, 4)),
    )
    for level in (0, 2):
        g1000 = tiny_chain(1000, 8)[0]
        add(
            f"compile 1000-node chain O{level} (numpy)",
            lambda g=g1000, level=level: (
                lambda: tl.compile(g, backend="numpy", opt_level=level, cache=False)
            ),
            5,
            0.0,
        )
    gm = mlp_block(B=64)[0]
    add(
        "compile MLP block O2 (numba)",
        lambda: lambda: tl.compile(gm, backend="numba", opt_level=2, cache=False),
        5,
        0.0,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated parts of the case names to run")
    ap.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="thread: the one-thread cases (ONE_THREAD) in the calling thread's CPU time",
    )
    args = ap.parse_args()
    res = {}
    for name, build, repeat, min_time in cases(args.quick):
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        fn = build()
        one = args.clock == "thread" and name.startswith(ONE_THREAD)
        clock = time.thread_time if one else time.perf_counter
        res[name] = sample(fn, 3 if args.quick else repeat, min_time, clock)
        print(f"{name}: {res[name] * 1e3:.4f} ms", file=sys.stderr, flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
