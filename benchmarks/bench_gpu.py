"""GPU benchmark: tensorlogic's cupy backend against CuPy (unfused, cupy.fuse, ElementwiseKernel)
and PyTorch (eager, torch.compile), on one CUDA device.

Families: the chain relu(a*b+c)*d-e (1M/16M/64M float32), row softmax and layer norm, attention
(bhqd,bhkd->bhqk, softmax, bhqk,bhkd->bhqd), a 30-node graph of small tensors (CUDA graph vs
stream launches), PTX generation speed, and first-call latency with a cold and a warm kernel cache.
Device times are CUDA-event medians over batches of back-to-back calls. Writes
benchmarks/results/bench_gpu_<card>.json (card, versions, date). ``--quick`` runs a short version.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorlogic as tl  # noqa: E402
from tensorlogic.backends.cupy import ptx  # noqa: E402
from tensorlogic.backends.cupy import spec as S  # noqa: E402
from tensorlogic.ir import ops  # noqa: E402
from tensorlogic.ir.fused import FusedBody, FusedOp  # noqa: E402

import cupy as cp  # noqa: E402
from _gpu_common import gpu_time, gpu_times, small_graph, wall_time  # noqa: E402

# torch.compile's pool of compile worker processes stays busy after compiling and slows every
# host-bound row measured after the chain section (softmax 4096x1024 read 17.7 us a call in a
# full run against 10.4 us alone): compile in-process instead
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
try:
    import torch
except ImportError:  # torch is a benchmark-only peer
    torch = None

RESULTS: dict = {}


def row(section: str, name: str, seconds: float, **extra) -> None:
    RESULTS.setdefault(section, {})[name] = {"ms": seconds * 1e3, **extra}
    more = "  ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()
    )
    print(f"  {name:<28} {seconds * 1e3:9.4f} ms  {more}", flush=True)


def _torch(x):
    return torch.from_dlpack(x)


def fused_node(g, inputs, instrs, space, dtype, tail=None, axes=(), shape=None):
    body = FusedBody(tuple(instrs), tuple(space), tail, tuple(axes))
    nid = g.add_node(
        ops.FUSED,
        None,
        [t.id for t in inputs],
        {"body": body.to_args()},
        shape=shape or tuple(space),
        dtype=dtype,
    )
    return g.tensor(nid)


def bench_copy(n: int) -> float:
    a = cp.random.standard_normal(n, dtype=cp.float32)
    b = cp.empty_like(a)
    t = gpu_time(lambda: b.__setitem__(Ellipsis, a), 20)
    bw = 2 * a.nbytes / t
    print(f"device-to-device copy: {bw / 1e12:.3f} TB/s (read+write, {a.nbytes >> 20} MiB)")
    RESULTS["copy"] = {"bytes": 2 * a.nbytes, "ms": t * 1e3, "TBps": bw / 1e12}
    return bw


def bench_chain(sizes, copy_bw: float, quick: bool) -> None:
    chain_k = cp.ElementwiseKernel(
        "T a, T b, T c, T d, T e", "T y", "y = max(a * b + c, (T)0) * d - e", "tl_bench_chain"
    )

    @cp.fuse()
    def chain_fuse(a, b, c, d, e):
        return cp.maximum(a * b + c, 0) * d - e

    def chain_torch(a, b, c, d, e):
        return torch.relu(a * b + c) * d - e

    compiled = torch.compile(chain_torch) if torch is not None else None
    for n in sizes:
        print(
            f"chain relu(a*b+c)*d-e, {n / 2**20:.0f}M float32 (roofline "
            f"{24 * n / copy_bw * 1e3:.4f} ms)"
        )
        xs = [cp.random.standard_normal(n, dtype=cp.float32) for _ in range(5)]
        bytes_ = 6 * 4 * n
        g = tl.EinsumGraph()
        ins = [g.input(k, (n,)) for k in "abcde"]
        y = fused_node(
            g,
            ins,
            [
                FusedOp("mul", (("in", 0), ("in", 1))),
                FusedOp("add", (("tmp", 0), ("in", 2))),
                FusedOp("relu", (("tmp", 1),)),
                FusedOp("mul", (("tmp", 2), ("in", 3))),
                FusedOp("sub", (("tmp", 3), ("in", 4))),
            ],
            (n,),
            "float32",
        )
        g.output(y, "y")
        feed = dict(zip("abcde", xs))
        inner = 10 if n >= 2**24 else 50
        res = {}
        for label, opts in (
            ("tensorlogic ptx", {"codegen": "ptx"}),
            ("tensorlogic cuda-c", {"codegen": "cuda"}),
        ):
            plan = tl.compile(g, backend="cupy", opt_level=0, **opts)
            out = plan(**feed)["y"]
            ref = chain_k(*xs)
            assert float(cp.abs(out - ref).max()) < 1e-4, label
            res[label] = gpu_time(lambda: plan(**feed), inner)
        g0 = tl.EinsumGraph()
        i0 = [g0.input(k, (n,)) for k in "abcde"]
        g0.output(g0.relu(i0[0] * i0[1] + i0[2]) * i0[3] - i0[4], "y")
        p0 = tl.compile(g0, backend="cupy", opt_level=0)
        res["tensorlogic unfused (O0)"] = gpu_time(lambda: p0(**feed), inner)
        res["cupy unfused"] = gpu_time(
            lambda: cp.maximum(xs[0] * xs[1] + xs[2], 0) * xs[3] - xs[4], inner
        )
        res["cupy.fuse"] = gpu_time(lambda: chain_fuse(*xs), inner)
        res["cupy ElementwiseKernel"] = gpu_time(lambda: chain_k(*xs), inner)
        if torch is not None:
            ts = [_torch(x) for x in xs]
            res["torch eager"] = gpu_time(lambda: chain_torch(*ts), inner)
            res["torch.compile"] = gpu_time(lambda: compiled(*ts), inner)
        ours = res["tensorlogic ptx"]
        for k, t in res.items():
            row(f"chain_{n}", k, t, bw_frac=bytes_ / t / copy_bw, speedup_vs_ours=t / ours)


def _layernorm_graph(shape, how: str):
    """Layer norm over rows without affine: the row op, or written out by hand (7 nodes)."""
    g = tl.EinsumGraph()
    x = g.input("x", shape)
    if how == "op":
        g.output(g.layer_norm(x, 1, eps=1e-5), "y")
        return g
    mu = g.mean(x, 1, keepdims=True)
    d = x - mu
    var = g.mean(g.square(d), 1, keepdims=True)
    g.output(d / g.sqrt(var + 1e-5), "y")
    return g


def _layernorm_affine_graph(shape, w, b):
    g = tl.EinsumGraph()
    x = g.input("x", shape)
    g.output(g.layer_norm(x, 1, eps=1e-5) * g.constant(w) + g.constant(b), "y")
    return g


def bench_rows(shapes) -> None:
    for shape in shapes:
        x = cp.random.standard_normal(shape, dtype=cp.float32)
        tx = _torch(x) if torch is not None else None
        inner = 200 if x.size <= 1 << 22 else 20  # host-bound small rows need long batches
        print(f"softmax {shape[0]}x{shape[1]} float32")
        g = tl.EinsumGraph()
        g.output(g.softmax(g.input("x", shape), 1), "y")
        res = {}
        for label, cg in (("tensorlogic ptx", "ptx"), ("tensorlogic cuda-c", "cuda")):
            plan = tl.compile(g, backend="cupy", opt_level=0, codegen=cg)
            if tx is not None:
                assert float((_torch(plan(x=x)["y"]) - torch.softmax(tx, 1)).abs().max()) < 1e-5
            res[label] = lambda p=plan: p(x=x)

        def cupy_softmax():
            e = cp.exp(x - x.max(1, keepdims=True))
            return e / e.sum(1, keepdims=True)

        res["cupy unfused"] = cupy_softmax
        if tx is not None:
            res["torch eager"] = lambda: torch.softmax(tx, 1)
        res = gpu_times(res, inner)
        for k, t in res.items():
            row(
                f"softmax_{shape[0]}x{shape[1]}",
                k,
                t,
                GBps=8 * x.size / t / 1e9,
                vs_torch=res.get("torch eager", t) / t,
            )
        print(f"log_softmax {shape[0]}x{shape[1]} float32")
        g = tl.EinsumGraph()
        g.output(g.log_softmax(g.input("x", shape), 1), "y")
        plan = tl.compile(g, backend="cupy", opt_level=0)
        res = {}
        if tx is not None:
            err = float((_torch(plan(x=x)["y"]) - torch.log_softmax(tx, 1)).abs().max())
            assert err < 1e-4, err
        res["tensorlogic ptx"] = lambda p=plan: p(x=x)
        if tx is not None:
            res["torch eager"] = lambda: torch.log_softmax(tx, 1)
        res = gpu_times(res, inner)
        for k, t in res.items():
            row(
                f"log_softmax_{shape[0]}x{shape[1]}",
                k,
                t,
                GBps=8 * x.size / t / 1e9,
                vs_torch=res.get("torch eager", t) / t,
            )
        print(f"layer norm {shape[0]}x{shape[1]} float32 (no affine)")
        res = {}
        tref = torch.nn.functional.layer_norm(tx, (shape[1],)) if tx is not None else None
        for label, how, cg, lvl in (
            ("tensorlogic layer_norm ptx", "op", "ptx", 0),
            ("tensorlogic layer_norm cuda-c", "op", "cuda", 0),
            ("tensorlogic hand-written O2 (rewritten)", "hand", "ptx", 2),
            ("tensorlogic hand-written O0 (7 kernels)", "hand", "ptx", 0),
        ):
            plan = tl.compile(
                _layernorm_graph(shape, how), backend="cupy", opt_level=lvl, codegen=cg
            )
            if tref is not None:
                err = float((_torch(plan(x=x)["y"]) - tref).abs().max())
                assert err < 1e-4, (label, err)
            res[label] = lambda p=plan: p(x=x)
        if tx is not None:
            res["torch eager"] = lambda: torch.nn.functional.layer_norm(tx, (shape[1],))
        res = gpu_times(res, inner)
        for k, t in res.items():
            row(
                f"layernorm_{shape[0]}x{shape[1]}",
                k,
                t,
                GBps=8 * x.size / t / 1e9,
                vs_torch=res.get("torch eager", t) / t,
            )
        print(f"layer norm {shape[0]}x{shape[1]} float32 with affine (weight, bias)")
        w = np.random.default_rng(0).standard_normal(shape[1]).astype(np.float32)
        bias = np.random.default_rng(1).standard_normal(shape[1]).astype(np.float32)
        res = {}
        if tx is not None:
            tw, tb = torch.from_numpy(w).to(tx.device), torch.from_numpy(bias).to(tx.device)
        for label, cg in (("tensorlogic O2", "ptx"), ("tensorlogic O2 cuda-c", "cuda")):
            plan = tl.compile(
                _layernorm_affine_graph(shape, w, bias), backend="cupy", opt_level=2, codegen=cg
            )
            assert len(plan.steps) == 1, "layer norm + affine should be one fused kernel"
            if tx is not None:
                err = float(
                    (
                        _torch(plan(x=x)["y"])
                        - torch.nn.functional.layer_norm(tx, (shape[1],), tw, tb)
                    )
                    .abs()
                    .max()
                )
                assert err < 1e-4, err
            res[label] = lambda p=plan: p(x=x)
        if tx is not None:
            res["torch eager"] = lambda: torch.nn.functional.layer_norm(tx, (shape[1],), tw, tb)
        res = gpu_times(res, inner)
        for k, t in res.items():
            row(
                f"layernorm_affine_{shape[0]}x{shape[1]}",
                k,
                t,
                GBps=8 * x.size / t / 1e9,
                vs_torch=res.get("torch eager", t) / t,
            )


def bench_full_reduction(sizes, copy_bw: float) -> None:
    for n in sizes:
        x = cp.random.standard_normal(n, dtype=cp.float32)
        tx = _torch(x) if torch is not None else None
        inner = 10 if n >= 2**24 else 50
        for op in ("sum", "max"):
            # it reads 4n bytes: the roofline moves them at the copy's read+write rate
            print(
                f"full {op} of {n / 2**20:.0f}M float32 (roofline {4 * n / copy_bw * 1e3:.4f} ms)"
            )
            g = tl.EinsumGraph()
            g.output(g.reduce(op, g.input("x", (n,))), "y")
            plan = tl.compile(g, backend="cupy", opt_level=0)
            want = float(getattr(cp, op)(x))
            err = abs(float(plan(x=x)["y"]) - want)
            assert err <= (1e-6 * n if op == "sum" else 0.0), (op, err)
            res = {
                "tensorlogic ptx": gpu_time(lambda: plan(x=x), inner),
                "cupy": gpu_time(lambda: getattr(cp, op)(x), inner),
            }
            if tx is not None:
                res["torch eager"] = gpu_time(lambda: getattr(torch, op)(tx), inner)
            for k, t in res.items():
                row(
                    f"full_{op}_{n}",
                    k,
                    t,
                    bw_frac=4 * n / t / copy_bw,
                    vs_torch=res.get("torch eager", t) / t,
                )


def bench_overhead() -> None:
    print("host time per call, launch-bound (1024 float32 elements, synchronized per batch)")
    n = 1024
    xs = [cp.random.standard_normal(n, dtype=cp.float32) for _ in range(5)]
    chain_k = cp.ElementwiseKernel(
        "T a, T b, T c, T d, T e", "T y", "y = max(a * b + c, (T)0) * d - e", "tl_bench_chain_small"
    )
    g = tl.EinsumGraph()
    ins = [g.input(k, (n,)) for k in "abcde"]
    g.output(g.relu(ins[0] * ins[1] + ins[2]) * ins[3] - ins[4], "y")
    plan = tl.compile(g, backend="cupy", opt_level=2, cuda_graph=False)  # O2: 5 steps
    gf = tl.EinsumGraph()
    fi = [gf.input(k, (n,)) for k in "abcde"]
    gf.output(
        fused_node(
            gf,
            fi,
            [
                FusedOp("mul", (("in", 0), ("in", 1))),
                FusedOp("add", (("tmp", 0), ("in", 2))),
                FusedOp("relu", (("tmp", 1),)),
                FusedOp("mul", (("tmp", 2), ("in", 3))),
                FusedOp("sub", (("tmp", 3), ("in", 4))),
            ],
            (n,),
            "float32",
        ),
        "y",
    )
    fused = tl.compile(gf, backend="cupy", opt_level=0, cuda_graph=False)
    feed = dict(zip("abcde", xs))
    g1 = tl.EinsumGraph()
    g1.output(g1.exp(g1.input("x", (n,))), "y")
    p1 = tl.compile(g1, backend="cupy", opt_level=0, cuda_graph=False)
    res = {
        "tensorlogic plan, 5 inputs 1 fused kernel": wall_time(lambda: fused(**feed), 2000),
        "tensorlogic plan, 5 inputs 5 steps (O2)": wall_time(lambda: plan(**feed), 2000),
        "tensorlogic plan, 1 input 1 kernel": wall_time(lambda: p1(x=xs[0]), 2000),
        "cupy ElementwiseKernel, 5 inputs": wall_time(lambda: chain_k(*xs), 2000),
        "cupy exp": wall_time(lambda: cp.exp(xs[0]), 2000),
        "cupy.empty": wall_time(lambda: cp.empty(n, cp.float32), 2000),
    }
    if torch is not None:
        tx = _torch(xs[0])
        res["torch exp"] = wall_time(lambda: torch.exp(tx), 2000)
    for k, t in res.items():
        row("overhead", k, t, us=t * 1e6)


def bench_attention(shape) -> None:
    b, h, n, d = shape
    print(f"attention {shape} float32")
    q, k, v = (cp.random.standard_normal(shape, dtype=cp.float32) for _ in range(3))
    g = tl.EinsumGraph()
    tq, tk, tv = (g.input(nm, shape) for nm in "qkv")
    s = g.einsum("bhqd,bhkd->bhqk", tq, tk)
    g.output(g.einsum("bhqk,bhkd->bhqd", g.softmax(s, -1), tv), "o")
    plan = tl.compile(g, backend="cupy", opt_level=0)
    g2 = tl.EinsumGraph()
    a2, b2 = g2.input("q", shape), g2.input("k", shape)
    g2.output(g2.einsum("bhqd,bhkd->bhqk", a2, b2), "s")
    plan_s = tl.compile(g2, backend="cupy", opt_level=0)
    plan_g = tl.compile(g, backend="cupy", opt_level=0, cuda_graph=True)
    res = {
        "tensorlogic attention": gpu_time(lambda: plan(q=q, k=k, v=v), 10),
        "tensorlogic attention (cuda graph)": gpu_time(lambda: plan_g(q=q, k=k, v=v), 10),
        "tensorlogic QK^T einsum": gpu_time(lambda: plan_s(q=q, k=k), 10),
    }
    print(f"  {plan_g.concrete.runner}")
    res["cupy attention"] = gpu_time(
        lambda: cp.matmul(_cp_softmax(cp.matmul(q, k.swapaxes(-1, -2))), v), 10
    )
    if torch is not None:
        tq_, tk_, tv_ = _torch(q), _torch(k), _torch(v)
        ref = torch.einsum(
            "bhqk,bhkd->bhqd", torch.softmax(torch.einsum("bhqd,bhkd->bhqk", tq_, tk_), -1), tv_
        )
        err = float((_torch(plan(q=q, k=k, v=v)["o"]) - ref).abs().max())
        assert err < 1e-3, err
        res["torch attention (einsum)"] = gpu_time(
            lambda: torch.einsum(
                "bhqk,bhkd->bhqd", torch.softmax(torch.einsum("bhqd,bhkd->bhqk", tq_, tk_), -1), tv_
            ),
            10,
        )
        res["torch QK^T einsum"] = gpu_time(lambda: torch.einsum("bhqd,bhkd->bhqk", tq_, tk_), 10)
    flops = 4 * b * h * n * n * d
    for k_, t in res.items():
        peer = res.get("torch QK^T einsum" if "QK" in k_ else "torch attention (einsum)", t)
        row(
            "attention",
            k_,
            t,
            TFLOPs=(flops / 2 if "QK" in k_ else flops) / t / 1e12,
            vs_torch=peer / t,
        )


def _cp_softmax(s):
    e = cp.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def bench_small_graph() -> None:
    print("30-node graph on 64x64 float32 (host wall time per call)")
    g = small_graph()
    data = cp.random.standard_normal((64, 64), dtype=cp.float32)
    launches = tl.compile(g, backend="cupy", opt_level=0, cuda_graph=False)
    graph = tl.compile(g, backend="cupy", opt_level=0, cuda_graph=True)
    a, b = launches(x=data)["y"], graph(x=data)["y"]
    graph(x=data)
    assert (
        float(cp.abs(a - graph(x=data)["y"]).max()) < 1e-5
        and graph.concrete.runner.graph is not None
    )
    del b
    t_l = wall_time(lambda: launches(x=data), 50)
    t_g = wall_time(lambda: graph(x=data), 200)
    row("small_graph_30", "stream launches", t_l, per_step_us=t_l / 30 * 1e6)
    row("small_graph_30", "cuda graph replay", t_g, speedup=t_l / t_g)
    # device time per call: a replay is bound by the GPU running 30 tiny kernels back to back
    row("small_graph_30", "cuda graph replay (device)", gpu_time(lambda: graph(x=data), 200))
    row("small_graph_30", "stream launches (device)", gpu_time(lambda: launches(x=data), 50))
    print(f"  {graph.concrete.runner}")
    if int(cp.cuda.Device().compute_capability) >= 90:  # programmatic dependent launch
        pdl = tl.compile(g, backend="cupy", opt_level=0, cuda_graph=True, pdl=True)
        for _ in range(3):
            pdl(x=data)
        assert float(cp.abs(a - pdl(x=data)["y"]).max()) < 1e-5
        t_p = wall_time(lambda: pdl(x=data), 200)
        row("small_graph_30", "cuda graph replay, pdl", t_p, speedup=t_l / t_p)
        row("small_graph_30", "cuda graph replay, pdl (device)", gpu_time(lambda: pdl(x=data), 200))
        print(f"  {pdl.concrete.runner}")


def bench_ptx_generation(quick: bool) -> None:
    specs = []
    for op in ops.ELEMENTWISE:
        arity = ops.ELEMENTWISE[op].arity
        prog = S.Program(
            (FusedOp(op, tuple(("in", k) for k in range(arity))),), ("tmp", 0), (4096, 1024)
        )
        specs.append(
            S.make_spec(
                prog,
                "float32",
                [(4096, 1024)] * arity,
                ["float32"] * arity,
                [S.contiguous_strides((4096, 1024))] * arity,
            )
        )
    prog = S.Program((FusedOp("exp", (("in", 0),)),), ("tmp", 0), (4096, 1024), "softmax", (1,))
    specs.append(
        S.make_spec(
            prog, "float32", [(4096, 1024)], ["float32"], [S.contiguous_strides((4096, 1024))]
        )
    )
    n = 0
    t0 = time.perf_counter()
    rounds = 5 if quick else 40
    for r in range(rounds):
        for k, sp in enumerate(specs):
            ptx.emit(sp, f"k{r}_{k}", 90)
            n += 1
    dt = time.perf_counter() - t0
    print(
        f"PTX generation: {n / dt:,.0f} kernels/s ({n} kernels, mixed elementwise ops and softmax)"
    )
    RESULTS["ptx_generation"] = {"kernels": n, "seconds": dt, "kernels_per_second": n / dt}


_FIRST_CALL = r"""
import time, sys, json
t0 = time.perf_counter()
import numpy as np, cupy as cp, tensorlogic as tl
t_import = time.perf_counter()
cp.cuda.Device().synchronize(); cp.ones(1).sum()
t_ctx = time.perf_counter()
g = tl.EinsumGraph(); x = g.input('x', (1024, 1024))
h = g.softmax(g.gelu(x * 2.0 + 1.0))
g.output(g.sum(h, 1) + g.max(h, 1), 'y')
data = cp.random.standard_normal((1024, 1024), dtype=cp.float32)
t1 = time.perf_counter()
plan = tl.compile(g, backend='cupy', opt_level=0, codegen=sys.argv[1])
out = plan(x=data)['y']; cp.cuda.Device().synchronize()
t2 = time.perf_counter()
be = tl.get_backend('cupy')
print(json.dumps({'first_call_s': t2 - t1, 'kernels': len(plan.steps), 'hits': be.cache.stats.hits,
                  'misses': be.cache.stats.misses}))
