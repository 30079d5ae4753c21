"""GPU benchmark of a whole transformer encoder block: tensorlogic's cupy backend in float32,
TF32 and bfloat16 against PyTorch eager and torch.compile, with and without
scaled_dot_product_attention, in one run on one CUDA device.

The block (built with the graph API, as a user would): B=8, D=512, 8 heads, GELU MLP of width
4D, two layer norms with affine, at S=1024 and S=4096. Rows per S:

- tensorlogic: float32 exact, TF32 (``matmul_precision="tf32"``), bf16 under the precision policy
  (``precision="bf16"``: float32 input and output), and a graph declared in bfloat16 throughout
  (bf16 input and output, as the torch bf16 model takes);
- torch eager and torch.compile, float32 / TF32 (``allow_tf32``) / bf16 (model and input in bf16),
  each with explicit softmax attention and with SDPA (flash forced for bf16).

Then each bf16 contraction step of tensorlogic's plan is timed alone against one bare cuBLAS
call of the same GEMM shape and dtype (``torch.matmul`` of (batch, m, k) x (batch, k, n)).
Device times are CUDA-event medians over batches of back-to-back calls. Writes
benchmarks/results/bench_gpu_models.json (card, versions, date).
"""

from __future__ import annotations

import argparse
import datetime
import json
import gc
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorlogic as tl  # noqa: E402
from tensorlogic import dtypes  # noqa: E402
from tensorlogic.ir import ops  # noqa: E402

import cupy as cp  # noqa: E402
from _gpu_common import gpu_time  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # every (dtype, TF32, SDPA, S) variant is its own compiled graph of one function
    for _knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, _knob):
            setattr(torch._dynamo.config, _knob, 64)
except ImportError:  # torch is a benchmark-only peer
    torch = None

RESULTS: dict = {}
B, D, HEADS = 8, 512, 8


def row(section: str, name: str, seconds: float | None, **extra) -> None:
    RESULTS.setdefault(section, {})[name] = {
        "ms": None if seconds is None else seconds * 1e3,
        **extra,
    }
    more = "  ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()
    )
    ms = "     n/a" if seconds is None else f"{seconds * 1e3:9.4f}"
    print(f"  {name:<40} {ms} ms  {more}", flush=True)


def weights(rng, d=D) -> dict[str, np.ndarray]:
    dh = d // HEADS

    def w(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "wq": w((d, HEADS, dh), d**-0.5),
        "wk": w((d, HEADS, dh), d**-0.5),
        "wv": w((d, HEADS, dh), d**-0.5),
        "wo": w((HEADS, dh, d), d**-0.5),
        "g1": 1 + w((d,), 0.1),
        "b1": w((d,), 0.1),
        "w1": w((d, 4 * d), d**-0.5),
        "c1": w((4 * d,), 0.1),
        "w2": w((4 * d, d), (4 * d) ** -0.5),
        "c2": w((d,), 0.1),
        "g2": 1 + w((d,), 0.1),
        "b2": w((d,), 0.1),
    }


def tl_block(p: dict[str, np.ndarray], s: int, dtype: str = "float32") -> tl.EinsumGraph:
    """The encoder block with the graph API (weights as constants of ``dtype``)."""
    g = tl.EinsumGraph()
    x = g.input("x", ("B", s, D), dtype)
    c = {k: g.constant(v, name=k, dtype=dtype) for k, v in p.items()}
    dh = D // HEADS
    q = g.einsum("bsd,dhe->bhse", x, c["wq"])
    k = g.einsum("bsd,dhe->bhse", x, c["wk"])
    v = g.einsum("bsd,dhe->bhse", x, c["wv"])
    att = g.softmax(g.einsum("bhqe,bhke->bhqk", q, k) * (dh**-0.5), axis=-1)
    o = g.einsum("bhqe,hed->bqd", g.einsum("bhqk,bhke->bhqe", att, v), c["wo"])
    h = g.layer_norm(x + o, axis=-1) * c["g1"] + c["b1"]
    m = g.gelu(g.einsum("bsd,df->bsf", h, c["w1"]) + c["c1"])
    m = g.einsum("bsf,fd->bsd", m, c["w2"]) + c["c2"]
    g.output(g.layer_norm(h + m, axis=-1) * c["g2"] + c["b2"], "y")
    return g


