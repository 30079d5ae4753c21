"""Fused attention: CPU (the S=4096 memory target) and GPU (attention alone vs torch SDPA).

CPU part (default): the attention of a transformer block written as einsums, as a user writes
it (x: 1 x S x 256, 4 heads of 64; per-head projections ``bsd,hkd->bhsk``; scores
``bhqk,bhsk->bhqs`` times 1/sqrt(64); an additive causal mask constant for the causal rows;
softmax; ``bhqs,bhsk->bqhk``; output projection ``bqhk,hkd->bqd``), float32. Contenders, each in
its own process so the process peak (ru_maxrss) is its own: tensorlogic numpy and numba at O2
with the attention pass (fused) and without it (``fuse_attention=False``, the unfused plan),
and torch with ``scaled_dot_product_attention``. Reported: median ms, planned peak
(``plan.memory.peak_bytes``, kernel scratch included), process peak RSS and its growth over the
inputs, the max difference from torch's output.

GPU part (``--gpu``): attention alone, B=1, 8 heads, head dim 64 and 128, S=1024..16384,
causal and not: tensorlogic cupy (the generated flash kernel: tensor-core mma.sync for bfloat16
and float16, 3xTF32 tensor-core MMAs for float32) against torch SDPA (16-bit: the flash backend
forced; float32: torch's choice, its memory-efficient kernel), CUDA-event medians, and the peak
device memory each call adds. Up to S=4096 the same attention written out as einsums and a
softmax (``fuse_attention=False``: cuBLAS GEMMs and our softmax kernel) is timed too, the
comparison behind the cupy backend's default of fusing attention per dtype.

Usage: python benchmarks/bench_attention.py [--quick] [--gpu] [--out FILE]
Writes benchmarks/results/bench_attention.json (CPU) or bench_attention_gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, table, versions, write_results

CPU_CONTENDERS = (
    "tl_numpy_fused",
    "tl_numpy_unfused",
    "tl_numba_fused",
    "tl_numba_unfused",
    "torch_sdpa",
)


def _weights(d_model: int, heads: int):
    rng = np.random.default_rng(1)
    k = d_model // heads
    return [
        (rng.standard_normal((heads, k, d_model)) / np.sqrt(d_model)).astype(np.float32)
        for _ in range(4)
    ]


def _x(s: int, d_model: int):
    return np.random.default_rng(2).standard_normal((1, s, d_model)).astype(np.float32)


def _tl_graph(s: int, d_model: int, heads: int, causal: bool):
    import tensorlogic as tl

    wq, wk, wv, wo = _weights(d_model, heads)
    g = tl.EinsumGraph()
    x = g.input("x", (1, s, d_model))
    q, k, v = (g.einsum("bsd,hkd->bhsk", x, g.constant(w)) for w in (wq, wk, wv))
    scores = g.einsum("bhqk,bhsk->bhqs", q, k) * float(1 / np.sqrt(d_model // heads))
    if causal:
        hide = np.zeros((s, s), np.float32)  # filled row by row: no S x S temporaries
        for i in range(s - 1):
            hide[i, i + 1 :] = -np.inf
        scores = scores + g.constant(hide, name="causal_mask")
        del hide
    o = g.einsum("bhqs,bhsk->bqhk", g.softmax(scores, -1), v)
    g.output(g.einsum("bqhk,hkd->bqd", o, g.constant(wo)), "y")
    return g


def _hwm() -> int:
    """Peak resident bytes of this process since the last reset (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> int | None:
    """Reset the peak-RSS mark (Linux clear_refs) and return the resident bytes now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cpu_worker(
    name: str, s: int, d_model: int, heads: int, causal: bool, rounds: int, out_path: str
) -> dict:
    """One contender in this process: times, planned and measured peaks; output saved."""
    x = _x(s, d_model)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    info: dict = {"contender": name}
    if name.startswith("tl_"):
        import tensorlogic as tl

        backend = name.split("_")[1]
        g = _tl_graph(s, d_model, heads, causal)
        plan = tl.compile(g, backend=backend, opt_level=2, fuse_attention=name.endswith("_fused"))
        info["planned_peak_bytes"] = plan.memory.peak_bytes
        info["steps"] = len(plan.steps)
        info["threads"] = os.cpu_count()

        def run():
            return plan(x=x)["y"]
    else:
        import torch

        wq, wk, wv, wo = (torch.from_numpy(w) for w in _weights(d_model, heads))
        xt = torch.from_numpy(x)
        info["threads"] = torch.get_num_threads()

        def run():
            with torch.inference_mode():
                q, k, v = (torch.einsum("bsd,hkd->bhsk", xt, w) for w in (wq, wk, wv))
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return torch.einsum("bhqk,hkd->bqd", o, wo).numpy()

    run_base = _reset_hwm()  # the calls' peak: the first call allocates the plan's arena
    y = run()  # warm-up (and first-call compilation)
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        y = run()
        ts.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    info["process_peak_bytes"] = peak
    info["peak_growth_bytes"] = peak - base_rss
    if run_base is not None:  # the peak while calling (graph building and compiling aside)
        info["run_peak_growth_bytes"] = _hwm() - run_base
    info["samples_ms"] = [t * 1e3 for t in ts]
    np.save(out_path, np.asarray(y))
    return info


def _spawn(name, s, d_model, heads, causal, rounds, tmp) -> dict | None:
    out = os.path.join(tmp, f"{name}_{int(causal)}.npy")
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        name,
        "--seq",
        str(s),
        "--rounds",
        str(rounds),
        "--out-array",
        out,
    ] + (["--causal"] if causal else [])
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        env=dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]
            ),
        ),
    )
    if r.returncode != 0:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode
        print(f"  {name}: failed ({why})")
        return None
    info = json.loads(r.stdout.strip().splitlines()[-1])
    info["y"] = out
    return info


def cpu(args) -> None:
    s, d_model, heads = args.seq, 256, 4
    rounds, passes = (2, 1) if args.quick else (2, 3)
    rows = []
    scores_bytes = heads * s * s * 4  # the scores of all heads
    sxs_bytes = s * s * 4  # one S x S matrix
    have_torch = True
    try:
        import torch  # noqa: F401
    except ImportError:
        have_torch = False
        print("  torch is not installed: the torch_sdpa peer is skipped")
    names = [n for n in CPU_CONTENDERS if have_torch or n != "torch_sdpa"]
    with tempfile.TemporaryDirectory() as tmp:
        for causal in (False, True):
            # contenders take turns, one process each per pass, so a busy minute on a shared
            # machine lands on all of them; medians over every sample of every pass
            got: dict[str, dict] = {}
            for _ in range(passes):
                for name in names:
                    info = _spawn(name, s, d_model, heads, causal, rounds, tmp)
                    if info is None:
                        continue
                    prev = got.get(name)
                    if prev is not None:
                        info["samples_ms"] = prev["samples_ms"] + info["samples_ms"]
                        for key in (
                            "process_peak_bytes",
                            "peak_growth_bytes",
                            "run_peak_growth_bytes",
                        ):
                            if key in prev:
                                info[key] = max(prev[key], info.get(key, 0))
                    got[name] = info
            for info in got.values():
                info["ms"] = statistics.median(info["samples_ms"])
            ref = np.load(got["torch_sdpa"]["y"]) if "torch_sdpa" in got else None
            for info in got.values():
                y = np.load(info.pop("y"))
                info["max_abs_diff_vs_torch"] = (
                    float(np.abs(y - ref).max()) if ref is not None else None
                )
                info.update(causal=causal, S=s, D=d_model, H=heads)
                rows.append(info)
            for be in ("numpy", "numba"):
                f, u = got.get(f"tl_{be}_fused"), got.get(f"tl_{be}_unfused")
                if f and u:
                    f["speedup_vs_unfused"] = u["ms"] / f["ms"]
                    f["planned_peak_fraction_of_unfused"] = (
                        f["planned_peak_bytes"] / u["planned_peak_bytes"]
                    )
                    f["process_peak_saving_bytes"] = (
                        u["process_peak_bytes"] - f["process_peak_bytes"]
                    )
                    f["saving_over_one_SxS"] = f["process_peak_saving_bytes"] / sxs_bytes
                    f["saving_over_all_heads"] = f["process_peak_saving_bytes"] / scores_bytes
                    if "torch_sdpa" in got:
                        f["ratio_torch_over_ours"] = got["torch_sdpa"]["ms"] / f["ms"]
    for r in rows:
        for key in (
            "planned_peak_bytes",
            "process_peak_bytes",
            "peak_growth_bytes",
            "process_peak_saving_bytes",
            "run_peak_growth_bytes",
        ):
            if key in r:
                r[key.replace("_bytes", "_MiB")] = r[key] / 2**20
    print(
        f"CPU attention, S={s}, B=1, D={d_model}, H={heads}, float32 (S x S scores of all "
        f"heads: {scores_bytes / 2**20:.0f} MiB); load {os.getloadavg()[0]:.2f}"
    )
    print(
        table(
            rows,
            [
                "contender",
                "causal",
                "ms",
                "threads",
                "planned_peak_MiB",
                "process_peak_MiB",
                "run_peak_growth_MiB",
                "speedup_vs_unfused",
                "planned_peak_fraction_of_unfused",
                "saving_over_one_SxS",
                "saving_over_all_heads",
                "ratio_torch_over_ours",
                "max_abs_diff_vs_torch",
            ],
        )
    )
    path = write_results(
        "bench_attention",
        rows,
        {
            "scores_bytes": scores_bytes,
            "sxs_bytes": sxs_bytes,
            "passes": passes,
            "calls_per_pass": rounds,
        },
        peers=("torch",),
    )
    print(f"wrote {path}")


def _gpu_case(hd: int, s: int, causal: bool, dtype: str, written: bool) -> dict:
    """One GPU row: ours and torch SDPA on the same inputs, times, memory, difference."""
    import cupy as cp
    import torch
    from _gpu_common import gpu_time
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tensorlogic as tl

    shape = (1, 8, s, hd)
    rng = np.random.default_rng(0)
    host = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    g = tl.EinsumGraph()
    q, k, v = (g.input(n, shape, dtype) for n in "qkv")
    g.output(g.attention(q, k, v, causal=causal), "y")
    plan = tl.compile(g, backend="cupy")
    ins = {n: cp.asarray(a.astype(dtype)) for n, a in host.items()}
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    tq = {n: torch.as_tensor(a, device="cuda").to(tdt) for n, a in host.items()}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # 16-bit: the flash backend forced; float32: torch's own choice (flash takes no float32)
    backends = (
        [SDPBackend.FLASH_ATTENTION]
        if dtype != "float32"
        else [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )

    def torch_run():
        with sdpa_kernel(backends):
            return sdpa(tq["q"], tq["k"], tq["v"], is_causal=causal)

    def ours_run():
        return plan(**ins)

    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    before = pool.used_bytes()
    y = plan(**ins)["y"]
    cp.cuda.Device().synchronize()
    ours_mem = pool.used_bytes() - before  # the output and anything a call allocates
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    yt = torch_run()
    torch.cuda.synchronize()
    torch_mem = torch.cuda.max_memory_allocated() - base
    diff = float(np.abs(cp.asnumpy(y).astype(np.float32) - yt.float().cpu().numpy()).max())
    del y, yt
    inner = 3 if s >= 8192 else 10
    ours = gpu_time(ours_run, inner, batches=5)
    theirs = gpu_time(torch_run, inner, batches=5)
    flops = 4 * 8 * s * s * hd / (2 if causal else 1)
    out = {
        "head_dim": hd,
        "S": s,
        "causal": causal,
        "dtype": dtype,
        "kernel": plan.steps[0].info,
        "ours_ms": ours * 1e3,
        "torch_ms": theirs * 1e3,
        "ratio_torch_over_ours": theirs / ours,
        "ours_TFLOPs": flops / ours / 1e12,
        "ours_mem_MiB": ours_mem / 2**20,
        "torch_mem_MiB": torch_mem / 2**20,
        "max_abs_diff": diff,
    }
    if written and s <= 4096:
        wg = tl.EinsumGraph()
        q, k, v = (wg.input(n, shape, dtype) for n in "qkv")
        sc = wg.einsum("bhqd,bhkd->bhqk", q, k) * (hd**-0.5)
        if causal:
            hide = np.triu(np.full((s, s), -np.inf, np.float32), 1).astype(dtype)
            sc = sc + wg.constant(hide)
        wg.output(wg.einsum("bhqk,bhkd->bhqd", wg.softmax(sc, -1), v), "y")
        wplan = tl.compile(wg, backend="cupy", fuse_attention=False)
        out["written_out_ms"] = gpu_time(lambda: wplan(**ins), inner, batches=5) * 1e3
        out["ratio_written_out_over_ours"] = out["written_out_ms"] / out["ours_ms"]
        del wplan
        cp.get_default_memory_pool().free_all_blocks()
    return out


def gpu(args) -> None:
    import cupy as cp
    import torch

    seqs = args.seqs or ([1024, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384])
    from tensorlogic.backends.cupy import attention_gpu, attention_mma

    rows = []
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal_rows]
    for hd in args.head_dims:
        if args.config:  # a block shape forced, to compare shapes ("auto": query in registers
            w, mt, qr, pair, *bn = args.config.split(",")  # up to head dim 64; keys a tile)
            attention_gpu.MMA_CONFIG = attention_mma.Config(
                int(w),
                int(mt),
                hd <= 64 if qr == "auto" else qr == "1",
                pair == "1",
                int(bn[0]) if bn else attention_mma.BN,
            )
        for s in seqs:
            for causal in causals:
                for dtype in args.dtypes:
                    rows.append(_gpu_case(hd, s, causal, dtype, not args.no_written))
                    print(table(rows[-1:], [c for c in rows[-1] if c != "kernel"]), flush=True)
    print(f"GPU attention alone on {dev} (B=1, 8 heads; torch 16-bit = flash backend)")
    print(table(rows, [c for c in rows[0] if c != "kernel"]))
    extra = {"device": dev, "torch": torch.__version__, "cupy": cp.__version__}
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "benchmark": "bench_attention_gpu",
                    "machine": machine(),
                    "versions": versions("torch", "cupy"),
                    "rows": rows,
                    **extra,
                },
                indent=1,
            )
        )
        print(f"wrote {args.out}")
    else:
        print(f"wrote {write_results('bench_attention_gpu', rows, extra, peers=('torch', 'cupy'))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--out", default=None, help="GPU part: JSON path")
    ap.add_argument(
        "--seqs",
        type=int,
        nargs="*",
        default=None,
        help="GPU part: sequence lengths (default 1024..16384)",
    )
    ap.add_argument(
        "--dtypes", nargs="*", default=["bfloat16", "float16", "float32"], help="GPU part: dtypes"
    )
    ap.add_argument(
        "--head-dims", type=int, nargs="*", default=[64, 128], help="GPU part: head dims"
    )
    ap.add_argument(
        "--config",
        default=None,
        help="GPU part: the tensor-core kernel's block shape, 'warps,m-tiles,"
        "query-in-registers(0/1/auto),paired(0/1)[,keys a tile]' (default: chosen per shape)",
    )
    ap.add_argument(
        "--causal-rows",
        choices=("both", "yes", "no"),
        default="both",
        help="GPU part: causal rows, plain rows or both",
    )
    ap.add_argument(
        "--no-written", action="store_true", help="GPU part: skip the written-out attention rows"
    )
    ap.add_argument("--seq", type=int, default=4096, help="CPU part: sequence length")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--causal", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--out-array", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        info = _cpu_worker(args.worker, args.seq, 256, 4, args.causal, args.rounds, args.out_array)
        print(json.dumps(info))
    elif args.gpu:
        gpu(args)
    else:
        cpu(args)


if __name__ == "__main__":
    main()