"""


def bench_first_call() -> None:
    print("first call (compile + first run of a 7-step plan), cold vs warm kernel cache")
    for path in ("ptx", "cuda"):
        with tempfile.TemporaryDirectory() as d:
            env = {**os.environ, "TL_CACHE_DIR": d, "CUPY_CACHE_DIR": os.path.join(d, "cupy")}
            runs = []
            for _ in range(2):
                r = subprocess.run(
                    [sys.executable, "-c", _FIRST_CALL, path],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if r.returncode:
                    print(r.stderr[-2000:])
                    raise SystemExit(1)
                runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
            cold, warm = runs
            row(f"first_call_{path}", "cold cache", cold["first_call_s"], compiled=cold["misses"])
            row(f"first_call_{path}", "warm cache", warm["first_call_s"], loaded=warm["hits"])


SECTIONS = ("chain", "rows", "reduce", "attention", "overhead", "small", "ptx", "first")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default results/bench_gpu_<card>.json, one file per card)",
    )
    ap.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}",
    )
    args = ap.parse_args()
    want = set(args.sections.split(","))
    props = cp.cuda.runtime.getDeviceProperties(0)
    card = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print(f"card: {card}; cupy {cp.__version__}; torch {getattr(torch, '__version__', None)}")
    if args.out is None:  # "NVIDIA H100 80GB HBM3" -> bench_gpu_h100.json, as gpu_run.sh names it
        tag = card.split()[1].lower() if len(card.split()) > 1 else "gpu"
        args.out = str(Path(__file__).parent / "results" / f"bench_gpu_{tag}.json")
    copy_bw = bench_copy(2**26)
    if "chain" in want:
        bench_chain([2**20] if args.quick else [2**20, 2**24, 2**26], copy_bw, args.quick)
    if "rows" in want:
        bench_rows([(4096, 1024)] if args.quick else [(4096, 1024), (16384, 4096)])
    if "reduce" in want:
        bench_full_reduction([2**20] if args.quick else [2**20, 2**24, 2**26], copy_bw)
    if "attention" in want:
        bench_attention((8, 8, 1024, 64))
    if "overhead" in want:
        bench_overhead()
    if "small" in want:
        bench_small_graph()
    if "ptx" in want:
        bench_ptx_generation(args.quick)
    if "first" in want:
        bench_first_call()
    meta = {
        "card": card,
        "compute_capability": cp.cuda.Device().compute_capability,
        "cupy": cp.__version__,
        "torch": getattr(torch, "__version__", None),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": RESULTS}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
