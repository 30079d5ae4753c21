"""Optimizer benchmark: O0 vs O2 on the numpy backend.

Cases: an MLP block (einsum, bias, gelu, residual, layer norm), an attention block (einsums and
softmax), a 12-op elementwise chain on 16M float32 elements (numexpr as a peer), and the compile
time of a 1000-node graph at O2. Prints medians and ratios; writes results/optimizer.json.

Usage: python benchmarks/bench_optimizer.py [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import tensorlogic as tl
from tensorlogic.backends.numpy import host_pool

from _common import interleaved_times, machine


def mlp_block(B=512, D=512, H=2048):
    g = tl.EinsumGraph()
    x = g.input("x", (B, D), "float32")
    rng = np.random.default_rng(0)
    # scale before the cast: a float32 array divided by np.sqrt's float64 scalar is float64
    w1 = g.constant((rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32), name="w1")
    b1 = g.constant(rng.standard_normal(H).astype(np.float32) * 0.1, name="b1")
    w2 = g.constant((rng.standard_normal((H, D)) / np.sqrt(H)).astype(np.float32), name="w2")
    b2 = g.constant(rng.standard_normal(D).astype(np.float32) * 0.1, name="b2")
    gamma = g.constant(np.ones(D, np.float32), name="gamma")
    beta = g.constant(np.zeros(D, np.float32), name="beta")
    h = g.gelu(g.einsum("bd,dh->bh", x, w1) + b1)
    r = g.einsum("bh,hd->bd", h, w2) + b2 + x
    mu = g.mean(r, axis=-1, keepdims=True)
    c = r - mu
    var = g.mean(c * c, axis=-1, keepdims=True)
    y = c / g.sqrt(var + 1e-5) * gamma + beta
    g.output(y, name="y")
    return g, {"x": rng.standard_normal((B, D)).astype(np.float32)}


def attention_block(B=8, T=256, d=64):
    g = tl.EinsumGraph()
    q = g.input("q", (B, T, d), "float32")
    k = g.input("k", (B, T, d), "float32")
    v = g.input("v", (B, T, d), "float32")
    # a Python float: a numpy float64 scalar is strong under NEP 50 (the product would be float64)
    s = g.einsum("bqd,bkd->bqk", q * float(1.0 / np.sqrt(d)), k)
    p = g.softmax(s, axis=-1)
    g.output(g.einsum("bqk,bkd->bqd", p, v), name="o")
    rng = np.random.default_rng(1)
    return g, {n: rng.standard_normal((B, T, d)).astype(np.float32) for n in "qkv"}


CHAIN_EXPR = (
    "-(minimum(sqrt(maximum(abs(x * 1.5 + 0.25) - x, 0.1)) * x + 0.5, 2.0) * 0.75 - x * 0.5 + 1.0)"
)


def elementwise_chain(n=1 << 24):
    g = tl.EinsumGraph()
    x = g.input("x", (n,), "float32")
    t = x * 1.5  # 1
    t = t + 0.25  # 2
    t = g.abs(t)  # 3
    t = t - x  # 4
    t = g.maximum(t, 0.1)  # 5
    t = g.sqrt(t)  # 6
    t = t * x  # 7
    t = t + 0.5  # 8
    t = g.minimum(t, 2.0)  # 9
    t = t * 0.75 - x * 0.5  # 10, 11, 12 (x * 0.5 is op 11)
    t = -(t + 1.0)  # 13, 14: still one chain; 12+ elementwise ops
    g.output(t, name="y")
    rng = np.random.default_rng(2)
    return g, {"x": rng.uniform(-1, 1, n).astype(np.float32)}


def memory_passes(plan) -> float:
    """Bytes all steps read and write, in units of the largest buffer (one full-array pass)."""
    biggest = max(b.nbytes for b in plan.concrete.buffers)
    return sum(s.bytes for s in plan.steps) / biggest


def big_graph(n_layers=100):
    g = tl.EinsumGraph()
    x = g.input("x", (8, 16), "float32")
    h = x
    for k in range(n_layers):
        w = g.constant(np.full((16, 16), 0.01 * (k + 1), np.float32))
        h = g.einsum("bi,ij->bj", h, w)
        h = g.tanh(h * 0.5 + 0.1) + h
        h = h - g.mean(h, axis=-1, keepdims=True)
    g.output(h, name="y")
    return g


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args()
    repeats = 3 if args.quick else 15
    rows = []
    for name, build in (
        ("mlp_block", mlp_block),
        ("attention_block", attention_block),
        ("chain_16M", elementwise_chain),
    ):
        g, inputs = build()
        res = {"case": name}
        outs, runs = {}, {}
        for lvl in (0, 2):
            plan = tl.compile(g, backend="numpy", opt_level=lvl, cache=False)
            outs[lvl] = plan(**inputs)
            runs[f"O{lvl}"] = lambda p=plan: p(**inputs)
            res[f"O{lvl}_steps"] = len(plan.steps)
            res[f"O{lvl}_passes"] = round(memory_passes(plan), 2)
        for k in outs[0]:
            np.testing.assert_allclose(outs[2][k], outs[0][k], rtol=1e-4, atol=1e-4)
        if name == "chain_16M":
            # the same O2 plan with its fused kernel on the calling thread only: how much of the
            # gain is fusion alone, and how much is the blocks running on every core
            saved = host_pool.helper_count
            host_pool.helper_count = lambda: 0
            try:
                serial = tl.compile(g, backend="numpy", opt_level=2, cache=False)
            finally:
                host_pool.helper_count = saved
            runs["O2_1thread"] = lambda: serial(**inputs)
            res["threads"] = 1 + host_pool.helper_count()
            try:
                import numexpr

                x = inputs["x"]
                out = np.empty_like(x)
                runs["numexpr"] = lambda: numexpr.evaluate(CHAIN_EXPR, local_dict={"x": x}, out=out)
                runs["numexpr"]()
                np.testing.assert_allclose(out, outs[0]["y"], rtol=1e-5, atol=1e-5)
            except ImportError:
                res["numexpr_s"] = None
        # contenders take turns, so a slow minute on the shared machine slows all of them
        res.update({f"{k}_s": v for k, v in interleaved_times(runs, repeats).items()})
        res["speedup"] = res["O0_s"] / res["O2_s"]
        if "O2_1thread_s" in res:
            res["speedup_1thread"] = res["O0_s"] / res["O2_1thread_s"]
        rows.append(res)

    g = big_graph()
    from tensorlogic.optimizer import optimize

    opt_times, compile_times = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        optimize(g, 2)
        t1 = time.perf_counter()
        tl.compile(g, backend="numpy", opt_level=2, cache=False)
        t2 = time.perf_counter()
        opt_times.append(t1 - t0)
        compile_times.append(t2 - t1)
    compile_row = {
        "nodes": len(g),
        "optimize_O2_ms": statistics.median(opt_times) * 1e3,
        "compile_O2_ms": statistics.median(compile_times) * 1e3,
    }

    print(
        f"{'case':<16} {'O0 ms':>9} {'O2 ms':>9} {'O0/O2':>7} "
        f"{'steps O0->O2':>13} {'mem passes O0->O2':>18}"
    )
    for r in rows:
        print(
            f"{r['case']:<16} {r['O0_s'] * 1e3:9.2f} {r['O2_s'] * 1e3:9.2f} {r['speedup']:7.2f} "
            f"{r['O0_steps']:>6} -> {r['O2_steps']:<4} {r['O0_passes']:>8} -> {r['O2_passes']:<7}"
        )
        if r.get("O2_1thread_s"):
            print(
                f"{'  O2, 1 thread':<16} {'':>9} {r['O2_1thread_s'] * 1e3:9.2f} "
                f"{r['speedup_1thread']:7.2f}   (the O2 row used {r['threads']} threads)"
            )
        if r.get("numexpr_s"):
            print(
                f"{'  numexpr peer':<16} {r['numexpr_s'] * 1e3:9.2f} ms "
                f"(O2/numexpr time ratio {r['O2_s'] / r['numexpr_s']:.2f})"
            )
    print(
        f"1000-node graph ({compile_row['nodes']} nodes): optimize at O2 "
        f"{compile_row['optimize_O2_ms']:.1f} ms, whole compile "
        f"{compile_row['compile_O2_ms']:.1f} ms"
    )

    import opt_einsum

    try:
        import numexpr as _ne

        ne_version = _ne.__version__
    except ImportError:
        ne_version = None
    result = {
        "benchmark": "optimizer",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick,
        "repeats": repeats,
        "machine": machine(),
        "versions": {
            "tensorlogic": tl.__version__,
            "numpy": np.__version__,
            "opt_einsum": opt_einsum.__version__,
            "numexpr": ne_version,
        },
        "cases": rows,
        "compile": compile_row,
    }
    out = Path(__file__).parent / "results" / "optimizer.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