def torch_block(p, x, sdpa: bool):
    d = x.shape[-1]
    dh = d // HEADS
    q = torch.einsum("bsd,dhe->bhse", x, p["wq"])
    k = torch.einsum("bsd,dhe->bhse", x, p["wk"])
    v = torch.einsum("bsd,dhe->bhse", x, p["wv"])
    if sdpa:
        o = F.scaled_dot_product_attention(q, k, v)
    else:
        o = torch.softmax(q @ k.transpose(-1, -2) * dh**-0.5, dim=-1) @ v
    o = torch.einsum("bhqe,hed->bqd", o, p["wo"])
    h = F.layer_norm(x + o, (d,), p["g1"], p["b1"], eps=1e-5)
    m = F.gelu(h @ p["w1"] + p["c1"], approximate="tanh") @ p["w2"] + p["c2"]
    return F.layer_norm(h + m, (d,), p["g2"], p["b2"], eps=1e-5)


class _Tf32:
    """torch's TF32 switch for the rows that allow it (restored after)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self):
        self.old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.on

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.old


def _rel_err(got, want) -> float:
    g = np.asarray(got, np.float64)
    return float(np.abs(g - want).max() / np.abs(want).max())


def _to_np(t) -> np.ndarray:
    if hasattr(t, "get"):
        t = t.get()
    if torch is not None and isinstance(t, torch.Tensor):
        return t.detach().float().cpu().numpy()
    return np.asarray(t).astype(np.float64)


def bench_block(
    s: int, p: dict, deadline: float, inner: int, modes=("fp32", "tf32", "bf16")
) -> None:
    sec = f"block_S{s}"
    print(f"encoder block B={B} S={s} D={D} heads={HEADS} (device ms per call)")
    rng = np.random.default_rng(1)
    x32 = rng.standard_normal((B, s, D)).astype(np.float32)
    xg = cp.asarray(x32)
    xg16 = cp.asarray(x32.astype(dtypes.bfloat16))
    ref = None
    if torch is not None:
        tp = {k: torch.from_numpy(v).cuda() for k, v in p.items()}
        xt = torch.from_numpy(x32).cuda()
        with torch.no_grad(), _Tf32(False):
            ref = torch_block({k: v.double() for k, v in tp.items()}, xt.double(), False)
        ref = ref.cpu().numpy()
        torch.cuda.empty_cache()
    results = {}

    def measure(name, fn, mode):
        if time.monotonic() > deadline:
            row(sec, name, None, skipped="time budget")
            return
        try:
            out = fn()
            cp.cuda.Device().synchronize()
            t = gpu_time(fn, inner, batches=5)
            err = _rel_err(_to_np(out), ref) if ref is not None else float("nan")
            results[name] = t
            row(sec, name, t, mode=mode, rel_err=err)
        except Exception as exc:  # noqa: BLE001 - one failing contender must not end the run
            traceback.print_exc()
            row(sec, name, None, error=f"{type(exc).__name__}: {exc}"[:300])

    def free() -> None:
        # each contender's working memory goes back before the next one runs
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()

    # ours
    g32 = tl_block(p, s)
    for name, mode, opts in (
        ("tensorlogic float32", "fp32", {}),
        ("tensorlogic float32, attention written out", "fp32", {"fuse_attention": False}),
        ("tensorlogic tf32", "tf32", {"matmul_precision": "tf32"}),
        ("tensorlogic bf16 policy (f32 I/O)", "bf16", {"precision": "bf16"}),
    ):
        if mode not in modes:
            continue
        plan = tl.compile(g32, backend="cupy", cache=False, **opts)
        measure(name, lambda plan=plan: plan(x=xg)["y"], mode)
        plan.release_memory()
        del plan
        free()
    # the default plan fuses bf16 attention (the tensor-core flash kernel); the written-out
    # form (cuBLAS GEMMs, S x S scores in memory) beside it
    # and the plan without cuBLASLt epilogues (GEMM and bias + GELU as two steps), to compare
    from tensorlogic.backends.cupy import backend as cupy_backend

    for name, opts, epilogues in (
        ("tensorlogic bf16 graph", {}, True),
        ("tensorlogic bf16 graph, no cuBLASLt epilogue", {}, False),
        ("tensorlogic bf16 graph, attention written out", {"fuse_attention": False}, True),
    ):
        if "bf16" not in modes:
            break
        cupy_backend.FUSE_EPILOGUES = epilogues
        try:  # plans build on first use: build this one while the switch holds
            plan16 = tl.compile(tl_block(p, s, "bfloat16"), backend="cupy", cache=False, **opts)
            plan16.specialize(B=B)
        finally:
            cupy_backend.FUSE_EPILOGUES = True
        measure(name, lambda plan=plan16: plan(x=xg16)["y"], "bf16")
        if not opts and epilogues:
            RESULTS.setdefault("plans", {})[f"S{s}_bf16"] = str(plan16)
            print(plan16)
        plan16.release_memory()
        del plan16
        free()
    if torch is None:
        return
    # torch
    tmodes = {
        "fp32": (torch.float32, False),
        "tf32": (torch.float32, True),
        "bf16": (torch.bfloat16, False),
    }
    # eager rows, then torch.compile rows in the order the targets need them (a run that hits
    # its time budget drops the last ones)
    order = [(False, m, sd) for m in tmodes for sd in (False, True)] + [
        (True, "bf16", True),
        (True, "bf16", False),
        (True, "fp32", True),
        (True, "tf32", True),
        (True, "fp32", False),
        (True, "tf32", False),
    ]
    for use_compile, mode, sdpa in order:
        if mode not in modes:
            continue
        tdt, tf32 = tmodes[mode]
        pp = {k: v.to(tdt) for k, v in tp.items()}
        xx = xt.to(tdt)
        flash = sdpa and mode == "bf16"
        tag = f"{mode}{' + SDPA' + (' (flash)' if flash else '') if sdpa else ''}"

        def ctx_of(flash=flash):
            # a fresh context per call (one made by sdpa_kernel cannot be entered twice)
            return sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if flash else _Null()

        fn = torch.compile(torch_block, dynamic=False) if use_compile else torch_block

        def call(pp=pp, xx=xx, sdpa=sdpa, ctx_of=ctx_of, tf32=tf32, fn=fn):
            with torch.no_grad(), ctx_of(), _Tf32(tf32):
                return fn(pp, xx, sdpa)

        measure(f"{'torch.compile' if use_compile else 'torch eager'} {tag}", call, mode)
        free()
    ratios = {}
    pairs = (
        ("tensorlogic bf16 graph", "torch eager bf16 + SDPA (flash)", 1.0),
        ("tensorlogic bf16 graph", "torch.compile bf16 + SDPA (flash)", 0.9),
        ("tensorlogic bf16 graph", "torch.compile bf16", 0.9),
        ("tensorlogic bf16 graph", "tensorlogic bf16 graph, attention written out", 1.0),
        ("tensorlogic bf16 policy (f32 I/O)", "torch eager bf16 + SDPA (flash)", 1.0),
        ("tensorlogic float32", "torch.compile fp32 + SDPA", 1.0),
        ("tensorlogic tf32", "torch.compile tf32 + SDPA", 1.0),
    )
    print("  ratios (peer time / ours; target in brackets):")
    for ours, peer, target in pairs:
        if ours in results and peer in results:
            r = results[peer] / results[ours]
            ratios[f"{ours} vs {peer}"] = {"ratio": r, "target": target}
            print(f"    {ours} vs {peer}: {r:.2f}x [{target}x]")
    RESULTS[sec]["ratios"] = ratios


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def captured_time(fn, inner: int) -> float:
    """Device seconds per call of ``fn`` captured ``inner`` times in one CUDA graph (no host
    launch cost, as a plan replays its graph), median of replays."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(inner):
            fn()
        graph = stream.end_capture()
    times = []
    for _ in range(7):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3 / inner)
    return sorted(times)[len(times) // 2]


def _gemms_of(kernel) -> list | None:
    """The (batch, m, n, k) GEMMs of a contraction step: its einsum plan is the kernel's impl
    (through a widening wrapper's inner kernel)."""
    impl = getattr(kernel, "impl", None)
    while impl is not None and not hasattr(impl, "gemms"):
        impl = getattr(impl, "impl", None)
    return None if impl is None else list(impl.gemms)


def bench_steps(s: int, p: dict, inner: int, epilogues: bool = True) -> None:
    """Every step of the bf16 plan alone (device time in a CUDA graph); each contraction step
    against bare cuBLAS calls of the GEMMs it makes (cublasGemmStridedBatchedEx on contiguous
    operands of the same (batch, m, n, k), bf16, float32 accumulation). A GEMM with a cuBLASLt
    epilogue is compared with the bare GEMM too, without the 1.1x target (it does more);
    ``epilogues=False``: the plan without them (the product and its consumer as two steps)."""
    from tensorlogic.backends.cupy import backend as cupy_backend, cublas

    sec = f"steps_S{s}" + ("" if epilogues else "_no_epilogue")
    tag = "" if epilogues else " without cuBLASLt epilogues"
    print(f"bf16 plan steps{tag} at S={s}, device ms (contractions: ours / bare cuBLAS GEMMs)")
    cupy_backend.FUSE_EPILOGUES = epilogues
    try:
        plan = tl.compile(tl_block(p, s, "bfloat16"), backend="cupy", cache=False)
        plan = plan.specialize(B=B)
    finally:
        cupy_backend.FUSE_EPILOGUES = True
    blas = cublas.get()
    rng = np.random.default_rng(2)
    total = 0.0
    for step, kernel in zip(plan.steps, plan.kernels):
        # the step's own inputs (a GEMM with its epilogue reads the product's operands)
        ins = [plan.buffers[i] for i in step.inputs]
        args = [cp.asarray(rng.standard_normal(b.shape).astype(b.dtype)) for b in ins]
        scratch = [cp.empty(b.shape, b.dtype) for b in plan.buffers if b.id in step.scratch]
        out = cp.empty(tuple(step.shape), step.dtype)
        t = captured_time(lambda k=kernel, a=args + scratch, o=out: k(a, o), inner)
        total += t
        extra = {"op": step.label[:60]}
        gemms = _gemms_of(kernel)
        if step.kind == ops.EINSUM and gemms and blas is not None:
            bare = 0.0
            for nb, m, n, k in gemms:
                ta = cp.asarray(rng.standard_normal((nb, m, k)).astype(dtypes.bfloat16))
                tb = cp.asarray(rng.standard_normal((nb, k, n)).astype(dtypes.bfloat16))
                tc = cp.empty((nb, m, n), dtypes.bfloat16)
                bare += captured_time(lambda a=ta, b=tb, c=tc: blas.matmul(a, b, out=c), inner)
            extra.update(gemms=gemms, bare_ms=bare * 1e3, ratio=t / bare)
            if "cuBLASLt epilogue" not in step.info:
                extra.update(target=1.1)
        row(sec, step.name, t, **extra)
    row(sec, "sum of steps", total)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "bench_gpu_models.json")
    )
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument(
        "--modes",
        default="fp32,tf32,bf16",
        help="comma-separated subset of fp32,tf32,bf16 (the rows run)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=400.0,
        help="contenders past this many seconds are recorded as skipped",
    )
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    props = cp.cuda.runtime.getDeviceProperties(0)
    card = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print(f"card: {card}; cupy {cp.__version__}; torch {getattr(torch, '__version__', None)}")
    p = weights(np.random.default_rng(0))
    for s in (int(v) for v in args.seqs.split(",")):
        inner = 20 if s <= 1024 else 4
        bench_block(s, p, deadline, inner, tuple(args.modes.split(",")))
        try:
            bench_steps(s, p, inner)
            bench_steps(s, p, inner, epilogues=False)
        except Exception:  # noqa: BLE001 - keep the block results
            traceback.print_exc()
    meta = {
        "card": card,
        "compute_capability": cp.cuda.Device().compute_capability,
        "cupy": cp.__version__,
        "torch": getattr(torch, "__version__", None),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "block": {"B": B, "D": D, "heads": HEADS, "mlp": 4 * D},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": RESULTS}, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
